"""Shared by the experiment scripts: run one training configuration in its own process
(so its peak memory is its own), and write JSON results and plots.

A results file is a JSON list of rows written one row per line, so that a rerun's diff
shows the rows it changed; experiments/summarize.py renders experiments/README.md from them.
"""
import fcntl
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "experiments", "results")


def training_command(name, train_args, work_dir):
    """(command, environment, output folder) of `tf-sparseconv train` with train_args."""
    out = os.path.join(work_dir, name)
    command = [sys.executable, "-m", "tf_sparseconv", "train", *map(str, train_args), "--out", out]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2")
    return command, env, out


def read_results(out):
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def scored(results):
    """How a finished run of tf-sparseconv train scored, for its closing line."""
    if results.get("val_accuracy") is None:
        return "no validation (--val-split none)"
    return f"validation accuracy {results['val_accuracy']:.4f}"


def run_training(name, train_args, work_dir):
    """Runs `tf-sparseconv train` with train_args; returns its results.json."""
    command, env, out = training_command(name, train_args, work_dir)
    print(f"=== {name}: {' '.join(command[4:])}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env)
    results = read_results(out)
    print(f"=== {name} finished in {time.perf_counter() - start:.0f} s: {scored(results)}", flush=True)
    return results


def run_trainings_at_once(runs, work_dir, poll_seconds=30):
    """Runs several `tf-sparseconv train` configurations ({name: train_args}) as
    concurrent processes (on a GPU they then share it), each logging to <work_dir>/<name>.log;
    prints every log's newest epoch line while they run. Returns {name: results.json}."""
    os.makedirs(work_dir, exist_ok=True)
    procs, start = {}, time.perf_counter()
    for name, train_args in runs.items():
        command, env, out = training_command(name, train_args, work_dir)
        print(f"=== {name}: {' '.join(command[4:])}", flush=True)
        log = open(os.path.join(work_dir, f"{name}.log"), "w")
        procs[name] = (subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log, out)
    while any(proc.poll() is None for proc, _, _ in procs.values()):
        time.sleep(poll_seconds)
        for name, (proc, _, _) in procs.items():
            print(f"=== {time.perf_counter() - start:5.0f} s {name}: {last_epoch_line(work_dir, name)}", flush=True)
    failed = [name for name, (proc, _, _) in procs.items() if proc.returncode != 0]
    for proc, log, _ in procs.values():
        log.close()
    if failed:
        raise RuntimeError(f"training failed: {failed}; see the logs in {work_dir}")
    results = {name: read_results(out) for name, (_, _, out) in procs.items()}
    for name, res in results.items():
        print(f"=== {name} finished: {scored(res)}", flush=True)
    return results


def last_epoch_line(work_dir, name):
    """The newest finished epoch of a run's log: Keras' "Epoch N/M" and its metrics line."""
    try:
        with open(os.path.join(work_dir, f"{name}.log")) as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no log yet"
    done = [i for i, line in enumerate(lines) if "val_accuracy" in line]
    if not done:
        return (lines[-1] if lines else "starting")[:160]
    header = next((line for line in reversed(lines[:done[-1]]) if line.startswith("Epoch ")), "")
    return f"{header} {lines[done[-1]]}"[:240]


def read_json(filename):
    """The rows of a results file, or [] where there is none yet."""
    path = os.path.join(RESULTS, filename)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def dumps_rows(rows):
    """A JSON list with one row per line."""
    return "[\n" + ",\n".join(json.dumps(row, separators=(",", ":")) for row in rows) + "\n]\n"


def write_json(filename, rows):
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, filename)
    with open(path, "w") as f:
        f.write(dumps_rows(rows))
    print(f"wrote {path}")
    return path


def replace_rows(filename, rows, replaced, order=None):
    """Writes rows into a results file in place of its rows for which replaced(row) holds,
    keeping the others (e.g. the other seeds of one figure), sorted by order where given.
    The file is locked meanwhile, so studies that share it may finish at the same time.
    Returns all rows of the file."""
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, filename)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        rows = [row for row in (json.loads(text) if text.strip() else []) if not replaced(row)] + list(rows)
        if order:
            rows.sort(key=order)
        f.seek(0)
        f.truncate()
        f.write(dumps_rows(rows))
    print(f"wrote {path}")
    return rows


def add_training_arguments(parser, filename, epochs, batch_size, max_examples_help=None):
    """The arguments a study passes on to every training (training_flags) and --replace for
    its results file."""
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--max-examples", type=int, default=0, help=max_examples_help)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--replace", action="store_true", help=f"overwrite experiments/results/{filename}")


def training_flags(args):
    """The trainer's flags for add_training_arguments' arguments."""
    flags = ["--epochs", args.epochs, "--batch-size", args.batch_size, "--max-examples", args.max_examples]
    return flags + (["--data-dir", args.data_dir] if args.data_dir else [])


def refuse_to_overwrite(parser, filename, replace, replaced=lambda row: True):
    """Stops before any training where the results file already holds rows this run would
    replace (those for which replaced(row) holds), unless --replace was given."""
    if not replace and any(replaced(row) for row in read_json(filename)):
        parser.error(f"experiments/results/{filename} already holds these results; give --replace to overwrite them")


def save_figure(figure, filename):
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, filename)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}")
    return path
