"""Whether the memory bound is a promise: the bound of tf_sparseconv.models.memory_bound
beside the measured peak of a serving model's forward pass, for small and very large
point clouds, with and without BoundedInference under a budget.

Each case runs in a fresh subprocess: the model (point_cloud_classifier around octnet3 or
site_resnet at --resolution) is built and called once on one cloud of 64 points (weights,
kernels), then on the case's batch of random sphere-shell clouds, given as a NumPy array
as a user would. The measured peak is the growth over that call, with a baseline taken
just before it (the model, its weights and the input already there):
  cpu  peak resident memory (VmHWM, reset through /proc/self/clear_refs) minus VmRSS
       before, with any GPU hidden; glibc maps buffers of 64 KiB and more (MALLOC_MMAP_
       THRESHOLD_), so freed buffers leave the resident set.
  gpu  tf.config.experimental.get_memory_info('GPU:0'): 'peak' after reset_memory_stats
       minus 'current' before; the call is made once before the measured one (the
       allocator's statistics count bytes in use, so a warm call hides nothing, and
       one-time cuBLAS / cuDNN workspaces are left out).
With --budget-mb the call is BoundedInference(model, budget) (on_exceed='split'), and the
row's bound is that of the chunks it ran; without, the model's own call and the bound of
the whole batch.

    python benchmarks/memory_cap.py                      # the default cases, CPU
    python benchmarks/memory_cap.py --device gpu         # the same cases on GPU:0
    python benchmarks/memory_cap.py --cases octnet3:8:400000 octnet3:64:400000:512
    python benchmarks/memory_cap.py --table              # the results as a markdown table

A case is MODEL:BATCH:POINTS[:BUDGET_MB]. One JSON object per case is appended to --out
(default benchmarks/results/memory_cap.jsonl): model, resolution, batch, points_per_cloud,
device ('cpu' or the GPU's name), budget_bytes (null: none), bound_bytes, measured_peak_bytes,
split_batches (model calls the batch took), and chunk_size, sites (occupied voxels of the
batch), seconds, date, git_revision. A case already in the file (same model, resolution,
batch, points, device kind and budget) is refused unless --replace, which drops the old row.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "memory_cap.jsonl")
sys.path.insert(0, HERE)
from run_info import checkout_commit, gpu_name  # noqa: E402
MODELS = ("octnet3", "site_resnet")
# Small and very large clouds, unbounded and under the 512 MB budget; 64 x 400k
# unbounded needs several GB and is left to --cases.
DEFAULT_CASES = ("octnet3:1:1000", "octnet3:8:1000", "octnet3:64:1000", "octnet3:1:400000", "octnet3:8:400000",
                 "octnet3:64:400000:512", "octnet3:64:1000:64",
                 "site_resnet:1:1000", "site_resnet:8:1000", "site_resnet:64:1000", "site_resnet:1:400000",
                 "site_resnet:8:400000", "site_resnet:64:400000:512")


def parse_case(text):
    parts = text.split(":")
    if len(parts) not in (3, 4) or parts[0] not in MODELS:
        raise argparse.ArgumentTypeError(f"a case is MODEL:BATCH:POINTS[:BUDGET_MB] with MODEL one of {MODELS}, "
                                         f"got {text!r}")
    try:
        batch, points = int(parts[1]), int(parts[2])
        budget = int(float(parts[3]) * 2**20) if len(parts) == 4 else None
    except ValueError:
        raise argparse.ArgumentTypeError(f"BATCH, POINTS and BUDGET_MB must be numbers, got {text!r}") from None
    if batch < 1 or points < 1 or (budget is not None and budget < 1):
        raise argparse.ArgumentTypeError(f"BATCH, POINTS and BUDGET_MB must be positive, got {text!r}")
    return {"model": parts[0], "batch": batch, "points_per_cloud": points, "budget_bytes": budget}


# ----------------------------------------------------------------------------- the child


def _status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def sphere_shells(rng, batch, points):
    """Points on random sphere shells (surface-like, as ModelNet40's), radii 0.3..0.95."""
    import numpy as np
    direction = rng.normal(size=(batch, points, 3))
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    return (direction * rng.uniform(0.3, 0.95, (batch, 1, 1))).astype(np.float32)


def build_model(name, resolution):
    import keras
    from tf_sparseconv import models
    keras.utils.set_random_seed(0)
    if name == "octnet3":
        core = models.octnet3(resolution, 40)
    else:
        core = models.site_resnet(40, resolution)
    return models.point_cloud_classifier(core, resolution)


def measure(case, resolution, device):
    """The row of one case, measured in this process."""
    import gc

    import numpy as np
    import tensorflow as tf
    from tf_sparseconv.models.memory_bound import BoundedInference, memory_bound

    model = build_model(case["model"], resolution)
    rng = np.random.default_rng(0)
    model(sphere_shells(rng, 1, 64), training=False)
    points = sphere_shells(rng, case["batch"], case["points_per_cloud"])
    budget = case["budget_bytes"]
    if budget is not None:
        runner = BoundedInference(model, budget, device=device)
        plan = runner.plan(points)
        bound, calls, chunk = plan.chunk_bytes, plan.chunks, plan.chunk_size
        call = lambda: runner(points)  # noqa: E731
    else:
        bound = memory_bound(model, case["batch"], case["points_per_cloud"], device=device).total_bytes
        calls, chunk = 1, case["batch"]
        call = lambda: model(points, training=False)  # noqa: E731
    if device == "gpu":
        call()
        gc.collect()
        tf.config.experimental.reset_memory_stats("GPU:0")
        before = tf.config.experimental.get_memory_info("GPU:0")["current"]
        start = time.perf_counter()
        logits = call()
        logits.numpy()
        seconds = time.perf_counter() - start
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] - before
        device_name = gpu_name()
    else:
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_bytes("VmRSS")
        start = time.perf_counter()
        logits = call()
        seconds = time.perf_counter() - start
        peak = _status_bytes("VmHWM") - before
        device_name = "cpu"
    voxelize = model.get_layer("point_cloud_to_sparse")
    sites = sum(int(voxelize(points[i:i + 1])["keys"].shape[0]) for i in range(len(points)))
    return {"model": case["model"], "resolution": resolution, "batch": case["batch"],
            "points_per_cloud": case["points_per_cloud"], "device": device_name, "budget_bytes": budget,
            "bound_bytes": int(bound), "measured_peak_bytes": int(peak), "split_batches": calls,
            "chunk_size": chunk, "sites": sites, "logits_shape": list(logits.shape), "seconds": round(seconds, 3)}


# ---------------------------------------------------------------------------- the parent


def child_env(device):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = "-1"
    return env


def run_case(case, resolution, device, timeout):
    command = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(case), "--resolution",
               str(resolution), "--device", device]
    result = subprocess.run(command, env=child_env(device), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"case {case} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def same_case(row, case, resolution, device):
    kind = "cpu" if row["device"] == "cpu" else "gpu"
    return (row["model"], row["resolution"], row["batch"], row["points_per_cloud"], kind, row["budget_bytes"]) == (
        case["model"], resolution, case["batch"], case["points_per_cloud"], device, case["budget_bytes"])


def megabytes(n):
    return "–" if n is None else f"{n / 2**20:,.1f}"


def progress_line(row):
    budget = f", budget {megabytes(row['budget_bytes'])} MB" if row["budget_bytes"] else ""
    verdict = "ok" if row["measured_peak_bytes"] <= row["bound_bytes"] else "OVER THE BOUND"
    if row["budget_bytes"] and row["measured_peak_bytes"] > row["budget_bytes"]:
        verdict += ", OVER THE BUDGET"
    return (f"{row['model']} {row['resolution']}^3, {row['batch']} x {row['points_per_cloud']:,} points{budget}: "
            f"bound {megabytes(row['bound_bytes'])} MB, measured {megabytes(row['measured_peak_bytes'])} MB "
            f"({row['bound_bytes'] / max(row['measured_peak_bytes'], 1):.2f}x), {row['split_batches']} call(s), "
            f"{row['seconds']:.1f} s: {verdict}")


def render_table(rows):
    lines = ["| model | r³ | batch | points per cloud | device | budget [MB] | calls | bound [MB] | measured [MB] "
             "| bound / measured |", "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['resolution']} | {row['batch']} | {row['points_per_cloud']:,} | "
                     f"{row['device']} | {megabytes(row['budget_bytes'])} | {row['split_batches']} | "
                     f"{megabytes(row['bound_bytes'])} | {megabytes(row['measured_peak_bytes'])} | "
                     f"{row['bound_bytes'] / max(row['measured_peak_bytes'], 1):.2f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--cases", type=parse_case, nargs="+", default=None,
                   help="MODEL:BATCH:POINTS[:BUDGET_MB] (default: " + " ".join(DEFAULT_CASES) + ")")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--replace", action="store_true", help="replace rows of the same cases in --out")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per case")
    p.add_argument("--table", action="store_true", help="print --out as a markdown table and exit")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(json.loads(args.child), args.resolution, args.device)))
        return
    if args.table:
        print(render_table(read_rows(args.out)))
        return
    cases = args.cases or [parse_case(c) for c in DEFAULT_CASES]
    existing = read_rows(args.out)
    repeated = [c for c in cases if any(same_case(r, c, args.resolution, args.device) for r in existing)]
    if repeated and not args.replace:
        p.error(f"{args.out} already holds {len(repeated)} of these cases (first: {repeated[0]}); "
                "give --replace to measure them again")
    if args.device == "gpu":
        import tensorflow as tf
        if not tf.config.list_physical_devices("GPU"):
            p.error("--device gpu: TensorFlow sees no GPU")
    context = {"date": datetime.date.today().isoformat(), "git_revision": checkout_commit()}
    rows, start = [], time.perf_counter()
    for case in cases:
        row = {**run_case(case, args.resolution, args.device, args.timeout), **context}
        rows.append(row)
        print(progress_line(row), flush=True)
        existing = [r for r in existing if not same_case(r, case, args.resolution, args.device)] + [row]
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in existing)
    over = [r for r in rows if r["measured_peak_bytes"] > r["bound_bytes"]
            or (r["budget_bytes"] and r["measured_peak_bytes"] > r["budget_bytes"])]
    print(f"\n{len(rows)} cases in {time.perf_counter() - start:.0f} s; {len(over)} over their bound or budget; "
          f"rows in {args.out}\n")
    print(render_table(rows))
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
