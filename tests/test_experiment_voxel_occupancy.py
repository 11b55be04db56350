"""experiments/voxel_occupancy.py: sites per cloud and occupied neighbours per site on
clouds whose voxels are known, and its refusal to overwrite results."""
import json
import os
import sys

import numpy as np
import pytest

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
sys.path.insert(0, EXPERIMENTS)
import voxel_occupancy  # noqa: E402


def voxel_centres(cells, r):
    """Points at the centres of the given voxels of an r^3 grid over [-1, 1]^3."""
    return (np.asarray(cells, np.float64) + 0.5) * (2.0 / r) - 1.0


def test_counts_sites_and_their_occupied_neighbours():
    r = 8
    # cloud 0: a row of three voxels (two neighbours for the middle one, one each for the
    # ends) and a lone voxel, the first voxel's point five times (one site); cloud 1: a
    # full 2x2x2 block (7 neighbours each)
    row = [[1, 1, 1], [2, 1, 1], [3, 1, 1], [6, 6, 6]]
    block = [[x, y, z] for x in (4, 5) for y in (4, 5) for z in (4, 5)]
    clouds = [voxel_centres(row + row[:1] * 4, r), voxel_centres(block, r)]
    sites, neighbours = voxel_occupancy.occupancy(clouds, r)
    assert sites == pytest.approx((4 + 8) / 2)
    assert neighbours == pytest.approx((1 + 2 + 1 + 0 + 8 * 7) / 12)


def test_writes_rows_and_refuses_to_overwrite(tmp_path, capsys):
    rng = np.random.default_rng(0)
    points = rng.integers(0, 256, (5, 64, 3), dtype=np.uint8)
    data = tmp_path / "clouds.npz"
    np.savez(data, points=points, labels=np.zeros(5, np.uint8))
    out = tmp_path / "occupancy.json"
    voxel_occupancy.main(["--data", str(data), "--resolutions", "4", "8", "--out", str(out)])
    rows = json.loads(out.read_text())
    assert [row["resolution"] for row in rows] == [4, 8]
    assert all(row["clouds"] == 5 and 1 <= row["sites_per_cloud"] <= 64 for row in rows)
    assert rows[0]["sites_per_cloud"] <= rows[1]["sites_per_cloud"]  # a finer grid splits sites
    with pytest.raises(SystemExit, match="exists"):
        voxel_occupancy.main(["--data", str(data), "--resolutions", "4", "--out", str(out)])
