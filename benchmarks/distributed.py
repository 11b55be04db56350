"""Training throughput on 1, 2, ... replicas under tf.distribute (issue 26's measure).

Workloads (rows appended to --out, default benchmarks/results/distributed.jsonl; keys
workload, strategy, replicas, device, items_per_s, date, plus what each run was):

- modelnet40_32_epoch: `tf-sparseconv train` of OctNet3 at 32^3 (Table 4's bounds) on
  ModelNet40 (--data-dir; --dataset synthetic without it), each configuration in its own
  process with CUDA_VISIBLE_DEVICES naming its GPUs: one replica (--strategy default) and R
  replicas (--strategies: mirrored, one process over R GPUs; multi-worker, one worker
  process per GPU on 127.0.0.1, as PyTorch's DDP runs) at the same global batch (strong scaling, the one-device
  run's batch split over the replicas) and at the same batch per replica (weak scaling, the
  global batch R times larger). items_per_s is the trainer's shapes/s (trained shapes over
  the mean epoch time, the first epoch left out: it traces the step); the row also keeps the
  run's validation scores, so accuracy at R replicas can be set against one replica at the
  same global batch.
- site_unet_lidar_step: a site UNet training step (custom loop, strategy.run, synchronized
  batch norm) on the real LiDAR frame (../shared/data/lidar_scan.npz or .devdata/) at 5 cm,
  one frame per replica (replica r takes the frame mirrored by r's bits, so every replica
  holds the same number of sites), under MirroredStrategy over the first R GPUs. items_per_s
  is frames per second: median over --windows windows of --steps steps, each ended by
  reading the loss back, after --warmup steps. --batch-norms chooses the batch norm, each
  a row per replica count (key batch_norm): synchronized (the library's
  FusedBatchNormalization: one all-reduce per layer forward, one backward), keras-synchronized
  (the same layer left to Keras' own synchronized computation: five all-reduces per layer and
  step, the baseline) and local (each replica's own statistics: no all-reduce).

Scaling efficiency is items_per_s at R replicas over R times items_per_s at one; the
summary prints it per workload. Without GPUs (for checking the script, not for speed) the
site workload's replicas are logical CPU devices and the trainer runs one replica only.

    python benchmarks/distributed.py --replicas 1 2 [--workloads ...] [--data-dir DIR]
"""
import argparse
import datetime
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from run_info import checkout_commit, checks_mode, gpu_thread_mode  # noqa: E402

RESULTS = os.path.join(HERE, "results")
WORKLOADS = ("modelnet40_32_epoch", "site_unet_lidar_step")
# The trainer's --collective choices (tf_sparseconv.training.distribute.COLLECTIVES; not imported
# here, so that this parent process does not load TensorFlow before its trainers run).
COLLECTIVES = ("nccl", "ring", "hierarchical-copy", "one-device")
GRADIENT_ALL_REDUCES = ("packed", "per-gradient")  # the trainer's --gradient-all-reduce choices
LIDAR_PATHS = (os.path.join(ROOT, "..", "shared", "data", "lidar_scan.npz"),
               os.path.join(ROOT, ".devdata", "lidar_scan.npz"))


def visible_gpus():
    """The GPUs this process may use, without loading TensorFlow here: nvidia-smi's count
    (which ignores CUDA_VISIBLE_DEVICES), or fewer where CUDA_VISIBLE_DEVICES names fewer
    (CUDA takes its entries up to the first negative one; empty or -1: none)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    count = sum(line.startswith("GPU ") for line in out.splitlines())
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        entries = [e.strip() for e in named.split(",")]
        usable = 0
        for entry in entries:
            if not entry or entry.startswith("-"):
                break
            usable += 1
        count = min(count, usable)
    return count


def device_name(replicas, gpus):
    """What one row's replicas ran on, e.g. '2x NVIDIA H100 80GB HBM3' or 'cpu'."""
    if not gpus:
        return "cpu"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=60).stdout.splitlines()
    return f"{replicas}x {out[0].strip()}"


def base_row(workload, strategy, replicas, device, items_per_s):
    return {"workload": workload, "strategy": strategy, "replicas": replicas, "device": device,
            "items_per_s": items_per_s, "date": datetime.date.today().isoformat(), "commit": checkout_commit(),
            "checks": checks_mode(), "gpu_thread_mode": gpu_thread_mode()}


# --- modelnet40_32_epoch: the trainer, one process per configuration ---------------------

def epoch_configurations(replica_counts, batch, scalings=("strong", "weak")):
    """(replicas, global batch, scaling) in run order: one replica's run (the baseline) where
    1 is asked for, and for each R > 1, in the order of scalings, the same global batch
    (strong, where R divides it) and the same batch per replica (weak)."""
    out = []
    for r in sorted(replica_counts):
        if r == 1:
            out.append((1, batch, "baseline"))
            continue
        for scaling in scalings:
            if scaling == "weak":
                out.append((r, batch * r, "weak"))
            elif batch % r == 0:
                out.append((r, batch, "strong"))
    return out


def trainer_commands(args, replicas, global_batch, strategy, gpus, out_dir, collective=None,
                     gradient_all_reduce=None):
    """[(argv, environment)] of one configuration's processes: one process over the first
    `replicas` GPUs (default, mirrored), or one worker process per GPU on 127.0.0.1
    (multi-worker, as one host would run MultiWorkerMirroredStrategy with a process a GPU)."""
    argv = [sys.executable, "-m", "tf_sparseconv", "train", "--model", "octnet3", "--resolution", "32",
            "--epochs", str(args.epochs), "--batch-size", str(global_batch), "--strategy", strategy,
            "--seed", str(args.seed), "--out", out_dir]
    if collective:
        argv += ["--collective", collective]
    if gradient_all_reduce:
        argv += ["--gradient-all-reduce", gradient_all_reduce]
    argv += (["--dataset", "modelnet40", "--data-dir", args.data_dir] if args.data_dir else
             ["--dataset", "synthetic", "--synthetic-per-class", str(args.synthetic_per_class)])
    if args.max_examples:
        argv += ["--max-examples", str(args.max_examples)]
    argv += args.train_args
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    if strategy != "multi-worker":
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(replicas))
        return [(argv, env)]
    from tf_sparseconv.training.distribute import free_local_ports, local_tf_config
    ports = free_local_ports(replicas)
    return [(argv, dict(env, TF_CONFIG=local_tf_config(ports, i), CUDA_VISIBLE_DEVICES=str(i) if gpus else ""))
            for i in range(replicas)]


def numa_node_of_cpu():
    """{cpu: NUMA node} from /sys (empty where the kernel does not say): cpu_blocks takes the
    CPUs node by node, so a block stays within one node where the nodes allow."""
    out = {}
    for path in glob.glob("/sys/devices/system/node/node[0-9]*/cpulist"):
        node = int(os.path.basename(os.path.dirname(path))[4:])
        with open(path) as f:
            for part in f.read().strip().split(","):
                if part:
                    low, _, high = part.partition("-")
                    out.update((cpu, node) for cpu in range(int(low), int(high or low) + 1))
    return out


def cpu_blocks(processes, replicas, per_replica):
    """The CPUs each of a configuration's processes may run on with --cpus-per-replica N: a
    disjoint block of N CPUs per replica it serves (in the order this process may use them),
    so a worker per GPU does not share cores with its peer and the one-replica baseline has
    what one worker has. None (no pinning) without N."""
    if not per_replica:
        return [None] * processes
    node = numa_node_of_cpu()
    cpus = sorted(os.sched_getaffinity(0), key=lambda cpu: (node.get(cpu, 0), cpu))
    size = per_replica * replicas // processes
    if size * processes > len(cpus):
        raise SystemExit(f"--cpus-per-replica {per_replica}: {replicas} replica(s) need {size * processes} CPUs, "
                         f"this process may use {len(cpus)}")
    return [cpus[i * size:(i + 1) * size] for i in range(processes)]


def run_trainer(args, replicas, global_batch, strategy, gpus, out_dir, collective=None, gradient_all_reduce=None):
    """One configuration of `tf-sparseconv train` (its processes at once) -> the chief's
    results.json (dict)."""
    commands = trainer_commands(args, replicas, global_batch, strategy, gpus, out_dir, collective, gradient_all_reduce)
    blocks = cpu_blocks(len(commands), replicas, args.cpus_per_replica)
    started = time.perf_counter()
    processes = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True,
                                  preexec_fn=(lambda cpus=cpus: os.sched_setaffinity(0, cpus)) if cpus else None)
                 for (argv, env), cpus in zip(commands, blocks)]
    deadline = started + args.timeout
    outputs = []
    try:
        for p in processes:
            try:
                outputs.append(p.communicate(timeout=max(1.0, deadline - time.perf_counter()))[0])
            except subprocess.TimeoutExpired:
                break
    finally:
        for p in processes:  # a worker whose peer died waits for it: end the whole group
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        outputs += [p.communicate()[0] for p in processes[len(outputs):]]
    if args.logs:  # each process's whole output, e.g. to see which collective NCCL_DEBUG=INFO reports
        os.makedirs(args.logs, exist_ok=True)
        for j, output in enumerate(outputs):
            name = f"{strategy}-{replicas}x{global_batch // replicas}-process{j}.log"
            with open(os.path.join(args.logs, name), "w") as f:
                f.write(output or "")
    what = " ".join(commands[0][0][2:])
    for i, (p, output) in enumerate(zip(processes, outputs)):
        if p.returncode:
            why = f"ran past --timeout {args.timeout:g} s" if p.returncode == -signal.SIGKILL else \
                f"failed ({p.returncode})"
            tails = "\n".join(f"--- process {j}:\n{o[-2000:]}" for j, o in enumerate(outputs))
            raise RuntimeError(f"{what} {why} (process {i} of {len(processes)}):\n{tails}")
    with open(os.path.join(out_dir, "results.json")) as f:
        results = json.load(f)
    results["process_s"] = time.perf_counter() - started
    results["cpus_per_process"] = len(blocks[0]) if blocks[0] else None
    results["argv"] = commands[0][0][1:]
    return results


def modelnet40_epoch_rows(args, gpus, record):
    rows = []
    runs = epoch_configurations(args.replicas, args.batch_size, args.scalings)
    configurations = [(replicas, batch, scaling, strategy, collective, packing) for replicas, batch, scaling in runs
                      for strategy in (["default"] if replicas == 1 else args.strategies)
                      for collective in ([None] if replicas == 1 else args.collectives or [None])
                      for packing in ([None] if replicas == 1 else args.gradient_all_reduces or [None])]
    with tempfile.TemporaryDirectory() as scratch:
        for i, (replicas, global_batch, scaling, strategy, collective, packing) in enumerate(configurations, 1):
            if replicas > max(gpus, 1) and not (strategy == "multi-worker" and not gpus):
                print(f"  skipped {replicas} replicas: {gpus} GPU(s) visible", flush=True)
                continue
            print(f"  [{i}/{len(configurations)}] {replicas} replica(s), --strategy {strategy}, global batch "
                  f"{global_batch} ({scaling})" + (f", --collective {collective}" if collective else "")
                  + (f", --gradient-all-reduce {packing}" if packing else ""), flush=True)
            r = run_trainer(args, replicas, global_batch, strategy, gpus, os.path.join(scratch, f"run{i}"),
                            collective, packing)
            row = base_row("modelnet40_32_epoch", r["strategy"], replicas, device_name(replicas, gpus),
                           r["shapes_per_s"])
            row.update(scaling=scaling, global_batch=global_batch, batch_per_replica=r["batch_size_per_replica"],
                       processes=replicas if strategy == "multi-worker" else 1,
                       dataset=r["dataset"], examples=r["examples"], epochs=r["epochs"],
                       sec_per_epoch=r["sec_per_epoch"], val_examples=r["val_examples"],
                       val_overall=r["val_overall"], val_mean_class=r["val_mean_class"],
                       val_overall_test_weighted=r["val_overall_test_weighted"],
                       val_overall_test_weighted_se=r["val_overall_test_weighted_se"],
                       process_s=round(r["process_s"], 1), cpus_per_process=r["cpus_per_process"],
                       command="python " + " ".join(r["argv"]))
            row["collective"] = r.get("collective")
            row["gradient_all_reduce"] = r.get("gradient_all_reduce")
            row["steps_per_execution"] = r.get("steps_per_execution", 1)
            row["convs"] = "exact" if "--exact-convs" in args.train_args else "padded"
            row["pooling"] = "exact" if "--exact-pools" in args.train_args else "padded"
            rows.append(row)
            record(row)
            val = "no validation" if row["val_overall"] is None else f"val overall {row['val_overall']:.4f}"
            epochs = [round(s, 1) for s in r["sec_per_epoch"]]
            print(f"      {row['items_per_s']:.1f} shapes/s, epochs {epochs} s, {val}", flush=True)
    return rows


# --- site_unet_lidar_step: a custom loop in this process ---------------------------------

def lidar_frames(replicas, voxel):
    """One voxelized frame per replica: (coords [N, 4] int32 with batch index 0, heights [N, 1]
    float32, labels [N] int32, spatial shape). Replica r's frame is mirrored in x (bit 0 of r)
    and y (bit 1), so all hold the same sites up to mirroring, in the same extents."""
    import numpy as np
    path = next((p for p in LIDAR_PATHS if os.path.exists(p)), None)
    if path is None:
        raise FileNotFoundError(f"site_unet_lidar_step needs lidar_scan.npz in one of {LIDAR_PATHS}")
    with np.load(path, allow_pickle=False) as f:
        points = f["pc"].astype(np.float64)
    cells = np.unique(np.floor((points - points.min(0)) / voxel).astype(np.int64), axis=0)
    extent = cells.max(0) + 1
    frames = []
    for r in range(replicas):
        mirrored = cells.copy()
        for axis in (0, 1):
            if r >> axis & 1:
                mirrored[:, axis] = extent[axis] - 1 - mirrored[:, axis]
        mirrored = mirrored[np.lexsort(mirrored.T[::-1])]
        coords = np.concatenate([np.zeros((len(mirrored), 1), np.int64), mirrored], 1).astype(np.int32)
        height = (mirrored[:, 2:3] / max(1, extent[2] - 1)).astype(np.float32)
        labels = (height[:, 0] > 0.1).astype(np.int32)  # above the ground band: 1
        frames.append((coords, height, labels))
    return frames, tuple(int(e) for e in extent)


BATCH_NORMS = ("synchronized", "keras-synchronized", "local")


def site_unet_rows(args, gpus, record):
    import tensorflow as tf

    from tf_sparseconv.training.distribute import mirrored_cross_device_ops

    frames, extent = lidar_frames(max(args.replicas), args.voxel)
    rows = []
    devices = [d.name for d in tf.config.list_logical_devices("GPU")] or \
        [d.name for d in tf.config.list_logical_devices("CPU")]
    for replicas in args.replicas:
        if replicas > len(devices):
            print(f"  skipped {replicas} replicas: {len(devices)} device(s)", flush=True)
            continue
        # Over GPUs, a strategy per --gradient-all-reduces value (NCCL); over logical CPUs one
        # strategy per replica count for all batch norms: a second strategy over the same
        # devices would draw the same collective keys (TensorFlow refuses the clash on CPUs).
        packings = (args.gradient_all_reduces or [None]) if gpus and replicas > 1 else [None]
        for packing in packings:
            strategy = tf.distribute.MirroredStrategy(
                devices[:replicas], cross_device_ops=mirrored_cross_device_ops("nccl", packing) if packing else None)
            site_unet_replica_rows(args, gpus, record, rows, strategy, replicas, packing, frames, extent)
    return rows


def site_unet_replica_rows(args, gpus, record, rows, strategy, replicas, packing, frames, extent):
    """The rows of every --batch-norms value under one strategy (appended to rows)."""
    import tensorflow as tf

    import tf_sparseconv as ts
    from tf_sparseconv.site.keras_io import as_site_keras_inputs
    from tf_sparseconv.training.distribute import per_replica_dataset

    def make(split):
        """One element per replica of this input pipeline, in replica order."""
        dataset = None
        for r in range(split.first, split.first + split.count):
            coords, height, labels = frames[r]
            x = as_site_keras_inputs(ts.make_site_sparse(coords, height, extent, 1))
            part = tf.data.Dataset.from_tensors((x, tf.constant(labels)))
            dataset = part if dataset is None else dataset.concatenate(part)
        return dataset

    iterator = iter(per_replica_dataset(strategy, make))
    for batch_norm in args.batch_norms:
        step_s, windows, loss = site_unet_step_time(args, strategy, iterator, extent, batch_norm)
        row = base_row("site_unet_lidar_step", "mirrored", replicas, device_name(replicas, gpus), replicas / step_s)
        row.update(step_s=step_s, window_step_s=windows, sites_per_frame=int(len(frames[0][0])),
                   voxel_m=args.voxel, spatial_shape=list(extent), channels=list(args.unet_channels),
                   synchronized_bn=batch_norm != "local", batch_norm=batch_norm, steps=args.steps,
                   warmup=args.warmup, loss=loss, gradient_all_reduce=packing)
        rows.append(row)
        record(row)
        print(f"  {replicas} replica(s), batch norm {batch_norm}"
              + (f", gradients {packing}" if packing else "")
              + f": {step_s * 1e3:.1f} ms per step, {row['items_per_s']:.2f} frames/s", flush=True)


def site_unet_step_time(args, strategy, iterator, extent, batch_norm):
    """A fresh site UNet's training step under strategy: (median s per step, each window's,
    the last loss)."""
    import keras
    import tensorflow as tf

    from tf_sparseconv.models import site_unet
    from tf_sparseconv.site.batch_norm import FusedBatchNormalization

    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        model = site_unet(2, resolution=extent, channels=tuple(args.unet_channels),
                          synchronized_bn=batch_norm != "local")
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)
    if batch_norm == "keras-synchronized":
        for layer in model._flatten_layers():
            if isinstance(layer, FusedBatchNormalization):
                layer._rows_apply = lambda *_: False  # Keras' own computation, synchronized
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(cross_entropy(y, model(x, training=True))) / replicas
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def step(iterator):
        return strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)), axis=None)

    for _ in range(args.warmup):
        float(step(iterator))
    windows = []
    for _ in range(args.windows):
        started = time.perf_counter()
        for _ in range(args.steps):
            loss = step(iterator)
        float(loss)  # every step of the window has run
        windows.append((time.perf_counter() - started) / args.steps)
    return statistics.median(windows), windows, float(loss)


def append_row(path, row):
    """Each row as soon as it is measured: a later configuration that fails keeps it."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def scaling_lines(rows):
    lines = []
    for workload in WORKLOADS:
        for r in rows:
            ones = [o for o in rows if o["workload"] == workload and o["replicas"] == 1
                    and o.get("batch_norm") == r.get("batch_norm")]
            if r["workload"] == workload and r["replicas"] > 1 and ones:
                what = (f" ({r['strategy']}, {r['scaling']}, global batch {r['global_batch']})" if "scaling" in r
                        else f" ({r['strategy']}, batch norm {r['batch_norm']})" if "batch_norm" in r
                        else f" ({r['strategy']})")
                speedup = r["items_per_s"] / ones[0]["items_per_s"]
                lines.append(f"{workload}: {r['replicas']} replicas{what} {r['items_per_s']:.2f}/s = "
                             f"{speedup:.2f}x one replica's {ones[0]['items_per_s']:.2f}/s "
                             f"(efficiency {speedup / r['replicas']:.0%})")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    p.add_argument("--data-dir", help="ModelNet40 (modelnet40_train.npz) for modelnet40_32_epoch; "
                                      "without it the built-in synthetic shapes")
    p.add_argument("--synthetic-per-class", type=int, default=100)
    p.add_argument("--max-examples", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3, help="per trainer run; the first is left out of the rate")
    p.add_argument("--batch-size", type=int, default=32, help="one replica's batch (the baseline's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategies", nargs="+", choices=("mirrored", "multi-worker"), default=["mirrored"],
                   help="modelnet40_32_epoch: how R > 1 replicas run: one process over R GPUs (mirrored) or "
                        "a worker process per GPU on this host (multi-worker)")
    p.add_argument("--collectives", nargs="+", choices=COLLECTIVES, default=None,
                   help="modelnet40_32_epoch: run R > 1 replicas once with each of these all-reduces (the trainer's "
                        "--collective; default: the trainer's own choice)")
    p.add_argument("--gradient-all-reduces", nargs="+", choices=GRADIENT_ALL_REDUCES, default=None,
                   help="the trainer's --gradient-all-reduce values to run at more than one replica (default: the "
                        "trainer's own, packed); site_unet_lidar_step: over GPUs, NCCL with each value")
    p.add_argument("--scalings", nargs="+", choices=("strong", "weak"), default=["strong", "weak"],
                   help="modelnet40_32_epoch: which runs of R > 1 replicas, in this order")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one trainer configuration may take")
    p.add_argument("--cpus-per-replica", type=int, default=0, metavar="N",
                   help="modelnet40_32_epoch: pin each trainer process to N disjoint CPUs per replica it serves "
                        "(0: no pinning, every process may use every CPU)")
    p.add_argument("--logs", metavar="DIR", help="write each trainer process's output to DIR/STRATEGY-RxB-processJ.log")
    p.add_argument("--train-args", nargs=argparse.REMAINDER, default=[],
                   help="more arguments for every trainer run (last on the line)")
    p.add_argument("--voxel", type=float, default=0.05, help="site_unet_lidar_step: voxel size in metres")
    p.add_argument("--unet-channels", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--batch-norms", nargs="+", choices=BATCH_NORMS, default=["synchronized"],
                   help="site_unet_lidar_step: the batch norms to measure (module docstring)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=os.path.join(RESULTS, "distributed.jsonl"))
    args = p.parse_args(argv)
    if any(r < 1 for r in args.replicas):
        p.error("--replicas must be positive")
    args.replicas = sorted(set(args.replicas))
    gpus = visible_gpus()
    if not gpus and "site_unet_lidar_step" in args.workloads:
        # Without GPUs the site workload's replicas are logical CPU devices, made before
        # TensorFlow runs anything (the trainer's runs take one replica only).
        import tensorflow as tf

        import tf_sparseconv  # noqa: F401 (first: keeps TensorFlow's start-up notices quiet)
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * max(args.replicas))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    rows = []
    for i, workload in enumerate(args.workloads, 1):
        print(f"[{i}/{len(args.workloads)}] {workload}, replicas {args.replicas}, "
              f"{f'{gpus} GPU(s)' if gpus else 'CPU'}", flush=True)
        rows += (modelnet40_epoch_rows if workload == "modelnet40_32_epoch" else site_unet_rows)(
            args, gpus, lambda row: append_row(args.out, row))
    # A baseline may come from an earlier run of the same checkout into the same file (one
    # replica measured beside other work, say, then two): the latest of the same GPU model.
    with open(args.out) as f:
        written = [json.loads(line) for line in f if line.strip()]

    def gpu_model(row):
        return row["device"].split("x ", 1)[-1]

    earlier = [r for r in reversed(written[:len(written) - len(rows)])
               if r.get("commit") == checkout_commit() and r["replicas"] == 1
               and any(gpu_model(r) == gpu_model(new) for new in rows)]
    ones = [r for r in rows if r["replicas"] == 1]
    print("summary:")
    for line in scaling_lines(ones + earlier + [r for r in rows if r["replicas"] > 1]) or \
            ["no scaling to report (a run of one replica and one of more are needed)"]:
        print("  " + line)
    print(f"{len(rows)} rows appended to {args.out}")
    return rows


if __name__ == "__main__":
    main()
