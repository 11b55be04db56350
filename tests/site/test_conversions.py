"""Conversions of the site-sparse tensor on each device: dense grids and back (site order),
point clouds (voxelization with a point -> site map, each reduction) and the channel-sparse
tensor and back."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as tsc
from tf_sparseconv.site.conversions import (from_channel_sparse, site_from_dense, site_to_dense, to_channel_sparse,
                                            voxelize_sites)
from tf_sparseconv.site.tensor import SiteSparseTensor, make_site_sparse
from tests.device import assert_on
from tests.site.helpers import random_sites

# The conversions are compositions of TensorFlow ops, some of them (sorts, unique keys,
# int32 index arithmetic) without GPU kernels for every type: they run with soft placement,
# and the values they produce must come from the device.
pytestmark = pytest.mark.soft_placement


def test_dense_round_trip_and_site_order(rng, device):
    grid = rng.standard_normal((2, 5, 4, 6, 3)).astype(np.float32) * (rng.random((2, 5, 4, 6, 1)) < 0.2)
    with tf.device(device):
        x = site_from_dense(grid)
        back = site_to_dense(x)
    assert_on(device, x.features, back)
    expected = np.argwhere(np.any(grid != 0, axis=-1)).astype(np.int32)
    np.testing.assert_array_equal(x.coords.numpy(), expected)
    np.testing.assert_array_equal(back.numpy(), grid)
    assert x.static_spatial_shape.as_list() == [5, 4, 6]


@pytest.mark.parametrize("reduction", ["mean", "max", "first"])
def test_voxelize_reduces_points_per_voxel_and_maps_points_to_sites(rng, reduction, device):
    points = rng.uniform(-0.2, 2.2, (300, 3)).astype(np.float32)
    batch_index = rng.integers(0, 2, 300).astype(np.int32)
    point_features = rng.standard_normal((300, 2)).astype(np.float32)
    with tf.device(device):
        x, point_to_site = voxelize_sites(points, 0.5, (4, 4, 4), batch_index, 2, point_features,
                                          reduction=reduction)
    assert_on(device, x.features)
    cells = np.floor(points / 0.5).astype(np.int64)
    inside = np.all((cells >= 0) & (cells < 4), axis=1)
    p2s = point_to_site.numpy()
    np.testing.assert_array_equal(p2s < 0, ~inside)
    coords = x.coords.numpy()
    site_keys = [tuple(c) for c in coords]
    assert site_keys == sorted(set(site_keys))  # unique, sorted by batch then coordinates
    for i in np.flatnonzero(inside):
        assert tuple(coords[p2s[i]]) == (batch_index[i], *cells[i])
    for s in range(len(coords)):
        members = np.flatnonzero(p2s == s)
        expected = {"mean": point_features[members].mean(0), "max": point_features[members].max(0),
                    "first": point_features[members[0]]}[reduction]
        np.testing.assert_allclose(x.features.numpy()[s], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, voxel", [(np.float32, 3e38), (np.float64, 1e308)])
def test_voxelize_keeps_points_below_the_origin_outside_when_the_quotient_underflows(dtype, voxel, device):
    # (p - origin) / voxel is subnormal here, and TensorFlow flushes subnormal results to
    # zero: -0.2 / 3e38 must still floor to cell -1 (outside), not to cell 0. Found by the
    # site fuzz at 1,500 examples (voxel_size set to 3e38).
    points = np.array([[0.8, 0.1], [-0.2, 0.1], [0.3, -1e-30]], dtype)
    features = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype)
    with tf.device(device):
        x, point_to_site = voxelize_sites(points, dtype(voxel), (4, 4), features=features)
    np.testing.assert_array_equal(point_to_site.numpy(), [0, -1, -1])
    np.testing.assert_array_equal(x.coords.numpy(), [[0, 0, 0]])
    np.testing.assert_array_equal(x.features.numpy(), [[1.0, 2.0]])


def test_channel_sparse_round_trip(rng, device):
    coords, features = random_sites(rng, 2, (4, 5, 3), 0.3, 3)
    features[rng.random(features.shape) < 0.3] = 0
    with tf.device(device):
        x = make_site_sparse(coords, features, (4, 5, 3), 2)
        cs = to_channel_sparse(x)
        channel_dense, site_dense = tsc.to_dense(cs), site_to_dense(x)
        back = from_channel_sparse(cs)
    assert_on(device, cs.values, back.features)
    np.testing.assert_array_equal(channel_dense.numpy(), site_dense.numpy())
    keep = np.any(features != 0, axis=1)  # sites whose channels are all zero have no entry
    order = np.lexsort(coords[keep].T[::-1])
    np.testing.assert_array_equal(back.coords.numpy(), coords[keep][order])
    np.testing.assert_array_equal(back.features.numpy(), features[keep][order])


@pytest.mark.parametrize("case, message", [
    (dict(voxel_size=0.0), "voxel_size must be positive and finite"),
    (dict(voxel_size=-0.5), "voxel_size must be positive and finite"),
    (dict(voxel_size=float("nan")), "voxel_size must be positive and finite"),
    (dict(voxel_size=[0.5, 0.0, 0.5]), "voxel_size must be positive and finite"),
    (dict(batch_index=[0, -1, 0, 1]), r"batch_index must lie in \[0, batch_size\)"),
    (dict(batch_index=[0, 2, 0, 1]), r"batch_index must lie in \[0, batch_size\)"),
    (dict(nan_point=True), "points hold NaN or Inf coordinates"),
    (dict(inf_point=True), "points hold NaN or Inf coordinates"),
    (dict(nan_feature=True), "features hold NaN or Inf"),
])
def test_voxelize_refuses_bad_sizes_batches_and_non_finite_values(case, message):
    points = np.array([[0.1, 0.2, 0.3], [1.1, 0.2, 0.3], [0.6, 1.4, 0.3], [0.1, 0.2, 0.3]], np.float32)
    features = np.ones((4, 2), np.float32)
    if case.get("nan_point"):
        points[1, 2] = np.nan
    if case.get("inf_point"):
        points[2, 0] = np.inf
    if case.get("nan_feature"):
        features[3, 1] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        voxelize_sites(points, case.get("voxel_size", 0.5), (4, 4, 4), case.get("batch_index", [0, 1, 0, 1]), 2,
                       features)


def test_voxelize_drops_non_finite_points_when_asked_and_refuses_other_types():
    points = np.array([[0.1, 0.2, 0.3], [np.nan, 0.2, 0.3], [0.6, 1.4, np.inf]], np.float32)
    features = np.array([[1.0], [np.nan], [2.0]], np.float32)  # a dropped point's features are not read
    x, point_to_site = voxelize_sites(points, 0.5, (4, 4, 4), features=features, non_finite="drop")
    np.testing.assert_array_equal(point_to_site.numpy(), [0, -1, -1])
    np.testing.assert_array_equal(x.coords.numpy(), [[0, 0, 0, 0]])
    np.testing.assert_array_equal(x.features.numpy(), [[1.0]])
    with pytest.raises(TypeError, match="points must be real numbers, got complex64"):
        voxelize_sites(points.astype(np.complex64), 0.5, (4, 4, 4))
    with pytest.raises(ValueError, match="voxel_size must be a scalar or one size per axis"):
        voxelize_sites(points, [0.5, 0.5], (4, 4, 4))
    with pytest.raises(ValueError, match="non_finite must be 'raise' or 'drop'"):
        voxelize_sites(points, 0.5, (4, 4, 4), non_finite="ignore")


def test_voxelize_refuses_batch_indices_and_shapes_a_cast_would_change():
    points = np.array([[0.1, 0.2, 0.3], [1.1, 0.2, 0.3]], np.float32)
    with pytest.raises(TypeError, match="voxelize_sites: batch_index must be integers"):  # used to truncate 0.7 to 0
        voxelize_sites(points, 0.5, (4, 4, 4), batch_index=[0.0, 0.7], batch_size=2)
    with pytest.raises(ValueError, match="voxelize_sites: batch_index must lie in the int32 range"):
        voxelize_sites(points, 0.5, (4, 4, 4), batch_index=np.array([0, 2**32]), batch_size=2)
    with pytest.raises(ValueError, match="voxelize_sites: spatial_shape must lie in the int32 range"):
        voxelize_sites(points, 0.5, np.array([4, 4, 2**32 + 4]))
    with pytest.raises(TypeError, match="voxelize_sites: features must be real numbers"):
        voxelize_sites(points, 0.5, (4, 4, 4), features=np.ones((2, 1), np.complex64))


def test_site_from_dense_refuses_complex_and_non_finite_entries_unless_allowed():
    dense = np.zeros((1, 3, 2, 1), np.float32)
    dense[0, 1, 1, 0] = np.nan
    dense[0, 2, 0, 0] = 2.0
    with pytest.raises(tf.errors.InvalidArgumentError, match="site_from_dense: dense entries hold NaN or infinite"):
        site_from_dense(dense)
    x = site_from_dense(dense, non_finite="allow")
    np.testing.assert_array_equal(x.coords.numpy(), [[0, 1, 1], [0, 2, 0]])
    assert np.isnan(x.features.numpy()[0, 0]) and x.features.numpy()[1, 0] == 2.0
    with pytest.raises(TypeError, match="site_from_dense: dense must be real numbers, got complex64"):
        site_from_dense(np.ones((1, 2, 2, 1), np.complex64))


@pytest.mark.parametrize("coords,message", [
    # Duplicates used to be summed (site_to_dense) or give duplicate keys (to_channel_sparse);
    # sites out of range failed in ScatterNd or ChannelSparseEncodeKeys.
    ([[0, 1, 1], [0, 1, 1]], "sites 0 and 1 have the same coordinates"),
    ([[0, 1, 1], [-1, 2, 2]], "site 1 has batch index -1"),
    ([[0, 1, 1], [0, 2, 4]], "site 1 has coordinate 4 in spatial dimension 1"),
])
@pytest.mark.parametrize("convert", [site_to_dense, to_channel_sparse], ids=["site_to_dense", "to_channel_sparse"])
def test_site_conversions_refuse_invalid_sites(coords, message, convert):
    x = SiteSparseTensor(tf.constant(coords, tf.int32), tf.ones([2, 1]), tf.constant([4, 4]), tf.constant(1))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        convert(x)


@pytest.mark.parametrize("keys,values,message", [
    ([3, 3], [1.0, 2.0], "keys must be unique: entries 0 and 1 share key 3"),  # used to be summed
    ([-3, 3], [1.0, 2.0], "key out of range at entry 0"),
    ([1, 3], [np.nan, 2.0], "values contains NaN at position 0"),
])
def test_from_channel_sparse_validates_its_input(keys, values, message):
    x = tsc.ChannelSparseTensor(tf.constant(keys, tf.int64), tf.constant(values), tf.constant([1, 2, 2, 1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        from_channel_sparse(x)


@pytest.mark.parametrize("dense_shape,what", [([2**31, 2, 2, 1], r"batch size \(dense_shape\[0\]\)"),
                                              ([1, 2, 2, 2**31], r"channel count \(dense_shape\[-1\]\)")])
def test_from_channel_sparse_refuses_a_batch_or_channel_count_beyond_int32(dense_shape, what):
    # A site tensor counts them in int32: the batch size used to wrap to -2^31.
    x = tsc.ChannelSparseTensor(tf.constant([0], tf.int64), tf.constant([1.0]), tf.constant(dense_shape, tf.int64))
    with pytest.raises(ValueError, match=f"from_channel_sparse: x's {what} must lie in the int32 range"):
        from_channel_sparse(x)


@pytest.mark.parametrize("case, message", [
    (dict(spatial_shape=(4, 4)), r"spatial_shape must have shape \[3\]"),
    (dict(spatial_shape=(4,)), r"spatial_shape must have shape \[3\]"),
    (dict(origin=np.zeros((1, 3), np.float32)), r"origin must have shape \[3\]"),
    (dict(batch_size=[2]), r"batch_size must have shape \[\]"),
    (dict(features=np.ones(4, np.float32)), r"features must have shape \[None, None\]"),
    (dict(features=np.ones((3, 2), np.float32)), "features must have one row per point"),
    (dict(batch_index=[0, 1, 0]), "batch_index must have one row per point"),
])
def test_voxelize_refuses_inputs_of_other_shapes_than_the_points(case, message):
    # Such shapes used to broadcast (an origin [1, d], one extent for every axis) or fail
    # inside TensorFlow's ops with their messages.
    points = np.array([[0.1, 0.2, 0.3], [1.1, 0.2, 0.3], [0.6, 1.4, 0.3], [0.1, 0.2, 0.3]], np.float32)
    args = dict(spatial_shape=(4, 4, 4), batch_index=[0, 1, 0, 1], batch_size=2, features=np.ones((4, 2), np.float32),
                origin=np.zeros(3, np.float32))
    args.update(case)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=f"voxelize_sites: {message}"):
        voxelize_sites(points, 0.5, **args)


@pytest.mark.parametrize("dtype, tiny", [(np.float32, 1e-40), (np.float64, 5e-324)])
def test_conversions_move_subnormal_values_unchanged(dtype, tiny, device):
    # Data movement writes each value as it is: a sum into zeros (scatter_nd) flushed these
    # to 0 (TensorFlow computes with subnormals flushed). Found by the site fuzz (values set
    # to 5e-324) at 1,500 examples.
    # dense_shape [1, 2, 2, 2] (key = (b * C + c) * 4 + 2 * x0 + x1): entries at
    # (0, 0, 0) channel 0, (0, 0, 1) channel 1, (0, 1, 1) channel 1
    keys = np.array([0, 5, 7], np.int64)
    values = np.array([tiny, 0.5, -tiny], dtype)
    with tf.device(device):
        x = from_channel_sparse(tsc.ChannelSparseTensor(keys, values, np.array([1, 2, 2, 2], np.int64)))
        dense = site_to_dense(x)
    np.testing.assert_array_equal(x.coords.numpy(), [[0, 0, 0], [0, 0, 1], [0, 1, 1]])
    np.testing.assert_array_equal(x.features.numpy(), np.array([[tiny, 0], [0, 0.5], [0, -tiny]], dtype))
    expected = np.zeros((1, 2, 2, 2), dtype)
    expected[0, 0, 0, 0], expected[0, 0, 1, 1], expected[0, 1, 1, 1] = tiny, 0.5, -tiny
    np.testing.assert_array_equal(dense.numpy(), expected)


@pytest.mark.parametrize("origin, error, message", [
    ([np.nan, 0.0, 0.0], tf.errors.InvalidArgumentError, "voxelize_sites: origin must be finite"),
    ([np.inf, 0.0, 0.0], tf.errors.InvalidArgumentError, "voxelize_sites: origin must be finite"),
    (np.array([1j, 0, 0]), TypeError, "voxelize_sites: origin must be real numbers, got complex128"),
    ("a", TypeError, "voxelize_sites: origin must be real numbers, got string"),
], ids=["nan", "inf", "complex", "string"])
def test_voxelize_refuses_an_origin_that_is_not_finite_and_real(origin, error, message):
    # Before: a NaN or infinite origin silently left every point outside the grid (0 sites), a
    # complex one lost its imaginary part, a string failed in TensorFlow's Cast ("Cast string
    # to float is not supported").
    points = np.random.default_rng(0).random((10, 3)).astype(np.float32)
    with pytest.raises(error, match=message):
        tsc.voxelize_sites(points, 0.1, [10, 10, 10], origin=origin)
    assert int(tsc.voxelize_sites(points, 0.1, [10, 10, 10], origin=np.zeros(3))[0].num_sites) > 0
