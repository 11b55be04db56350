"""direct_conv(..., activation='relu'): the sparse ReLU fused into the convolution op gives
what sparse_relu(direct_conv(...)) gives (keys, values, counts, gradients), refuses NaN as
the ReLU does, and is what the Keras layer runs (the wait it saves on the GPU:
tests/test_host_syncs.py)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tests.channel.helpers import random_filter
from tests.channel.test_direct_conv import CONV_CASES, random_sparse, reference_conv, reference_selection
from tests.device import CPU, GPU, assert_same_error, first_line


@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", CONV_CASES)
@pytest.mark.parametrize("selection", ["none", "signed", "abs"])
@pytest.mark.parametrize("dataflow", ["sort", "dense"])
def test_fused_relu_is_sparse_relu_of_the_convolution(rng, batch, spatial, cin, cout, kernel, density,
                                                      filter_density, selection, dataflow, device):
    dense = random_sparse(rng, batch, spatial, cin, density)
    w, mask = random_filter(rng, kernel, cin, cout, filter_density)
    bias = rng.standard_normal(cout) * 0.5
    bound = {} if selection == "none" else dict(selection=selection, k=3)
    with tf.device(device):
        x = ts.from_dense(dense)
        fused, touched, positive = ts.direct_conv(x, w, bias, mask, dataflow=dataflow, activation="relu",
                                                  return_counts=True, **bound)
        plain, plain_touched, plain_positive = ts.direct_conv(x, w, bias, mask, dataflow=dataflow,
                                                              return_counts=True, **bound)
        relu = ts.sparse_relu(plain)
    np.testing.assert_array_equal(fused.keys.numpy(), relu.keys.numpy())
    np.testing.assert_array_equal(fused.values.numpy(), relu.values.numpy())  # bit-identical
    np.testing.assert_array_equal(fused.dense_shape.numpy(), plain.dense_shape.numpy())
    np.testing.assert_array_equal(touched.numpy(), plain_touched.numpy())
    np.testing.assert_array_equal(positive.numpy(), plain_positive.numpy())
    # And against the dense reference: the touched set, k-selection, then the entries > 0.
    keys, values, _ = reference_conv(dense, w, mask, bias)
    if selection != "none":
        keys, values = reference_selection(keys, values, int(np.prod(spatial)), 3, selection)
    np.testing.assert_array_equal(fused.keys.numpy(), keys[values > 0])
    np.testing.assert_allclose(fused.values.numpy(), values[values > 0], rtol=1e-10, atol=1e-10)
    assert np.all(fused.values.numpy() > 0)


def test_fused_relu_can_leave_nothing(device):
    dense = np.zeros((2, 5, 5, 1))
    dense[0, 2, 2, 0] = 1.0
    with tf.device(device):
        y = ts.direct_conv(ts.from_dense(dense), -np.ones((3, 3, 1, 2)), activation="relu")
    assert y.keys.shape[0] == 0 and y.values.shape[0] == 0


def _loss_and_gradients(x, w, bias, mask, upstream_seed, fused, **bound):
    values, filters, b = tf.constant(x.values), tf.constant(w), tf.constant(bias)
    with tf.GradientTape() as tape:
        tape.watch([values, filters, b])
        if fused:
            y = ts.direct_conv(x.with_values(values), filters, b, mask, activation="relu", **bound)
        else:
            y = ts.sparse_relu(ts.direct_conv(x.with_values(values), filters, b, mask, **bound))
        dense = ts.to_dense(y)
        upstream = tf.constant(np.random.default_rng(upstream_seed).standard_normal(dense.shape))
        loss = tf.reduce_sum(dense * upstream)
    return tape.gradient(loss, [values, filters, b])


@pytest.mark.parametrize("selection", ["none", "signed"])
def test_fused_relu_gradients_are_the_unfused_ones(rng, selection, device):
    dense = random_sparse(rng, 2, (7, 6, 5), 2, 0.3)
    w, mask = random_filter(rng, (3, 3, 3), 2, 4, 0.6)
    bias = rng.standard_normal(4) * 0.3
    bound = {} if selection == "none" else dict(selection=selection, k=6)
    with tf.device(device):
        x = ts.from_dense(dense)
        fused = _loss_and_gradients(x, w, bias, mask, 7, True, **bound)
        unfused = _loss_and_gradients(x, w, bias, mask, 7, False, **bound)
    for f, u in zip(fused, unfused):
        np.testing.assert_allclose(f.numpy(), u.numpy(), rtol=1e-12, atol=1e-12)
    assert np.any(fused[1].numpy() != 0)


@pytest.mark.soft_placement
def test_fused_relu_gradients_match_numerical_jacobian_float64(rng, device):
    dense = random_sparse(rng, 2, (6, 5), 2, 0.35)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.7)
    bias = rng.standard_normal(3) * 0.3
    with tf.device(device):
        x = ts.from_dense(dense)
        upstream = None

        def f(values, filters, b):
            nonlocal upstream
            y = ts.direct_conv(x.with_values(values), filters, b, mask, activation="relu")
            out = ts.to_dense(y)
            if upstream is None:
                upstream = tf.constant(np.random.default_rng(3).standard_normal(out.shape))
            return tf.reduce_sum(out * upstream)

        theoretical, numerical = tf.test.compute_gradient(
            f, [x.values, tf.constant(w), tf.constant(bias)], delta=1e-6)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=1e-6)
    assert np.any(theoretical[1] != 0)


def test_fused_relu_refuses_nan_made_from_infinite_input(device):
    # inf at x = 1 and -inf at x = 3 of a 1-D line: y = 2 sums inf - inf = NaN. The unfused
    # ReLU refuses it; so does the fused one.
    dense = np.zeros((1, 5, 1))
    dense[0, 1, 0], dense[0, 3, 0] = np.inf, -np.inf
    w = np.ones((3, 1, 1))
    with tf.device(device):
        x = ts.from_dense(dense, non_finite="allow")
        with pytest.raises(tf.errors.InvalidArgumentError, match="relu input values contains NaN"):
            ts.sparse_relu(ts.direct_conv(x, w)).values.numpy()
        with pytest.raises(tf.errors.InvalidArgumentError, match="activation 'relu'.*NaN"):
            ts.direct_conv(x, w, activation="relu").values.numpy()
        # Infinity alone is no NaN: kept where it is > 0.
        dense[0, 3, 0] = 0.0
        y = ts.direct_conv(ts.from_dense(dense, non_finite="allow"), w, activation="relu")
    np.testing.assert_array_equal(y.values.numpy(), [np.inf] * 3)


def test_fused_relu_refuses_nan_on_the_gpu_as_on_the_cpu(gpu):
    dense = np.zeros((1, 5, 1))
    dense[0, 1, 0], dense[0, 3, 0] = np.inf, -np.inf
    x = ts.from_dense(dense, non_finite="allow")
    assert_same_error(lambda: ts.direct_conv(x, np.ones((3, 1, 1)), activation="relu").values,
                      "activation 'relu'.*NaN")


@pytest.mark.parametrize("dataflow", ["sort", "dense", "bitmap", "atomic"])
def test_fused_relu_refuses_nan_in_every_gpu_dataflow(dataflow, gpu):
    """The bitmaps and the atomic sums check the values before the ReLU in the kernel that
    writes them, the sort and the dense grid in a pass of their own: each refuses the NaN,
    with the CPU's message (the CPU runs the sort where the dataflow is the GPU's alone)."""
    dense = np.zeros((1, 5, 1))
    dense[0, 1, 0], dense[0, 3, 0] = np.inf, -np.inf
    x = ts.from_dense(dense, non_finite="allow")
    messages = {}
    for device, flow in ((CPU, dataflow if dataflow in ("sort", "dense") else "sort"), (GPU, dataflow)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="activation 'relu'.*NaN") as error:
            with tf.device(device):
                ts.direct_conv(x, np.ones((3, 1, 1)), activation="relu", dataflow=flow).values.numpy()
        messages[device] = first_line(error.value)
    assert messages[GPU] == messages[CPU]


@pytest.mark.parametrize("activation", ["tanh", "linear", "ReLU"])
def test_direct_conv_refuses_other_activations(activation):
    x = ts.from_dense(np.ones((1, 3, 3, 1)))
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        ts.direct_conv(x, np.ones((3, 3, 1, 1)), activation=activation)


def test_the_op_refuses_an_unknown_activation_attr():
    from tf_sparseconv._op_library import ops
    x = ts.from_dense(np.ones((1, 3, 3, 1)))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="activation"):
        ops.direct_sparse_conv(in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape,
                               filter=tf.ones((3, 3, 1, 1), tf.float64), filter_mask=tf.ones((3, 3, 1, 1), tf.bool),
                               bias=tf.zeros([1], tf.float64), activation="sigmoid")


def test_the_keras_layer_runs_the_fused_op_with_the_unfused_result(rng):
    dense = random_sparse(rng, 2, (6, 6, 6), 2, 0.3, np.float32)
    with tf.device(CPU):
        x = ts.from_dense(dense)
        layer = kl.DirectSparseConv(5, 3, activation="relu", rho_up=0.2, kernel_initializer="he_normal",
                                    bias_initializer=keras.initializers.Constant(0.05))
        y = kl.from_keras_inputs(layer(kl.as_keras_inputs(x)))
        plain = ts.sparse_relu(ts.direct_conv(x, layer.kernel, layer.bias, tf.cast(layer.mask, tf.bool),
                                              selection="signed", rho_up=0.2))
        traced = tf.function(lambda v: kl.from_keras_inputs(layer(kl.as_keras_inputs(x.with_values(v)))).values)
        graph = traced.get_concrete_function(tf.TensorSpec([None], tf.float32)).graph
    np.testing.assert_array_equal(y.keys.numpy(), plain.keys.numpy())
    np.testing.assert_array_equal(y.values.numpy(), plain.values.numpy())
    types = {op.type for op in graph.get_operations()}
    assert "TfSparseconv>DirectSparseConv" in types
    assert "TfSparseconv>SparseRelu" not in types  # fused: one op, one wait on the GPU
