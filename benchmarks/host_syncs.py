"""Host synchronisations per training step: how often the library's ops make the host wait
for the GPU during one step of OctNet3 (channel family, 32^3, Keras' compiled train
function) and of a site UNet (site family, a traced GradientTape step), counted by
tf_sparseconv.host_sync_count() (every wait of the library's GPU kernels for their stream).
A wait stalls the host until the GPU has run everything queued before it, so TensorFlow
cannot queue the step's next ops ahead of the GPU's work. Each row also gives the step's
deferred read-backs (tf_sparseconv.deferred_read_back_count(): sizes read back in a
callback without a wait, as SiteKernelMap does on the GPU).

Batches: the embedded synthetic shapes (tf_sparseconv.data.synthetic), voxelized as in
training. Appends one row per model to --out (default benchmarks/results/host_syncs.jsonl):
model, device, syncs_per_step, how, commit, checks (boundary, or "every op" with
TF_SPARSECONV_CHECK_EVERY_OP=1), date, batch, resolution, steps, deferred_per_step.

    python benchmarks/host_syncs.py [--steps 5] [--batch-size 32]
"""
import argparse
import datetime
import json
import os
import sys

import keras
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tf_sparseconv as ts  # noqa: E402
from tf_sparseconv import data as datasets  # noqa: E402
from tf_sparseconv.models import DEFAULT_RHOS, octnet3, site_unet  # noqa: E402
from tf_sparseconv.training.train import keras_batches, site_keras_batches  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_info import checkout_commit, checks_mode, gpu_name  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
HOW = "tf_sparseconv.host_sync_count(): the library's count of its cudaStreamSynchronize calls"


def waits_per_step(step, batch, steps):
    """(waits, deferred read-backs) per step."""
    step(*batch)  # tracing and first-call work outside the count
    before, deferred = ts.host_sync_count(), ts.deferred_read_back_count()
    for _ in range(steps):
        loss = step(*batch)
    float(tf.nest.flatten(loss)[0])  # the last step has run
    return (ts.host_sync_count() - before) / steps, (ts.deferred_read_back_count() - deferred) / steps


def octnet3_step(points, labels, classes, resolution, batch_size, exact_convs=False, exact_pools=False):
    model = octnet3(resolution, len(classes), DEFAULT_RHOS[resolution], padded_convs=False if exact_convs else "auto",
                    padded_pools=False if exact_pools else "auto")
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batch = next(iter(keras_batches(datasets.point_cloud_dataset(points, labels, resolution, batch_size, seed=0))))
    return lambda x, y: model.train_on_batch(x, y), batch


def site_unet_step(points, labels, classes, resolution, batch_size, exact_convs=False, exact_pools=False):
    model = site_unet(2, resolution=resolution)
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, _ = next(iter(site_keras_batches(datasets.point_cloud_dataset(points, labels, resolution, batch_size,
                                                                      seed=0))))
    site_labels = tf.cast(x["coords"][:, 3] >= resolution // 2, tf.int32)  # upper half of each shape: 1

    @tf.function(reduce_retracing=True)
    def step(inputs, targets):
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step, (x, site_labels)


MODELS = {"octnet3": octnet3_step, "site_unet": site_unet_step}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--exact-pools", action="store_true",
                   help="OctNet3's poolings with exact outputs instead of padded ones (the row's key pooling)")
    p.add_argument("--exact-convs", action="store_true",
                   help="OctNet3's convolutions with exact outputs instead of padded ones (the row's key convs)")
    p.add_argument("--out", default=os.path.join(RESULTS, "host_syncs.jsonl"))
    args = p.parse_args()
    points, labels, classes = datasets.make_shapes(max(1, args.batch_size // 8 + 1), seed=0)
    device = gpu_name() or "cpu"
    rows = []
    for i, name in enumerate(args.models, 1):
        print(f"[{i}/{len(args.models)}] {name} {args.resolution}^3, batch {args.batch_size}, on {device}", flush=True)
        step, batch = MODELS[name](points, labels, classes, args.resolution, args.batch_size, args.exact_convs,
                                   args.exact_pools)
        waits, deferred = waits_per_step(step, batch, args.steps)
        rows.append({"model": name, "device": device, "syncs_per_step": waits, "deferred_per_step": deferred,
                     "how": HOW, "commit": checkout_commit(), "checks": checks_mode(),
                     "date": datetime.date.today().isoformat(),
                     "batch": args.batch_size, "resolution": args.resolution, "steps": args.steps})
        if name == "octnet3":
            rows[-1]["convs"] = "exact" if args.exact_convs else "padded"
            rows[-1]["pooling"] = "exact" if args.exact_pools else "padded"
        print(f"  {waits:g} host waits and {deferred:g} deferred read-backs per training step", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print("summary: " + "; ".join(f"{r['model']} {r['syncs_per_step']:g} waits/step, "
                                  f"{r['deferred_per_step']:g} deferred read-backs/step" for r in rows)
          + f" ({device}); appended to {args.out}")


if __name__ == "__main__":
    main()
