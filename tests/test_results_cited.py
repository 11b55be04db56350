"""Every result file kept in the tree is cited by a document: results that no page reads
are removed (git history keeps them), so a reader can trust that what is there is used.

A file counts as cited where docs/*.md, README.md or experiments/README.md name it by its
path from the repository root (benchmarks/results/x.jsonl) or from its results folder's
parent (results/x.png, as experiments/README.md links its figures).
"""
import glob
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULT_FOLDERS = ("benchmarks/results", "experiments/results")


def documents():
    paths = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    paths += [os.path.join(REPO, name) for name in ("README.md", os.path.join("experiments", "README.md"))]
    return {os.path.relpath(p, REPO): open(p, encoding="utf-8").read() for p in paths if os.path.exists(p)}


def result_files():
    """(folder, path inside it) of every file under the results folders."""
    found = []
    for folder in RESULT_FOLDERS:
        root = os.path.join(REPO, folder)
        for dirpath, _, names in os.walk(root):
            for name in names:
                found.append((folder, os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")))
    return sorted(found)


def citations(folder, inside):
    """The strings any one of which cites results file `inside` of `folder`."""
    return [f"{folder}/{inside}", f"results/{inside}"]


def uncited(files, docs):
    text = "\n".join(docs.values())
    return [f"{folder}/{inside}" for folder, inside in files
            if not any(name in text for name in citations(folder, inside))]


def test_there_are_results_and_documents():
    files = result_files()
    assert any(folder == "benchmarks/results" for folder, _ in files)
    assert any(folder == "experiments/results" for folder, _ in files)
    assert "docs/benchmarks.md" in documents()


@pytest.mark.parametrize("folder", RESULT_FOLDERS)
def test_every_result_file_is_cited(folder):
    missing = uncited([f for f in result_files() if f[0] == folder], documents())
    assert not missing, (f"result files no document cites (cite them in docs/*.md, README.md or "
                         f"experiments/README.md, or remove them): {missing}")


def test_experiment_results_are_written_one_row_per_line():
    """experiments/common.py's layout: a JSON list, one row per line (no pretty-printed histories)."""
    for folder, inside in result_files():
        if folder == "experiments/results" and inside.endswith(".json"):
            with open(os.path.join(REPO, folder, inside), encoding="utf-8") as f:
                text = f.read()
            assert len(text.splitlines()) == len(json.loads(text)) + 2, inside


def test_citation_rules():
    docs = {"docs/a.md": "`benchmarks/results/x.jsonl`, ![f](results/y.png), `results/runs/`",
            "README.md": "mentions z.json only by its bare name"}
    files = [("benchmarks/results", "x.jsonl"), ("experiments/results", "y.png"),
             ("experiments/results", "runs/r1.json"), ("experiments/results", "z.json"),
             ("benchmarks/results", "w.jsonl")]
    assert uncited(files, docs) == ["experiments/results/runs/r1.json", "experiments/results/z.json",
                                    "benchmarks/results/w.jsonl"]
