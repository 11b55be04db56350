"""Demo: voxelize point clouds, run a sparse conv stack, print densities and memory bounds.

    python -m tf_sparseconv.channel.demo [--resolution 64] [--batch 4]

Every conv layer keeps at most k = ceil(rho_up * r^3) entries per (batch, channel), so
its output is bounded by B * Cout * k entries before anything runs; the demo prints that
bound beside what was actually produced.
"""
import argparse
import time

import numpy as np
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv.data.voxelize import voxelize_points


def procedural_shapes(batch, points_per_shape, rng):
    """Sphere shells, tori and boxes' surfaces with random scale: sparse 3-D surfaces."""
    clouds = []
    for i in range(batch):
        u = rng.random((points_per_shape, 2))
        kind = i % 3
        if kind == 0:  # sphere
            theta, phi = 2 * np.pi * u[:, 0], np.arccos(2 * u[:, 1] - 1)
            p = np.stack([np.sin(phi) * np.cos(theta), np.sin(phi) * np.sin(theta), np.cos(phi)], 1)
        elif kind == 1:  # torus
            a, b = 2 * np.pi * u[:, 0], 2 * np.pi * u[:, 1]
            p = np.stack([(0.7 + 0.25 * np.cos(b)) * np.cos(a), (0.7 + 0.25 * np.cos(b)) * np.sin(a),
                          0.25 * np.sin(b)], 1)
        else:  # box surface
            p = rng.uniform(-1, 1, (points_per_shape, 3))
            face = rng.integers(0, 3, points_per_shape)
            p[np.arange(points_per_shape), face] = np.sign(p[np.arange(points_per_shape), face])
        clouds.append(p * rng.uniform(0.6, 0.95))
    return clouds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--points", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    r = args.resolution

    print(f"[1/3] voxelizing {args.batch} procedural shapes at {r}^3")
    x = voxelize_points(procedural_shapes(args.batch, args.points, rng), r)
    print(f"      input: {int(x.num_entries)} entries, density {float(x.density()):.4f} (1/r = {1 / r:.4f})")

    # (Cin, Cout, rho_up) per conv; each conv is followed by ReLU and 2x max-pooling.
    layers = [(1, 8, 1.5 / r), (8, 16, 3.0 / r), (16, 32, 6.0 / r)]
    print(f"[2/3] running {len(layers)} x (direct conv 3^3 with k-selection -> ReLU -> max-pool 2)")
    rows, total_bound = [], 0
    h, resolution = x, r
    start = time.perf_counter()
    for i, (cin, cout, rho_up) in enumerate(layers):
        w = rng.standard_normal((3, 3, 3, cin, cout)).astype(np.float32) / np.sqrt(27 * cin)
        mask = rng.random(w.shape) < 0.5  # a half-pruned filter: pruned weights are skipped
        k = ts.k_from_rho_up(rho_up, (resolution,) * 3)
        bound_entries = args.batch * cout * k
        t0 = time.perf_counter()
        conv, touched, _ = ts.direct_conv(h, w, np.full(cout, 0.05, np.float32), mask, selection="signed",
                                          k=k, return_counts=True)
        h = ts.sparse_max_pool(ts.sparse_relu(conv), 2)
        elapsed = time.perf_counter() - t0
        bound_bytes = bound_entries * (8 + 4)
        total_bound += bound_bytes
        rows.append((f"conv{i + 1} {cin}->{cout} @ {resolution}^3", int(tf.reduce_sum(touched)),
                     int(conv.num_entries), bound_entries, bound_bytes, float(h.density()), elapsed))
        print(f"      layer {i + 1}/{len(layers)} done in {elapsed * 1e3:.1f} ms")
        resolution = (resolution + 1) // 2
    logits = tf.reduce_max(tf.reshape(ts.to_dense(h), [args.batch, -1, layers[-1][1]]), axis=1)
    total = time.perf_counter() - start

    print("[3/3] summary")
    print(f"{'layer':<24}{'touched':>10}{'kept':>10}{'bound':>10}{'bound MB':>10}{'density out':>13}{'ms':>8}")
    for name, touched, kept, bound, bound_bytes, density, seconds in rows:
        assert kept <= bound, "k-selection must keep the output within its bound"
        print(f"{name:<24}{touched:>10}{kept:>10}{bound:>10}{bound_bytes / 2**20:>10.2f}{density:>13.5f}"
              f"{seconds * 1e3:>8.1f}")
    print(f"global max-pooled features: {tuple(logits.shape)}; forward pass {total * 1e3:.1f} ms")
    print(f"memory bound of all conv outputs (known before running): {total_bound / 2**20:.2f} MB; "
          f"the dense equivalent of the first conv output alone: "
          f"{args.batch * r ** 3 * layers[0][1] * 4 / 2**20:.1f} MB")


if __name__ == "__main__":
    main()
