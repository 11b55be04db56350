"""Voxelization against a per-point loop reference: occupancy, counts, mean normals, clipping,
key order, errors."""
import time

import numpy as np
import pytest

import tf_sparseconv as ts
from tf_sparseconv.data.voxelize import num_channels, voxelize_arrays, voxelize_points


def reference_grid(clouds, r, features, bounds=(-1.0, 1.0)):
    """Dense [B, r, r, r, C] built point by point."""
    lo, hi = bounds
    grid_count = np.zeros([len(clouds), r, r, r])
    grid_normal = np.zeros([len(clouds), r, r, r, 3])
    grid_offset = np.zeros([len(clouds), r, r, r, 3])
    for b, cloud in enumerate(clouds):
        for point in cloud:
            cell = [min(max(int(np.floor((v - lo) / (hi - lo) * r)), 0), r - 1) for v in point[:3]]
            grid_count[(b, *cell)] += 1
            if len(point) >= 6:
                grid_normal[(b, *cell)] += point[3:6]
            voxel = (hi - lo) / r
            grid_offset[(b, *cell)] += [(v - (lo + (c + 0.5) * voxel)) / voxel for v, c in zip(point[:3], cell)]
    occupied = grid_count > 0
    channels = []
    for feature in features:
        if feature == "occupancy":
            channels.append(occupied.astype(float)[..., None])
        elif feature == "count":
            channels.append(grid_count[..., None])
        elif feature == "offset":
            channels.append(np.clip(np.divide(grid_offset, grid_count[..., None], out=np.zeros_like(grid_offset),
                                              where=occupied[..., None]), -0.5, 0.5))
        else:
            channels.append(np.divide(grid_normal, grid_count[..., None], out=np.zeros_like(grid_normal),
                                      where=occupied[..., None]))
    return np.concatenate(channels, axis=-1)


def random_clouds(rng, batch, n, with_normals=True, spread=1.2):
    clouds = rng.uniform(-spread, spread, (batch, n, 3))
    if not with_normals:
        return clouds
    normals = rng.normal(size=(batch, n, 3))
    normals /= np.linalg.norm(normals, axis=2, keepdims=True)
    normals[:, : n // 4, 1:] = 0  # axis-aligned normals: exact zeros, which are not stored
    normals[:, : n // 4, 0] = 1
    return np.concatenate([clouds, normals], 2)


@pytest.mark.parametrize("features", [("occupancy",), ("occupancy", "count"), ("occupancy", "normals"),
                                      ("normals", "count", "occupancy"), ("occupancy", "offset"),
                                      ("offset", "normals")])
@pytest.mark.parametrize("resolution", [1, 4, 7])
def test_matches_loop_reference(rng, features, resolution):
    clouds = random_clouds(rng, 3, 60)
    x = voxelize_points(clouds, resolution, features=features)
    ts.validate(x)
    expected = reference_grid(clouds, resolution, features)
    assert x.dense_shape.numpy().tolist() == [3, resolution, resolution, resolution, num_channels(features)]
    np.testing.assert_allclose(ts.to_dense(x).numpy(), expected, rtol=1e-6, atol=1e-7)
    # Nothing stored is zero: the channel-sparse form of the dense grid, as from_dense gives it.
    assert np.all(x.values.numpy() != 0)
    np.testing.assert_array_equal(x.keys.numpy(), ts.from_dense(expected.astype(np.float32)).keys.numpy())


def test_offset_is_the_mean_position_in_the_voxel_in_voxel_units():
    # r = 4 on [-1, 1]: voxels of 0.5; voxel (2, 1, 3) spans [0, 0.5) x [-0.5, 0) x [0.5, 1), centre (.25, -.25, .75)
    cloud = np.array([[[0.05, -0.30, 0.90], [0.15, -0.40, 0.80],   # mean (0.1, -0.35, 0.85)
                       [5.0, 0.0, -5.0]]])                           # clipped into voxel (3, 2, 0): offset clipped
    x = voxelize_points(cloud, 4, features=("offset",))
    grid = ts.to_dense(x).numpy()[0]
    np.testing.assert_allclose(grid[2, 1, 3], [(0.1 - 0.25) / 0.5, (-0.35 + 0.25) / 0.5, (0.85 - 0.75) / 0.5],
                               atol=1e-6)
    np.testing.assert_allclose(grid[3, 2, 0], [0.5, -0.5, -0.5])  # (8.5, -0.5, -8.5) clipped
    assert np.count_nonzero(grid) == 6


def test_keys_follow_the_formula_channel_major(rng):

    clouds = random_clouds(rng, 2, 30)
    r = 5
    keys, values, dense_shape = voxelize_arrays(clouds, r, features=("occupancy", "count"))
    assert np.all(np.diff(keys) > 0)
    # The formula from each point's cell, not from the keys themselves (decoding keys and
    # encoding them again gives them back whatever cells they name).
    cells = np.clip(np.floor((clouds[..., :3] + 1.0) * (r / 2.0)), 0, r - 1).astype(np.int64)
    sites = [np.unique((cell[:, 0] * r + cell[:, 1]) * r + cell[:, 2]) for cell in cells]
    np.testing.assert_array_equal(keys, np.concatenate([(batch * 2 + channel) * r ** 3 + sites[batch]
                                                        for batch in range(2) for channel in range(2)]))
    indices = ts.decode_keys(keys, dense_shape).numpy()
    b, x, y, z, c = indices.T
    # Every occupied site appears once per channel, occupancy block before count block in each batch.
    for batch in range(2):
        channel = c[b == batch]
        assert np.all(np.diff(channel) >= 0)
        assert (channel == 0).sum() == (channel == 1).sum()


def test_variable_sized_list_and_empty_cloud(rng):
    clouds = [rng.uniform(-1, 1, (n, 3)) for n in (5, 0, 17)]
    x = voxelize_points(clouds, 6, features=("occupancy", "count"))
    ts.validate(x)
    np.testing.assert_allclose(ts.to_dense(x).numpy(), reference_grid(clouds, 6, ("occupancy", "count")))
    assert voxelize_points([], 4).dense_shape.numpy().tolist() == [0, 4, 4, 4, 1]


def test_outside_bounds_are_clipped_and_custom_bounds():
    points = np.array([[[-5.0, 0.0, 9.0], [1.0, 1.0, 1.0], [0.999, -1.0, -1.0]]])
    dense = ts.to_dense(voxelize_points(points, 4)).numpy()[0, ..., 0]
    assert dense[0, 2, 3] == 1 and dense[3, 3, 3] == 1 and dense[3, 0, 0] == 1 and dense.sum() == 3
    dense = ts.to_dense(voxelize_points(points, 4, bounds=(0.0, 2.0))).numpy()[0, ..., 0]
    assert dense[0, 0, 3] == 1 and dense[2, 2, 2] == 1 and dense[1, 0, 0] == 1


def test_nan_or_inf_names_the_cloud(rng):
    clouds = [rng.uniform(-1, 1, (4, 3)) for _ in range(3)]
    clouds[2][1, 0] = np.nan
    with pytest.raises(ValueError, match="point cloud 2 contains NaN or infinite"):
        voxelize_points(clouds, 8)
    batch = rng.uniform(-1, 1, (3, 4, 6))
    batch[1, 3, 4] = np.inf
    voxelize_points(batch, 8)  # the normal is not read for occupancy
    with pytest.raises(ValueError, match="point cloud 1 contains NaN or infinite"):
        voxelize_points(batch, 8, features=("occupancy", "normals"))


def test_bad_arguments(rng):
    with pytest.raises(ValueError, match="features"):
        voxelize_points(rng.uniform(-1, 1, (1, 4, 3)), 8, features=("occupancy", "colour"))
    with pytest.raises(ValueError, match=r"\[N, 6\]"):
        voxelize_points([rng.uniform(-1, 1, (4, 3))], 8, features=("occupancy", "normals"))
    with pytest.raises(ValueError, match="resolution"):
        voxelize_points(rng.uniform(-1, 1, (1, 4, 3)), 0)
    with pytest.raises(ValueError, match="bounds"):
        voxelize_points(rng.uniform(-1, 1, (1, 4, 3)), 8, bounds=(1.0, -1.0))


def test_dtype():
    x = voxelize_points([np.zeros((2, 3))], 3, (-1.0, 1.0), np.float64)
    assert x.dtype == np.float64 and x.keys.numpy().tolist() == [13]


def test_batch_of_32_clouds_at_32_cubed_is_fast(rng):
    clouds = rng.normal(size=(32, 1024, 3)).astype(np.float32)
    clouds /= np.linalg.norm(clouds, axis=2, keepdims=True)
    voxelize_arrays(clouds, 32)
    best = min(_timed(voxelize_arrays, clouds, 32) for _ in range(10))
    # About 1.5 ms on the 2-core development machine; the bound only catches a fallback to loops.
    assert best < 0.05, f"voxelizing 32 x 1024 points at 32^3 took {best * 1e3:.1f} ms"


def _timed(f, *args):
    start = time.perf_counter()
    f(*args)
    return time.perf_counter() - start


@pytest.mark.parametrize("resolution,bounds,message", [
    (True, (-1.0, 1.0), "resolution must be a whole number >= 1"),   # was a resolution of 1
    ("a", (-1.0, 1.0), "resolution must be a whole number >= 1"),    # failed in int()
    (4, (0.0, 1.0, 2.0), "bounds must be"),                           # taken as (0, 1)
    (4, "ab", "bounds must be"),                                      # failed in float()
    (2 ** 22, (-1.0, 1.0), "resolution 4194304 makes keys beyond int64"),  # an OverflowError
])
def test_voxelize_arrays_refuses_bad_resolutions_and_bounds(resolution, bounds, message):
    with pytest.raises(ValueError, match="voxelize_arrays: " + message):
        voxelize_arrays(np.zeros((1, 4, 3)), resolution, bounds)
