"""Shared by the experiment scripts: run one training configuration in its own process
(so its peak memory is its own), and write JSON results and plots."""
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "experiments", "results")


def run_training(name, train_args, work_dir):
    """Runs `python -m tf_sparseconv.train` with train_args; returns its results.json."""
    out = os.path.join(work_dir, name)
    command = [sys.executable, "-m", "tf_sparseconv.train", *map(str, train_args), "--out", out]
    print(f"=== {name}: {' '.join(command[3:])}", flush=True)
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run(command, check=True, env=env)
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    print(f"=== {name} finished in {time.perf_counter() - start:.0f} s: "
          f"validation accuracy {results['val_accuracy']:.4f}", flush=True)
    return results


def read_json(filename):
    """The rows of a results file, or [] where there is none yet."""
    path = os.path.join(RESULTS, filename)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def write_json(filename, rows):
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, filename)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {path}")
    return path


def save_figure(figure, filename):
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, filename)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")
    return path
