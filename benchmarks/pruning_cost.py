"""What pruning buys per training step (Fig. 6): the OctNet3 network of
experiments/pruning.py with a fraction of each sparse convolution's weights pruned at
random (mask 0, weight 0), timed per training step and per layer on the same batches.

The time of a training step at λ > 0 falls for two reasons: pruned weights that the
direct convolution skips, and lower output densities. This isolates the first: the
weights of a briefly trained network are pruned to each --present fraction in turn,
its densities left as they come.

    python benchmarks/pruning_cost.py --resolution 16 --present 1.0 0.6 0.4 0.2

One JSON object per line in --out (default results/pruning_cost_cpu.jsonl, or _gpu where
a GPU is visible): kind "step" (ms per compiled training step, median over the batches
and --repeats rounds) and kind "layer" (each sparse convolution's forward and
forward+backward ms, benchmarks/train_step.py's layer_rows).
"""
import argparse
import json
import os
import statistics
import sys
import time

import keras
import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from train_step import device_name, layer_rows  # noqa: E402

from tf_sparseconv import data as datasets  # noqa: E402
from tf_sparseconv.training import train as trainer  # noqa: E402
from tf_sparseconv.channel.conv_layer import DirectSparseConv  # noqa: E402
from tf_sparseconv.models import octnet3  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", type=int, default=16)
    p.add_argument("--rho", type=float, nargs="+", default=[0.12, 0.24], help="density bounds (pruning.py's at 16^3)")
    p.add_argument("--present", type=float, nargs="+", default=[1.0, 0.6, 0.4, 0.2])
    p.add_argument("--examples", type=int, default=320, help="stratified subset of ModelNet40 for the batches")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warm-steps", type=int, default=8, help="training steps before pruning (densities settle)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reps", type=int, default=3, help="calls per layer figure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=trainer.DEFAULT_DATA_DIR)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    gpu = bool(tf.config.list_physical_devices("GPU"))
    out = args.out or os.path.join(HERE, "results", f"pruning_cost_{'gpu' if gpu else 'cpu'}.jsonl")
    examples, labels, _ = trainer.load_examples("modelnet40", args.data_dir,
                                                {"points": 1024, "synthetic_per_class": 150}, args.seed)
    keep, _ = datasets.stratified_split(labels, 1 - args.examples / len(labels), args.seed)
    batches = list(trainer.keras_batches(datasets.point_cloud_dataset(
        examples[keep], labels[keep], args.resolution, args.batch_size, shuffle=False, seed=args.seed)
    ).take(args.batches))
    keras.utils.set_random_seed(args.seed)
    model = octnet3(args.resolution, 40, tuple(args.rho))
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for step in range(args.warm_steps):
        model.train_on_batch(*batches[step % len(batches)])
    convs = [layer for layer in model.layers if isinstance(layer, DirectSparseConv)]
    trained = [conv.kernel.numpy() for conv in convs]
    rng = np.random.default_rng(args.seed)
    rows = []
    for present in args.present:
        for conv, w in zip(convs, trained):
            mask = (rng.random(w.shape) < present).astype(np.float32)
            conv.mask.assign(mask)
            conv.kernel.assign(w * mask)
        for batch in batches:  # the train function is traced; one round warms it up
            model.train_on_batch(*batch)
        times = []
        for _ in range(args.repeats):
            for batch in batches:
                start = time.perf_counter()
                model.train_on_batch(*batch)
                times.append(time.perf_counter() - start)
        weights = int(sum(conv.present_weights() for conv in convs))
        step_ms = statistics.median(times) * 1e3
        rows.append({"kind": "step", "present": present, "present_weights": weights, "step_ms": step_ms})
        layers = [r for r in layer_rows(model, batches[0], args.reps) if r["class"] == "DirectSparseConv"]
        for r in layers:
            rows.append({"kind": "layer", "present": present, **r})
        conv_ms = sum(r["fwd_bwd_ms"] for r in layers)
        print(f"present {present:.2f} ({weights:,} weights): training step {step_ms:7.1f} ms, "
              f"sparse convolutions forward+backward {conv_ms:7.1f} ms", flush=True)
    base = {r["present"]: r for r in rows if r["kind"] == "step"}
    first = base[args.present[0]]["step_ms"]
    print("summary: step time relative to present = %.2f: " % args.present[0] +
          ", ".join(f"{p:.2f} -> {base[p]['step_ms'] / first:.2f}" for p in args.present))
    meta = {"resolution": args.resolution, "rho": args.rho, "batch_size": args.batch_size, "device": device_name(),
            "loadavg_1m": os.getloadavg()[0]}
    with open(out, "a") as f:
        for r in rows:
            f.write(json.dumps({**meta, **r}) + "\n")
    print(f"{len(rows)} rows -> {out}")


if __name__ == "__main__":
    main()
