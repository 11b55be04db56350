"""The static logical shape travels through every op, eagerly and while tracing."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts


def test_ops_propagate_the_static_shape_in_eager_mode(rng):
    dense = (rng.random((2, 9, 8, 7, 3)) < 0.2).astype(np.float32)
    x = ts.from_dense(dense)
    assert x.shape.as_list() == [2, 9, 8, 7, 3]
    y = ts.direct_conv(x, rng.standard_normal((3, 3, 3, 3, 5)).astype(np.float32))
    assert y.shape.as_list() == [2, 9, 8, 7, 5]
    assert ts.sparse_relu(y).shape.as_list() == [2, 9, 8, 7, 5]
    pooled = ts.sparse_max_pool(y, [2, 3, 2])
    assert pooled.shape.as_list() == [2, 5, 3, 4, 5]
    np.testing.assert_array_equal(pooled.dense_shape.numpy(), pooled.shape.as_list())
    assert ts.to_dense(pooled).shape.as_list() == [2, 5, 3, 4, 5]


def test_traced_shapes_keep_what_the_signature_knows(rng):
    w = tf.constant(rng.standard_normal((3, 3, 1, 4)).astype(np.float32))
    seen = {}

    @tf.function(input_signature=[ts.ChannelSparseTensor.spec([None, 10, 6, 1])])
    def net(x):
        y = ts.sparse_max_pool(ts.sparse_relu(ts.direct_conv(x, w)), 2)
        seen["conv"] = y.shape
        dense = ts.to_dense(y)
        seen["dense"] = dense.shape
        return dense

    out = net(ts.from_dense((rng.random((3, 10, 6, 1)) < 0.3).astype(np.float32)))
    assert seen["conv"].as_list() == [None, 5, 3, 4]
    assert seen["dense"].as_list() == [None, 5, 3, 4]
    assert out.shape == (3, 5, 3, 4)


def test_static_shape_must_agree_with_dense_shape_rank():
    with pytest.raises(ValueError, match="does not match a dense_shape"):
        ts.ChannelSparseTensor(tf.zeros([0], tf.int64), tf.zeros([0]), tf.constant([1, 4, 1], tf.int64),
                               tf.TensorShape([1, 4, 4, 1]))
