"""Padded channel-sparse tensors (issue 24's contract): a tensor may end in padding, key
PADDING_KEY and value 0 after every live entry, made by a library op with padded output.
Every op of the family given a padded copy of a fresh random tensor gives the values and
gradients of the exact one (padding's gradient 0); pooling's padded output holds the exact
output's entries and then padding; a user's tensor with a padding key, and padding that is
not a tail, are still InvalidArgumentError; the tensors handed back to the user drop it."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tf_sparseconv._op_library import ops as raw_ops
from tf_sparseconv.channel import keras_io
from tf_sparseconv.channel.tensor import PADDING_KEY
from tf_sparseconv.checks import padded_by_library
from tests.channel.helpers import assert_exact_then_padding, random_filter, random_sparse_components
from tests.device import assert_same_error

SHAPE = [2, 6, 5, 4, 3]  # B, R1..R3, C


def _case(rng, dtype=np.float64, shape=SHAPE, density=0.3):
    keys, values, dense_shape = random_sparse_components(rng, shape, density, dtype)
    return keys, values, dense_shape


def _tensors(device, keys, values, dense_shape, pad):
    """(exact, padded) ChannelSparseTensors on device, the padded one with pad padding entries."""
    with tf.device(device):
        exact = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        padded = ts.ChannelSparseTensor(tf.constant(np.concatenate([keys, np.full(pad, PADDING_KEY, np.int64)])),
                                        tf.constant(np.concatenate([values, np.zeros(pad, values.dtype)])),
                                        tf.constant(dense_shape), padded=True)
    return exact, padded


def _dense(x):
    return ts.to_dense(x).numpy()


@pytest.mark.parametrize("pad", [0, 1, 17])
def test_live_entries_and_what_the_user_sees(rng, device, pad):
    keys, values, dense_shape = _case(rng)
    exact, padded = _tensors(device, keys, values, dense_shape, pad)
    assert int(padded.num_entries) == len(keys) + pad
    assert int(padded.live_entries) == len(keys) == int(exact.live_entries)
    np.testing.assert_array_equal(padded.without_padding().keys.numpy(), keys)
    assert not padded.without_padding().padded
    np.testing.assert_array_equal(_dense(padded), _dense(exact))
    sp = ts.to_sparse_tensor(padded)
    np.testing.assert_array_equal(tf.sparse.to_dense(sp).numpy(), _dense(exact))
    assert float(padded.density()) == float(exact.density())
    np.testing.assert_array_equal(ts.validate(padded).keys.numpy(), padded.keys.numpy())
    np.testing.assert_array_equal(ts.site_to_dense(ts.from_channel_sparse(padded)).numpy(), _dense(exact))


def _values_and_grads(fn, x):
    """fn(x)'s dense output and the gradient of a fixed weighting of it w.r.t. x.values."""
    with tf.GradientTape() as tape:
        tape.watch(x.values)
        out = fn(x)
        dense = out if isinstance(out, tf.Tensor) else ts.to_dense(out)
        weights = tf.cast(tf.reshape(tf.range(tf.size(dense)) % 7 - 3, tf.shape(dense)), dense.dtype)
        loss = tf.reduce_sum(dense * weights)
    grad = tape.gradient(loss, x.values, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return dense.numpy(), grad.numpy()


def _ops(rng, dtype):
    w, mask = random_filter(rng, [3, 3, 3], SHAPE[-1], 2, 0.7, dtype)
    bias = rng.standard_normal(2).astype(dtype)
    return {
        "conv": lambda x: ts.direct_conv(x, w, bias, mask),
        "conv-sort": lambda x: ts.direct_conv(x, w, bias, mask, dataflow="sort"),
        "conv-dense": lambda x: ts.direct_conv(x, w, bias, mask, dataflow="dense"),
        "conv-k-relu": lambda x: ts.direct_conv(x, w, bias, mask, selection="abs", k=5, activation="relu"),
        "relu": ts.sparse_relu,
        "pool": lambda x: ts.sparse_max_pool(x, [2, 2, 3]),
        "pool-padded": lambda x: ts.sparse_max_pool(x, 2, padded_output=True),
        "to_dense": ts.to_dense,
        "gather_dense": lambda x: ts.gather_dense(x, tf.reshape(tf.range(tf.reduce_prod(SHAPE), dtype=x.dtype),
                                                                SHAPE)),
        "validate": ts.validate,
    }


@pytest.mark.parametrize("op", ["conv", "conv-sort", "conv-dense", "conv-k-relu", "relu", "pool", "pool-padded",
                                "to_dense", "gather_dense", "validate"])
def test_every_op_on_a_padded_copy_gives_the_exact_values_and_gradients(rng, device, op):
    keys, values, dense_shape = _case(rng)
    fn = _ops(rng, np.float64)[op]
    exact, padded = _tensors(device, keys, values, dense_shape, pad=int(rng.integers(1, 40)))
    with tf.device(device):
        want, want_grad = _values_and_grads(fn, exact)
        got, got_grad = _values_and_grads(fn, padded)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got_grad[:len(keys)], want_grad, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got_grad[len(keys):], 0)


def test_conv_gradients_of_a_padded_input_match_numeric_ones(rng):
    keys, values, dense_shape = _case(rng, shape=[1, 4, 3, 3, 2], density=0.4)
    w, mask = random_filter(rng, [3, 3, 3], 2, 2, 0.8)
    _, padded = _tensors("/CPU:0", keys, values, dense_shape, pad=5)

    def f(v, filters):
        return ts.direct_conv(padded.with_values(v), filters, None, mask).values

    theoretical, numerical = tf.test.compute_gradient(f, [padded.values, tf.constant(w)])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("strides", [2, [1, 2, 3]])
def test_padded_pooling_output_is_the_exact_output_then_padding(rng, device, strides, dtype):
    keys, values, dense_shape = _case(rng, dtype)
    exact, _ = _tensors(device, keys, values, dense_shape, pad=0)
    with tf.device(device):
        want = ts.sparse_max_pool(exact, strides)
        got = ts.sparse_max_pool(exact, strides, padded_output=True)
    assert got.padded and not want.padded
    pooled_cells = int(np.prod(want.dense_shape.numpy()))
    assert int(got.num_entries) == min(len(keys), pooled_cells)
    assert_exact_then_padding(got, want)
    # padding's arg-max: its own position, so that the gradient's scatter of its zeros goes
    # to distinct input entries (not all to entry 0, one contended address on the GPU)
    with tf.device(device):
        argmax = raw_ops.sparse_max_pool(exact.keys, exact.values, exact.dense_shape, strides=[1, 2, 3],
                                         padded_output=True)[3].numpy()
        live = int(raw_ops.sparse_max_pool(exact.keys, exact.values, exact.dense_shape, strides=[1, 2, 3])[0].shape[0])
    np.testing.assert_array_equal(argmax[live:], np.arange(live, len(argmax)))


def test_padded_pooling_of_a_dense_batch_is_capped_by_the_output_cells(device):
    dense = np.arange(1, 2 * 4 * 4 * 1 + 1, dtype=np.float32).reshape([2, 4, 4, 1])
    with tf.device(device):
        y = ts.sparse_max_pool(ts.from_dense(dense), 2, padded_output=True)
    assert int(y.num_entries) == int(y.live_entries) == 8  # every cell live, no padding
    np.testing.assert_array_equal(_dense(y), tf.nn.max_pool2d(dense, 2, 2, "VALID").numpy())


def test_a_traced_network_over_padded_pooling_equals_the_exact_one(rng, device):
    """conv -> padded pool -> conv -> padded pool -> to_dense in one tf.function: the same
    output and gradients as without padding."""
    keys, values, dense_shape = _case(rng, np.float32, shape=[2, 8, 8, 8, 1])
    w1, m1 = random_filter(rng, [3, 3, 3], 1, 4, 0.8, np.float32)
    w2, m2 = random_filter(rng, [3, 3, 3], 4, 3, 0.8, np.float32)
    exact, _ = _tensors(device, keys, values, dense_shape, pad=0)
    filters = [tf.Variable(w1), tf.Variable(w2)]

    def network(padded_output):
        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                h = ts.direct_conv(x, filters[0], None, m1, activation="relu")
                h = ts.sparse_max_pool(h, 2, padded_output=padded_output)
                h = ts.direct_conv(h, filters[1], None, m2, selection="abs", k=6, activation="relu")
                h = ts.sparse_max_pool(h, 2, padded_output=padded_output)
                dense = ts.to_dense(h)
                weights = tf.reshape(tf.range(1.0, 1.0 + tf.cast(tf.size(dense), tf.float32)) ** 0.5, tf.shape(dense))
                loss = tf.reduce_sum(dense * weights) / tf.cast(tf.size(dense), tf.float32)
            return dense, tape.gradient(loss, filters)
        return step

    with tf.device(device):
        want, want_grads = network(False)(exact)
        got, got_grads = network(True)(exact)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    for g, e in zip(got_grads, want_grads):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["conv", "relu", "pool", "to_dense", "gather_dense", "validate"])
def test_a_users_padding_key_is_still_out_of_range(rng, device, op):
    keys, values, dense_shape = _case(rng)
    fn = _ops(rng, np.float64)[op]
    exact, padded = _tensors(device, keys, values, dense_shape, pad=3)
    users = ts.ChannelSparseTensor(padded.keys, padded.values, padded.dense_shape)  # padded=False
    with tf.device(device), pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        _values_and_grads(fn, users)


@pytest.mark.parametrize("op", ["conv", "relu", "pool", "to_dense", "gather_dense", "validate"])
def test_padding_before_a_live_key_is_refused(rng, device, op):
    keys, values, dense_shape = _case(rng)
    fn = _ops(rng, np.float64)[op]
    bad_keys = np.concatenate([keys[:3], [PADDING_KEY], keys[3:]])
    bad_values = np.concatenate([values[:3], [0.0], values[3:]])
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(bad_keys), tf.constant(bad_values), tf.constant(dense_shape),
                                   padded=True)
        with pytest.raises(tf.errors.InvalidArgumentError, match="sorted|out of range"):
            _values_and_grads(fn, x)


@pytest.mark.parametrize("op", ["conv", "relu", "pool", "validate"])
def test_nan_in_a_padding_value_is_refused_on_either_device(rng, device, op):
    keys, values, dense_shape = _case(rng)
    fn = _ops(rng, np.float64)[op]
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(np.concatenate([keys, np.full(3, PADDING_KEY, np.int64)])),
                                   tf.constant(np.concatenate([values, [0.0, np.nan, 0.0]])),
                                   tf.constant(dense_shape), padded=True)
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"NaN at position {len(keys) + 1}"):
            _values_and_grads(fn, x)


def test_padding_before_a_live_key_gets_one_message_on_both_devices(rng, gpu):
    keys, values, dense_shape = _case(rng)
    bad_keys = np.concatenate([keys[:3], [PADDING_KEY], keys[3:]])
    bad_values = np.concatenate([values[:3], [0.0], values[3:]])

    def pool():
        x = ts.ChannelSparseTensor(tf.constant(bad_keys), tf.constant(bad_values), tf.constant(dense_shape),
                                   padded=True)
        ts.sparse_max_pool(x, 2)

    assert_same_error(pool, "must be sorted")


@pytest.mark.parametrize("gpu", [True, False])
def test_the_keras_pooling_layer_auto_pads_inside_a_traced_model_only(rng, monkeypatch, gpu):
    # "auto" pads in traced functions where TensorFlow sees a GPU (its waits are what padding
    # spares); told there is one, it pads here on the CPU too.
    monkeypatch.setattr(keras_io, "gpu_visible", lambda: gpu)
    keys, values, dense_shape = _case(rng, np.float32, shape=[2, 8, 8, 8, 1])
    x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape),
                               tf.TensorShape([None, 8, 8, 8, 1]))
    inputs = kl.sparse_input([8, 8, 8, 1])
    h = kl.DirectSparseConv(4, 3, activation="relu")(inputs)
    h = kl.SparseMaxPool(2, padded_output="auto")(h)
    h = kl.DirectSparseConv(3, 3, activation="relu")(h)
    outputs = kl.SparseToDense()(kl.SparseMaxPool(2, padded_output="auto")(h))
    model = keras.Model(inputs, outputs)
    eager = model(kl.as_keras_inputs(x)).numpy()
    traced = tf.function(model)(kl.as_keras_inputs(x)).numpy()
    np.testing.assert_allclose(traced, eager, rtol=1e-6, atol=1e-6)
    seen = []

    @tf.function
    def pooled(inputs):
        y = kl.SparseMaxPool(2, padded_output="auto")(inputs)
        seen.append(padded_by_library(y["keys"]))
        return y["keys"]

    keys_out = pooled(kl.as_keras_inputs(x)).numpy()
    if gpu:
        assert seen == [True] and keys_out[-1] == PADDING_KEY or len(keys_out) == 2 * 4 * 4 * 4
    else:
        assert seen == [False] and PADDING_KEY not in keys_out
    eager_pool = kl.SparseMaxPool(2, padded_output="auto")(kl.as_keras_inputs(x))
    assert not padded_by_library(eager_pool["keys"])
    assert PADDING_KEY not in eager_pool["keys"].numpy()
    with pytest.raises(ValueError, match="padded_output"):
        kl.SparseMaxPool(2, padded_output="yes")
