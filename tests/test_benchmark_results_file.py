"""A benchmark never overwrites rows of its results file unless given --replace
(benchmarks/results_file.py): the check itself, and the scripts stopping before they measure."""
import argparse
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from results_file import add_replace_argument, refuse_to_replace  # noqa: E402


def parser():
    p = argparse.ArgumentParser()
    add_replace_argument(p)
    return p


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_rows_the_run_would_overwrite_stop_it_unless_replace(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    write_rows(out, [{"kind": "time", "r": 64}, {"kind": "stack", "r": 64}])
    with pytest.raises(SystemExit) as stopped:
        refuse_to_replace(parser(), str(out), replace=False)
    assert stopped.value.code == 2
    assert "already holds 2 row(s)" in capsys.readouterr().err
    refuse_to_replace(parser(), str(out), replace=True)
    assert out.read_text().count("\n") == 2  # the check never writes


def test_only_the_rows_the_run_replaces_count(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    write_rows(out, [{"kind": "time", "r": 64}, {"kind": "epoch"}])
    refuse_to_replace(parser(), str(out), False, lambda row: row["kind"] == "memory")
    with pytest.raises(SystemExit):
        refuse_to_replace(parser(), str(out), False, lambda row: row["kind"] == "time")
    assert "already holds 1 row(s)" in capsys.readouterr().err


def test_a_missing_or_empty_file_needs_no_replace(tmp_path):
    refuse_to_replace(parser(), str(tmp_path / "none.jsonl"), False)
    (tmp_path / "empty.jsonl").write_text("\n")
    refuse_to_replace(parser(), str(tmp_path / "empty.jsonl"), False)


@pytest.mark.parametrize("script,args", [
    ("train_step.py", ["--resolutions", "8", "--steps", "1"]),
    ("site_conv_cpu.py", ["--scenes", "lidar_10cm"]),
    ("conv_capacity.py", ["--resolutions", "8"]),
])
def test_scripts_stop_before_measuring_over_existing_rows(tmp_path, script, args):
    out = tmp_path / "kept.jsonl"
    kept = [{"kind": "step", "step_ms": 1.0}]
    write_rows(out, kept)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, os.path.join("benchmarks", script), *args, "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "give --replace" in done.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == kept
