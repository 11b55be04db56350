"""Scenes and layer configurations of the site-sparse benchmarks, in NumPy only, so that
our TensorFlow process and the spconv (PyTorch) process build identical inputs.

Scenes: the real LiDAR frame (../shared/data/lidar_scan.npz) at 5 cm and 10 cm voxels;
synthetic LiDAR-like scenes (ground seen in rings that thin out with range, walls, poles
and tree trunks as cylinders, in a 100 m x 100 m x 8 m box) at 5 cm, batch 1 and 4; an
indoor-like room (floor, walls, furniture boxes; 8 m x 8 m x 3 m) at 2 cm.
"""
import os

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ../shared/data beside the checkout, or a copy in .devdata/ (carried to the lent GPU).
LIDAR = next((p for p in (os.path.join(_ROOT, "..", "shared", "data", "lidar_scan.npz"),
                          os.path.join(_ROOT, ".devdata", "lidar_scan.npz")) if os.path.exists(p)),
             os.path.join(_ROOT, "..", "shared", "data", "lidar_scan.npz"))

# MinkUNet-style layers: (name, kind, level in, cin, cout, kernel, stride, map key).
# 'subm' keeps the sites, 'down' is a strided conv (level -> level + 1), 'inv' its inverse.
LAYERS = [
    ("subm_l0_32", "subm", 0, 32, 32, 3, 1, "subm0"),
    ("subm_l0_64", "subm", 0, 64, 64, 3, 1, "subm0"),
    ("down_l0_64_128", "down", 0, 64, 128, 2, 2, "down1"),
    ("subm_l1_128", "subm", 1, 128, 128, 3, 1, "subm1"),
    ("down_l1_128_256", "down", 1, 128, 256, 2, 2, "down2"),
    ("subm_l2_256", "subm", 2, 256, 256, 3, 1, "subm2"),
    ("inv_l2_256_128", "inv", 2, 256, 128, 2, 2, "down2"),
    ("inv_l1_128_64", "inv", 1, 128, 64, 2, 2, "down1"),
]
# The end-to-end chain: down the U and back up.
CHAIN = ["subm_l0_64", "down_l0_64_128", "subm_l1_128", "down_l1_128_256", "subm_l2_256", "inv_l2_256_128",
         "inv_l1_128_64"]


def voxelize(points, voxel, batch_index=0):
    cells = np.floor((points - points.min(0)) / voxel).astype(np.int64)
    cells = np.unique(cells, axis=0)
    coords = np.concatenate([np.full((len(cells), 1), batch_index), cells], 1).astype(np.int32)
    return coords


def _lidar_like(rng):
    """Points of one synthetic outdoor frame (metres, sensor at the centre, 1.8 m high)."""
    parts = []
    # Ground: rings every few tenths of a degree of elevation, denser near the sensor.
    r = 3.0 + rng.exponential(14.0, 160_000)
    r = r[r < 70.0]
    a = rng.uniform(0, 2 * np.pi, len(r))
    parts.append(np.stack([r * np.cos(a), r * np.sin(a), rng.normal(0, 0.02, len(r))], 1))
    # Walls: a few vertical planes (building fronts).
    for _ in range(6):
        x0, y0 = rng.uniform(-45, 45, 2)
        angle = rng.uniform(0, np.pi)
        t = rng.uniform(0, rng.uniform(8, 30), 20_000)
        h = rng.uniform(0, rng.uniform(3, 7.5), 20_000)
        parts.append(np.stack([x0 + t * np.cos(angle), y0 + t * np.sin(angle), h], 1))
    # Poles and trunks: cylinders.
    for _ in range(40):
        cx, cy = rng.uniform(-48, 48, 2)
        radius, height = rng.uniform(0.1, 0.5), rng.uniform(2, 7.5)
        a = rng.uniform(0, 2 * np.pi, 1500)
        parts.append(np.stack([cx + radius * np.cos(a), cy + radius * np.sin(a), rng.uniform(0, height, 1500)], 1))
    points = np.concatenate(parts)
    keep = (np.abs(points[:, 0]) < 50) & (np.abs(points[:, 1]) < 50) & (points[:, 2] < 8)
    return points[keep].astype(np.float32)


def _indoor(rng):
    """Points of one synthetic room (metres)."""
    parts = [np.stack([rng.uniform(0, 8, 150_000), rng.uniform(0, 8, 150_000), np.zeros(150_000)], 1)]
    for axis in (0, 1):
        for value in (0.0, 8.0):
            wall = np.stack([rng.uniform(0, 8, 40_000), rng.uniform(0, 8, 40_000), rng.uniform(0, 3, 40_000)], 1)
            wall[:, axis] = value
            parts.append(wall)
    for _ in range(12):  # furniture: box surfaces
        lo = np.array([*rng.uniform(0.5, 6.5, 2), 0.0])
        size = np.array([*rng.uniform(0.4, 1.5, 2), rng.uniform(0.4, 1.2)])
        p = lo + rng.uniform(0, 1, (8000, 3)) * size
        face = rng.integers(0, 5, 8000)
        p[face == 0, 2] = lo[2] + size[2]
        p[face == 1, 0], p[face == 2, 0] = lo[0], lo[0] + size[0]
        p[face == 3, 1], p[face == 4, 1] = lo[1], lo[1] + size[1]
        parts.append(p)
    return np.concatenate(parts).astype(np.float32)


def scenes(which=None, seed=0):
    """{name: coords [N, 4] int32 (batch, x, y, z)} with the spatial shape of each."""
    rng = np.random.default_rng(seed)
    out = {}
    wanted = lambda name: which is None or name in which  # noqa: E731
    if os.path.exists(LIDAR):
        pc = np.load(LIDAR)["pc"]
        for voxel, name in ((0.05, "lidar_5cm"), (0.10, "lidar_10cm")):
            if wanted(name):
                out[name] = voxelize(pc, voxel)
    for batch in (1, 4):
        name = f"synthetic_lidar_5cm_b{batch}"
        if wanted(name):
            out[name] = np.concatenate([voxelize(_lidar_like(rng), 0.05, b) for b in range(batch)])
    if wanted("indoor_2cm"):
        out["indoor_2cm"] = voxelize(_indoor(rng), 0.02)
    shaped = {}
    for name, coords in out.items():
        # Extents a multiple of 4, so two stride-2 levels divide evenly.
        spatial = ((coords[:, 1:].max(0) + 1 + 3) // 4 * 4).astype(np.int32)
        shaped[name] = (coords, spatial, int(coords[:, 0].max()) + 1)
    return shaped


def layer_weights(cin, cout, kernel, seed):
    """Weights [k, k, k, Cin, Cout] of one layer, identical in both processes."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((kernel, kernel, kernel, cin, cout)) / np.sqrt(kernel ** 3 * cin)).astype(np.float32)


def level_features(n, cin, seed):
    """Feature rows of a level's sites in sorted-coordinate order (both processes sort)."""
    return np.random.default_rng(seed).standard_normal((n, cin)).astype(np.float32)
