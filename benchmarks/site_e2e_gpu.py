"""Whole site-sparse networks against spconv 2.3.8: what a user runs, one call from
(coordinates, features) to the output features, every kernel map built inside the call.

Networks (benchmarks/site_networks.py): unet5_lidar_5cm (the seven-convolution chain of
site_conv_gpu.py on the 5 cm LiDAR frame), resunet42_lidar_5cm_b1 and _b2 (a
SparseResUNet42-style network with batch norm and ReLU, on one frame and on the frame
plus its mirror image). Passes: fwd (inference: batch norm from its moving statistics)
and train (forward in training mode, a float32 loss that weighs each output site and
channel (site_networks: SITE_HASH), and the gradients of every weight; the optimizer's
update is left out on both sides). dtypes:
fp32 (TF32 off on both sides) and fp16 (weights and features; batch-norm statistics and
parameters in float32).

Three phases, the first and last in TensorFlow, the middle in PyTorch:

    python benchmarks/site_e2e_gpu.py --phase ours        # times ours, writes the exchange
    python benchmarks/site_e2e_spconv.py                  # times spconv on the same inputs
    python benchmarks/site_e2e_gpu.py --phase merge       # rows -> results/site_e2e_gpu.jsonl

The exchange (--exchange, default /tmp/site_e2e) carries the sites, features, weights,
batch-norm statistics (ours after one training-mode call, so that inference sees
normalised features) and our fp32 outputs and gradients, which spconv's side must match
before it times anything. Rows: network, dtype, pass, ours_s, spconv_s, ratio (spconv_s /
ours_s: above 1 we are faster), max_rel_err, device, date, commit, plus the sites, our host
waits per call and spconv's algorithm (its faster of Native and MaskImplicitGemm).
Our batch norm is the library's FusedBatchNormalization (--bn fused, the default; --bn
keras times Keras' own layer too; --bn block puts each convolution, its batch norm and a
ReLU that follows into one SiteConvBlock, which folds the batch norm and the ReLU into the
convolution's epilogue in inference).
Both sides take their inputs on the GPU: spconv int32 indices, ours int64 coordinates
(--coords-dtype; TensorFlow keeps an int32 argument of a tf.function in host memory, so
int32 coordinates would be copied to the GPU in every call), which make_site_sparse checks
and casts to int32 inside the call.
Times are medians of synchronised whole calls (cudaDeviceSynchronize on both sides)
after warm-up. With --kernels N (both sides) three more calls of each pass are traced
(TensorFlow's profiler, PyTorch's) and the merge appends, per side, the GPU's busy time per
call and its N costliest kernels to results/site_e2e_kernels.jsonl: what a call's time is
made of, kernel maps, convolutions, batch norm and the host's gaps between them (ours: the
GPU's idle time per call and its longest idle stretches, with the kernels around them).
"""
import argparse
import datetime
import itertools
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from site_networks import (BN_EPS, SITE_HASH, SITE_HASH_MOD, conv_weights, loss_channel_weights,  # noqa: E402
                           network, relative, scene, sorted_rows)
from site_scenes import LIDAR  # noqa: E402

RUNS = {"unet5_lidar_5cm": ("unet5", 1), "resunet42_lidar_5cm_b1": ("resunet42", 1),
        "resunet42_lidar_5cm_b2": ("resunet42", 2)}
RESULTS = os.path.join(HERE, "results", "site_e2e_gpu.jsonl")
KERNELS_RESULTS = os.path.join(HERE, "results", "site_e2e_kernels.jsonl")
# Our batch-norm layer (--bn): the library's FusedBatchNormalization (the row batch-norm
# ops), Keras' own layer, or FusedBatchNormalization inside a SiteConvBlock with its
# convolution (and the ReLU after it).
BN_CHOICES = ("fused", "keras", "block")


def bn_layer(bn):
    """The batch-norm layer class of a --bn choice."""
    import keras
    from tf_sparseconv.site.batch_norm import FusedBatchNormalization
    return keras.layers.BatchNormalization if bn == "keras" else FusedBatchNormalization


def block_groups(steps):
    """{index of a conv step: (its bn step, the relu step after that or None)} for every
    convolution whose output only its batch norm reads (and that batch norm's only a ReLU)."""
    readers = {}
    for step in steps:
        for src in step[2:4] if step[0] in ("add", "concat") else step[2:3]:
            readers.setdefault(src, []).append(step)
    groups = {}
    for i, step in enumerate(steps):
        if step[0] != "conv" or len(readers.get(step[1], [])) != 1 or readers[step[1]][0][0] != "bn":
            continue
        norm = readers[step[1]][0]
        after = readers.get(norm[1], [])
        groups[i] = (norm, after[0] if len(after) == 1 and after[0][0] == "relu" else None)
    return groups


def build_model(steps, spatial, cin, dtype, bn="fused"):
    """Our Keras model of `steps` -> (model, {conv step: layer}, {bn step: batch-norm layer},
    a model of the same layers whose outputs are every convolution's output site dict, or
    None for bn "block", whose convolutions' outputs are not tensors of their own).
    bn: the batch-norm layer (BN_CHOICES)."""
    import keras
    from tf_sparseconv.site.conv_block import SiteConvBlock
    from tf_sparseconv.site.keras_io import site_input
    from tf_sparseconv.site.layers import SiteAdd, SiteConcat, SiteFeatures
    bn_dtype = "mixed_float16" if dtype == "float16" else "float32"
    inputs = site_input(tuple(int(s) for s in spatial), cin, dtype=dtype)
    tensors, convs, norms = {"x": inputs}, {}, {}
    groups = block_groups(steps) if bn == "block" else {}
    absorbed = {part[1] for norm, relu in groups.values() for part in (norm, relu) if part is not None}
    for i, step in enumerate(steps):
        op, out = step[0], step[1]
        if out in absorbed:
            continue  # inside the SiteConvBlock of its convolution
        if i in groups:
            _, _, src, kind, _, cout, k, key = step
            norm_step, relu_step = groups[i]
            conv = conv_layer(kind, cout, k, key, dtype, out)
            norm = bn_layer("fused")(momentum=0.0, epsilon=BN_EPS, dtype=bn_dtype, name=f"{norm_step[1]}_inner")
            convs[out], norms[norm_step[1]] = conv, norm
            last = (relu_step or norm_step)[1]
            tensors[last] = SiteConvBlock(conv, norm, activation="relu" if relu_step else None,
                                          name=f"{out}_block")(tensors[src])
            continue
        if op == "conv":
            _, _, src, kind, _, cout, k, key = step
            layer = conv_layer(kind, cout, k, key, dtype, out)
            convs[out] = layer
            tensors[out] = layer(tensors[src])
        elif op == "bn":
            norm = bn_layer(bn)(momentum=0.0, epsilon=BN_EPS, dtype=bn_dtype, name=f"{out}_inner")
            norms[out] = norm
            tensors[out] = SiteFeatures(norm, dtype=dtype, name=out)(tensors[step[2]])
        elif op == "relu":
            tensors[out] = SiteFeatures(keras.layers.ReLU(dtype=dtype), dtype=dtype, name=out)(tensors[step[2]])
        elif op == "add":
            tensors[out] = SiteAdd(dtype=dtype, name=out)([tensors[step[2]], tensors[step[3]]])
        elif op == "concat":
            tensors[out] = SiteConcat(dtype=dtype, name=out)([tensors[step[2]], tensors[step[3]]])
        else:
            raise ValueError(f"unknown step {step}")
    last = tensors[steps[-1][1]]
    model = keras.Model(inputs, {"coords": last["coords"], "features": last["features"]})
    if groups:
        return model, convs, norms, None
    # Every convolution's output, for finding where two implementations part (same layers).
    probes = keras.Model(inputs, {name: {"coords": tensors[name]["coords"], "features": tensors[name]["features"]}
                                  for name in convs})
    return model, convs, norms, probes


def conv_layer(kind, cout, k, key, dtype, name):
    """Our layer of a conv step's kind ('subm', 'down' or 'inv'), without a bias."""
    from tf_sparseconv.site.conv_layers import SPARSE_CONV, SPARSE_INVERSE_CONV, SUBM_CONV
    if kind == "subm":
        return SUBM_CONV[3](cout, k, indice_key=key, use_bias=False, dtype=dtype, name=name)
    if kind == "down":
        return SPARSE_CONV[3](cout, k, strides=2, indice_key=key, use_bias=False, dtype=dtype, name=name)
    return SPARSE_INVERSE_CONV[3](cout, indice_key=key, use_bias=False, dtype=dtype, name=name)


def site_inputs(coords, features, spatial, batch):
    """The model's input dict, made as a user makes it (make_site_sparse's checks included)."""
    from tf_sparseconv.site.keras_io import as_site_keras_inputs
    from tf_sparseconv.site.tensor import make_site_sparse
    return as_site_keras_inputs(make_site_sparse(coords, features, spatial, batch))


def set_statistics(norms, stats):
    for name, norm in norms.items():
        norm.moving_mean.assign(stats[name][0])
        norm.moving_variance.assign(stats[name][1])


def functions(model, spatial, batch):
    """(fwd, train) tf.functions of (coords, features): the whole call a user makes."""
    import tensorflow as tf

    @tf.function
    def fwd(coords, features):
        return model(site_inputs(coords, features, spatial, batch), training=False)["features"]

    @tf.function
    def train(coords, features):
        with tf.GradientTape() as tape:
            out = model(site_inputs(coords, features, spatial, batch), training=True)
            y = tf.cast(out["features"], tf.float32)
            h = tf.reduce_sum(tf.cast(out["coords"], tf.int64) * tf.constant(SITE_HASH, tf.int64), 1)
            h = tf.math.floormod(h, SITE_HASH_MOD)
            s = tf.cast(h, tf.float32) / SITE_HASH_MOD - 0.5
            loss = tf.reduce_mean(s * tf.linalg.matvec(y, loss_channel_weights(y.shape[-1])))
        return loss, tape.gradient(loss, model.trainable_variables)

    return fwd, train


def run_ours(args):
    import tensorflow as tf
    import tf_sparseconv as ts
    from gpu_trace import append_kernel_row, named_gaps, rank_events, traced_events
    from timing import median_time, sync, sync_method
    tf.config.experimental.enable_tensor_float_32_execution(False)  # fp32 is fp32 on both sides
    os.makedirs(args.exchange, exist_ok=True)
    if os.path.exists(os.path.join(args.exchange, "kernels.jsonl")):
        os.remove(os.path.join(args.exchange, "kernels.jsonl"))  # an earlier run's
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    rows = []
    for run in args.networks:
        net, batch = RUNS[run]
        steps = network(net)
        coords, spatial, features = scene(net, batch, args.lidar, tiny=args.tiny)
        weights = conv_weights(net, steps)
        cin = features.shape[1]
        print(f"[ours] {run}: {len(coords):,} sites, spatial shape {spatial.tolist()}, "
              f"{len(weights)} convolutions", flush=True)
        np.savez(os.path.join(args.exchange, f"{run}_inputs.npz"), coords=coords, spatial=spatial,
                 features=features, batch=batch)
        reference, stats = reference_pass(steps, spatial, cin, weights, coords, features, batch, device)
        np.savez(os.path.join(args.exchange, f"{run}_reference.npz"), **reference)
        np.savez(os.path.join(args.exchange, f"{run}_bn.npz"), **{f"{k}_mean": v[0] for k, v in stats.items()},
                 **{f"{k}_var": v[1] for k, v in stats.items()})
        check = None
        if args.cpu_check and device != "/CPU:0":
            on_cpu, _ = reference_pass(steps, spatial, cin, weights, coords, features, batch, "/CPU:0")
            if any(not np.array_equal(on_cpu[k], reference[k]) for k in reference if k.endswith("_coords")):
                raise RuntimeError(f"{run}: our CPU and GPU kernels give different sites")
            check = {k: relative(on_cpu[k], reference[k]) for k in reference if not k.endswith("_coords")}
            worst = max(check, key=check.get)
            print(f"  ours on the CPU against the GPU: largest relative difference {check[worst]:.1e} ({worst})",
                  flush=True)
            for kind in ("probe_", "grad_"):
                order = [k for k in check if k.startswith(kind)]
                parted = [k for k in order if check[k] > 1e-4]
                print(f"    {kind[:-1]}s beyond 1e-4: {len(parted)} of {len(order)}, in network order: "
                      + ", ".join(f"{k} {check[k]:.1e}" for k in parted[:8]), flush=True)
        first_outputs = {}  # dtype -> the inference output of the first --bn, which the others must give
        for bn, dtype_name in itertools.product(args.bn, args.dtypes):
            if bn != args.bn[0] and not any(step[0] == "bn" for step in steps):
                continue  # no batch norm: every --bn is the same network
            dtype = {"fp32": "float32", "fp16": "float16"}[dtype_name]
            with tf.device(device):
                model, convs, norms, _ = build_model(steps, spatial, cin, dtype, bn)
                for name, layer in convs.items():
                    layer.kernel.assign(weights[name].astype(dtype))
                set_statistics(norms, stats)
                c = tf.constant(coords.astype(args.coords_dtype))
                f = tf.constant(features.astype(dtype))
                fwd, train = functions(model, tf.constant(spatial), batch)
                output = tf.cast(fwd(c, f), tf.float32).numpy()
                same = None
                if first_outputs.setdefault(dtype_name, output) is not output:
                    same = relative(output, first_outputs[dtype_name])
                    print(f"  {bn} {dtype_name}: inference output within {same:.1e} of --bn {args.bn[0]}'s", flush=True)
                for pass_name, fn in (("fwd", fwd), ("train", train)):
                    fn(c, f)
                    sync()
                    before, deferred = ts.host_sync_count(), ts.deferred_read_back_count()
                    fn(c, f)
                    sync()
                    waits = ts.host_sync_count() - before
                    deferred = ts.deferred_read_back_count() - deferred
                    seconds = median_time(fn, args.warmup, args.reps, (c, f))
                    rows.append({"network": run, "dtype": dtype_name, "pass": pass_name, "ours_s": seconds,
                                 "n_sites": len(coords), "ours_host_syncs": waits, "ours_deferred_read_backs": deferred,
                                 "sync": sync_method(),
                                 "ours_cpu_gpu_rel_err": check and max(check.values()), "bn": bn,
                                 "coords_dtype": args.coords_dtype,
                                 **({"rel_err_vs_first_bn": same} if same is not None else {})})
                    print(f"  {bn} {dtype_name} {pass_name}: {seconds * 1e3:.3f} ms, {waits} host waits, "
                          f"{deferred} deferred read-backs", flush=True)
                    if args.kernels:
                        events = traced_events(lambda *a: (fn(*a), sync()), (c, f), KERNEL_CALLS)
                        busy_ms, top = rank_events(events, KERNEL_CALLS, args.kernels, 1e9)
                        # Where the GPU waits for the host: its idle stretches of 20 us or more
                        # within and between the traced calls, the longest with their neighbours.
                        idle, count, longest = named_gaps(events, 20e6, args.kernels)
                        print(f"    GPU idle {idle / 1e9 / KERNEL_CALLS:.3f} ms per call in {count / KERNEL_CALLS:.1f} "
                              "stretches of 20 us or more; the longest (ms, after, before):", flush=True)
                        for gap, before, after in longest:
                            print(f"      {gap / 1e9:8.3f}  {before[:50]}  ->  {after[:50]}", flush=True)
                        append_kernel_row(os.path.join(args.exchange, "kernels.jsonl"),
                                          {"network": run, "dtype": dtype_name, "pass": pass_name, "side": "ours",
                                           "bn": bn, "idle_s": idle / 1e12 / KERNEL_CALLS,
                                           "idle_stretches": count / KERNEL_CALLS,
                                           "longest_idle": [[gap / 1e12, before[:120], after[:120]]
                                                            for gap, before, after in longest]},
                                          busy_ms, top, KERNEL_CALLS)
        with open(os.path.join(args.exchange, "ours.json"), "w") as out_file:
            json.dump({"rows": rows, "device": device_name()}, out_file)
    print(f"[ours] {len(rows)} rows -> {args.exchange}/ours.json", flush=True)


KERNEL_CALLS = 3  # calls traced for --kernels


PROBE_ROWS = 2000  # rows of each convolution's output kept, the first in coordinate order


def reference_pass(steps, spatial, cin, weights, coords, features, batch, device):
    """fp32 on `device`: one training-mode call sets the batch-norm statistics (momentum 0:
    this batch's), then the inference output, every convolution's output (PROBE_ROWS rows),
    the loss and every convolution's weight gradient in training mode -> (arrays, stats)."""
    import tensorflow as tf
    with tf.device(device):
        model, convs, norms, probes = build_model(steps, spatial, cin, "float32")
        for name, layer in convs.items():
            layer.kernel.assign(weights[name])
        c, f = tf.constant(coords), tf.constant(features)
        _, train = functions(model, tf.constant(spatial), batch)
        train(c, f)
        stats = {name: (n.moving_mean.numpy(), n.moving_variance.numpy()) for name, n in norms.items()}
        inputs = site_inputs(c, f, spatial, batch)
        out = model(inputs, training=False)
        probed = probes(inputs, training=False)
        loss, grads = train(c, f)
        set_statistics(norms, stats)  # train() set them again: the same batch, the same values
    grad_of = {v.path if hasattr(v, "path") else v.name: g for v, g in zip(model.trainable_variables, grads)}
    reference = {"out_coords": out["coords"].numpy(), "out_features": out["features"].numpy(),
                 "loss": np.float64(loss.numpy())}
    for name in convs:
        key = next(k for k in grad_of if k.startswith(f"{name}/") and "kernel" in k)
        reference[f"grad_{name}"] = grad_of[key].numpy()
        head = sorted_rows(probed[name]["coords"].numpy(), probed[name]["features"].numpy(), PROBE_ROWS)
        reference[f"probe_{name}_coords"], reference[f"probe_{name}_features"] = head
    return reference, stats


def device_name():
    from run_info import gpu_name
    return gpu_name() or "CPU"


def merge(args):
    from run_info import checkout_commit
    with open(os.path.join(args.exchange, "ours.json")) as f:
        ours = json.load(f)
    with open(os.path.join(args.exchange, "spconv.json")) as f:
        peer = json.load(f)
    theirs = {(r["network"], r["dtype"], r["pass"]): r for r in peer["rows"]}
    errors = peer.get("rel_err", {})
    stamp = {"device": ours["device"], "date": datetime.date.today().isoformat(), "commit": checkout_commit(),
             "run": args.run}
    out = []
    for r in ours["rows"]:
        key = (r["network"], r["dtype"], r["pass"])
        if key not in theirs:
            print(f"[merge] no spconv row for {key}; left out", flush=True)
            continue
        s = theirs[key]
        err = errors.get(r["network"], {})
        # fwd: the fp32 outputs; train: the fp32 outputs and loss, the gradients beside them
        checked = {"fwd": ("output",), "train": ("output", "loss")}[r["pass"]]
        out.append({**r, "spconv_s": s["spconv_s"], "ratio": s["spconv_s"] / r["ours_s"],
                    "max_rel_err": max((err[k] for k in checked if k in err), default=None),
                    **({"grad_rel_err": err.get("gradients")} if r["pass"] == "train" else {}),
                    "spconv_algo": s["algo"], "spconv_gpu_s": s.get("spconv_gpu_s"), **stamp})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        for row in out:
            f.write(json.dumps(row) + "\n")
    print(f"{'network':<24} {'dtype':<5} {'pass':<6} {'bn':<6} {'ours ms':>9} {'spconv ms':>10} {'ratio':>6}")
    for row in out:
        print(f"{row['network']:<24} {row['dtype']:<5} {row['pass']:<6} {row.get('bn', ''):<6} "
              f"{row['ours_s'] * 1e3:9.3f} {row['spconv_s'] * 1e3:10.3f} {row['ratio']:6.2f}")
    print(f"[merge] {len(out)} rows appended to {args.out}")
    kernels = os.path.join(args.exchange, "kernels.jsonl")
    if os.path.exists(kernels):  # --kernels rows of both sides
        with open(kernels) as f:
            rows = [{**json.loads(line), **stamp} for line in f]
        with open(args.kernels_out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"[merge] {len(rows)} kernel rows appended to {args.kernels_out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=("ours", "merge"), required=True)
    p.add_argument("--networks", nargs="+", choices=tuple(RUNS), default=list(RUNS))
    p.add_argument("--dtypes", nargs="+", choices=("fp32", "fp16"), default=["fp32", "fp16"])
    p.add_argument("--bn", nargs="+", choices=BN_CHOICES, default=["fused"],
                   help="our batch-norm layer(s): the library's FusedBatchNormalization (fused), Keras' own (keras), "
                        "or FusedBatchNormalization in a SiteConvBlock with its convolution and ReLU (block)")
    p.add_argument("--exchange", default="/tmp/site_e2e")
    p.add_argument("--lidar", default=LIDAR)
    p.add_argument("--tiny", action="store_true", help="a small random scene instead of the frame (tests, CPU)")
    p.add_argument("--coords-dtype", choices=("int64", "int32"), default="int64",
                   help="the coordinates our call takes, on the GPU as spconv's are: int64 (the default) stays "
                        "there; TensorFlow passes an int32 argument of a tf.function in host memory, so int32 "
                        "adds a copy to the GPU (and from it, for a tensor made there) to every call")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--cpu-check", action="store_true",
                   help="also make the fp32 reference on the CPU and report how far the GPU's is from it")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="also trace 3 calls of each pass and give the GPU's busy time per call and its N costliest "
                        "kernels (rows in <exchange>/kernels.jsonl; the merge appends them to --kernels-out)")
    p.add_argument("--kernels-out", default=KERNELS_RESULTS)
    p.add_argument("--run", default=None, help="a label for the merged rows")
    args = p.parse_args()
    if args.phase == "ours":
        if "fp32" not in args.dtypes:
            p.error("the fp32 pass makes the reference and the batch-norm statistics: keep fp32 in --dtypes")
        args.dtypes = ["fp32"] + [d for d in args.dtypes if d != "fp32"]
        if not args.tiny and not os.path.exists(args.lidar):
            p.error(f"no LiDAR frame at {args.lidar} (--lidar, or --tiny)")
        sys.path.insert(0, ROOT)
        run_ours(args)
    else:
        merge(args)


if __name__ == "__main__":
    main()
