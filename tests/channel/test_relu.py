"""Sparse ReLU: keeps exactly the positive entries, agrees with the dense ReLU, and passes the
gradient to the kept entries; on each device (the GPU's float64 gradients of ReLU, max-pool
and to_dense also against the numerical Jacobian)."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tests.channel.helpers import random_sparse_components
from tests.device import GPU, assert_on_gpu

SHAPES = [pytest.param([2, 9, 3], id="1d"), pytest.param([3, 4, 5, 2], id="2d"),
          pytest.param([2, 3, 4, 2, 4], id="3d"), pytest.param([2, 2, 3, 2, 3, 1], id="4d")]
GRADIENT_SHAPES = [pytest.param([2, 6, 2], id="1d"), pytest.param([2, 3, 3, 2], id="2d"),
                   pytest.param([1, 2, 3, 2, 3], id="3d"), pytest.param([1, 2, 2, 2, 2, 2], id="4d")]


def channel_sparse(keys, values, dense_shape, dtype=tf.float64):
    return ts.ChannelSparseTensor(tf.constant(keys, tf.int64), tf.constant(values, dtype),
                                  tf.constant(dense_shape, tf.int64))


@pytest.mark.parametrize("shape", SHAPES)
def test_sparse_relu_equals_dense_relu(shape, fill, dtype, random_dense, device):
    dense = random_dense(shape, dtype=dtype, **fill)
    with tf.device(device):
        y = ts.sparse_relu(ts.from_dense(dense))
        y_dense = ts.to_dense(y)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y.dense_shape.numpy(), shape)
    np.testing.assert_array_equal(y_dense.numpy(), tf.nn.relu(dense).numpy())


@pytest.mark.parametrize("shape", SHAPES)
def test_sparse_relu_support_is_exactly_the_positive_entries(shape, fill, dtype, random_dense, device):
    with tf.device(device):
        x = ts.from_dense(random_dense(shape, dtype=dtype, **fill))
        y = ts.validate(ts.sparse_relu(x))
    positive = x.values.numpy() > 0
    np.testing.assert_array_equal(y.keys.numpy(), x.keys.numpy()[positive])
    np.testing.assert_array_equal(y.values.numpy(), x.values.numpy()[positive])


@pytest.mark.parametrize("value", [0.0, -0.0], ids=["zero", "negative-zero"])
def test_sparse_relu_drops_stored_zeros(value, device):
    with tf.device(device):
        y = ts.sparse_relu(channel_sparse([1, 4, 7], [2.0, value, 3.0], [1, 4, 2, 1]))
    np.testing.assert_array_equal(y.keys.numpy(), [1, 7])
    np.testing.assert_array_equal(y.values.numpy(), [2.0, 3.0])


@pytest.mark.soft_placement
@pytest.mark.parametrize("shape", GRADIENT_SHAPES)
def test_sparse_relu_gradient_matches_numerical_jacobian(shape, random_dense, assert_gradient_matches_numerical,
                                                         device):
    with tf.device(device):
        x = ts.from_dense(random_dense(shape, 0.6))
    assert np.any(x.values.numpy() < 0), "the check needs dropped entries"
    jacobian = assert_gradient_matches_numerical(lambda values: ts.sparse_relu(x.with_values(values)).values,
                                                 x.values, device)
    np.testing.assert_array_equal(jacobian, np.eye(len(x.values))[x.values.numpy() > 0])


@pytest.mark.parametrize("keys, values, message", [
    pytest.param([1, 4], [np.nan, 1.0], "contains NaN", id="nan-value"),
    pytest.param([4, 1], [1.0, 2.0], "keys must be sorted", id="unsorted-keys"),
    pytest.param([1, 8], [1.0, 2.0], "key out of range", id="key-out-of-range"),
])
def test_sparse_relu_rejects_malformed_input(keys, values, message, dtype):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ts.sparse_relu(channel_sparse(keys, values, [1, 4, 2, 1], dtype))


@pytest.mark.soft_placement
def test_relu_and_max_pool_gradients_match_numerical_jacobian_on_gpu_float64(rng, gpu):
    keys, values, dense_shape = random_sparse_components(rng, [2, 4, 5, 2], 0.6, np.float64)

    def on_gpu(y):
        assert_on_gpu(y)
        return y

    with tf.device(GPU):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        for f in (lambda v: on_gpu(ts.sparse_relu(x.with_values(v)).values),
                  lambda v: on_gpu(ts.sparse_max_pool(x.with_values(v), [2, 3]).values),
                  lambda v: on_gpu(ts.to_dense(x.with_values(v)))):
            theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(values)])
            assert np.any(theoretical[0])
            np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-6)
