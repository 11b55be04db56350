"""Site pooling (TensorFlow's segment reductions over a strided kernel map) against dense
max and average pooling, its gradients against the numerical Jacobian, and global pooling
per batch element; on each device."""
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv.site import global_pool, site_conv, site_pool
from tf_sparseconv.site.tensor import SiteSparseTensor, make_site_sparse
from tests.device import CPU, assert_on
from tests.site.helpers import random_sites, rows_at, to_grid


def test_max_pool_matches_dense_max_pool_where_empty_cells_are_minus_infinity(rng, device):
    batch, shape = 2, (8, 6, 10)
    coords, features = random_sites(rng, batch, shape, 0.2, 3)
    with tf.device(device):
        y = site_pool(make_site_sparse(coords, features, shape, batch), 2, mode="max")
    with tf.device(CPU):
        dense = tf.nn.max_pool3d(to_grid(coords, features, batch, shape, fill=-np.inf), 2, 2, "VALID").numpy()
        # The windows holding a site, from an occupancy grid: TensorFlow's oneDNN max-pool on some
        # CPUs (AVX-512 ones here) returns the lowest float, not -inf, for an all -inf window.
        occupied = tf.nn.max_pool3d(to_grid(coords, np.ones((len(coords), 1), np.float32), batch, shape), 2, 2,
                                    "VALID").numpy()
    expected_sites = np.argwhere(occupied[..., 0] > 0.5).astype(np.int32)
    assert 0 < len(expected_sites) < occupied[..., 0].size  # some windows empty, some not
    np.testing.assert_array_equal(y.coords.numpy(), expected_sites)
    np.testing.assert_array_equal(y.features.numpy(), rows_at(dense, expected_sites))


def test_avg_pool_averages_over_the_active_sites_of_each_window(rng, device):
    batch, shape = 2, (9, 9)
    coords, features = random_sites(rng, batch, shape, 0.3, 2)
    with tf.device(device):
        y = site_pool(make_site_sparse(coords, features, shape, batch), 3, strides=3, mode="avg")
    with tf.device(CPU):
        summed = tf.nn.avg_pool2d(to_grid(coords, features, batch, shape), 3, 3, "VALID").numpy() * 9
        count = tf.nn.avg_pool2d(to_grid(coords, np.ones((len(coords), 1), np.float32), batch, shape), 3, 3,
                                 "VALID").numpy() * 9
    sites = np.argwhere(count[..., 0] > 0.5).astype(np.int32)
    np.testing.assert_array_equal(y.coords.numpy(), sites)
    np.testing.assert_allclose(y.features.numpy(), rows_at(summed / np.maximum(count, 1), sites), rtol=1e-5)


@pytest.mark.soft_placement
def test_pool_gradients_match_numerical_gradients(rng, device):
    coords, _ = random_sites(rng, 2, (6, 6, 6), 0.3, 2, np.float64)
    # Distinct magnitudes 1/8 apart: no two values of a window within a finite-difference
    # step of each other, where the numerical Jacobian of the max would split.
    features = (0.25 + 0.125 * rng.permutation(2 * len(coords))).reshape(-1, 2) * rng.choice([-1.0, 1.0],
                                                                                            (len(coords), 2))
    with tf.device(device):
        x = make_site_sparse(coords, features, (6, 6, 6), 2)
    for mode in ("max", "avg"):
        def pooled(f, mode=mode):
            y = site_pool(x.with_features(f), 2, mode=mode).features
            assert_on(device, y)
            return y

        with tf.device(device):
            theoretical, numerical = tf.test.compute_gradient(pooled, [tf.constant(features)])
        np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-6)


@pytest.mark.soft_placement  # TensorFlow's segment reductions of int32 counts
def test_global_pool_per_batch_element_and_empty_elements_give_zero(rng, device):
    coords, features = random_sites(rng, 3, (5, 5), 0.3, 4)
    coords, features = coords[coords[:, 0] != 1], features[coords[:, 0] != 1]  # batch element 1 is empty
    with tf.device(device):
        x = make_site_sparse(coords, features, (5, 5), 3)
    for mode, reduce in (("max", np.max), ("mean", np.mean), ("sum", np.sum)):
        with tf.device(device):
            pooled = global_pool(x, mode)
        assert_on(device, pooled)
        pooled = pooled.numpy()
        for b in range(3):
            mine = features[coords[:, 0] == b]
            expected = reduce(mine, axis=0) if len(mine) else np.zeros(4)
            np.testing.assert_allclose(pooled[b], expected, rtol=1e-5, err_msg=f"{mode}, batch {b}")


def test_site_pool_refuses_a_window_beyond_the_kernel_volume_limit():
    # A 4097^3 window used to size a vector by its volume: SIGSEGV.
    x = make_site_sparse(np.zeros((1, 4), np.int32), np.ones((1, 1), np.float32), (4097, 4097, 4097), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"kernel_size \[4097, 4097, 4097\] has more than"):
        site_pool(x, 4097)


@pytest.mark.parametrize("coords,message", [
    # Duplicates used to be pooled twice, a negative batch index dropped, a site outside the grid kept.
    ([[0, 1, 1], [0, 1, 1]], "sites 0 and 1 have the same coordinates"),
    ([[0, 1, 1], [-1, 2, 2]], "site 1 has batch index -1"),
    ([[0, 1, 1], [2, 2, 2]], "site 1 has batch index 2"),  # used to fail in UnsortedSegmentSum
    ([[0, 1, 1], [0, 9, 2]], "site 1 has coordinate 9 in spatial dimension 0"),
])
@pytest.mark.parametrize("mode", ["max", "mean", "sum"])
def test_global_pool_refuses_invalid_sites(coords, message, mode):
    x = SiteSparseTensor(tf.constant(coords, tf.int32), tf.ones([2, 1]), tf.constant([5, 5]), tf.constant(2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        global_pool(x, mode)


def test_a_nan_feature_pools_to_nan_wherever_it_sits(rng):
    # TensorFlow's segment max kept or dropped a NaN depending on its row.
    coords = np.array([[0, 0, 0], [0, 0, 1], [0, 3, 3], [1, 2, 2]], np.int32)
    for nan_row in (0, 1):
        features = np.array([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [4.0, 8.0]], np.float32)
        features[nan_row, 0] = np.nan
        x = make_site_sparse(coords, features, (4, 4), 2, non_finite="allow")
        for mode in ("max", "mean", "sum"):
            pooled = global_pool(x, mode).numpy()
            assert np.isnan(pooled[0, 0]) and not np.isnan(pooled[0, 1]) and not np.isnan(pooled[1]).any(), mode
        for mode in ("max", "avg"):
            windows = site_pool(x, 2, mode=mode)  # sites 0 and 1 share window (0, 0, 0)
            np.testing.assert_array_equal(np.isnan(windows.features.numpy()),
                                          [[True, False], [False, False], [False, False]], err_msg=mode)


@pytest.mark.soft_placement  # TensorFlow's segment reductions of int32 counts
def test_max_pools_of_minus_infinity_alone_are_minus_infinity(device):
    # TensorFlow's segment max starts from the lowest float32 and returned it, -3.4e38, for a
    # window (or batch element) whose features are all -inf.
    coords = np.array([[0, 0, 0], [0, 0, 1], [0, 3, 3], [1, 2, 2]], np.int32)
    features = np.array([[-np.inf, 5.0], [-np.inf, -np.inf], [3.0, -np.inf], [-np.inf, 8.0]], np.float32)
    with tf.device(device):
        x = make_site_sparse(coords, features, (4, 4), 3, non_finite="allow")
        windows = site_pool(x, 2, mode="max").features.numpy()  # sites 0 and 1 share window (0, 0, 0)
        pooled = global_pool(x, "max").numpy()
    np.testing.assert_array_equal(windows, [[-np.inf, 5.0], [3.0, -np.inf], [-np.inf, 8.0]])
    np.testing.assert_array_equal(pooled, [[3.0, 5.0], [-np.inf, 8.0], [0.0, 0.0]])  # batch 2: no site


def test_global_pool_of_a_model_tensor_builds_no_check_map(rng):
    coords, features = random_sites(rng, 2, (5, 5), 0.4, 2)
    x = make_site_sparse(coords, features, (5, 5), 2)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)
    # After a layer with an indice_key the sites are a trusted map's: SiteKernelMap checked them.
    graph = tf.function(lambda t: global_pool(site_conv(t, w, subm=True, indice_key="k"))).get_concrete_function(
        x).graph
    assert sum(op.type.endswith("SiteKernelMap") for op in graph.get_operations()) == 1
    graph = tf.function(lambda t: global_pool(t)).get_concrete_function(x).graph
    assert sum(op.type.endswith("SiteKernelMap") for op in graph.get_operations()) == 1  # the check
