"""One fp16 layer of site_conv_gpu.py's benchmark, run a few times so that a profiler can
catch its kernels, e.g. on the lent GPU:

    ncu --clock-control none -k regex:GatherGemmStore -c 2 --section SpeedOfLight \\
        python3 benchmarks/site_conv_profile.py --scene synthetic_lidar_5cm_b4 --layer subm_l1_128 \\
        --dataflow table --mask-groups 1

dataflow: pairs (TF_SPARSECONV_SITE_DATAFLOW=pairs), or table (outputs, from a neighbour
table of --mask-groups groups built once). Prints the layer's sizes; with --time (not under a
profiler) also the device time per call (calls queued back to back, as the benchmark's
ours_gpu_s).
"""
import argparse
import os
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from site_conv_gpu import layer_rows, levels_of  # noqa: E402
from site_scenes import LAYERS, layer_weights, level_features, scenes  # noqa: E402
from timing import queued_s_per_call  # noqa: E402

from tf_sparseconv._op_library import ops as _ops  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scene", nargs="+", default=["synthetic_lidar_5cm_b4"])
    p.add_argument("--layer", nargs="+", default=["subm_l1_128"], choices=[spec[0] for spec in LAYERS])
    p.add_argument("--dataflow", default="table", choices=("pairs", "table"))
    p.add_argument("--mask-groups", type=int, default=1)
    p.add_argument("--calls", type=int, default=3, help="forward calls after one warm-up call")
    p.add_argument("--time", action="store_true", help="then time the call (not under a profiler)")
    args = p.parse_args()
    os.environ["TF_SPARSECONV_SITE_DATAFLOW"] = "pairs" if args.dataflow == "pairs" else "outputs"
    for scene, (coords, spatial, batch) in scenes(args.scene).items():
        sites, maps = levels_of(coords, spatial, batch)
        for layer in args.layer:
            profile_layer(args, scene, layer, sites, maps)


def profile_layer(args, scene, layer, sites, maps):
    li = [spec[0] for spec in LAYERS].index(layer)
    _, kind, level, cin, cout, k, _, key = LAYERS[li]
    in_rows, out_rows, splits, num_in, num_out, _ = layer_rows(kind, level, key, maps, sites)
    table = (_ops.site_neighbour_table(in_rows, out_rows, splits, num_in, num_out, map_is_trusted=True,
                                       mask_groups=args.mask_groups)
             if args.dataflow == "table" else tf.zeros([0], tf.int32))
    feats = tf.constant(level_features(int(num_in), cin, seed=1000 + li), tf.float16)
    w = tf.constant(layer_weights(cin, cout, k, seed=2000 + li).reshape(k ** 3, cin, cout), tf.float16)

    def fwd(f, w):
        return _ops.site_sparse_conv(f, w, in_rows, out_rows, splits, num_out, table, map_is_trusted=True,
                                     map_is_submanifold=kind == "subm")
    print(f"{scene} {layer}: {int(num_in):,} -> {int(num_out):,} sites, {int(in_rows.shape[0]):,} pairs, "
          f"C {cin} -> {cout}, {args.dataflow}" + (f", {args.mask_groups} mask groups" if args.dataflow == "table"
                                                  else ""), flush=True)
    for _ in range(1 + args.calls):
        y = fwd(feats, w)
    print(f"checksum {float(tf.reduce_sum(tf.cast(y, tf.float32))):.4f}", flush=True)
    if args.time:
        t = queued_s_per_call(fwd, 20, (feats, w))
        print(f"device time per call: {t * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
