"""Direct sparse convolution against dense references on each device: values, support,
k-selection, gradients (Eq. 3), dataflows, graph mode, SavedModel and every error path; on the
GPU, with each dataflow, against the CPU: keys, counts and forward values bit-identical (the
atomic sums' values within rounding), gradients within tolerance, the CPU's errors,
bit-identical reruns (also under op determinism, where 'auto' leaves the atomic sums out), the
forward in groups of examples, and a SavedModel."""
import itertools
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tests.channel.helpers import (assert_close, assert_close_on, assert_same_sparse, random_filter,
                                   random_sparse_components, sparse_on)
from tests.device import (REPO, CPU, GPU, assert_on, assert_on_gpu, assert_same_error, first_line, on,
                          run_in_own_process)


def random_sparse(rng, batch, spatial, channels, density, dtype=np.float64):
    shape = (batch, *spatial, channels)
    dense = rng.standard_normal(shape) * (rng.random(shape) < density)
    return dense.astype(dtype)


def to_key_order(dense):
    """Flattens [B, R..., C] in key order (b, c, spatial)."""
    d = dense.ndim - 2
    return np.transpose(dense, (0, d + 1, *range(1, d + 1))).reshape(-1)


def dense_conv(x, w):
    """'same' cross-correlation for any d: tf.nn.convolution for d <= 3, shifted sums for d = 4."""
    d = x.ndim - 2
    if d <= 3:
        with tf.device(CPU):
            return tf.nn.convolution(x, w, padding="SAME").numpy()
    out = np.zeros(x.shape[:-1] + (w.shape[-1],), dtype=x.dtype)
    half = [(k - 1) // 2 for k in w.shape[:d]]
    padded = np.pad(x, [(0, 0)] + [(h, h) for h in half] + [(0, 0)])
    for offset in itertools.product(*[range(k) for k in w.shape[:d]]):
        window = padded[(slice(None),) + tuple(slice(o, o + r) for o, r in zip(offset, x.shape[1:-1]))]
        out += np.einsum("...i,io->...o", window, w[offset])
    return out


def reference_conv(dense, w, mask, bias):
    """Expected (keys, values) of direct_conv: dense result on the touched set, bias there only."""
    present = (dense != 0).astype(dense.dtype)
    touched = dense_conv(present, mask.astype(dense.dtype)) > 0
    full = dense_conv(dense, w * mask) + bias
    flat_touched = to_key_order(touched)
    keys = np.nonzero(flat_touched)[0]
    return keys, to_key_order(full)[keys], flat_touched


def reference_selection(keys, values, segment_size, k, mode):
    """Per segment keep the k best by score, ties to the smaller key, in key order."""
    kept = []
    for seg in np.unique(keys // segment_size):
        idx = np.nonzero(keys // segment_size == seg)[0]
        score = values[idx] if mode == "signed" else np.abs(values[idx])
        order = sorted(idx, key=lambda i: (-score[np.searchsorted(idx, i)], keys[i]))
        kept.extend(sorted(order[:k]))
    kept = np.array(sorted(kept), dtype=np.int64)
    return keys[kept], values[kept]


CONV_CASES = [
    # (batch, spatial, cin, cout, kernel, density, filter_density)
    pytest.param(1, (9,), 2, 3, (3,), 0.3, 1.0, id="1d"),
    pytest.param(2, (7, 6), 3, 4, (3, 3), 0.2, 0.5, id="2d"),
    pytest.param(3, (8, 5), 1, 2, (5, 3), 0.1, 0.7, id="2d-anisotropic-kernel"),
    pytest.param(2, (6, 5, 4), 2, 3, (3, 3, 3), 0.15, 0.5, id="3d"),
    pytest.param(1, (9, 9, 9), 1, 8, (3, 3, 3), 0.05, 0.1, id="3d-pruned"),
    pytest.param(2, (4, 3, 4, 3), 2, 2, (3, 1, 3, 3), 0.2, 0.6, id="4d"),
]
# The GPU against the CPU: conv_inputs leaves example 1 of a batch of 3 empty.
GPU_CONV_CASES = CONV_CASES + [
    pytest.param(3, (6, 7), 2, 3, (3, 3), 0.3, 0.8, id="2d-batch1-empty"),
    # more than 32 kernel offsets: the dense grid's neighbour masks share bits between offsets
    pytest.param(2, (8, 9, 7), 2, 3, (5, 5, 3), 0.04, 0.6, id="3d-75-offsets"),
    pytest.param(1, (5, 5, 4, 4), 1, 2, (3, 3, 3, 3), 0.05, 0.5, id="4d-81-offsets"),
    # R^d a multiple of 32: the dense grid's thread per site and 8 output channels (a partial last chunk)
    pytest.param(3, (8, 8), 3, 11, (3, 3), 0.2, 0.7, id="2d-site-chunks"),
    pytest.param(2, (4, 8, 8), 2, 9, (3, 3, 3), 0.1, 0.6, id="3d-site-chunks"),
    pytest.param(1, (8, 8, 8), 2, 3, (5, 5, 3), 0.03, 0.6, id="3d-75-offsets-site-chunks"),
    # the dense grid's weights in shared memory for float32 (35 KiB), too many for float64 (70 KiB)
    pytest.param(1, (4, 8, 8), 40, 3, (3, 3, 3), 0.03, 0.6, id="3d-site-chunks-40-channels"),
    # kernel offsets beyond a signed byte: the input gradient without packed weights
    pytest.param(2, (300,), 1, 2, (257,), 0.05, 0.3, id="1d-257-wide-kernel"),
]


@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", CONV_CASES)
@pytest.mark.parametrize("dataflow", ["auto", "sort", "dense"])
def test_conv_matches_dense_convolution_on_touched_set(rng, batch, spatial, cin, cout, kernel,
                                                        density, filter_density, dataflow, device):
    dense = random_sparse(rng, batch, spatial, cin, density)
    w, mask = random_filter(rng, kernel, cin, cout, filter_density)
    bias = rng.standard_normal(cout)
    with tf.device(device):
        y, touched, positive = ts.direct_conv(ts.from_dense(dense), w, bias, mask, dataflow=dataflow,
                                              return_counts=True)
    keys, values, flat_touched = reference_conv(dense, w, mask, bias)
    np.testing.assert_array_equal(y.keys.numpy(), keys)
    np.testing.assert_allclose(y.values.numpy(), values, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(y.dense_shape.numpy(), [batch, *spatial, cout])
    expected_counts = flat_touched.reshape(batch, cout, -1).sum(axis=2)
    np.testing.assert_array_equal(touched.numpy(), expected_counts)
    segment = keys // int(np.prod(spatial))
    expected_positive = np.bincount(segment, values > 0, minlength=batch * cout).reshape(batch, cout)
    np.testing.assert_array_equal(positive.numpy(), expected_positive)


def sparse_case(rng, batch, spatial, cin, cout, density, filter_density, dtype=np.float64):
    """A ChannelSparseTensor input, a 3^d filter and its mask."""
    x = ts.from_dense(random_sparse(rng, batch, spatial, cin, density, dtype))
    return (x, *random_filter(rng, (3,) * len(spatial), cin, cout, filter_density, dtype))


def assert_identical(a, b):
    np.testing.assert_array_equal(a.keys.numpy(), b.keys.numpy())
    np.testing.assert_array_equal(a.values.numpy(), b.values.numpy())


# Filter densities: 1.0 gives only whole [Cout] rows (no mask applied), 0.6 whole, partly
# pruned and mostly pruned rows, 0.15 mostly pruned ones (their present channels visited).
@pytest.mark.parametrize("filter_density", [1.0, 0.6, 0.15])
@pytest.mark.parametrize("spatial,density", [
    pytest.param((12, 11, 10), 0.08, id="one-slab"),
    # 64^3 positions x 8 channels exceed the CPU dense path's 8 MiB scratch: two slabs, and
    # the entries near their border reach both
    pytest.param((64, 64, 64), 0.0005, id="slabs")])
def test_sort_and_dense_dataflows_are_bit_identical(rng, spatial, density, filter_density, device):
    with tf.device(device):
        x, w, mask = sparse_case(rng, 2, spatial, 3, 8, density, filter_density, np.float32)
        dense, merged = (ts.direct_conv(x, w, None, mask, dataflow=dataflow, return_counts=True)
                         for dataflow in ("dense", "sort"))
    assert_identical(dense[0], merged[0])
    np.testing.assert_array_equal(dense[1].numpy(), merged[1].numpy())
    assert len(merged[0].keys) > 100


def test_pruned_weights_add_nothing_to_an_infinite_value_in_either_dataflow(device):
    # 1-D, 1 -> 2 channels, inputs at x = 1 (infinite) and x = 2; output channel 0 keeps
    # only the kernel's last tap (y = x - 1). The dense dataflow once added inf * 0 through
    # the pruned taps: NaN at y = 1, where the sort dataflow gives 2 * 5.
    keys, values, dense_shape = np.array([1, 2], np.int64), np.array([np.inf, 2.0]), [1, 5, 1]
    w = np.arange(1.0, 7.0).reshape(3, 1, 2)  # w[q, 0, oc]: channel 0 has 1, 3, 5
    mask = np.ones(w.shape, bool)
    mask[:2, 0, 0] = False
    # An infinite gradient at channel 0, y = 1 (key 1) reaches x = 2 through the present
    # tap, x = 1 only through a pruned one: dL/dx1 = 5 + (2 + 4 + 6) (channel 1's taps).
    out_grad = np.array([1.0, np.inf, 1.0, 1.0, 1.0, 1.0])
    for dataflow in ("sort", "dense"):
        with tf.device(device):
            x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape, tf.int64))
            y = ts.direct_conv(x, w, None, mask, dataflow=dataflow)
            in_grad = ts.raw_ops.direct_sparse_conv_backprop(
                in_keys=keys, in_values=values, dense_shape=dense_shape, filter=w, filter_mask=mask,
                out_keys=y.keys, out_grad=out_grad, dataflow=dataflow).in_grad.numpy()
        np.testing.assert_array_equal(y.keys.numpy(), [0, 1, 5, 6, 7, 8], err_msg=dataflow)
        np.testing.assert_array_equal(y.values.numpy()[:2], [np.inf, 10.0], err_msg=dataflow)
        np.testing.assert_array_equal(in_grad, [17.0, np.inf], err_msg=dataflow)


def test_accumulator_is_the_deprecated_name_of_dataflow(rng):
    x, w, mask = sparse_case(rng, 2, (9, 8), 2, 3, 0.2, 0.6)
    for accumulator, dataflow in (("merge", "sort"), ("dense", "dense")):
        with pytest.warns(DeprecationWarning, match="use dataflow="):
            old = ts.direct_conv(x, w, None, mask, selection="signed", k=4, accumulator=accumulator)
        assert_identical(old, ts.direct_conv(x, w, None, mask, selection="signed", k=4, dataflow=dataflow))
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="disagree"):
        ts.direct_conv(x, w, None, mask, dataflow="dense", accumulator="merge")


def test_temp_limit_changes_nothing_on_the_cpu(rng):
    """The cap is on the GPU sort's contribution buffers; the CPU's sort holds none."""
    x, w, mask = sparse_case(rng, 3, (8, 7), 2, 3, 0.3, 0.6)
    assert_identical(ts.direct_conv(x, w, None, mask, dataflow="sort", temp_limit_bytes=1),
                     ts.direct_conv(x, w, None, mask, dataflow="sort"))


def test_pruned_weights_are_skipped_and_change_nothing(rng, device):
    dense = random_sparse(rng, 1, (8, 8), 2, 0.2)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.4)
    garbage = np.where(mask, w, 1e6)  # pruned weights hold huge values: must not leak in
    with tf.device(device):
        x = ts.from_dense(dense)
        masked = ts.direct_conv(x, w, None, mask)
        with_garbage = ts.direct_conv(x, garbage, None, mask)
    np.testing.assert_array_equal(with_garbage.values.numpy(), masked.values.numpy())


def test_bias_only_on_touched_entries_empty_space_stays_empty(rng, device):
    dense = np.zeros((1, 10, 10, 1))
    dense[0, 5, 5, 0] = 2.0
    w = np.ones((3, 3, 1, 2))
    with tf.device(device):
        y = ts.direct_conv(ts.from_dense(dense), w, np.array([10.0, -1.0]))
        out = ts.to_dense(y).numpy()
    assert y.num_entries.numpy() == 2 * 9
    np.testing.assert_allclose(out[0, 4:7, 4:7, 0], 12.0)
    np.testing.assert_allclose(out[0, 4:7, 4:7, 1], 1.0)
    assert np.count_nonzero(out) == 18


@pytest.mark.parametrize("mode", ["signed", "abs"])
@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density", [
    (2, (10, 9), 2, 3, (3, 3), 0.2),
    (3, (6, 7, 5), 2, 2, (3, 3, 3), 0.1),
])
def test_k_selection_keeps_k_best_per_batch_and_channel(rng, mode, batch, spatial, cin, cout, kernel, density,
                                                         device):
    dense = random_sparse(rng, batch, spatial, cin, density)
    w, mask = random_filter(rng, kernel, cin, cout, 0.7)
    bias = rng.standard_normal(cout)
    k = 7
    with tf.device(device):
        y, touched, positive = ts.direct_conv(ts.from_dense(dense), w, bias, mask, selection=mode, k=k,
                                              return_counts=True)
    keys, values, _ = reference_conv(dense, w, mask, bias)
    exp_keys, exp_values = reference_selection(keys, values, int(np.prod(spatial)), k, mode)
    np.testing.assert_array_equal(y.keys.numpy(), exp_keys)
    np.testing.assert_allclose(y.values.numpy(), exp_values, rtol=1e-10)
    # The bound known before the op runs: at most B * Cout * k entries.
    assert y.num_entries.numpy() <= batch * cout * k
    assert touched.numpy().max() > k  # the selection actually had work to do
    # Counts describe the support before selection, not the kept entries.
    full_keys, full_values, _ = reference_conv(dense, w, mask, bias)
    expected_positive = np.bincount(full_keys // int(np.prod(spatial)), full_values > 0, minlength=batch * cout)
    np.testing.assert_array_equal(positive.numpy().reshape(-1), expected_positive)


def test_rho_up_sets_k_to_ceil_of_rho_up_times_spatial_size(rng, device):
    dense = random_sparse(rng, 1, (10, 10), 1, 0.5)
    w = rng.standard_normal((3, 3, 1, 2))
    with tf.device(device):
        y = ts.direct_conv(ts.from_dense(dense), w, selection="signed", rho_up=0.055)
    counts = np.bincount(y.keys.numpy() // 100, minlength=2)
    np.testing.assert_array_equal(counts, [6, 6])  # ceil(0.055 * 100) = 6
    assert ts.k_from_rho_up(0.055, (10, 10)) == 6


def test_k_selection_ties_prefer_smaller_key(device):
    dense = np.zeros((1, 1, 12, 1))
    dense[0, 0, [1, 4, 7, 10], 0] = [5.0, 5.0, -5.0, 5.0]
    w = np.ones((1, 1, 1, 1))
    with tf.device(device):
        signed = ts.direct_conv(ts.from_dense(dense), w, selection="signed", k=2)
        absolute = ts.direct_conv(ts.from_dense(dense), w, selection="abs", k=3)
    np.testing.assert_array_equal(signed.keys.numpy(), [1, 4])
    np.testing.assert_array_equal(absolute.keys.numpy(), [1, 4, 7])


def test_empty_input_and_empty_batch_element(rng, device):
    w = rng.standard_normal((3, 3, 2, 3))
    with tf.device(device):
        empty = ts.ChannelSparseTensor(tf.zeros([0], tf.int64), tf.zeros([0], tf.float64),
                                       tf.constant([2, 5, 5, 2], tf.int64))
        y = ts.direct_conv(empty, w, np.ones(3), selection="signed", k=3)
    assert y.num_entries.numpy() == 0
    dense = random_sparse(rng, 3, (5, 5), 2, 0.3)
    dense[1] = 0.0
    with tf.device(device):
        y = ts.direct_conv(ts.from_dense(dense), w, np.ones(3))
    keys, values, _ = reference_conv(dense, w, np.ones_like(w, bool), np.ones(3))
    np.testing.assert_array_equal(y.keys.numpy(), keys)
    np.testing.assert_allclose(y.values.numpy(), values, rtol=1e-10)


def _conv_values_fn(x, mask, device, **kwargs):
    def f(values, filters, bias):
        y = ts.direct_conv(x.with_values(values), filters, bias, mask, **kwargs).values
        assert_on(device, y)
        return y
    return f


@pytest.mark.soft_placement
@pytest.mark.parametrize("spatial,kernel,cin,cout,dataflow", [
    ((7, 6), (3, 3), 2, 3, "dense"),
    ((7, 6), (3, 3), 2, 3, "sort"),
    ((5, 4, 5), (3, 3, 3), 2, 2, "auto"),
    ((11,), (5,), 3, 2, "auto"),
])
def test_gradients_match_numerical_jacobian_float64(rng, spatial, kernel, cin, cout, dataflow, device):
    dense = random_sparse(rng, 2, spatial, cin, 0.25)
    w, mask = random_filter(rng, kernel, cin, cout, 0.6)
    with tf.device(device):
        x = ts.from_dense(dense)
        theoretical, numerical = tf.test.compute_gradient(
            _conv_values_fn(x, mask, device, dataflow=dataflow),
            [x.values, tf.constant(w), tf.constant(rng.standard_normal(cout))])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=1e-7)


def test_gradients_follow_eq3_support_and_present_zero_weights(rng, device):
    dense = random_sparse(rng, 2, (6, 6), 2, 0.3)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.5)
    present_zero = np.argwhere(mask)[0]
    w[tuple(present_zero)] = 0.0  # a weight passing through zero keeps its gradient
    with tf.device(device):
        x = ts.from_dense(dense)
        filters = tf.Variable(w)
        bias = tf.Variable(np.zeros(3))
        with tf.GradientTape() as tape:
            y = ts.direct_conv(x, filters, bias, mask)
            loss = tf.reduce_sum(y.values ** 2)
        g_filter, g_bias = tape.gradient(loss, [filters, bias])
    assert np.all(g_filter.numpy()[~mask] == 0.0)
    assert g_filter.numpy()[tuple(present_zero)] != 0.0
    # Bias gradient: sum of dL/dy over the entries that received the bias.
    grad_y = 2 * y.values.numpy()
    seg = y.keys.numpy() // 36 % 3
    assert_close_on(device, g_bias.numpy(), np.bincount(seg, grad_y, minlength=3), rtol=1e-12)


@pytest.mark.parametrize("mode", ["signed", "abs"])
def test_dropped_entries_receive_no_gradient_and_kept_match_dense_gradient(rng, mode, device):
    dense = random_sparse(rng, 2, (8, 7), 2, 0.3)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.6)
    bias = rng.standard_normal(3)
    with tf.device(device):
        x = ts.from_dense(dense)
        values, filters, b = tf.constant(x.values), tf.constant(w), tf.constant(bias)
        with tf.GradientTape() as tape:
            tape.watch([values, filters, b])
            y = ts.direct_conv(x.with_values(values), filters, b, mask, selection=mode, k=5)
            upstream = tf.constant(rng.standard_normal(y.values.shape[0]))
            loss = tf.reduce_sum(y.values * upstream)
        g_values, g_filter, g_bias = tape.gradient(loss, [values, filters, b])
    # Reference: the dense convolution, differentiated through the kept positions only.
    with tf.device(CPU):
        dense_in = tf.constant(dense)
        dense_w = tf.constant(w * mask)
        kept_idx = ts.decode_keys(y.keys, y.dense_shape)
        with tf.GradientTape() as tape:
            tape.watch([dense_in, dense_w])
            full = tf.nn.convolution(dense_in, dense_w, padding="SAME")
            ref_loss = tf.reduce_sum(tf.gather_nd(full, kept_idx) * upstream)
        ref_in, ref_w = tape.gradient(ref_loss, [dense_in, dense_w])
        ref_values = ts.gather_dense(x, ref_in).values.numpy()
    assert_close_on(device, g_values.numpy(), ref_values, atol=1e-10)
    assert_close_on(device, g_filter.numpy(), ref_w.numpy() * mask, atol=1e-10)
    seg = y.keys.numpy() // 56 % 3
    assert_close_on(device, g_bias.numpy(), np.bincount(seg, upstream.numpy(), minlength=3), atol=1e-10)


def test_conv_in_tf_function_with_gradient(rng, device):
    dense = random_sparse(rng, 2, (6, 6, 6), 1, 0.1, np.float32)
    with tf.device(device):
        w = tf.Variable(rng.standard_normal((3, 3, 3, 1, 4)).astype(np.float32))
        x = ts.from_dense(dense)
    spec = ts.ChannelSparseTensor.spec([None, 6, 6, 6, 1], tf.float32)

    @tf.function(input_signature=[spec])
    def step(inp):
        with tf.GradientTape() as tape:
            y = ts.sparse_relu(ts.direct_conv(inp, w, selection="signed", rho_up=0.05))
            loss = tf.reduce_sum(y.values)
        return loss, tape.gradient(loss, w)

    with tf.device(device):
        loss, grad = step(x)
        eager_y = ts.sparse_relu(ts.direct_conv(x, w, selection="signed", rho_up=0.05))
    np.testing.assert_allclose(loss.numpy(), tf.reduce_sum(eager_y.values).numpy(), rtol=1e-6)
    assert grad.shape == w.shape


@pytest.mark.parametrize("check_every_op", [None, "0", "1"])
def test_the_gradient_tells_backprop_its_inputs_were_checked_unless_every_op_checks(rng, monkeypatch, check_every_op):
    if check_every_op is None:
        monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    else:
        monkeypatch.setenv(ts.checks.CHECK_EVERY_OP_ENV, check_every_op)
    x = ts.from_dense(random_sparse(rng, 1, (5, 5), 1, 0.4, np.float32))
    w = tf.Variable(rng.standard_normal((3, 3, 1, 2)).astype(np.float32))

    @tf.function
    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ts.direct_conv(x, w).values)
        return tape.gradient(loss, w)

    graph = grad.get_concrete_function().graph
    backprops = [op for op in graph.get_operations() if op.type.endswith("DirectSparseConvBackprop")]
    assert len(backprops) == 1
    assert backprops[0].get_attr("inputs_checked") == (check_every_op != "1")

    @tf.function
    def dense_grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ts.to_dense(ts.direct_conv(x, w)))
        return tape.gradient(loss, w)

    gathers = [op for op in dense_grad.get_concrete_function().graph.get_operations()
               if op.type.endswith("ChannelSparseGatherDense")]
    assert len(gathers) == 1 and gathers[0].get_attr("inputs_checked") == (check_every_op != "1")
    # the same gradient either way
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(ts.direct_conv(x, w).values)
    np.testing.assert_allclose(grad().numpy(), tape.gradient(loss, w).numpy(), rtol=1e-6)


def test_check_every_op_takes_0_or_1(monkeypatch):
    monkeypatch.setenv(ts.checks.CHECK_EVERY_OP_ENV, "yes")
    with pytest.raises(ValueError, match="TF_SPARSECONV_CHECK_EVERY_OP must be 0 or 1, got 'yes'"):
        ts.checks.check_every_op()


def test_backprop_on_the_cpu_checks_its_inputs_even_when_told_they_were_checked(rng):
    from tf_sparseconv._op_library import ops
    w = tf.constant(rng.standard_normal((3, 3, 1, 2)).astype(np.float32))
    with tf.device(CPU), pytest.raises(tf.errors.InvalidArgumentError, match="sorted"):
        ops.direct_sparse_conv_backprop(
            in_keys=tf.constant([3, 1], tf.int64), in_values=tf.ones([2]), dense_shape=tf.constant([1, 5, 5, 1], tf.int64),
            filter=w, filter_mask=tf.ones_like(w, tf.bool), out_keys=tf.constant([0], tf.int64),
            out_grad=tf.ones([1]), inputs_checked=True)


def test_conv_savedmodel_round_trip(rng, tmp_path):
    dense = random_sparse(rng, 1, (7, 7), 2, 0.3, np.float32)
    x = ts.from_dense(dense)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.5, np.float32)

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(w)
            self.mask = tf.Variable(mask, trainable=False)

        @tf.function(input_signature=[ts.ChannelSparseTensor.spec([None, None, None, 2], tf.float32)])
        def __call__(self, inp):
            return ts.direct_conv(inp, self.w, None, self.mask, selection="abs", k=6)

    net = Net()
    expected = net(x)
    tf.saved_model.save(net, str(tmp_path / "model"))
    restored = tf.saved_model.load(str(tmp_path / "model"))
    got = restored(x)
    np.testing.assert_array_equal(got.keys.numpy(), expected.keys.numpy())
    np.testing.assert_array_equal(got.values.numpy(), expected.values.numpy())


@pytest.mark.soft_placement
def test_savedmodel_runs_on_gpu_like_eager_cpu(rng, tmp_path, gpu):
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, 2, (9, 8, 7), 2, 4, (3, 3, 3), 0.1, 0.5,
                                                           np.float32)

    class Net(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(w)
            self.b = tf.Variable(bias)
            self.mask = tf.Variable(mask, trainable=False)

        @tf.function(input_signature=[ts.ChannelSparseTensor.spec([None] * 5, tf.float32)])
        def __call__(self, x):
            y = ts.sparse_relu(ts.direct_conv(x, self.w, self.b, self.mask, selection="abs", k=30))
            return ts.sparse_max_pool(y, 2)

    with tf.device(CPU):
        expected = Net()(sparse_on(CPU, keys, values, dense_shape))
    tf.saved_model.save(Net(), str(tmp_path / "model"))
    with tf.device(GPU):
        restored = tf.saved_model.load(str(tmp_path / "model"))
        got = restored(sparse_on(GPU, keys, values, dense_shape))
    assert_same_sparse(got, expected, np.float32)


def _sparse(keys, shape, dtype=tf.float64):
    keys = tf.constant(keys, tf.int64)
    return ts.ChannelSparseTensor(keys, tf.ones(tf.shape(keys), dtype), tf.constant(shape, tf.int64))


@pytest.mark.parametrize("keys,match", [
    ([3, 1, 5], "must be sorted"),
    ([1, 3, 3], "must be unique"),
    ([-1, 2], "out of range"),
    ([2, 50], "out of range"),
])
def test_conv_rejects_malformed_keys(keys, match):
    x = _sparse(keys, [1, 5, 5, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        ts.direct_conv(x, np.ones((3, 3, 1, 1)))


@pytest.mark.parametrize("filter_shape,mask_shape,bias_shape,match", [
    ((3, 3, 2, 1), None, None, "channel mismatch"),
    ((2, 3, 1, 1), None, None, "odd"),
    ((3, 3, 3, 1, 1), None, None, "rank 4"),
    ((3, 3, 1, 2), (3, 3, 1, 1), None, "filter_mask must have"),
    ((3, 3, 1, 2), None, (3,), "bias must have shape"),
])
def test_conv_rejects_mismatched_filter_mask_or_bias(filter_shape, mask_shape, bias_shape, match):
    x = _sparse([0, 7], [1, 5, 5, 1])
    mask = None if mask_shape is None else np.ones(mask_shape, bool)
    bias = None if bias_shape is None else np.zeros(bias_shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        ts.direct_conv(x, np.ones(filter_shape), bias, mask)


@pytest.mark.parametrize("kwargs,match", [
    (dict(selection="signed", rho_up=1.5), r"rho_up must be in \(0, 1\]"),
    (dict(selection="signed", rho_up=-0.1), r"rho_up must be in \(0, 1\]"),
    (dict(selection="signed", rho_up=float("nan")), r"rho_up must be in \(0, 1\]"),
    (dict(selection="none", k=3), "selection='none'"),
    (dict(selection="abs", k=3, rho_up=0.1), "exactly one of"),
    (dict(selection="signed"), "exactly one of"),
    (dict(selection="signed", k=-2), "k must be >= 0"),
])
def test_conv_rejects_bad_selection_options(kwargs, match):
    x = _sparse([0, 7], [1, 5, 5, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        ts.direct_conv(x, np.ones((3, 3, 1, 1)), **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(selection="top"), "selection must be one of"),
    (dict(dataflow="fastest"), r"dataflow must be one of \('auto', 'sort', 'dense', 'bitmap', 'atomic'\)"),
    (dict(accumulator="hash"), "accumulator must be one of"),
    (dict(temp_limit_bytes=-1), "temp_limit_bytes must be a whole number of bytes >= 0"),
    (dict(temp_limit_bytes=1.5), "temp_limit_bytes must be a whole number of bytes >= 0"),
    (dict(temp_limit_bytes="12MB"), "temp_limit_bytes must be a whole number of bytes >= 0"),
])
def test_conv_rejects_unknown_choices_in_python(kwargs, match):
    x = _sparse([0, 7], [1, 5, 5, 1])
    with pytest.raises(ValueError, match=match):
        ts.direct_conv(x, np.ones((3, 3, 1, 1)), **kwargs)


@pytest.mark.parametrize("kwargs,error,match", [
    # A complex filter used to lose its imaginary part in the conversion to the values' dtype.
    (dict(filters=np.ones((3, 3, 1, 1)) * (1 + 1j)), TypeError, "direct_conv: filters must be real numbers"),
    (dict(bias=np.ones(1) * 1j), TypeError, "direct_conv: bias must be real numbers"),
    (dict(selection="abs", k=2.5), TypeError, "direct_conv: k must be an int, got 2.5"),  # used to truncate to 2
])
def test_conv_refuses_what_a_cast_would_change(kwargs, error, match):
    x = _sparse([0, 7], [1, 5, 5, 1])
    kwargs = dict(dict(filters=np.ones((3, 3, 1, 1))), **kwargs)
    with pytest.raises(error, match=match):
        ts.direct_conv(x, **kwargs)


@pytest.mark.parametrize("rho_up", [[0.5], True, "0.5"], ids=["list", "bool", "string"])
def test_conv_names_a_rho_up_that_is_not_a_number(rho_up):
    x = _sparse([0, 7], [1, 5, 5, 1])
    with pytest.raises(TypeError, match="direct_conv: rho_up must be a number"):  # was float()'s message
        ts.direct_conv(x, np.ones((3, 3, 1, 1)), selection="abs", rho_up=rho_up)


@pytest.mark.parametrize("dataflow", ["bitmap", "atomic"])
def test_gpu_only_dataflows_are_refused_on_the_cpu(rng, dataflow):
    x, w, mask = sparse_case(rng, 1, (5, 5), 1, 2, 0.3, 1.0)
    with tf.device(CPU):
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"dataflow '{dataflow}' runs on the GPU only"):
            ts.direct_conv(x, w, None, mask, dataflow=dataflow)


def test_conv_op_rejects_unknown_dataflow_and_negative_temp_limit():
    x = _sparse([0, 7], [1, 5, 5, 1])
    inputs = dict(in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape,
                  filter=tf.ones((3, 3, 1, 1), tf.float64), filter_mask=tf.ones((3, 3, 1, 1), tf.bool))
    with pytest.raises(tf.errors.InvalidArgumentError, match="dataflow"):
        ts.raw_ops.direct_sparse_conv(**inputs, bias=tf.zeros([1], tf.float64), dataflow="fastest")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"temp_limit_bytes must be >= 0 \(0: no limit\), got -1"):
        ts.raw_ops.direct_sparse_conv(**inputs, bias=tf.zeros([1], tf.float64), temp_limit_bytes=-1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dataflow"):
        ts.raw_ops.direct_sparse_conv_backprop(**inputs, out_keys=x.keys, out_grad=x.values, dataflow="merge")


@pytest.mark.parametrize("where", ["values", "filter", "bias"])
def test_conv_rejects_nan(where):
    x = _sparse([0, 7], [1, 5, 5, 1])
    values, w, b = np.ones(2), np.ones((3, 3, 1, 1)), np.zeros(1)
    {"values": values, "filter": w, "bias": b}[where].flat[0] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):
        ts.direct_conv(x.with_values(tf.constant(values)), w, b)


def test_conv_rejects_key_overflow_and_bad_dense_shape():
    with pytest.raises(tf.errors.InvalidArgumentError, match="key overflow"):
        ts.direct_conv(_sparse([0], [2**21, 2**21, 2**21, 1]), np.ones((1, 1, 1, 1)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be positive"):
        ts.direct_conv(_sparse([], [1, 0, 5, 1]), np.ones((1, 1, 1, 1)))


@pytest.mark.parametrize("filter_density", [1.0, 0.5, 0.15])
def test_cpu_backprop_dataflows_agree_over_batches_of_several_examples_per_chunk(rng, filter_density):
    # 20 examples: the dense path's units (at most 16 batch chunks) take two examples each
    # in turn through one [S, Cout] buffer; k-selection leaves outputs without a gradient.
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, 20, (7, 8, 6), 3, 5, (3, 3, 3), 0.1,
                                                           filter_density, np.float64)
    y, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias, selection="abs", k=20)
    out_keys = y.keys.numpy()
    out_grad = rng.standard_normal(len(out_keys))
    dense = backprop(CPU, keys, values, dense_shape, w, mask, out_keys, out_grad, dataflow="dense")
    merged = backprop(CPU, keys, values, dense_shape, w, mask, out_keys, out_grad, dataflow="sort")
    assert np.count_nonzero(dense[0]) > len(keys) // 2
    for got, expected in zip(dense, merged):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert np.all(dense[1][~mask] == 0)


def eager_and_traced_gradients(device, inputs, dataflow, wanted):
    """The gradients of sum(y^2) by the input values, the filter and the bias of one direct_conv
    on `device`: all three from an eager call, and those `wanted` (indices) from a traced one."""
    keys, values, dense_shape, w, mask, bias = inputs

    def gradients(x_values, filters, b, which):
        with tf.GradientTape() as tape:
            x = ts.ChannelSparseTensor(tf.constant(keys), x_values, tf.constant(dense_shape))
            y = ts.direct_conv(x, filters, b, mask, dataflow=dataflow)
            loss = tf.reduce_sum(y.values * y.values)
        return tape.gradient(loss, [[x_values, filters, b][i] for i in which])

    with tf.device(device):
        x_values, filters, b = tf.Variable(values), tf.Variable(w), tf.Variable(bias)
        eager = [g.numpy() for g in gradients(x_values, filters, b, (0, 1, 2))]
        traced = [g.numpy() for g in tf.function(lambda: gradients(x_values, filters, b, wanted))()]
    assert np.any(eager[0] != 0) and np.any(eager[1] != 0)
    return eager, traced


@pytest.mark.parametrize("dataflow", ["sort", "dense"])
@pytest.mark.parametrize("wanted", [(0,), (1, 2), (0, 2), (2,)])
def test_cpu_traced_gradients_of_a_subset_match_eager(rng, dataflow, wanted):
    """In a traced function that asks for some of the input's, the filter's and the bias'
    gradients, the CPU backprop kernel computes only those an op reads (output_required):
    each equals an eager call's, which computes every gradient, bit for bit."""
    inputs = conv_inputs(rng, 3, (7, 8, 6), 2, 4, (3, 3, 3), 0.2, 0.6, np.float32)
    eager, traced = eager_and_traced_gradients(CPU, inputs, dataflow, wanted)
    for got, i in zip(traced, wanted):
        np.testing.assert_array_equal(got, eager[i])


def test_backprop_op_rejects_output_keys_of_another_geometry():
    x = _sparse([0, 7], [1, 5, 5, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="output key out of range"):
        ts.raw_ops.direct_sparse_conv_backprop(
            in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape, filter=tf.ones((3, 3, 1, 1), tf.float64),
            filter_mask=tf.ones((3, 3, 1, 1), tf.bool), out_keys=tf.constant([0, 99], tf.int64),
            out_grad=tf.ones([2], tf.float64))


def test_k_from_rho_up_matches_the_op_where_rho_up_times_size_is_whole(device):
    """ceil(0.1 * 100) is 10 in double precision, but the op holds rho_up as float32 (0.1000000015)
    and keeps 11: the Python bound must say 11 too."""
    from tf_sparseconv.channel.direct_conv import k_from_rho_up
    assert k_from_rho_up(0.1, (10, 10)) == 11
    dense = np.zeros((1, 10, 10, 1), np.float32)
    dense[0, :, :, 0] = np.arange(1, 101, dtype=np.float32).reshape(10, 10)
    with tf.device(device):
        y = ts.direct_conv(ts.from_dense(dense), np.ones((1, 1, 1, 1), np.float32), selection="signed", rho_up=0.1)
    assert int(y.num_entries) == k_from_rho_up(0.1, (10, 10))


@pytest.mark.parametrize("rho_up, spatial_shape, error, message", [
    (True, (4, 4), TypeError, "rho_up must be a number, got True"),
    ("0.5", (4, 4), TypeError, "rho_up must be a number, got '0.5'"),
    (None, (4, 4), TypeError, "rho_up must be a number, got None"),
    (float("nan"), (4, 4), ValueError, r"rho_up must be in \(0, 1\], got nan"),
    (0.5, (-4, 4), ValueError, "spatial_shape entries must be >= 1, got -4"),
    (0.5, (0, 4), ValueError, "spatial_shape entries must be >= 1, got 0"),
    (0.5, (4.7, 4), TypeError, "spatial_shape entries must be an int, got 4.7"),
    (0.5, (), ValueError, "spatial_shape must have at least one extent"),
    (0.5, 4, TypeError, "spatial_shape must be a sequence of extents"),
])
def test_k_from_rho_up_refuses_bad_bounds_and_extents(rho_up, spatial_shape, error, message):
    # Before: True was rho 1 (k 16), extents (-4, 4) gave k = -8, (0, 4) k = 0, (4.7, 4) k = 8
    # (truncated), () k = 1; a string or None raised "'<' not supported between instances".
    with pytest.raises(error, match=f"k_from_rho_up: {message}"):
        ts.k_from_rho_up(rho_up, spatial_shape)
    assert ts.k_from_rho_up(np.float32(0.5), (np.int64(4), 4)) == 8


# --- on the GPU, against the CPU ----------------------------------------------------------------

@pytest.fixture(params=["sort", "dense", "bitmap", "atomic"])
def gpu_dataflow(request):
    """The direct convolution's GPU dataflows (`dataflow=`; `auto` picks the dense grid for every
    small grid here): a test taking this fixture runs its GPU calls with each forced."""
    return request.param


def on_cpu(dataflow):
    """The CPU's dataflow for a GPU test's reference run: 'bitmap' and 'atomic' are the GPU's
    alone, and their results are the sort's (the atomic sums' within rounding)."""
    return "sort" if dataflow in ("bitmap", "atomic") else dataflow


def assert_same_error_per_device(fn, phrase):
    """fn(device) raises InvalidArgumentError matching phrase on the CPU and the GPU, with one message."""
    messages = {}
    for device in (CPU, GPU):
        with pytest.raises(tf.errors.InvalidArgumentError, match=phrase) as error:
            with tf.device(device):
                fn(device)
        messages[device] = first_line(error.value)
    assert messages[GPU] == messages[CPU]


def conv_inputs(rng, batch, spatial, cin, cout, kernel, density, filter_density, dtype, tie_values=None):
    empty_batch = 1 if batch == 3 else None
    keys, values, dense_shape = random_sparse_components(rng, (batch, *spatial, cin), density, dtype,
                                                         empty_batch=empty_batch, tie_values=tie_values)
    w, mask = random_filter(rng, kernel, cin, cout, filter_density, dtype)
    bias = rng.standard_normal(cout).astype(dtype)
    return keys, values, dense_shape, w, mask, bias


def run_conv(device, keys, values, dense_shape, w, mask, bias, **kwargs):
    """direct_conv on `device` (dataflow="auto" unless kwargs name one)."""
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        y, touched, positive = ts.direct_conv(x, tf.constant(w), tf.constant(bias), tf.constant(mask),
                                              return_counts=True, **kwargs)
        return y, tf.stack([touched, positive])  # [2, B, Cout]: touched and positive counts


SELECTIONS = [pytest.param({}, id="none"), pytest.param(dict(selection="signed", k=5), id="signed-k5"),
              pytest.param(dict(selection="abs", k=3), id="abs-k3"),
              pytest.param(dict(selection="signed", rho_up=0.2), id="signed-rho0.2"),
              pytest.param(dict(selection="abs", k=1), id="abs-k1"),
              pytest.param(dict(selection="signed", k=100000), id="signed-k-above-touched")]


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", GPU_CONV_CASES)
def test_conv_matches_cpu(rng, batch, spatial, cin, cout, kernel, density, filter_density, selection, dtype,
                          gpu_dataflow, gpu):
    inputs = conv_inputs(rng, batch, spatial, cin, cout, kernel, density, filter_density, dtype)
    y_cpu, counts_cpu = run_conv(CPU, *inputs, **selection)
    y_gpu, counts_gpu = run_conv(GPU, *inputs, dataflow=gpu_dataflow, **selection)
    assert_same_sparse(y_gpu, y_cpu, dtype)
    assert_on_gpu(counts_gpu)
    np.testing.assert_array_equal(counts_gpu.numpy(), counts_cpu.numpy())


@pytest.mark.parametrize("selection", ["signed", "abs"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_conv_k_selection_ties_go_to_the_smaller_key_like_cpu(rng, selection, k, dtype, gpu_dataflow, gpu):
    # Values and weights from small integer sets: many equal responses, exact in float32.
    inputs = conv_inputs(rng, 2, (8, 9), 2, 3, (3, 3), 0.3, 0.7, dtype, tie_values=[-1.0, 1.0, 2.0])
    keys, values, dense_shape, w, mask, _ = inputs
    w = np.round(w).astype(dtype)
    bias = np.zeros(3, dtype)
    touched, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias)
    segments = touched.keys.numpy() // (8 * 9)
    scores = touched.values.numpy() if selection == "signed" else np.abs(touched.values.numpy())
    assert any(len(np.unique(scores[segments == s])) < np.sum(segments == s) for s in np.unique(segments)), \
        "the case needs tied responses within a segment"
    y_cpu, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias, selection=selection, k=k)
    y_gpu, _ = run_conv(GPU, keys, values, dense_shape, w, mask, bias, selection=selection, k=k,
                        dataflow=gpu_dataflow)
    assert_same_sparse(y_gpu, y_cpu, dtype)


def test_conv_k_selection_ties_at_zero_prefer_the_smaller_key(gpu_dataflow, gpu):
    # Stored +0 and -0 entries are equal responses, as on the CPU.
    keys = np.array([1, 4, 7, 10], np.int64)
    values = np.array([3.0, -0.0, 0.0, 3.0])
    w, mask, bias = np.ones((1, 1, 1, 1)), np.ones((1, 1, 1, 1), bool), np.array([0.0])
    for selection in ("signed", "abs"):
        y_cpu, _ = run_conv(CPU, keys, values, np.array([1, 1, 12, 1]), w, mask, bias, selection=selection, k=3)
        y_gpu, _ = run_conv(GPU, keys, values, np.array([1, 1, 12, 1]), w, mask, bias, selection=selection, k=3,
                            dataflow=gpu_dataflow)
        np.testing.assert_array_equal(y_cpu.keys.numpy(), [1, 4, 10])
        np.testing.assert_array_equal(y_gpu.keys.numpy(), y_cpu.keys.numpy())


@pytest.mark.parametrize("selection", [pytest.param(dict(selection="signed", k=1), id="signed-k1"),
                                       pytest.param(dict(selection="abs", k=40), id="abs-k40"),
                                       pytest.param(dict(selection="signed", rho_up=0.3), id="signed-rho0.3"),
                                       pytest.param(dict(selection="signed", k=300), id="signed-k300"),
                                       pytest.param(dict(selection="abs", k=100000), id="abs-k-above-touched")])
@pytest.mark.parametrize("spatial,density", [pytest.param((9, 8, 7), 0.3, id="tiles-of-ties"),
                                             pytest.param((16, 16, 16), 0.05, id="larger-segments")])
def test_k_selection_over_many_segments_matches_cpu(rng, spatial, density, selection, dtype, gpu_dataflow, gpu):
    """4 examples x 64 output channels = 256 segments: the GPU selects them a block per segment
    (SelectSegmentsKernel, from 256 segments), with responses from small integer sets, so ties
    that span the block's tiles of 256 entries decide the kept set."""
    keys, values, dense_shape, w, mask, _ = conv_inputs(rng, 4, spatial, 2, 64, (3, 3, 3), density, 0.5, dtype,
                                                        tie_values=[-1.0, 1.0, 2.0])
    w = np.round(w * 2).astype(dtype)
    bias = np.zeros(64, dtype)
    touched, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias)
    segments = touched.keys.numpy() // np.prod(spatial)
    assert len(np.unique(segments)) >= 250 and np.bincount(segments).max() > 256, \
        "the case needs about 256 segments, some of more than one tile"
    y_cpu, counts_cpu = run_conv(CPU, keys, values, dense_shape, w, mask, bias, **selection)
    y_gpu, counts_gpu = run_conv(GPU, keys, values, dense_shape, w, mask, bias, dataflow=gpu_dataflow, **selection)
    assert_same_sparse(y_gpu, y_cpu, dtype)
    np.testing.assert_array_equal(counts_gpu.numpy(), counts_cpu.numpy())


@pytest.mark.parametrize("selection", [pytest.param(dict(selection="signed", k=1), id="signed-k1"),
                                       pytest.param(dict(selection="abs", k=700), id="abs-k700"),
                                       pytest.param(dict(selection="signed", k=5000), id="signed-k5000"),
                                       pytest.param(dict(selection="signed", rho_up=0.2), id="signed-rho0.2"),
                                       pytest.param(dict(selection="abs", k=10 ** 6), id="abs-k-above-touched")])
@pytest.mark.parametrize("batch,spatial,cout,density", [
    pytest.param(2, (40, 36, 20), 4, 0.2, id="segments-over-many-tiles"),
    pytest.param(3, (5, 4, 3), 60, 0.3, id="many-segments-per-tile")])
def test_k_selection_by_rounds_matches_cpu(rng, batch, spatial, cout, density, selection, dtype, gpu_dataflow,
                                           gpu):
    """Fewer than 256 segments: the GPU selects in rounds of launches over the whole touched set
    (SelectByRounds). Responses from small integer sets, so the entries equal to the threshold
    span the rank tiles of 2,048 entries and the histograms' of 4,096 (segments of up to about
    28,000 entries), or one tile holds dozens of small segments."""
    keys, values, dense_shape, w, mask, _ = conv_inputs(rng, batch, spatial, 2, cout, (3, 3, 3), density, 0.5,
                                                        dtype, tie_values=[-1.0, 1.0, 2.0])
    w = np.round(w * 2).astype(dtype)
    bias = np.zeros(cout, dtype)
    touched, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias)
    segments = touched.keys.numpy() // np.prod(spatial)
    assert len(np.unique(segments)) < 256, "the case must take the rounds, not a block per segment"
    y_cpu, counts_cpu = run_conv(CPU, keys, values, dense_shape, w, mask, bias, **selection)
    y_gpu, counts_gpu = run_conv(GPU, keys, values, dense_shape, w, mask, bias, dataflow=gpu_dataflow, **selection)
    assert_same_sparse(y_gpu, y_cpu, dtype)
    np.testing.assert_array_equal(counts_gpu.numpy(), counts_cpu.numpy())


@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", GPU_CONV_CASES)
def test_conv_values_are_bit_identical_to_cpu(rng, batch, spatial, cin, cout, kernel, density, filter_density,
                                              dtype, gpu_dataflow, gpu):
    """Contributions are summed in the CPU's order with the CPU's roundings (no FMA)."""
    if gpu_dataflow == "atomic":
        pytest.skip("the atomic sums add in the order the atomics run: within rounding of the CPU's")
    inputs = conv_inputs(rng, batch, spatial, cin, cout, kernel, density, filter_density, dtype)
    y_cpu, _ = run_conv(CPU, *inputs)
    y_gpu, _ = run_conv(GPU, *inputs, dataflow=gpu_dataflow)
    np.testing.assert_array_equal(y_gpu.values.numpy(), y_cpu.values.numpy())


def test_conv_of_an_empty_input_and_all_pruned_filter(rng, dtype, gpu_dataflow, gpu):
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.5, dtype)
    empty = (np.zeros([0], np.int64), np.zeros([0], dtype), np.array([2, 5, 5, 2], np.int64))
    for filter_mask in (mask, np.zeros_like(mask)):
        for kwargs in ({}, dict(selection="signed", k=3)):
            y_gpu, touched = run_conv(GPU, *empty, w, filter_mask, np.ones(3, dtype), dataflow=gpu_dataflow,
                                      **kwargs)
            assert y_gpu.keys.shape[0] == 0
            np.testing.assert_array_equal(touched.numpy(), np.zeros((2, 2, 3)))
    keys, values, dense_shape = random_sparse_components(rng, [2, 5, 5, 2], 0.4, dtype)
    y_gpu, touched = run_conv(GPU, keys, values, dense_shape, w, np.zeros_like(mask), np.ones(3, dtype),
                              dataflow=gpu_dataflow)
    assert y_gpu.keys.shape[0] == 0 and not touched.numpy().any()


def test_gpu_dataflows_give_bit_identical_results(rng, gpu):
    inputs = conv_inputs(rng, 2, (9, 8, 7), 2, 3, (3, 3, 3), 0.1, 0.6, np.float32)
    results = [run_conv(GPU, *inputs, dataflow=dataflow)[0] for dataflow in ("auto", "sort", "dense", "bitmap")]
    for y in results[1:]:
        np.testing.assert_array_equal(y.keys.numpy(), results[0].keys.numpy())
        np.testing.assert_array_equal(y.values.numpy(), results[0].values.numpy())


def atomic_sized_inputs(rng, dtype=np.float32):
    """Past the 2^20 contribution slots from which the GPU's 'auto' takes the atomic sums, on a grid
    whose dense buffers would outweigh the sort's and with more present weights per output channel
    than the bitmaps take: 'auto' takes the atomic sums (direct_conv_gpu.h, ForwardPathOf)."""
    return conv_inputs(rng, 1, (96, 96, 96), 2, 8, (3, 3, 3), 0.004, 1.0, dtype)


def atomic_kernel_ran(dataflow, inputs):
    """Whether a GPU call of run_conv with `dataflow` runs the atomic sums' kernel (TensorFlow's
    profiler; start it in a process of its own, as the profiler is the process's)."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from gpu_trace import traced_events
    events = traced_events(lambda: run_conv(GPU, *inputs, dataflow=dataflow), (), 1)
    return any("AtomicContributionsKernel" in name for _, _, name in events)


def test_atomic_sums_agree_with_the_sort_on_a_large_case(rng, gpu):
    inputs = atomic_sized_inputs(rng)
    keys, _, _, _, mask, _ = inputs
    assert len(keys) * mask.sum(axis=(0, 1, 2, 4)).max() >= 2**20, "the case needs 2^20 contribution slots"
    for selection in ({}, dict(selection="signed", rho_up=0.02)):
        y_sort, counts_sort = run_conv(GPU, *inputs, dataflow="sort", **selection)
        y, counts = run_conv(GPU, *inputs, dataflow="atomic", **selection)
        assert_same_sparse(y, y_sort, np.float32)
        np.testing.assert_array_equal(counts.numpy(), counts_sort.numpy())


def test_auto_takes_the_atomic_sums_on_a_large_case(gpu):
    output = run_in_own_process("""
        import numpy as np
        from tests.channel.test_direct_conv import atomic_kernel_ran, atomic_sized_inputs
        inputs = atomic_sized_inputs(np.random.default_rng(7))
        print("auto", atomic_kernel_ran("auto", inputs), "sort", atomic_kernel_ran("sort", inputs))
    """)
    assert "auto True sort False" in output


def test_atomic_sums_are_refused_and_auto_deterministic_under_op_determinism(gpu):
    # enable_op_determinism cannot be turned off again: a process of its own.
    output = run_in_own_process("""
        import numpy as np, pytest, tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from tests.channel.test_direct_conv import GPU, atomic_sized_inputs, run_conv
        inputs = atomic_sized_inputs(np.random.default_rng(7))
        with pytest.raises(tf.errors.InvalidArgumentError, match="dataflow 'atomic' sums with float atomics"):
            run_conv(GPU, *inputs, dataflow="atomic")
        first, second = (run_conv(GPU, *inputs)[0] for _ in range(2))
        sort = run_conv(GPU, *inputs, dataflow="sort")[0]
        for y in (second, sort):  # 'auto' took a deterministic dataflow: the sort's bits
            np.testing.assert_array_equal(y.keys.numpy(), first.keys.numpy())
            np.testing.assert_array_equal(y.values.numpy().view(np.uint32), first.values.numpy().view(np.uint32))
        from tests.channel.test_direct_conv import atomic_kernel_ran
        assert not atomic_kernel_ran("auto", inputs)
        print("deterministic without the atomic sums")
    """)
    assert "deterministic without the atomic sums" in output


def large_conv_inputs(rng, dtype):
    """Enough entries for many compaction tiles, sort passes and gradient parts per segment."""
    return conv_inputs(rng, 2, (40, 36, 32), 2, 4, (3, 3, 3), 0.03, 0.6, dtype)


@pytest.mark.parametrize("selection", [pytest.param({}, id="none"),
                                       pytest.param(dict(selection="signed", rho_up=0.01), id="signed"),
                                       pytest.param(dict(selection="abs", k=500), id="abs")])
def test_large_conv_matches_cpu(rng, selection, dtype, gpu_dataflow, gpu):
    inputs = large_conv_inputs(rng, dtype)
    y_cpu, counts_cpu = run_conv(CPU, *inputs, **selection)
    y_gpu, counts_gpu = run_conv(GPU, *inputs, dataflow=gpu_dataflow, **selection)
    assert counts_cpu.numpy()[0].min() > 2048, "the case needs segments larger than a tile"
    assert_same_sparse(y_gpu, y_cpu, dtype)
    np.testing.assert_array_equal(counts_gpu.numpy(), counts_cpu.numpy())


@pytest.mark.parametrize("selection", [pytest.param({}, id="none"),
                                       pytest.param(dict(selection="signed", k=900), id="signed")])
def test_sparse_input_on_a_large_grid_matches_cpu(rng, selection, dtype, gpu_dataflow, gpu):
    """Fig. 4's setting scaled down: a 96 x 80 x 64 grid at density 1/64, 1 -> 8 channels, 10 % of
    the weights present. The output bits of the bitmaps and the atomic sums span 120 read-out
    tiles of 2,048 words."""
    inputs = conv_inputs(rng, 2, (96, 80, 64), 1, 8, (3, 3, 3), 1 / 64, 0.1, dtype)
    y_cpu, counts_cpu = run_conv(CPU, *inputs, **selection)
    y_gpu, counts_gpu = run_conv(GPU, *inputs, dataflow=gpu_dataflow, **selection)
    assert (2 * 8 * 96 * 80 * 64 // 32 + 2047) // 2048 == 120 and y_cpu.keys.shape[0] > 10000
    assert_same_sparse(y_gpu, y_cpu, dtype)
    np.testing.assert_array_equal(counts_gpu.numpy(), counts_cpu.numpy())


def backprop(device, keys, values, dense_shape, w, mask, out_keys, out_grad, dataflow="auto"):
    """Raw backprop outputs. The GPU sums dL/dx in the order of the CPU's search path
    (dataflow='sort'), so that CPU run is the bit-identical reference."""
    with tf.device(device):
        return [t.numpy() for t in ts.raw_ops.direct_sparse_conv_backprop(
            in_keys=tf.constant(keys), in_values=tf.constant(values), dense_shape=tf.constant(dense_shape),
            filter=tf.constant(w), filter_mask=tf.constant(mask), out_keys=tf.constant(out_keys),
            out_grad=tf.constant(out_grad), dataflow=dataflow)]


@pytest.mark.parametrize("selection", [pytest.param({}, id="none"),
                                       pytest.param(dict(selection="abs", k=4), id="abs-k4")])
@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", GPU_CONV_CASES)
def test_conv_backprop_matches_cpu(rng, batch, spatial, cin, cout, kernel, density, filter_density, selection,
                                   dtype, gpu_dataflow, gpu):
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, batch, spatial, cin, cout, kernel, density,
                                                           filter_density, dtype)
    y, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias, **selection)
    out_keys = y.keys.numpy()
    out_grad = rng.standard_normal(len(out_keys)).astype(dtype)
    cpu_grads = backprop(CPU, keys, values, dense_shape, w, mask, out_keys, out_grad, dataflow="sort")
    gpu_grads = backprop(GPU, keys, values, dense_shape, w, mask, out_keys, out_grad, dataflow=gpu_dataflow)
    np.testing.assert_array_equal(gpu_grads[0], cpu_grads[0])  # in_grad: the CPU's summation order
    assert np.all(gpu_grads[1][~mask] == 0)
    for g, c in zip(gpu_grads[1:], cpu_grads[1:]):
        assert_close(g, c, dtype)


def test_large_conv_backprop_matches_cpu(rng, dtype, gpu_dataflow, gpu):
    keys, values, dense_shape, w, mask, bias = large_conv_inputs(rng, dtype)
    y, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias)
    out_grad = rng.standard_normal(y.keys.shape[0]).astype(dtype)
    cpu_grads = backprop(CPU, keys, values, dense_shape, w, mask, y.keys.numpy(), out_grad, dataflow="sort")
    gpu_grads = backprop(GPU, keys, values, dense_shape, w, mask, y.keys.numpy(), out_grad, dataflow=gpu_dataflow)
    np.testing.assert_array_equal(gpu_grads[0], cpu_grads[0])
    for g, c in zip(gpu_grads[1:], cpu_grads[1:]):
        assert_close(g, c, dtype)


def test_conv_backprop_counts_an_output_gradient_with_the_grids_no_output_bits(rng, dtype, gpu_dataflow, gpu):
    # The GPU's backward may look output gradients up in a grid over the output keys that marks
    # "no output here" with all-ones bits, a NaN. An output gradient with exactly those bits is
    # still a gradient: NaN where it reaches, as on the CPU, never dropped.
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, 2, (8, 9, 7), 2, 3, (3, 3, 3), 0.1, 0.6, dtype)
    y, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias)
    out_grad = rng.standard_normal(y.keys.shape[0]).astype(dtype)
    out_grad[[0, len(out_grad) // 2]] = np.array(-1, np.int32 if dtype == np.float32 else np.int64).view(dtype)
    assert np.isnan(out_grad[0]) and out_grad.view(np.uint8)[:out_grad.itemsize].tolist() == [255] * out_grad.itemsize
    cpu_grads = backprop(CPU, keys, values, dense_shape, w, mask, y.keys.numpy(), out_grad, dataflow="sort")
    gpu_grads = backprop(GPU, keys, values, dense_shape, w, mask, y.keys.numpy(), out_grad, dataflow=gpu_dataflow)
    assert 0 < np.isnan(cpu_grads[0]).sum() < len(keys)
    np.testing.assert_array_equal(gpu_grads[0], cpu_grads[0])  # NaN at the same entries, the rest equal bits
    for g, c in zip(gpu_grads[1:], cpu_grads[1:]):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(c))
        assert_close(np.nan_to_num(g), np.nan_to_num(c), dtype)


def conv_and_gradients(keys, values, dense_shape, w, mask, bias, dataflow="auto"):
    """The forward's keys and values and the gradients of sum(y^2) by the input values and the
    filter."""
    with tf.GradientTape() as tape:
        tape.watch([values, w])
        y = ts.direct_conv(ts.ChannelSparseTensor(keys, values, dense_shape), w, bias, mask, dataflow=dataflow)
        loss = tf.reduce_sum(y.values * y.values)
    return (y.keys, y.values, *tape.gradient(loss, [values, w]))


@pytest.mark.parametrize("wanted", [(1, 2), (0,), (2,), (0, 1, 2)])
def test_traced_gradients_of_a_subset_match_eager(rng, dtype, gpu_dataflow, wanted, gpu):
    """In a traced function that asks for some of the input's, the filter's and the bias'
    gradients, the GPU kernel computes only those an op reads (the executor's output_required;
    with the bias' alone, no gradient lookup at all); what it computes is what an eager call,
    which computes every output, gives, bit for bit."""
    inputs = conv_inputs(rng, 2, (8, 9, 7), 2, 3, (3, 3, 3), 0.2, 0.6, dtype)
    eager, traced = eager_and_traced_gradients(GPU, inputs, gpu_dataflow, wanted)
    # The atomic sums' forward adds in no fixed order, so its outputs, and the gradients of
    # sum(y^2), may differ in the last bits from call to call.
    same = (lambda got, expected: assert_close(got, expected, dtype)) if gpu_dataflow == "atomic" else \
        np.testing.assert_array_equal
    for got, i in zip(traced, wanted):
        same(got, eager[i])


def test_gpu_kernels_follow_their_mask_and_shapes_across_calls(rng, dtype, gpu_dataflow, gpu):
    """The GPU kernels keep the present-weight tables of their last call while the mask, the
    grid and the channels stay the same. One traced function (one forward and one backprop
    kernel) called with a mask that changes and changes back, another grid, other channels and
    an all-pruned mask, each call against the CPU."""
    spec = [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], dtype), tf.TensorSpec([5], tf.int64),
            tf.TensorSpec([3, 3, 3, None, None], dtype), tf.TensorSpec([3, 3, 3, None, None], tf.bool),
            tf.TensorSpec([None], dtype)]
    with tf.device(GPU):
        traced = tf.function(lambda *a: conv_and_gradients(*a, dataflow=gpu_dataflow), input_signature=spec)
    w, first_mask = random_filter(rng, (3, 3, 3), 2, 3, 0.5, dtype)
    other_mask = ~first_mask
    w2, mask2 = random_filter(rng, (3, 3, 3), 3, 2, 0.6, dtype)
    calls = [((2, 8, 8, 8, 2), w, first_mask), ((2, 8, 8, 8, 2), w, other_mask), ((2, 8, 8, 8, 2), w, first_mask),
             ((2, 6, 9, 7, 2), w, first_mask), ((1, 7, 7, 7, 3), w2, mask2),
             ((1, 7, 7, 7, 3), w2, np.zeros_like(mask2))]
    for shape, filters, mask in calls:
        keys, values, dense_shape = random_sparse_components(rng, shape, 0.2, dtype)
        bias = rng.standard_normal(filters.shape[-1]).astype(dtype)
        arrays = [tf.constant(a) for a in (keys, values, dense_shape, filters, mask, bias)]
        with tf.device(CPU):
            expected = [t.numpy() for t in conv_and_gradients(*arrays)]
        with tf.device(GPU):
            got = traced(*arrays)
        assert_on_gpu(*got)
        np.testing.assert_array_equal(got[0].numpy(), expected[0])
        for g, c in zip(got[1:], expected[1:]):
            assert_close(g.numpy(), c, dtype)
    assert traced.experimental_get_tracing_count() == 1


def tape_gradients(device, fn, *arrays):
    with tf.device(device):
        variables = [tf.constant(a) for a in arrays]
        with tf.GradientTape() as tape:
            tape.watch(variables)
            out = fn(*variables)
            loss = tf.reduce_sum(out * out)
        return [g.numpy() for g in tape.gradient(loss, variables)]


def test_conv_relu_pool_gradients_on_gpu_match_cpu(rng, dtype, gpu_dataflow, gpu):
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, 2, (8, 7, 6), 2, 3, (3, 3, 3), 0.15, 0.6, dtype)

    def net_with(dataflow):
        def net(v, filters, b):
            x = ts.ChannelSparseTensor(tf.constant(keys), v, tf.constant(dense_shape))
            y = ts.sparse_relu(ts.direct_conv(x, filters, b, tf.constant(mask), selection="signed", k=20,
                                              dataflow=dataflow))
            return ts.to_dense(ts.sparse_max_pool(y, 2))
        return net

    cpu_grads = tape_gradients(CPU, net_with(on_cpu(gpu_dataflow)), values, w, bias)
    gpu_grads = tape_gradients(GPU, net_with(gpu_dataflow), values, w, bias)
    for g, c in zip(gpu_grads, cpu_grads):
        assert_close(g, c, dtype)


@pytest.mark.soft_placement
@pytest.mark.parametrize("spatial,kernel,cin,cout", [((7, 6), (3, 3), 2, 3), ((5, 4, 5), (3, 3, 3), 2, 2),
                                                     ((11,), (5,), 3, 2)])
def test_conv_gradient_matches_numerical_jacobian_on_gpu_float64(rng, spatial, kernel, cin, cout, gpu_dataflow,
                                                                 gpu):
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, 2, spatial, cin, cout, kernel, 0.25, 0.6,
                                                           np.float64)
    with tf.device(GPU):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))

        def f(v, filters, b):
            y = ts.direct_conv(x.with_values(v), filters, b, tf.constant(mask), dataflow=gpu_dataflow)
            assert_on_gpu(y.values)
            return y.values

        theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(values), tf.constant(w),
                                                              tf.constant(bias)])
    for t, n in zip(theoretical, numerical):
        assert np.any(t)
        np.testing.assert_allclose(t, n, atol=1e-7)


# --- determinism ---------------------------------------------------------------------------------

def all_outputs(rng_seed, dtype):
    """Every op's outputs on the GPU, as numpy arrays, for inputs from rng_seed."""
    rng = np.random.default_rng(rng_seed)
    keys, values, dense_shape, w, mask, bias = large_conv_inputs(rng, dtype)
    outputs = []
    for kwargs in ({}, dict(selection="signed", rho_up=0.01)):
        y, touched = run_conv(GPU, keys, values, dense_shape, w, mask, bias, **kwargs)
        outputs += [y.keys.numpy(), y.values.numpy(), touched.numpy()]
        out_grad = np.linspace(-1, 1, y.keys.shape[0]).astype(dtype)
        outputs += backprop(GPU, keys, values, dense_shape, w, mask, y.keys.numpy(), out_grad)
    x = sparse_on(GPU, keys, values, dense_shape)
    outputs += [t.numpy() for t in on(GPU, ts.raw_ops.sparse_max_pool, x.keys, x.values, x.dense_shape,
                                      strides=[2, 2, 3])]
    outputs += [t.numpy() for t in on(GPU, ts.raw_ops.sparse_relu, x.keys, x.values, x.dense_shape)]
    dense = on(GPU, ts.to_dense, x)
    outputs += [dense.numpy()] + [t.numpy() for t in on(GPU, ts.raw_ops.dense_to_channel_sparse, dense)]
    return outputs


def test_gpu_results_are_bit_identical_across_runs(dtype, gpu):
    first, second = all_outputs(7, dtype), all_outputs(7, dtype)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_gpu_results_are_bit_identical_under_op_determinism(gpu):
    # enable_op_determinism cannot be turned off again: a process of its own.
    output = run_in_own_process("""
        import numpy as np, tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from tests.channel.test_direct_conv import all_outputs
        for dtype in (np.float32, np.float64):
            first, second = all_outputs(11, dtype), all_outputs(11, dtype)
            for a, b in zip(first, second):
                np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        print("bit-identical under op determinism")
    """)
    assert "bit-identical under op determinism" in output


# --- errors on the GPU: the CPU's messages ------------------------------------------------------

@pytest.mark.parametrize("out_keys,phrase", [([0, 99], "output key out of range"), ([5, 2], "must be sorted"),
                                             ([4, 4], "must be unique")])
def test_backprop_output_keys_give_the_cpu_error_on_gpu(out_keys, phrase, gpu):
    assert_same_error(lambda: ts.raw_ops.direct_sparse_conv_backprop(
        in_keys=tf.constant([0, 7], tf.int64), in_values=tf.ones([2], tf.float64),
        dense_shape=tf.constant([1, 5, 5, 1], tf.int64), filter=tf.ones((3, 3, 1, 1), tf.float64),
        filter_mask=tf.ones((3, 3, 1, 1), tf.bool), out_keys=tf.constant(out_keys, tf.int64),
        out_grad=tf.ones([2], tf.float64)), phrase)


@pytest.mark.parametrize("where", ["values", "filter", "bias"])
def test_conv_nan_gives_the_cpu_error_on_gpu(where, gpu_dataflow, gpu):
    def conv(device):
        values, w, b = np.ones(2), np.ones((3, 3, 1, 1)), np.zeros(1)
        {"values": values, "filter": w, "bias": b}[where].flat[-1] = np.nan
        x = _sparse([0, 7], [1, 5, 5, 1])
        return ts.direct_conv(x.with_values(tf.constant(values)), tf.constant(w), tf.constant(b),
                              dataflow=gpu_dataflow if device == GPU else on_cpu(gpu_dataflow))
    assert_same_error_per_device(conv, "contains NaN")
    if where != "bias":
        assert_same_error(lambda: ts.raw_ops.direct_sparse_conv_backprop(
            in_keys=tf.constant([0, 7], tf.int64),
            in_values=tf.constant([1.0, np.nan] if where == "values" else [1.0, 1.0], tf.float64),
            dense_shape=tf.constant([1, 5, 5, 1], tf.int64),
            filter=tf.constant(np.full((3, 3, 1, 1), np.nan if where == "filter" else 1.0)),
            filter_mask=tf.ones((3, 3, 1, 1), tf.bool), out_keys=tf.constant([0, 1], tf.int64),
            out_grad=tf.ones([2], tf.float64), dataflow=gpu_dataflow), "contains NaN")


@pytest.mark.parametrize("where", ["filter", "bias"])
@pytest.mark.parametrize("case", ["every_weight_pruned", "no_entries"])
def test_conv_nan_is_found_where_nothing_is_touched(where, case, gpu_dataflow, gpu):
    """The GPU's NaN checks ride on each dataflow's first kernel over the entries; where that
    kernel does not run (no entries, or no present weight: nothing touched) they run alone."""
    def conv(device):
        w, b = np.ones((3, 3, 1, 1)), np.zeros(1)
        {"filter": w, "bias": b}[where].flat[-1] = np.nan
        x = _sparse([] if case == "no_entries" else [0, 7], [1, 5, 5, 1])
        mask = np.zeros(w.shape, bool) if case == "every_weight_pruned" else np.ones(w.shape, bool)
        return ts.direct_conv(x, tf.constant(w), tf.constant(b), tf.constant(mask),
                              dataflow=gpu_dataflow if device == GPU else on_cpu(gpu_dataflow))
    assert_same_error_per_device(conv, f"{where} contains NaN")


def test_unknown_direct_choices_are_rejected(rng, gpu):
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, 1, (5, 5), 1, 2, (3, 3), 0.3, 1.0, np.float32)
    with pytest.raises(ValueError, match="dataflow must be one of"):
        run_conv(GPU, keys, values, dense_shape, w, mask, bias, dataflow="fastest")
    for bad in ("lots", -1, 1.5, "12MB"):
        with pytest.raises(ValueError, match="temp_limit_bytes must be a whole number of bytes >= 0"):
            run_conv(GPU, keys, values, dense_shape, w, mask, bias, temp_limit_bytes=bad)
    inputs = dict(in_keys=tf.constant(keys), in_values=tf.constant(values), dense_shape=tf.constant(dense_shape),
                  filter=tf.constant(w), filter_mask=tf.constant(mask), bias=tf.constant(bias))
    with tf.device(GPU):
        with pytest.raises(tf.errors.InvalidArgumentError, match="dataflow"):
            ts.raw_ops.direct_sparse_conv(**inputs, dataflow="fastest")
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"temp_limit_bytes must be >= 0"):
            ts.raw_ops.direct_sparse_conv(**inputs, temp_limit_bytes=-1)


# --- the forward in groups of examples (temp_limit_bytes) ---------------------------------------

def grouped_inputs(rng, dtype):
    """7 examples (example 3 empty) of ~550 entries and ~65 present weights per input channel:
    ~0.86 MB of sort buffers per example in float32, ~1.15 MB in float64."""
    keys, values, dense_shape = random_sparse_components(rng, (7, 24, 24, 24, 2), 0.02, dtype, empty_batch=3)
    w, mask = random_filter(rng, (3, 3, 3), 2, 4, 0.6, dtype)
    return keys, values, dense_shape, w, mask, rng.standard_normal(4).astype(dtype)


def peak_gpu_bytes(fn):
    tf.config.experimental.reset_memory_stats("GPU:0")
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    result = fn()
    return result, tf.config.experimental.get_memory_info("GPU:0")["peak"] - before


@pytest.mark.parametrize("selection", [pytest.param({}, id="none"),
                                       pytest.param(dict(selection="signed", rho_up=0.002), id="signed"),
                                       pytest.param(dict(selection="abs", k=7), id="abs-k7")])
@pytest.mark.parametrize("limit_mb", [1, 2])  # 1: one example per group; 2: two (float32) or one
def test_forward_in_example_groups_is_the_one_run_result(rng, selection, limit_mb, dtype, gpu):
    inputs = grouped_inputs(rng, dtype)
    (y_one, counts_one), peak_one = peak_gpu_bytes(lambda: run_conv(GPU, *inputs, dataflow="sort", **selection))
    (y_grouped, counts_grouped), peak_grouped = peak_gpu_bytes(
        lambda: run_conv(GPU, *inputs, dataflow="sort", temp_limit_bytes=limit_mb << 20, **selection))
    assert_on_gpu(y_grouped.keys, y_grouped.values, counts_grouped)
    np.testing.assert_array_equal(y_grouped.keys.numpy(), y_one.keys.numpy())
    np.testing.assert_array_equal(y_grouped.values.numpy(), y_one.values.numpy())
    np.testing.assert_array_equal(counts_grouped.numpy(), counts_one.numpy())
    assert counts_one.numpy()[0, 3].sum() == 0 and counts_one.numpy()[0].sum() > 0  # the empty example
    y_cpu, counts_cpu = run_conv(CPU, *inputs, **selection)
    assert_same_sparse(y_grouped, y_cpu, dtype)
    np.testing.assert_array_equal(counts_grouped.numpy(), counts_cpu.numpy())
    # The groups' temporaries replace the whole batch's: the peak falls.
    assert peak_grouped < peak_one


def test_forward_in_example_groups_checks_keys_across_the_groups(rng, gpu):
    grouped = dict(dataflow="sort", temp_limit_bytes=1 << 20)
    keys, values, dense_shape, w, mask, bias = grouped_inputs(rng, np.float64)
    per_example = 24 ** 3 * 2
    last_of_first = np.searchsorted(keys, per_example) - 1
    keys[[last_of_first, last_of_first + 1]] = keys[[last_of_first + 1, last_of_first]]  # unsorted at a boundary
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be sorted"):
        run_conv(GPU, keys, values, dense_shape, w, mask, bias, **grouped)
    keys, values, dense_shape, w, mask, bias = grouped_inputs(rng, np.float64)
    values[-1] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="contains NaN"):
        run_conv(GPU, keys, values, dense_shape, w, mask, bias, **grouped)


@pytest.mark.parametrize("shape", [[2**40, 1, 1], [2**29, 1, 1], [2**12, 1, 2**13]], ids=["2^40", "2^29", "channels"])
def test_conv_refuses_huge_empty_shapes_before_sizing_tables(shape):
    # Used to size per-(batch, channel) tables from dense_shape alone: SIGSEGV from an
    # escaping std::bad_alloc, or gigabytes for an empty tensor.
    x = _sparse([], shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dense_shape of input has B = .* \(2\^24\)"):
        ts.direct_conv(x, np.ones((1, shape[2], 1)))


def test_conv_refuses_an_output_with_too_many_segments():
    x = _sparse([], [2**12, 1, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dense_shape of output has B = 4096 and C = 8192"):
        ts.direct_conv(x, np.ones((1, 1, 2**13)))


def test_a_grid_of_more_than_2_to_the_32_positions_gives_the_small_grids_values(rng):
    # Coordinates decode by 32-bit multiplications up to 2^32 - 1 positions per example and
    # by 64-bit divisions beyond: the same sites in both grids, the same outputs where the
    # small grid has them (the big one also reaches z = 5).
    small, big_z = (6, 7, 5), 2 ** 27 + 1
    dense = random_sparse(rng, 2, small, 2, 0.3)
    b, x, y, z, c = np.nonzero(dense)
    w = rng.standard_normal((3, 3, 3, 2, 3))

    def run(spatial):
        keys = ((b * 2 + c) * np.prod(spatial, dtype=np.int64) + (x * spatial[1] + y) * spatial[2] + z)
        order = np.argsort(keys)
        out = ts.direct_conv(ts.ChannelSparseTensor(tf.constant(keys[order], tf.int64),
                                                    tf.constant(dense[b, x, y, z, c][order]),
                                                    tf.constant([2, *spatial, 2], tf.int64)), w)
        size = np.prod(spatial, dtype=np.int64)
        k, v = out.keys.numpy(), out.values.numpy()
        seg, lin = k // size, k % size
        coords = np.stack([seg // 3, lin // (spatial[1] * spatial[2]), lin // spatial[2] % spatial[1],
                           lin % spatial[2], seg % 3], 1)
        return {tuple(p): value for p, value in zip(coords.tolist(), v)}

    want, got = run(small), run((6, 7, big_z))
    assert 6 * 7 * big_z > 2 ** 32 and len(got) > len(want) > 0
    assert all(p[3] == 5 for p in set(got) - set(want))
    np.testing.assert_allclose([got[p] for p in want], [want[p] for p in want], rtol=1e-12, atol=1e-12)
