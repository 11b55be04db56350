"""Keys the library made in a traced graph are not checked again by to_dense (on the GPU: no
wait): made_by_library's provenance, what it leaves checked, the switch that checks every
op, and the same dense tensor either way."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tf_sparseconv.checks import made_by_library
from tf_sparseconv.models import octnet3
from tests.device import CPU

TO_DENSE = "TfSparseconv>ChannelSparseToDense"


def _to_dense_attrs(graph):
    """inputs_checked of every ChannelSparseToDense op in graph (and its nested function graphs)."""
    found = []
    for op in graph.get_operations():
        if op.type == TO_DENSE:
            found.append(op.get_attr("inputs_checked"))
    for function in getattr(graph, "_functions", {}).values():
        found += _to_dense_attrs(function.graph) if hasattr(function, "graph") else []
    return found


def _dense_case(rng):
    return np.where(rng.random((2, 5, 5, 5, 2)) < 0.3, rng.standard_normal((2, 5, 5, 5, 2)), 0).astype(np.float32)


def test_keys_of_a_library_op_are_trusted_in_a_traced_graph(rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    dense = _dense_case(rng)
    w = rng.standard_normal((3, 3, 3, 2, 3)).astype(np.float32)

    def step(d):
        x = ts.from_dense(d)
        y = ts.direct_conv(x, w, activation="relu")
        pooled = ts.sparse_max_pool(y, 2)
        return ts.to_dense(y), ts.to_dense(pooled), ts.to_dense(ts.sparse_relu(x))

    with tf.device(CPU):
        graph = tf.function(step).get_concrete_function(tf.TensorSpec(dense.shape, tf.float32)).graph
        assert _to_dense_attrs(graph) == [True, True, True]
        eager = step(dense)
        traced = tf.function(step)(dense)
    for e, t in zip(eager, traced):
        np.testing.assert_array_equal(e.numpy(), t.numpy())
    np.testing.assert_array_equal(eager[2].numpy(), np.maximum(dense, 0))


def test_the_users_keys_a_foreign_layout_and_eager_tensors_stay_checked(rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    dense = _dense_case(rng)

    def user_keys(keys, values):
        return ts.to_dense(ts.ChannelSparseTensor(keys, values, tf.constant([2, 5, 5, 5, 2], tf.int64)))

    def foreign_layout(d):
        x = ts.from_dense(d)
        return ts.to_dense(ts.ChannelSparseTensor(x.keys, x.values, tf.constant([2, 5, 5, 5, 2], tf.int64)))

    with tf.device(CPU):
        graph = tf.function(user_keys).get_concrete_function(tf.TensorSpec([None], tf.int64),
                                                             tf.TensorSpec([None], tf.float32)).graph
        assert _to_dense_attrs(graph) == [False]
        graph = tf.function(foreign_layout).get_concrete_function(tf.TensorSpec(dense.shape, tf.float32)).graph
        assert _to_dense_attrs(graph) == [False]
        x = ts.from_dense(dense)
        assert not made_by_library(x.keys, x.dense_shape)  # eager: no op to trust
        # A checked op still refuses bad keys (the CPU checks in any case).
        with pytest.raises(tf.errors.InvalidArgumentError, match="to_dense"):
            tf.function(user_keys)(tf.constant([3, 1], tf.int64), tf.constant([1.0, 2.0]))


def test_check_every_op_checks_the_librarys_keys_too(rng, monkeypatch):
    monkeypatch.setenv(ts.checks.CHECK_EVERY_OP_ENV, "1")
    dense = _dense_case(rng)
    with tf.device(CPU):
        graph = tf.function(lambda d: ts.to_dense(ts.from_dense(d))).get_concrete_function(
            tf.TensorSpec(dense.shape, tf.float32)).graph
    assert _to_dense_attrs(graph) == [False]


def test_octnet3s_sparse_to_dense_layer_trusts_the_last_convolution(rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    model = octnet3(8, 3, rhos=(0.5, 1.0), fc_units=8)
    dense = (rng.random((4, 8, 8, 8, 1)) < 0.2).astype(np.float32)
    x = kl.as_keras_inputs(ts.from_dense(dense))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(inputs, labels):  # the layers as a traced training step runs them
        with tf.GradientTape() as tape:
            value = loss(labels, model(inputs, training=True))
        return tape.gradient(value, model.trainable_variables)

    with tf.device(CPU):
        traced = tf.function(train_step)
        eager = model(x).numpy()
        graph = traced.get_concrete_function(x, tf.constant([0, 1, 2, 0])).graph
        grads = traced(x, tf.constant([0, 1, 2, 0]))
    assert _to_dense_attrs(graph) == [True]  # the model's input keys are the user's: only ToDense trusts
    assert all(np.all(np.isfinite(g.numpy())) for g in grads) and eager.shape == (4, 3)
