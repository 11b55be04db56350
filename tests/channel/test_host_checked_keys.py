"""The user's keys where they enter a traced graph are checked on the host before a GPU
convolution (so that the GPU op need not wait for its own check): where the check goes, the
same values and gradients as the eager call, InvalidArgument for malformed keys, and where it
stays in the op (no GPU, keys a library op made, eager tensors, the switch that checks every
op)."""
import importlib

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tests.device import CPU

direct_conv_module = importlib.import_module("tf_sparseconv.channel.direct_conv")
VALIDATE = "TfSparseconv>ChannelSparseValidate"
CONV = "TfSparseconv>DirectSparseConv"


@pytest.fixture
def as_if_gpu(monkeypatch):
    """direct_conv taking this machine for one with a GPU (the check's placement is what is
    tested; where TensorFlow sees a GPU it is one)."""
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    monkeypatch.setattr(direct_conv_module, "gpu_visible", lambda: True)


def _case(rng):
    dense = np.where(rng.random((2, 5, 5, 5, 2)) < 0.3, rng.standard_normal((2, 5, 5, 5, 2)), 0).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 2, 3)).astype(np.float32)
    return ts.from_dense(tf.constant(dense)), tf.constant(w)


def _conv_of_arguments(w):
    def step(keys, values, dense_shape):
        x = ts.ChannelSparseTensor(keys, values, dense_shape)
        return ts.to_dense(ts.direct_conv(x, w, activation="relu"))
    return tf.function(step)


def _ops(graph, op_type):
    return [op for op in graph.get_operations() if op.type == op_type]


def test_the_arguments_keys_are_checked_on_the_host_and_trusted_by_the_op(rng, as_if_gpu, device):
    with tf.device(device):
        x, w = _case(rng)
        step = _conv_of_arguments(w)
        graph = step.get_concrete_function(x.keys, x.values, x.dense_shape).graph
        [check] = _ops(graph, VALIDATE)
        assert "CPU" in check.device
        [conv] = _ops(graph, CONV)
        assert conv.get_attr("inputs_checked") and conv.inputs[0].op is check
        traced = step(x.keys, x.values, x.dense_shape)
        eager = ts.to_dense(ts.direct_conv(x, w, activation="relu"))
    np.testing.assert_allclose(traced.numpy(), eager.numpy(), rtol=1e-5, atol=1e-6)


def test_gradients_through_the_host_check_are_the_eager_ones(rng, as_if_gpu, device):
    with tf.device(device):
        x, w = _case(rng)
        filters = tf.Variable(w)

        def loss(keys, values, dense_shape):
            y = ts.direct_conv(ts.ChannelSparseTensor(keys, values, dense_shape), filters, activation="relu")
            return tf.reduce_sum(tf.square(ts.to_dense(y)))

        @tf.function
        def traced(keys, values, dense_shape):
            with tf.GradientTape() as tape:
                tape.watch(values)
                value = loss(keys, values, dense_shape)
            return tape.gradient(value, [values, filters])

        with tf.GradientTape() as tape:
            tape.watch(x.values)
            value = loss(x.keys, x.values, x.dense_shape)
        eager = tape.gradient(value, [x.values, filters])
        got = traced(x.keys, x.values, x.dense_shape)
    for a, b in zip(got, eager):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fault, message", [("unsorted", "sorted"), ("duplicate", "duplicate|sorted|unique"),
                                            ("out of range", "range|exceed|dense_shape")])
def test_malformed_keys_are_refused_by_the_host_check(rng, as_if_gpu, fault, message):
    with tf.device(CPU):
        x, w = _case(rng)
        keys = x.keys.numpy().copy()
        if fault == "unsorted":
            keys[[0, 1]] = keys[[1, 0]]
        elif fault == "duplicate":
            keys[1] = keys[0]
        else:
            keys[-1] = np.iinfo(np.int64).max - 1
        step = _conv_of_arguments(w)
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            step(tf.constant(keys), x.values, x.dense_shape)


def test_the_check_stays_in_the_op_without_a_gpu_for_library_keys_and_with_every_op_checked(rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    with tf.device(CPU):
        x, w = _case(rng)
        monkeypatch.setattr(direct_conv_module, "gpu_visible", lambda: False)
        graph = _conv_of_arguments(w).get_concrete_function(x.keys, x.values, x.dense_shape).graph
        assert not _ops(graph, VALIDATE) and not _ops(graph, CONV)[0].get_attr("inputs_checked")

        monkeypatch.setattr(direct_conv_module, "gpu_visible", lambda: True)
        made = tf.function(lambda d: ts.to_dense(ts.direct_conv(ts.from_dense(d), w)))
        graph = made.get_concrete_function(tf.TensorSpec([2, 5, 5, 5, 2], tf.float32)).graph
        assert not _ops(graph, VALIDATE) and _ops(graph, CONV)[0].get_attr("inputs_checked")  # from_dense's keys

        monkeypatch.setenv(ts.checks.CHECK_EVERY_OP_ENV, "1")
        graph = _conv_of_arguments(w).get_concrete_function(x.keys, x.values, x.dense_shape).graph
        assert not _ops(graph, VALIDATE) and not _ops(graph, CONV)[0].get_attr("inputs_checked")
