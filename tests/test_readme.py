"""The README is the front door: short, its test command is the one CI runs, and its
self-contained examples run as written."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
# Examples that need a trained model or the user's files are shown, not run here.
EXAMPLES = [block for block in re.findall(r"```python\n(.*?)```", README, re.S) if "runs/" not in block]


def test_readme_is_a_front_door_of_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_readme_names_the_test_command_that_ci_runs():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert "bash scripts/test.sh" in ci and "bash scripts/test.sh" in README


def test_readme_links_point_at_files_that_exist():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, target)), target


def test_readme_has_one_runnable_example_per_family():
    assert len(EXAMPLES) == 2 and "direct_conv" in EXAMPLES[0] and "site_conv" in EXAMPLES[1]


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs_as_written(index):
    result = subprocess.run([sys.executable, "-c", EXAMPLES[index]], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
