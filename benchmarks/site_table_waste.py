"""How much work the output-stationary (table) tiles do beyond the pairs: for each
submanifold map of the benchmark scenes, the rows a tile multiplies (tile rows times the
offsets in the union of their neighbour masks, summed over tiles) over the map's pairs,
for tile heights of 128, 64 and 32 rows and for the offsets split into 1, 2 or 3 groups
that are each sorted by their own part of the mask (spconv's mask split). 1.0 would be
no waste; the pair tiles' work is 1.0 plus the padding of each offset's last tile.

CPU only (it counts, it does not time):
    python benchmarks/site_table_waste.py [--scenes synthetic_lidar_5cm_b1 indoor_2cm]
Writes JSON lines to benchmarks/results/site_table_waste.jsonl.
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
from site_scenes import scenes  # noqa: E402

from tf_sparseconv.ops.site_conv import kernel_map  # noqa: E402
from tf_sparseconv.site_sparse_tensor import make_site_sparse  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "site_table_waste.jsonl")


def neighbour_masks(kmap, num_out):
    """Bit q of masks[o]: output o has a pair at offset q."""
    splits = kmap.offset_splits.numpy()
    out_rows = kmap.out_rows.numpy()
    masks = np.zeros(num_out, np.uint32)
    for q in range(len(splits) - 1):
        masks[out_rows[splits[q]:splits[q + 1]]] |= np.uint32(1 << q)
    return masks


def tile_work(masks, volume, groups, tile_rows):
    """Rows multiplied by tiles of tile_rows outputs, the offsets split into `groups`
    contiguous groups, each with the outputs sorted (stably) by that group's mask bits."""
    bounds = np.linspace(0, volume, groups + 1).astype(int)
    work = 0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        part = (masks >> np.uint32(lo)) & np.uint32((1 << (hi - lo)) - 1)
        part = np.sort(part, kind="stable")
        n_tiles = (len(part) + tile_rows - 1) // tile_rows
        padded = np.zeros(n_tiles * tile_rows, np.uint32)
        padded[:len(part)] = part
        unions = np.bitwise_or.reduce(padded.reshape(n_tiles, tile_rows), axis=1)
        work += int(sum(bin(int(u)).count("1") for u in unions)) * tile_rows
    return work


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenes", nargs="*", default=["lidar_5cm", "synthetic_lidar_5cm_b1", "indoor_2cm"])
    p.add_argument("--out", default=DEFAULT_OUT)
    args = p.parse_args()
    rows = []
    for scene, (coords, spatial, batch) in scenes(args.scenes).items():
        x = make_site_sparse(coords, np.zeros((len(coords), 1), np.float32), spatial, batch)
        for level in range(3):
            m = kernel_map(x, 3, mode="submanifold")
            n = int(x.coords.shape[0])
            masks = neighbour_masks(m, n)
            pairs = int(m.in_rows.shape[0])
            for groups in (1, 2, 3):
                for tile_rows in (128, 64, 32):
                    ratio = tile_work(masks, 27, groups, tile_rows) / pairs
                    rows.append({"scene": scene, "level": level, "sites": n, "pairs": pairs, "mask_groups": groups,
                                 "tile_rows": tile_rows, "work_over_pairs": round(ratio, 4)})
            print(f"[waste] {scene} level {level}: {n:,} sites, {pairs:,} pairs; 128-row tiles, 1/2/3 mask groups: "
                  + " / ".join(f"{r['work_over_pairs']:.2f}" for r in rows[-9::3]), flush=True)
            if level < 2:
                down = kernel_map(x, 2, 2, mode="strided")
                x = make_site_sparse(down.out_coords, tf.zeros([tf.shape(down.out_coords)[0], 1]),
                                     down.out_spatial_shape, batch)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    worst = max((r for r in rows if r["mask_groups"] == 1 and r["tile_rows"] == 128),
                key=lambda r: r["work_over_pairs"])
    print(f"[waste] {len(rows)} rows -> {args.out}; largest waste with today's tiles (128 rows, one mask): "
          f"{worst['scene']} level {worst['level']}, {worst['work_over_pairs']:.2f}x the pairs")


if __name__ == "__main__":
    main()
