"""SparseRelu with padded output (issue 24: every op allocates from a bound known before it
runs): its length is the input's, its live entries are the exact output's and padding
follows; values and gradients equal the exact call's; after a library op in a traced
function it trusts the keys (inputs_checked) and, on the GPU, reads nothing back."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tf_sparseconv._op_library import OP_NAMESPACE, ops as raw_ops
from tf_sparseconv.channel.tensor import PADDING_KEY
from tf_sparseconv.checks import padded_by_library
from tests.channel.helpers import assert_exact_then_padding, random_filter, random_sparse_components


def _input(rng, shape=(2, 6, 5, 4, 3), density=0.4, dtype=np.float32):
    keys, values, dense_shape = random_sparse_components(rng, list(shape), density, dtype)
    return ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))


@pytest.mark.parametrize("padded_input", [False, True])
def test_padded_output_is_the_exact_output_then_padding(rng, device, padded_input):
    with tf.device(device):
        x = _input(rng)
        if padded_input:  # the live entries, then three padding entries
            n = int(x.num_entries)
            x = ts.ChannelSparseTensor(tf.concat([x.keys, tf.fill([3], tf.constant(PADDING_KEY, tf.int64))], 0),
                                       tf.concat([x.values, tf.zeros([3], x.dtype)], 0), x.dense_shape,
                                       padded=True)
            assert int(x.num_entries) == n + 3
        want = ts.sparse_relu(x.without_padding())
        got = ts.sparse_relu(x, padded_output=True)
        keys, values, kept = raw_ops.sparse_relu(x.keys, x.values, x.dense_shape, padded_input=x.padded,
                                                 padded_output=True)
    assert got.padded and int(got.num_entries) == int(x.num_entries)  # the input's length
    assert 0 < int(want.num_entries) < int(x.without_padding().num_entries)  # some entries dropped
    assert_exact_then_padding(got, want)
    live = int(want.num_entries)
    np.testing.assert_array_equal(keys.numpy(), got.keys.numpy())
    np.testing.assert_array_equal(values.numpy(), got.values.numpy())
    # the kept entries' input positions, then each padding entry's own position
    positions = np.nonzero(x.values.numpy() > 0)[0]
    np.testing.assert_array_equal(kept.numpy()[:live], positions)
    np.testing.assert_array_equal(kept.numpy()[live:], np.arange(live, int(x.num_entries)))


def test_gradients_equal_the_exact_calls(rng, device):
    with tf.device(device):
        x = _input(rng)
        weights = tf.constant(rng.standard_normal(x.dense_shape.numpy()).astype(np.float32))
        grads = {}
        for padded in (False, True):
            with tf.GradientTape() as tape:
                tape.watch(x.values)
                loss = tf.reduce_sum(ts.to_dense(ts.sparse_relu(x, padded_output=padded)) * weights)
            grads[padded] = tape.gradient(loss, x.values).numpy()
    np.testing.assert_array_equal(grads[True], grads[False])
    assert np.count_nonzero(grads[True]) > 0


def test_numeric_gradients_of_a_padded_output(rng):
    keys, values, dense_shape = random_sparse_components(rng, [1, 4, 3, 3, 2], 0.5, np.float64)
    values = np.where(np.abs(values) < 0.05, 0.3, values)  # no value within the numeric step of 0
    x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))

    def f(v):
        return ts.to_dense(ts.sparse_relu(x.with_values(v), padded_output=True))

    theoretical, numerical = tf.test.compute_gradient(f, [x.values])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-6)


def test_a_users_nan_is_refused_with_padded_output(device):
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant([1, 5, 9], tf.int64), tf.constant([1.0, np.nan, 2.0], tf.float32),
                                   tf.constant([1, 4, 4, 1, 1], tf.int64))
        with pytest.raises(tf.errors.InvalidArgumentError, match="relu input values"):
            ts.sparse_relu(x, padded_output=True).values.numpy()


@pytest.mark.parametrize("padded", [False, True])
def test_a_traced_relu_after_a_convolution_trusts_its_keys_and_equals_the_exact_one(rng, device, padded):
    """conv -> relu -> conv -> to_dense in one tf.function with padded or exact ReLU (padded
    convolutions): the same output and filter gradients; the ReLU takes the keys the first
    convolution made (inputs_checked), and the second convolution knows them padded."""
    keys, values, dense_shape = random_sparse_components(rng, [2, 10, 10, 10, 1], 0.2, np.float32)
    w1, m1 = random_filter(rng, [3, 3, 3], 1, 4, 0.8, np.float32)
    w2, m2 = random_filter(rng, [3, 3, 3], 4, 2, 0.8, np.float32)
    filters = [tf.Variable(w1), tf.Variable(w2)]

    def network(padded_relu):
        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                h = ts.direct_conv(x, filters[0], None, m1, padded_output=True)
                h = ts.sparse_relu(h, padded_output=padded_relu)
                h = ts.direct_conv(h, filters[1], None, m2, selection="signed", k=30, padded_output=True)
                dense = ts.to_dense(h)
                weights = tf.reshape(tf.range(1.0, 1.0 + tf.cast(tf.size(dense), tf.float32)) ** 0.5, tf.shape(dense))
                loss = tf.reduce_sum(dense * weights)
            return dense, tape.gradient(loss, filters)
        return step

    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        want, want_grads = network(False)(x)
        traced = network(padded)
        got, got_grads = traced(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    for g, e in zip(got_grads, want_grads):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    graph = traced.get_concrete_function(x).graph
    relus = [op for op in graph.get_operations() if op.type == OP_NAMESPACE + "SparseRelu"]
    assert len(relus) == 1 and relus[0].get_attr("inputs_checked")
    assert relus[0].get_attr("padded_output") == padded
    assert padded_by_library(relus[0].outputs[0]) == padded
    convs = [op for op in graph.get_operations() if op.type == OP_NAMESPACE + "DirectSparseConv"]
    assert [op.get_attr("padded_input") for op in sorted(convs, key=lambda o: o.name)] == [False, padded]


def test_the_keras_layer_pads_as_asked_and_keeps_the_option_in_its_config():
    layer = kl.SparseReLU(padded_output="auto")
    assert layer.get_config()["padded_output"] == "auto"
    assert kl.SparseReLU.from_config(layer.get_config()).padded_output == "auto"
    assert kl.SparseReLU().padded_output is False
    with pytest.raises(ValueError, match="padded_output must be 'auto', True or False"):
        kl.SparseReLU(padded_output="yes")
    with pytest.raises(ValueError, match="padded_output must be True or False"):
        ts.sparse_relu(ts.from_dense(np.ones((1, 2, 2, 1, 1), np.float32)), padded_output=1)


def test_a_padded_keras_layer_inside_a_traced_model_gives_the_exact_layers_output(rng):
    inputs = kl.sparse_input([6, 5, 4, 1])
    h = kl.DirectSparseConv(3, 3)(inputs)
    exact = keras.Model(inputs, kl.SparseToDense()(kl.SparseReLU()(h)))
    padded = keras.Model(inputs, kl.SparseToDense()(kl.SparseReLU(padded_output=True)(h)))
    keys, values, dense_shape = random_sparse_components(rng, [2, 6, 5, 4, 1], 0.3, np.float32)
    x = kl.as_keras_inputs(ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape),
                                                  tf.TensorShape([None, 6, 5, 4, 1])))
    want = exact(x).numpy()
    assert np.count_nonzero(want) > 0 and np.count_nonzero(want < 0) == 0
    np.testing.assert_array_equal(tf.function(padded)(x).numpy(), want)
    np.testing.assert_array_equal(padded(x).numpy(), want)  # eager: the padding stripped between layers
