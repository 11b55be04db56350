"""Where a training step of the ModelNet40 OctNet3 network spends its time, and one
training epoch (the paper's Table 2 figure), on whatever device TensorFlow picks (the GPU
where there is one).

For each resolution, on a stratified subset of ../shared/data/modelnet40_train.npz:
  input     ms per batch of the tf.data pipeline alone (voxelization, key encoding);
  step      ms per training step on one cached batch (Keras' compiled train function,
            median of the steps of three fits of --steps steps after a warm-up fit, each
            step timed by a callback up to the end of its device work): the model's part;
  layers    ms per layer: each layer's forward call on the cached batch, synchronised,
            median of --reps calls, and its forward+backward under a GradientTape;
  epoch     (--epoch) one real epoch of model.fit over all 8,858 training shapes, the
            figure the issue asks for, with the steps and the input pipeline as in training;
            an epoch per --epoch-train-functions: "overlap" (default) trains through
            training.overlap_steps as `tf-sparseconv train` does, "keras" through Keras' own
            train function (the host waits for each step's GPU work);
  dense     (--dense-baseline) the baseline of the same run: the same network with
            keras.layers.Conv3D and MaxPool3D in place of the sparse blocks, trained on the
            same batch as a dense [B, r, r, r, 1] grid; step ms as above, and ratio =
            dense step / sparse step (> 1: the sparse network is faster).
One JSON object per line in --out, which a run replaces only with --replace (default: results/train_step_gpu.jsonl
where a GPU is visible, else results/train_step_cpu.jsonl): kind = "step" | "layer" | "epoch" | "dense_step";
on a GPU the epoch rows are also appended to results/direct_conv_gpu.jsonl, beside the
direct convolution's GPU figures, where the epochs of earlier runs stay as history.

    python benchmarks/train_step.py --resolutions 32 64 [--epoch] [--dense-baseline] [--dataflows sort dense auto]
                                    [--out PATH]

--dataflows: the DirectSparseConv layers' dataflow= for the step and layer figures, one model
each in turn, each starting from the weights the previous one reached; the epoch runs with
--epoch-dataflow.
    python benchmarks/train_step.py --table [--out PATH]   # docs/benchmarks.md's figures of a results file
"""
import argparse
import json
import os
import statistics
import sys
import time

import keras
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_sparseconv import data as datasets  # noqa: E402
from tf_sparseconv.channel.direct_conv import DATAFLOWS  # noqa: E402
from tf_sparseconv.channel.conversions import to_dense  # noqa: E402
from tf_sparseconv.models import DEFAULT_RHOS, octnet3  # noqa: E402
from tf_sparseconv.models.octnet3 import BLOCK_CHANNELS, _default_dense_blocks  # noqa: E402
from tf_sparseconv.training.overlapping_steps import overlap_steps  # noqa: E402
from tf_sparseconv.training.train import DEFAULT_DATA_DIR, keras_batches  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import add_replace_argument, refuse_to_replace  # noqa: E402
from timing import median_time, sync  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def device_name():
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    return f"CPU ({os.cpu_count()} cores)"


def build(resolution, classes, dataflow="auto"):
    model = octnet3(resolution, classes, DEFAULT_RHOS[resolution], dataflow=dataflow)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def dense_octnet3(resolution, classes, blocks, dense_blocks, fc_units=1024, dropout=0.5):
    """OctNet3 with every block dense: the network a user would train without this library."""
    inputs = keras.Input((resolution,) * 3 + (1,))
    h = inputs
    for block in range(blocks + dense_blocks):
        if block:
            h = keras.layers.MaxPool3D(2)(h)
        for _ in range(3):
            h = keras.layers.Conv3D(BLOCK_CHANNELS[block], 3, padding="same", activation="relu",
                                    kernel_initializer="he_normal")(h)
    h = keras.layers.Dropout(dropout)(keras.layers.Flatten()(h))
    h = keras.layers.Dense(fc_units, activation="relu", kernel_initializer="he_normal")(h)
    model = keras.Model(inputs, keras.layers.Dense(classes)(h))
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


class StepTimes(keras.callbacks.Callback):
    """Seconds of each training step, from its start to the end of its device work. Timing
    steps instead of a whole fit leaves out fit's own start and end (the iterator's setup
    and teardown), which took seconds per call on the 2-core CPU and would swamp a short fit."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_train_batch_begin(self, batch, logs=None):
        sync()
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        sync()
        self.seconds.append(time.perf_counter() - self.start)


def step_ms(model, batches, steps):
    """Median ms of the steps of three fits of `steps` steps over batches (a repeated
    dataset), after a warm-up fit."""
    model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0)  # warm-up and tracing
    times = StepTimes()
    for _ in range(3):
        model.fit(batches, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[times])
    return statistics.median(times.seconds) * 1e3


def layer_rows(model, batch, reps):
    """Forward and forward+backward ms of every layer on the activations of one batch."""
    x, y = batch
    rows, value = [], x
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        inputs = value

        def forward(layer=layer, inputs=inputs):
            return layer(inputs, training=True)

        fwd = median_time(forward, 1, reps)
        float_inputs = [t for t in tf.nest.flatten(inputs) if t.dtype.is_floating]

        def forward_backward(layer=layer, inputs=inputs):
            with tf.GradientTape() as tape:
                tape.watch(float_inputs)
                out = layer(inputs, training=True)
                loss = sum(tf.reduce_sum(t) for t in tf.nest.flatten(out) if t.dtype.is_floating)
            return tape.gradient(loss, layer.trainable_variables + float_inputs)

        bwd = median_time(forward_backward, 1, reps)
        value = forward()
        rows.append({"layer": layer.name, "class": type(layer).__name__, "fwd_ms": fwd * 1e3,
                     "fwd_bwd_ms": bwd * 1e3})
    return rows


def is_sparse_conv(row):
    return "Sparse" in row["class"] and "Conv" in row["class"]


def markdown_tables(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| resolution | dataflow | step ms | input ms per batch | sparse convolutions fwd+bwd ms (sum) "
          "| largest sparse convolution fwd+bwd ms |")
    print("|---:|---|---:|---:|---:|---:|")
    for step in (r for r in rows if r["kind"] == "step"):
        layers = [r for r in rows if r["kind"] == "layer" and is_sparse_conv(r)
                  and (r["resolution"], r.get("dataflow")) == (step["resolution"], step.get("dataflow"))]
        largest = max(layers, key=lambda r: r["fwd_bwd_ms"]) if layers else None
        largest_text = f"{largest['fwd_bwd_ms']:.2f} ({largest['layer']})" if largest else "—"
        print(f"| {step['resolution']}³ | {step.get('dataflow') or 'auto'} | {step['step_ms']:.1f} "
              f"| {step['input_ms']:.2f} | {sum(r['fwd_bwd_ms'] for r in layers):.1f} | {largest_text} |")
    for dense in (r for r in rows if r["kind"] == "dense_step"):
        print(f"\nThe same network with dense Conv3D blocks at {dense['resolution']}³ on {dense['device']}: "
              f"{dense['step_ms']:.1f} ms per step against the sparse {dense['sparse_step_ms']:.1f} ms "
              f"(sparse {dense['ratio']:.2f}x the dense speed)")
    for epoch in (r for r in rows if r["kind"] == "epoch"):
        print(f"\nEpoch at {epoch['resolution']}³ on {epoch['device']} ({epoch.get('dataflow', 'auto')}, "
              f"{epoch.get('train_function', 'keras')} train function): "
              f"{epoch['sec_per_epoch']:.1f} s, {epoch['steps']} steps of batch {epoch['batch']}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolutions", type=int, nargs="+", default=[32])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--examples", type=int, default=1280, help="stratified subset for the step and layer figures")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--epoch", action="store_true", help="also time one real epoch over all training shapes")
    p.add_argument("--dataflows", nargs="+", choices=DATAFLOWS, default=["auto"],
                   help="the sparse convolutions' dataflow= to time the step and layers under, in one process "
                        "(e.g. sort dense auto)")
    p.add_argument("--dense-baseline", action="store_true",
                   help="also time the same network with dense Conv3D blocks on the same batch (the baseline)")
    p.add_argument("--epoch-dataflow", choices=DATAFLOWS, default="auto", help="the dataflow of --epoch")
    p.add_argument("--epoch-train-functions", nargs="+", choices=("keras", "overlap"), default=["overlap"],
                   help="--epoch's train function, an epoch each: Keras' own, or training.overlap_steps' "
                        "(what tf-sparseconv train uses)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    p.add_argument("--out", default=None, help="JSON-lines file to write (default: by device, see above)")
    p.add_argument("--table", action="store_true", help="print the figures of --out (default: the GPU file) and exit")
    add_replace_argument(p)
    args = p.parse_args()
    if args.table:
        markdown_tables(args.out or os.path.join(RESULTS, "train_step_gpu.jsonl"))
        return
    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    args.out = args.out or os.path.join(RESULTS, "train_step_gpu.jsonl" if on_gpu else "train_step_cpu.jsonl")
    refuse_to_replace(p, args.out, args.replace)
    npz = args.data_dir if args.data_dir.endswith(".npz") else os.path.join(args.data_dir, "modelnet40_train.npz")
    points, labels, classes = datasets.load_modelnet_npz(npz)
    train_idx, _ = datasets.stratified_split(labels, 0.1, 0)
    subset, _ = datasets.stratified_split(labels[train_idx], 1 - args.examples / len(train_idx), 0)
    subset = train_idx[subset]
    device = device_name()
    out_rows = []
    for r in args.resolutions:
        print(f"=== {r}^3 on {device}", flush=True)
        make = lambda idx: keras_batches(datasets.point_cloud_dataset(  # noqa: E731
            points[idx], labels[idx], r, args.batch_size, shuffle=True, seed=0))
        pipeline = make(subset)
        start, batches = time.perf_counter(), 0
        for _ in pipeline:
            batches += 1
        input_ms = (time.perf_counter() - start) / batches * 1e3
        cached = pipeline.take(1).cache().repeat()
        steps_per_epoch = -(-len(train_idx) // args.batch_size)
        weights = None
        for dataflow in args.dataflows:
            model = build(r, len(classes), dataflow)
            if weights is not None:
                model.set_weights(weights)
            sparse_ms = step_ms(model, cached, args.steps)
            row = {"kind": "step", "resolution": r, "device": device, "batch": args.batch_size, "dataflow": dataflow,
                   "input_ms": input_ms, "step_ms": sparse_ms, "steps_per_epoch": steps_per_epoch,
                   "projected_sec_per_epoch": steps_per_epoch * max(sparse_ms, input_ms) / 1e3}
            print(json.dumps(row), flush=True)
            out_rows.append(row)
            batch = next(iter(cached))
            for layer in layer_rows(model, batch, args.reps):
                layer.update(kind="layer", resolution=r, device=device, batch=args.batch_size, dataflow=dataflow)
                print(f"  {layer['layer']:<22}{layer['class']:<16} fwd {layer['fwd_ms']:8.2f} ms   "
                      f"fwd+bwd {layer['fwd_bwd_ms']:8.2f} ms", flush=True)
                out_rows.append(layer)
            weights = model.get_weights()
        if args.dense_baseline:
            sparse_ms = statistics.median(row["step_ms"] for row in out_rows
                                          if row["kind"] == "step" and row["resolution"] == r)
            blocks = len(DEFAULT_RHOS[r])
            dense_batches = datasets.point_cloud_dataset(points[subset], labels[subset], r, args.batch_size,
                                                         shuffle=True, seed=0).take(1)
            dense_batches = dense_batches.map(lambda x, y: (to_dense(x), y)).cache().repeat()
            dense_ms = step_ms(dense_octnet3(r, len(classes), blocks, _default_dense_blocks(r, blocks)),
                               dense_batches, args.steps)
            row = {"kind": "dense_step", "resolution": r, "device": device, "batch": args.batch_size,
                   "step_ms": dense_ms, "sparse_step_ms": sparse_ms, "ratio": dense_ms / sparse_ms,
                   "note": "the same network with Conv3D and MaxPool3D blocks on the same batch as a dense grid"}
            print(json.dumps(row), flush=True)
            out_rows.append(row)
        for train_function in (args.epoch_train_functions if args.epoch else ()):
            model = build(r, len(classes), args.epoch_dataflow)
            if train_function == "overlap":
                overlap_steps(model)
            full = make(train_idx)
            model.fit(full.take(2), epochs=1, verbose=0)  # tracing, outside the timed epoch
            start = time.perf_counter()
            history = model.fit(full, epochs=1, verbose=2)
            seconds = time.perf_counter() - start
            row = {"kind": "epoch", "resolution": r, "device": device, "sec_per_epoch": seconds,
                   "dataflow": args.epoch_dataflow, "train_function": train_function,
                   "steps": steps_per_epoch, "ms_per_step": seconds / steps_per_epoch * 1e3,
                   "batch": args.batch_size, "train_accuracy": float(history.history["accuracy"][-1]),
                   "note": f"one epoch of model.fit over {len(train_idx)} ModelNet40 shapes after a 2-step "
                           "warm-up fit (tracing outside the timed epoch); benchmarks/train_step.py --epoch"}
            print(json.dumps(row), flush=True)
            out_rows.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for row in out_rows:
            f.write(json.dumps(row) + "\n")
    print(f"summary: {len(out_rows)} rows written to {args.out}")
    epochs = [row for row in out_rows if row["kind"] == "epoch"]
    if on_gpu and epochs:
        with open(os.path.join(RESULTS, "direct_conv_gpu.jsonl"), "a") as f:
            for row in epochs:
                f.write(json.dumps(row) + "\n")
        print(f"         {len(epochs)} epoch rows also appended to {os.path.join(RESULTS, 'direct_conv_gpu.jsonl')}")
    for row in out_rows:
        if row["kind"] != "layer":
            print("  " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                                   if k not in ("note",)))


if __name__ == "__main__":
    main()
