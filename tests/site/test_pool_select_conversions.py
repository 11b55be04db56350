"""Site pooling against dense pooling, global pooling, density-bounded site selection,
the conversions (dense, point clouds, channel-sparse), and the site-sparse tensor in
tf.function, tf.data and SavedModel."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as tsc
from tf_sparseconv.site import global_pool, select_sites, site_conv, site_pool
from tf_sparseconv.site.conversions import (from_channel_sparse, site_from_dense, site_to_dense, to_channel_sparse,
                                            voxelize_sites)
from tf_sparseconv.site.tensor import SiteSparseTensor, make_site_sparse
from tests.site.helpers import random_sites, rows_at, to_grid


def test_max_pool_matches_dense_max_pool_where_empty_cells_are_minus_infinity(rng):
    batch, shape = 2, (8, 6, 10)
    coords, features = random_sites(rng, batch, shape, 0.2, 3)
    y = site_pool(make_site_sparse(coords, features, shape, batch), 2, mode="max")
    dense = tf.nn.max_pool3d(to_grid(coords, features, batch, shape, fill=-np.inf), 2, 2, "VALID").numpy()
    # The windows holding a site, from an occupancy grid: TensorFlow's oneDNN max-pool on some
    # CPUs (AVX-512 ones here) returns the lowest float, not -inf, for an all -inf window.
    occupied = tf.nn.max_pool3d(to_grid(coords, np.ones((len(coords), 1), np.float32), batch, shape), 2, 2,
                                "VALID").numpy()
    expected_sites = np.argwhere(occupied[..., 0] > 0.5).astype(np.int32)
    assert 0 < len(expected_sites) < occupied[..., 0].size  # some windows empty, some not
    np.testing.assert_array_equal(y.coords.numpy(), expected_sites)
    np.testing.assert_array_equal(y.features.numpy(), rows_at(dense, expected_sites))


def test_avg_pool_averages_over_the_active_sites_of_each_window(rng):
    batch, shape = 2, (9, 9)
    coords, features = random_sites(rng, batch, shape, 0.3, 2)
    y = site_pool(make_site_sparse(coords, features, shape, batch), 3, strides=3, mode="avg")
    summed = tf.nn.avg_pool2d(to_grid(coords, features, batch, shape), 3, 3, "VALID").numpy() * 9
    count = tf.nn.avg_pool2d(to_grid(coords, np.ones((len(coords), 1), np.float32), batch, shape), 3, 3,
                             "VALID").numpy() * 9
    sites = np.argwhere(count[..., 0] > 0.5).astype(np.int32)
    np.testing.assert_array_equal(y.coords.numpy(), sites)
    np.testing.assert_allclose(y.features.numpy(), rows_at(summed / np.maximum(count, 1), sites), rtol=1e-5)


def test_pool_gradients_match_numerical_gradients(rng):
    coords, features = random_sites(rng, 2, (6, 6, 6), 0.3, 2, np.float64)
    x = make_site_sparse(coords, features, (6, 6, 6), 2)
    for mode in ("max", "avg"):
        theoretical, numerical = tf.test.compute_gradient(
            lambda f: site_pool(x.with_features(f), 2, mode=mode).features, [tf.constant(features)])
        np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-6)


def test_global_pool_per_batch_element_and_empty_elements_give_zero(rng):
    coords, features = random_sites(rng, 3, (5, 5), 0.3, 4)
    coords, features = coords[coords[:, 0] != 1], features[coords[:, 0] != 1]  # batch element 1 is empty
    x = make_site_sparse(coords, features, (5, 5), 3)
    for mode, reduce in (("max", np.max), ("mean", np.mean), ("sum", np.sum)):
        pooled = global_pool(x, mode).numpy()
        for b in range(3):
            mine = features[coords[:, 0] == b]
            expected = reduce(mine, axis=0) if len(mine) else np.zeros(4)
            np.testing.assert_allclose(pooled[b], expected, rtol=1e-5, err_msg=f"{mode}, batch {b}")


def test_select_sites_keeps_the_k_largest_per_batch_element_in_order(rng):
    coords, features = random_sites(rng, 3, (10, 10), 0.4, 3)
    features[5] = features[6]  # a tie: the lower row wins
    x = make_site_sparse(coords, features, (10, 10), 3)
    k = 7
    y = select_sites(x, k)
    norms = np.linalg.norm(features, axis=1)
    expected = []
    for b in range(3):
        rows = np.flatnonzero(coords[:, 0] == b)
        ranked = sorted(rows, key=lambda r: (-norms[r], r))
        expected += ranked[:k]
    expected = np.sort(expected)
    np.testing.assert_array_equal(y.coords.numpy(), coords[expected])
    np.testing.assert_array_equal(y.features.numpy(), features[expected])
    assert y.coords.shape[0] <= 3 * k
    with pytest.raises(ValueError, match="k >= 1"):
        select_sites(x, 0)


def test_dense_round_trip_and_site_order(rng):
    grid = rng.standard_normal((2, 5, 4, 6, 3)).astype(np.float32) * (rng.random((2, 5, 4, 6, 1)) < 0.2)
    x = site_from_dense(grid)
    expected = np.argwhere(np.any(grid != 0, axis=-1)).astype(np.int32)
    np.testing.assert_array_equal(x.coords.numpy(), expected)
    np.testing.assert_array_equal(site_to_dense(x).numpy(), grid)
    assert x.static_spatial_shape.as_list() == [5, 4, 6]


@pytest.mark.parametrize("reduction", ["mean", "max", "first"])
def test_voxelize_reduces_points_per_voxel_and_maps_points_to_sites(rng, reduction):
    points = rng.uniform(-0.2, 2.2, (300, 3)).astype(np.float32)
    batch_index = rng.integers(0, 2, 300).astype(np.int32)
    point_features = rng.standard_normal((300, 2)).astype(np.float32)
    x, point_to_site = voxelize_sites(points, 0.5, (4, 4, 4), batch_index, 2, point_features, reduction=reduction)
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


def test_channel_sparse_round_trip(rng):
    coords, features = random_sites(rng, 2, (4, 5, 3), 0.3, 3)
    features[rng.random(features.shape) < 0.3] = 0
    x = make_site_sparse(coords, features, (4, 5, 3), 2)
    cs = to_channel_sparse(x)
    np.testing.assert_array_equal(tsc.to_dense(cs).numpy(), site_to_dense(x).numpy())
    back = from_channel_sparse(cs)
    keep = np.any(features != 0, axis=1)  # sites whose channels are all zero have no entry
    order = np.lexsort(coords[keep].T[::-1])
    np.testing.assert_array_equal(back.coords.numpy(), coords[keep][order])
    np.testing.assert_array_equal(back.features.numpy(), features[keep][order])


def test_site_tensor_in_tf_function_tf_data_and_saved_model(rng, tmp_path):
    coords, features = random_sites(rng, 2, (6, 6, 6), 0.3, 2)
    x = make_site_sparse(coords, features, (6, 6, 6), 2)
    kernel = tf.Variable(rng.standard_normal((3, 3, 3, 2, 4)).astype(np.float32))
    down = tf.Variable(rng.standard_normal((3, 3, 3, 4, 2)).astype(np.float32))

    class Net(tf.Module):
        def __init__(self):
            self.kernel, self.down = kernel, down

        @tf.function(input_signature=[SiteSparseTensor.spec([6, 6, 6], 2)])
        def __call__(self, x):
            y = site_conv(x, self.kernel, subm=True, indice_key="s1")
            return site_conv(y, self.down, strides=2, padding=1).features

    net = Net()
    eager = site_conv(site_conv(x, kernel, subm=True), down, strides=2, padding=1).features.numpy()
    np.testing.assert_allclose(net(x).numpy(), eager, rtol=1e-5)
    tf.saved_model.save(net, str(tmp_path / "net"))
    np.testing.assert_allclose(tf.saved_model.load(str(tmp_path / "net"))(x).numpy(), eager, rtol=1e-5)
    dataset = tf.data.Dataset.from_tensors(x).repeat(2).map(lambda s: s.with_features(s.features * 2))
    for item in dataset:
        assert isinstance(item, SiteSparseTensor)
        np.testing.assert_array_equal(item.features.numpy(), features * 2)


def test_type_checks():
    with pytest.raises(TypeError, match="must be int32"):
        SiteSparseTensor(tf.zeros([1, 3], tf.int64), tf.zeros([1, 2]), tf.constant([4, 4]), tf.constant(1))
    with pytest.raises(ValueError, match="2 sites but 3 feature rows"):
        make_site_sparse(np.zeros((2, 3), np.int32), np.zeros((3, 2), np.float32), (4, 4), 1)
    with pytest.raises(ValueError, match="coords must be"):
        make_site_sparse(np.zeros((2, 4), np.int32), np.zeros((2, 2), np.float32), (4, 4), 1)
