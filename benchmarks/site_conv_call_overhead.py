"""Where the whole-call time of one site-convolution layer goes beyond its device time
(issue 5: the call figure against spconv's), on the lent GPU.

For each layer: the synchronised call of `tf.function`s that differ in one thing each,
medians after warm-up (timing.median_time), and the time per call with 20 calls queued
back to back (timing.queued_s_per_call, calling the tf.function: its host work included):
  floor        a tf.function of one tiny op (TensorFlow's own share of any call)
  pairs        the map's int32 rows captured by the function, as a user's cached map is:
               TensorFlow places int32 function inputs in host memory, so both row
               tensors are copied to the GPU at every call
  pairs_host   the same with the op's HostMemory inputs (offset_splits, num_in,
               num_out) already in host memory rather than copied from the device
  pairs_bits   the rows entering as float32 bit patterns, tf.bitcast back inside
  table_bits   the same, from a neighbour table built once (also as bit patterns)
One JSON object per line in --out (default results/site_conv_call_overhead.jsonl).

    python3 benchmarks/site_conv_call_overhead.py --scene lidar_5cm --layers subm_l0_64 subm_l2_256
"""
import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from site_conv_gpu import NO_TABLE, device_int32, int32_of, layer_rows, levels_of, neighbour_table  # noqa: E402
from site_scenes import LAYERS, layer_weights, level_features, scenes  # noqa: E402
from timing import median_time, queued_s_per_call  # noqa: E402

from tf_sparseconv._op_library import ops as _ops  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scene", default="lidar_5cm")
    p.add_argument("--layers", nargs="+", default=["subm_l0_64", "subm_l1_128", "subm_l2_256"])
    p.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=os.path.join(HERE, "results", "site_conv_call_overhead.jsonl"))
    p.add_argument("--tag", default=None, help="a run name stored in every row")
    args = p.parse_args()
    if not tf.config.list_physical_devices("GPU"):
        sys.exit("needs a GPU")
    device = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get("device_name")
    dt = tf.float16 if args.dtype == "fp16" else tf.float32
    tf.config.experimental.enable_tensor_float_32_execution(False)
    coords, spatial, batch = scenes([args.scene])[args.scene]
    sites, maps = levels_of(coords, spatial, batch)
    rows = []
    floor = median_time(tf.function(lambda v: v + 1.0), args.warmup, args.reps, (tf.zeros([8]),))
    rows.append({"variant": "floor", "call_s": floor})
    print(f"{args.scene}: a tiny tf.function call {floor * 1e3:.3f} ms", flush=True)
    for name in args.layers:
        li = [spec[0] for spec in LAYERS].index(name)
        _, kind, level, cin, cout, k, _, key = LAYERS[li]
        in_rows, out_rows, splits, num_in, num_out, _ = layer_rows(kind, level, key, maps, sites)
        with tf.device("/CPU:0"):
            host = tuple(tf.identity(t) for t in (splits, num_in, num_out))
        table_bits = device_int32(neighbour_table(in_rows, out_rows, splits, num_in, num_out))
        feats = tf.constant(level_features(int(num_in), cin, seed=1000 + li), dt)
        w = tf.constant(layer_weights(cin, cout, k, seed=2000 + li).reshape(k ** 3, cin, cout), dt)

        rows_bits = (device_int32(in_rows), device_int32(out_rows))

        def make(use_table, host_inputs, bits):
            s, n_out = (host[0], host[2]) if host_inputs else (splits, num_out)

            @tf.function
            def call(f, w):
                table = int32_of(table_bits) if use_table else NO_TABLE
                rows = tuple(int32_of(b) for b in rows_bits) if bits else (in_rows, out_rows)
                return _ops.site_sparse_conv(f, w, *rows, s, n_out, table, map_is_trusted=True,
                                             map_is_submanifold=kind == "subm")
            return call
        reference = None
        for variant, use_table, host_inputs, bits in (("pairs", False, False, False),
                                                       ("pairs_host", False, True, False),
                                                       ("pairs_bits", False, False, True),
                                                       ("table_bits", True, False, True)):
            if use_table and args.dtype != "fp16":
                continue
            call = make(use_table, host_inputs, bits)
            y = call(feats, w).numpy().astype(np.float32)
            if reference is None:
                reference = y
            assert np.allclose(y, reference, rtol=2e-2, atol=2e-2 * np.abs(reference).max()), variant
            call_s = median_time(call, args.warmup, args.reps, (feats, w))
            queued_s = queued_s_per_call(call, 20, (feats, w), op_by_op=False)
            rows.append({"variant": variant, "layer": name, "cin": cin, "cout": cout, "pairs": int(in_rows.shape[0]),
                         "call_s": call_s, "queued_s": queued_s})
            print(f"  {name:<16} {variant:<11} call {call_s * 1e3:7.3f} ms, queued {queued_s * 1e3:7.3f} ms",
                  flush=True)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps({"scene": args.scene, "dtype": args.dtype, "device": device, "run": args.tag,
                                **row}) + "\n")
    print(f"{len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    main()
