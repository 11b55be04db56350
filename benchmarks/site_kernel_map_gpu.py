"""Kernel-map construction on the GPU: the hash builder against the sort builder (Minuet's
segmented sorting and double-traversed binary search, seed 002 §4), on the real LiDAR frame
(../shared/data/lidar_scan.npz) voxelized at 5 cm and 10 cm.

Geometries: a 3x3x3 submanifold map, a 2x2x2 stride-2 map, a 3x3x3 stride-2 padding-1 map
and the 2x2x2 stride-2 transposed map of the 2x2x2 map's output sites. Before timing, both
builders' maps are checked identical to each other and to the CPU kernel's.

Time: the op inside a tf.function on inputs already on the GPU, medians of synchronised
calls after warm-up. Results are JSON lines in benchmarks/results/site_kernel_map_gpu.jsonl
(--out, replaced by each run) with the keys of site_conv_gpu.jsonl's map rows (scene,
layer, pass = "map", n_sites, device, ours_s, builder, pairs) plus out_sites.

    python benchmarks/site_kernel_map_gpu.py [--data PATH] [--repeats 50] [--out PATH]
"""
import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tf_sparseconv._op_library import ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from site_scenes import LIDAR  # noqa: E402
from timing import median_time  # noqa: E402

DEFAULT_OUT = os.path.join(REPO, "benchmarks", "results", "site_kernel_map_gpu.jsonl")
VOXELS = [("lidar_5cm", 0.05), ("lidar_10cm", 0.10)]
BUILDERS = ["hash", "sort"]
# (layer, mode, kernel, stride, padding, sites): sites "input" or "coarse" (the output
# sites of the 2x2x2 stride-2 map, the input of the transposed map back up).
GEOMETRIES = [
    ("map_subm_k3", "submanifold", 3, 1, 0, "input"),
    ("map_down_k2s2", "strided", 2, 2, 0, "input"),
    ("map_down_k3s2p1", "strided", 3, 2, 1, "input"),
    ("map_up_k2s2", "transposed", 2, 2, 0, "coarse"),
]


def voxelize(points, voxel):
    """Batch-0 sites of the occupied voxels, and the grid's extent."""
    cells = np.unique(np.floor((points - points.min(0)) / voxel).astype(np.int64), axis=0)
    coords = np.concatenate([np.zeros((len(cells), 1), np.int64), cells], 1).astype(np.int32)
    return coords, (cells.max(0) + 1).astype(np.int32)


def map_fn(mode, kernel, stride, padding, builder):
    d = 3

    @tf.function
    def build(coords, spatial_shape, batch_size):
        return ops.site_kernel_map(coords, spatial_shape, batch_size, mode=mode, kernel_size=[kernel] * d,
                                   strides=[stride] * d, padding=[padding] * d, dilation=[1] * d, builder=builder)
    return build


def same_map(a, b):
    return all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a, b))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=LIDAR, help="the LiDAR frame (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--no-cpu-check", action="store_true", help="skip the comparison with the CPU kernel")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        sys.exit("site_kernel_map_gpu.py needs a GPU visible to TensorFlow")
    device = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    points = np.load(args.data)["pc"][:, :3].astype(np.float64)

    rows = []
    for scene, voxel in VOXELS:
        coords, shape = voxelize(points, voxel)
        inputs = {"input": (coords, shape)}
        with tf.device("/GPU:0"):
            coarse = ops.site_kernel_map(tf.constant(coords), tf.constant(shape), tf.constant(1), mode="strided",
                                         kernel_size=[2] * 3, strides=[2] * 3, padding=[0] * 3, dilation=[1] * 3)
        inputs["coarse"] = (coarse[0].numpy(), coarse[1].numpy())
        for layer, mode, kernel, stride, padding, sites in GEOMETRIES:
            site_coords, site_shape = inputs[sites]
            # The sites in GPU memory (made by a GPU kernel, so no copy is timed), the
            # spatial shape and batch size in host memory, where the op reads them.
            with tf.device("/GPU:0"):
                gpu_coords = tf.cast(tf.constant(site_coords.astype(np.float32)), tf.int32)  # exact below 2^24
            with tf.device("/CPU:0"):
                gpu_args = (gpu_coords, tf.constant(site_shape), tf.constant(1))
            maps = {}
            for builder in BUILDERS:
                with tf.device("/GPU:0"):
                    maps[builder] = map_fn(mode, kernel, stride, padding, builder)(*gpu_args)
            if not same_map(maps["hash"], maps["sort"]):
                sys.exit(f"{scene} {layer}: the hash and sort builders disagree")
            if not args.no_cpu_check:
                with tf.device("/CPU:0"):
                    cpu = ops.site_kernel_map(tf.constant(site_coords), tf.constant(site_shape), tf.constant(1),
                                              mode=mode, kernel_size=[kernel] * 3, strides=[stride] * 3,
                                              padding=[padding] * 3, dilation=[1] * 3)
                if not same_map(maps["hash"], cpu):
                    sys.exit(f"{scene} {layer}: the GPU map differs from the CPU's")
            for builder in BUILDERS:
                build = map_fn(mode, kernel, stride, padding, builder)
                with tf.device("/GPU:0"):
                    seconds = median_time(lambda: build(*gpu_args), args.warmup, args.repeats)
                row = dict(scene=scene, layer=layer, **{"pass": "map"}, n_sites=int(len(site_coords)), device=device,
                           ours_s=seconds, builder=builder, pairs=int(maps[builder][2].shape[0]),
                           out_sites=int(maps[builder][0].shape[0]))
                rows.append(row)
                print(f"{scene:11s} {layer:16s} {builder:4s} n={row['n_sites']:7d} pairs={row['pairs']:8d} "
                      f"out={row['out_sites']:7d}  {seconds * 1e3:8.3f} ms", flush=True)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
