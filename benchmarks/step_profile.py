"""Where a training step's time goes: a few Keras training steps of OctNet3 32^3 (the model of
the ModelNet40 epoch in benchmarks/distributed.py; --resolution 64 for 64^3, Table 4's bounds
for each) under TensorFlow's profiler, on one replica
or on N replicas of tf.distribute.MirroredStrategy (batch 32 per replica), and what the trace
says per step:

  step_ms        wall time per traced step (the host's clock around them)
  gpu_busy_ms    per GPU: the union of its kernels' and copies' intervals per step
  gpu_idle       per GPU: 1 - busy / step, the share of the step the GPU waits for the host
  kernels        per GPU: kernels per step
  collective_ms  per GPU: NCCL kernels per step (the all-reduce)
  long_gaps, long_gap_ms   per GPU: idle stretches of 0.1 ms or more per step, and their
                 time per step (a host wait, the step's end: the host's share of the idle time)
  longest_gap_ms per GPU: the longest idle stretch of the traced steps
  host_waits     the library's host waits per step (tf_sparseconv.host_sync_count())

A step whose GPUs are idle most of the time is bound by the host (the waits, op launches); a
step whose two replicas' GPUs are idle longer than one replica's lose the time between the
replicas (waiting for each other at the all-reduce). The trace is read from the profiler's
XSpace (.xplane.pb); --keep-trace DIR also keeps it (TensorBoard's profile plugin reads it).

Rows (one per configuration) are appended to --out (default
benchmarks/results/step_profile.jsonl): workload, strategy, replicas, device, step_ms, the
per-GPU lists, host_waits, optimizer, train_function, steps, warmup, between_steps, commit, checks, date. The traced
steps are a whole epoch of --steps steps after one of warm-up, timed and traced from epoch hooks:
Keras queues step after step with no wait between them, as a fit without callbacks does.

    python benchmarks/step_profile.py --replicas 1 2 [--optimizers keras-adam fused-adam] [--data-dir DIR]
                                      [--steps 10] [--resolution 64]
"""
import argparse
import datetime
import glob
import json
import os
import sys
import tempfile
import time

import keras
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tf_sparseconv as ts  # noqa: E402
from tf_sparseconv import data as datasets  # noqa: E402
from tf_sparseconv.models import DEFAULT_RHOS, octnet3  # noqa: E402
from tf_sparseconv.training.distribute import per_replica_dataset  # noqa: E402
from tf_sparseconv.training.optimizers import FusedAdam  # noqa: E402
from tf_sparseconv.training.overlapping_steps import overlap_steps  # noqa: E402
from tf_sparseconv.training.train import keras_batches  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_trace import gpu_stream_events, idle_gaps, union_length  # noqa: E402
from run_info import checkout_commit, checks_mode, gpu_name, gpu_thread_mode  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
RESOLUTIONS = (32, 64)
# keras-adam: Keras' Adam (about ten ops per variable and step); fused-adam: the trainer's
# (tf_sparseconv.training.optimizers.FusedAdam, one kernel per variable). Either as the
# ModelNet40 recipes use it: a cosine schedule, decoupled weight decay 0.5 of the kernels.
OPTIMIZERS = {"keras-adam": keras.optimizers.Adam, "fused-adam": FusedAdam}


def make_optimizer(name):
    optimizer = OPTIMIZERS[name](keras.optimizers.schedules.CosineDecay(1e-3, decay_steps=10_000), weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


# An idle stretch of a GPU this long is the host's doing (a wait, the step's end, a launch
# queue run dry), not the gap between two queued kernels (a few microseconds).
LONG_GAP_PS = 100 * 10**6


class TraceSteps(keras.callbacks.Callback):
    """Traces the second epoch of a fit into logdir and times it. Epoch hooks only: a batch
    hook would make Keras hand over every step's logs as numbers, a wait for the GPU between
    steps that fit without callbacks does not have."""

    def __init__(self, logdir):
        super().__init__()
        self.logdir = logdir
        self.seconds = self.waits = None

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            tf.profiler.experimental.start(self.logdir)
            self._start = (time.perf_counter(), ts.host_sync_count())

    def on_epoch_end(self, epoch, logs=None):
        # Keras hands this callback the epoch's logs as numbers: its steps have run.
        if epoch == 1:
            self.seconds = time.perf_counter() - self._start[0]
            self.waits = ts.host_sync_count() - self._start[1]
            tf.profiler.experimental.stop()


def gpu_summary(xspace_path):
    """Per GPU plane of the trace: (name, busy ps, kernels, NCCL ps, line names, idle gaps of
    at least LONG_GAP_PS), from the events on its stream lines (gpu_stream_events)."""
    out = []
    for plane, (lines, events) in gpu_stream_events(xspace_path).items():
        intervals = [(b, e) for b, e, _ in events]
        # by the event's own name: a stream line's name lists every kind it carried
        # ("Stream #22(MemcpyD2H,MemcpyH2D,Compute,Memset)")
        kernels = sum(1 for _, _, name in events if not name.lower().startswith(("memcpy", "memset")))
        nccl = [(b, e) for b, e, name in events if "nccl" in name.lower()]
        out.append((plane, union_length(intervals), kernels, union_length(nccl), sorted(set(lines)),
                    idle_gaps(intervals, LONG_GAP_PS)))
    return sorted(out)


def dataset(strategy, replicas, points, labels, resolution):
    batch = 32 * replicas
    if replicas == 1:
        return keras_batches(datasets.point_cloud_dataset(points, labels, resolution, batch, seed=0)).repeat()
    return per_replica_dataset(strategy, lambda split: keras_batches(datasets.point_cloud_dataset(
        points, labels, resolution, batch, seed=0, split=split, drop_remainder=True)))


def queued_train_function(model):
    """A train function for fit that runs one step on the iterator's next batch and returns
    its logs, without the Optional that Keras' own wraps them in: Keras asks that Optional
    whether the step made logs (`has_value()`, an op on the GPU, read on the host), so the
    host waits for each step's end before it starts the next. Here the host queues the next
    step at once; the end of the data surfaces as OutOfRangeError, which fit's epoch loop
    takes as the epoch's end."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica
    strategy = model.distribute_strategy

    @tf.function(reduce_retracing=True)
    def train_function(iterator):
        outputs = strategy.run(model.train_step, args=(iterator.get_next(),))
        return reduce_per_replica(outputs, strategy, reduction="auto")

    return train_function


# keras: fit's own train function; queued: queued_train_function's; overlap: the library's
# training.overlap_steps (the logs of the metrics before each step, on the host)
TRAIN_FUNCTIONS = ("keras", "queued", "overlap")


def profile(replicas, optimizer, points, labels, classes, steps, keep_trace, train_function="keras", resolution=32):
    gpus = tf.config.list_logical_devices("GPU")
    devices = [d.name for d in gpus[:replicas]] or ["/cpu:0"]
    if replicas > max(1, len(gpus)):
        raise SystemExit(f"--replicas {replicas}: TensorFlow sees {len(gpus)} GPU(s)")
    strategy = tf.distribute.MirroredStrategy(devices) if replicas > 1 else tf.distribute.get_strategy()
    with strategy.scope():
        model = octnet3(resolution, len(classes), DEFAULT_RHOS[resolution])
        model.compile(make_optimizer(optimizer), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if train_function == "queued":
        model.train_function = queued_train_function(model)  # fit keeps a train function it finds
    if train_function == "overlap":
        overlap_steps(model)
    logdir = (os.path.join(keep_trace, f"replicas{replicas}-{optimizer}-{train_function}") if keep_trace
              else tempfile.mkdtemp(prefix="step_profile_"))
    trace = TraceSteps(logdir)
    # the first epoch warms up (tracing, the first launches), the second is traced
    model.fit(dataset(strategy, replicas, points, labels, resolution), epochs=2, steps_per_epoch=steps,
              callbacks=[trace], verbose=0, shuffle=False)
    files = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not files:
        raise SystemExit(f"the profiler wrote no .xplane.pb under {logdir}")
    planes = gpu_summary(files[-1])

    def per_step(ps):  # picoseconds over all traced steps -> ms per step
        return ps / 1e9 / steps

    step_ms = trace.seconds * 1e3 / steps
    return {
        "step_ms": step_ms,
        "gpu_busy_ms": [per_step(p[1]) for p in planes],
        "gpu_idle": [1 - per_step(p[1]) / step_ms for p in planes],
        "kernels": [p[2] / steps for p in planes],
        "collective_ms": [per_step(p[3]) for p in planes],
        "long_gaps": [len(p[5]) / steps for p in planes],
        "long_gap_ms": [per_step(sum(p[5])) for p in planes],
        "longest_gap_ms": [max(p[5], default=0) / 1e9 for p in planes],
        "host_waits": trace.waits / steps,
        "gpu_planes": [p[0] for p in planes],
        "stream_lines": [p[4] for p in planes],
        "trace": files[-1] if keep_trace else None,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[1])
    p.add_argument("--optimizers", nargs="+", choices=sorted(OPTIMIZERS), default=["fused-adam"],
                   help="each configuration with each (keras-adam: the baseline of fused-adam, the trainer's)")
    p.add_argument("--train-functions", nargs="+", choices=TRAIN_FUNCTIONS, default=["keras"],
                   help="each configuration with each (queued: queued_train_function, no wait between steps; "
                        "overlap: training.overlap_steps)")
    p.add_argument("--data-dir", help="a folder with modelnet40_train.npz (default: the embedded synthetic shapes)")
    p.add_argument("--steps", type=int, default=10, help="traced steps")
    p.add_argument("--resolution", type=int, choices=RESOLUTIONS, default=32, help="OctNet3's grid, r^3")
    p.add_argument("--keep-trace", metavar="DIR", help="keep the profiler's trace under DIR/replicas<N>")
    p.add_argument("--out", default=os.path.join(RESULTS, "step_profile.jsonl"))
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.data_dir:
        points, labels, classes = datasets.load_modelnet_npz(os.path.join(args.data_dir, "modelnet40_train.npz"))
        workload = f"modelnet40_{args.resolution}_step"
    else:
        points, labels, classes = datasets.make_shapes(64, seed=0)
        workload = f"synthetic_{args.resolution}_step"
    device = gpu_name() or "cpu"
    rows = []
    configurations = [(r, o, t) for r in args.replicas for o in args.optimizers for t in args.train_functions]
    for i, (replicas, optimizer, train_function) in enumerate(configurations, 1):
        print(f"[{i}/{len(configurations)}] {workload}, {replicas} replica(s), {optimizer}, {train_function} train "
              f"function, batch 32 each, "
              f"on {device}: an epoch of {args.steps} steps, then one traced", flush=True)
        row = {"workload": workload, "strategy": "mirrored" if replicas > 1 else "default", "replicas": replicas,
               "device": f"{replicas}x {device}" if device != "cpu" else "cpu"}
        row.update(optimizer=optimizer, train_function=train_function)
        row.update(profile(replicas, optimizer, points, labels, classes, args.steps, args.keep_trace, train_function,
                           args.resolution))
        row.update(steps=args.steps, warmup=args.steps, between_steps="no wait (epoch hooks)", commit=checkout_commit(),
                   checks=checks_mode(), gpu_thread_mode=gpu_thread_mode(),
                   date=datetime.date.today().isoformat())
        rows.append(row)
        busy = ", ".join(f"{b:.1f}" for b in row["gpu_busy_ms"]) or "no GPU"
        gaps = ", ".join(f"{n:.1f} ({ms:.1f} ms)" for n, ms in zip(row["long_gaps"], row["long_gap_ms"])) or "none"
        print(f"      {row['step_ms']:.1f} ms per step; GPU busy {busy} ms per step; "
              f"{row['host_waits']:g} host waits per step; idle stretches >= 0.1 ms per step: {gaps}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print("summary: " + "; ".join(
        f"{r['replicas']} replica(s) {r['optimizer']} {r['train_function']} {r['step_ms']:.1f} ms/step, GPU idle "
        + ("/".join(f"{x:.0%}" for x in r["gpu_idle"]) or "n/a") for r in rows) + f"; appended to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
