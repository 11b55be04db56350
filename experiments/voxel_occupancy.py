"""How the ModelNet40 clouds fill a voxel grid: occupied sites per shape and occupied
neighbours per site (of the 26 in its 3x3x3 window) at each resolution, for issue 27's
question of what a finer grid gives the networks. Clouds are centred and scaled into the
unit sphere and voxelized as the models do (tf_sparseconv.data.voxelize_arrays).

    python experiments/voxel_occupancy.py --data ../shared/data/modelnet40_train.npz

Writes experiments/results/voxel_occupancy.json (refuses to overwrite it without
--overwrite) and prints a table.
"""
import argparse
import os
import sys

import numpy as np

import tf_sparseconv as ts
from common import dumps_rows
from tf_sparseconv.data.modelnet import normalize_to_unit_sphere
from tf_sparseconv.data.voxelize import voxelize_arrays

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "voxel_occupancy.json")


def occupancy(clouds, r):
    """(mean sites per cloud, mean occupied neighbours per site) at resolution r: the pairs
    of the sites' 3x3x3 submanifold kernel map (tf_sparseconv.kernel_map), less each
    site's pair with itself."""
    keys, _, _ = voxelize_arrays(clouds, r)  # occupancy only: key = b * r^3 + (x * r + y) * r + z
    b, lin = np.divmod(keys, r ** 3)
    coords = np.stack([b, lin // (r * r), (lin // r) % r, lin % r], axis=1).astype(np.int32)
    sites = ts.make_site_sparse(coords, np.ones((len(keys), 1), np.float32), [r, r, r], len(clouds))
    pairs = int(ts.kernel_map(sites, 3, mode="submanifold").offset_splits[-1])
    return len(keys) / len(clouds), (pairs - len(keys)) / len(keys)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join("..", "shared", "data", "modelnet40_train.npz"))
    parser.add_argument("--resolutions", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if os.path.exists(args.out) and not args.overwrite:
        sys.exit(f"{args.out} exists; pass --overwrite to replace it")
    with np.load(args.data) as data:
        points = data["points"].astype(np.float64) / 255 * 2 - 1
    clouds = np.stack([normalize_to_unit_sphere(p) for p in points])
    rows = []
    for r in args.resolutions:
        sites, neighbours = occupancy(clouds, r)
        rows.append(dict(data=os.path.basename(args.data), resolution=r, clouds=len(clouds),
                         points_per_cloud=clouds.shape[1],
                         sites_per_cloud=round(sites, 1), neighbours_per_site=round(neighbours, 2)))
        print(f"{r:4d}^3: {sites:7.1f} occupied sites per cloud, {neighbours:5.2f} occupied neighbours per site",
              flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(dumps_rows(rows))
    print(f"{len(clouds)} clouds of {clouds.shape[1]} points; wrote {args.out}")


if __name__ == "__main__":
    main()
