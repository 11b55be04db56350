"""Direct sparse convolution against dense references: values, support, k-selection,
gradients (Eq. 3), dataflows, graph mode, SavedModel and every error path."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts


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


def random_filter(rng, kernel, cin, cout, filter_density, dtype=np.float64):
    w = rng.standard_normal((*kernel, cin, cout)).astype(dtype)
    mask = rng.random(w.shape) < filter_density
    return w, mask


CONV_CASES = [
    # (batch, spatial, cin, cout, kernel, density, filter_density)
    (1, (9,), 2, 3, (3,), 0.3, 1.0),
    (2, (7, 6), 3, 4, (3, 3), 0.2, 0.5),
    (3, (8, 5), 1, 2, (5, 3), 0.1, 0.7),
    (2, (6, 5, 4), 2, 3, (3, 3, 3), 0.15, 0.5),
    (1, (9, 9, 9), 1, 8, (3, 3, 3), 0.05, 0.1),
    (2, (4, 3, 4, 3), 2, 2, (3, 1, 3, 3), 0.2, 0.6),
]


@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", CONV_CASES)
@pytest.mark.parametrize("dataflow", ["auto", "sort", "dense"])
def test_conv_matches_dense_convolution_on_touched_set(rng, batch, spatial, cin, cout, kernel,
                                                        density, filter_density, dataflow):
    dense = random_sparse(rng, batch, spatial, cin, density)
    w, mask = random_filter(rng, kernel, cin, cout, filter_density)
    bias = rng.standard_normal(cout)
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


def test_sort_and_dense_dataflows_are_bit_identical(rng):
    x, w, mask = sparse_case(rng, 2, (12, 11, 10), 4, 5, 0.08, 0.6, np.float32)
    assert_identical(ts.direct_conv(x, w, None, mask, dataflow="dense"),
                     ts.direct_conv(x, w, None, mask, dataflow="sort"))


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


def test_pruned_weights_are_skipped_and_change_nothing(rng):
    dense = random_sparse(rng, 1, (8, 8), 2, 0.2)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.4)
    x = ts.from_dense(dense)
    masked = ts.direct_conv(x, w, None, mask)
    garbage = np.where(mask, w, 1e6)  # pruned weights hold huge values: must not leak in
    np.testing.assert_array_equal(ts.direct_conv(x, garbage, None, mask).values.numpy(), masked.values.numpy())


def test_bias_only_on_touched_entries_empty_space_stays_empty(rng):
    dense = np.zeros((1, 10, 10, 1))
    dense[0, 5, 5, 0] = 2.0
    w = np.ones((3, 3, 1, 2))
    y = ts.direct_conv(ts.from_dense(dense), w, np.array([10.0, -1.0]))
    assert y.num_entries.numpy() == 2 * 9
    out = ts.to_dense(y).numpy()
    np.testing.assert_allclose(out[0, 4:7, 4:7, 0], 12.0)
    np.testing.assert_allclose(out[0, 4:7, 4:7, 1], 1.0)
    assert np.count_nonzero(out) == 18


@pytest.mark.parametrize("mode", ["signed", "abs"])
@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density", [
    (2, (10, 9), 2, 3, (3, 3), 0.2),
    (3, (6, 7, 5), 2, 2, (3, 3, 3), 0.1),
])
def test_k_selection_keeps_k_best_per_batch_and_channel(rng, mode, batch, spatial, cin, cout, kernel, density):
    dense = random_sparse(rng, batch, spatial, cin, density)
    w, mask = random_filter(rng, kernel, cin, cout, 0.7)
    bias = rng.standard_normal(cout)
    k = 7
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


def test_rho_up_sets_k_to_ceil_of_rho_up_times_spatial_size(rng):
    dense = random_sparse(rng, 1, (10, 10), 1, 0.5)
    w = rng.standard_normal((3, 3, 1, 2))
    y = ts.direct_conv(ts.from_dense(dense), w, selection="signed", rho_up=0.055)
    counts = np.bincount(y.keys.numpy() // 100, minlength=2)
    np.testing.assert_array_equal(counts, [6, 6])  # ceil(0.055 * 100) = 6
    assert ts.k_from_rho_up(0.055, (10, 10)) == 6


def test_k_selection_ties_prefer_smaller_key():
    dense = np.zeros((1, 1, 12, 1))
    dense[0, 0, [1, 4, 7, 10], 0] = [5.0, 5.0, -5.0, 5.0]
    w = np.ones((1, 1, 1, 1))
    signed = ts.direct_conv(ts.from_dense(dense), w, selection="signed", k=2)
    np.testing.assert_array_equal(signed.keys.numpy(), [1, 4])
    absolute = ts.direct_conv(ts.from_dense(dense), w, selection="abs", k=3)
    np.testing.assert_array_equal(absolute.keys.numpy(), [1, 4, 7])


def test_empty_input_and_empty_batch_element(rng):
    w = rng.standard_normal((3, 3, 2, 3))
    empty = ts.ChannelSparseTensor(tf.zeros([0], tf.int64), tf.zeros([0], tf.float64),
                                   tf.constant([2, 5, 5, 2], tf.int64))
    y = ts.direct_conv(empty, w, np.ones(3), selection="signed", k=3)
    assert y.num_entries.numpy() == 0
    dense = random_sparse(rng, 3, (5, 5), 2, 0.3)
    dense[1] = 0.0
    y = ts.direct_conv(ts.from_dense(dense), w, np.ones(3))
    keys, values, _ = reference_conv(dense, w, np.ones_like(w, bool), np.ones(3))
    np.testing.assert_array_equal(y.keys.numpy(), keys)
    np.testing.assert_allclose(y.values.numpy(), values, rtol=1e-10)


def _conv_values_fn(x, mask, **kwargs):
    def f(values, filters, bias):
        return ts.direct_conv(x.with_values(values), filters, bias, mask, **kwargs).values
    return f


@pytest.mark.parametrize("spatial,kernel,cin,cout,dataflow", [
    ((7, 6), (3, 3), 2, 3, "dense"),
    ((7, 6), (3, 3), 2, 3, "sort"),
    ((5, 4, 5), (3, 3, 3), 2, 2, "auto"),
    ((11,), (5,), 3, 2, "auto"),
])
def test_gradients_match_numerical_jacobian_float64(rng, spatial, kernel, cin, cout, dataflow):
    dense = random_sparse(rng, 2, spatial, cin, 0.25)
    w, mask = random_filter(rng, kernel, cin, cout, 0.6)
    x = ts.from_dense(dense)
    theoretical, numerical = tf.test.compute_gradient(
        _conv_values_fn(x, mask, dataflow=dataflow),
        [x.values, tf.constant(w), tf.constant(rng.standard_normal(cout))])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=1e-7)


def test_gradients_follow_eq3_support_and_present_zero_weights(rng):
    dense = random_sparse(rng, 2, (6, 6), 2, 0.3)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.5)
    present_zero = np.argwhere(mask)[0]
    w[tuple(present_zero)] = 0.0  # a weight passing through zero keeps its gradient
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
    np.testing.assert_allclose(g_bias.numpy(), np.bincount(seg, grad_y, minlength=3), rtol=1e-12)


@pytest.mark.parametrize("mode", ["signed", "abs"])
def test_dropped_entries_receive_no_gradient_and_kept_match_dense_gradient(rng, mode):
    dense = random_sparse(rng, 2, (8, 7), 2, 0.3)
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.6)
    bias = rng.standard_normal(3)
    x = ts.from_dense(dense)
    values, filters, b = tf.constant(x.values), tf.constant(w), tf.constant(bias)
    with tf.GradientTape() as tape:
        tape.watch([values, filters, b])
        y = ts.direct_conv(x.with_values(values), filters, b, mask, selection=mode, k=5)
        upstream = tf.constant(rng.standard_normal(y.values.shape[0]))
        loss = tf.reduce_sum(y.values * upstream)
    g_values, g_filter, g_bias = tape.gradient(loss, [values, filters, b])
    # Reference: the dense convolution, differentiated through the kept positions only.
    dense_in = tf.constant(dense)
    dense_w = tf.constant(w * mask)
    kept_idx = ts.decode_keys(y.keys, y.dense_shape)
    with tf.GradientTape() as tape:
        tape.watch([dense_in, dense_w])
        full = tf.nn.convolution(dense_in, dense_w, padding="SAME")
        ref_loss = tf.reduce_sum(tf.gather_nd(full, kept_idx) * upstream)
    ref_in, ref_w = tape.gradient(ref_loss, [dense_in, dense_w])
    np.testing.assert_allclose(g_values.numpy(), ts.gather_dense(x, ref_in).values.numpy(), atol=1e-10)
    np.testing.assert_allclose(g_filter.numpy(), ref_w.numpy() * mask, atol=1e-10)
    seg = y.keys.numpy() // 56 % 3
    np.testing.assert_allclose(g_bias.numpy(), np.bincount(seg, upstream.numpy(), minlength=3), atol=1e-10)


def test_conv_in_tf_function_with_gradient(rng):
    dense = random_sparse(rng, 2, (6, 6, 6), 1, 0.1, np.float32)
    w = tf.Variable(rng.standard_normal((3, 3, 3, 1, 4)).astype(np.float32))
    x = ts.from_dense(dense)
    spec = ts.ChannelSparseTensor.spec([None, 6, 6, 6, 1], tf.float32)

    @tf.function(input_signature=[spec])
    def step(inp):
        with tf.GradientTape() as tape:
            y = ts.sparse_relu(ts.direct_conv(inp, w, selection="signed", rho_up=0.05))
            loss = tf.reduce_sum(y.values)
        return loss, tape.gradient(loss, w)

    loss, grad = step(x)
    eager_y = ts.sparse_relu(ts.direct_conv(x, w, selection="signed", rho_up=0.05))
    np.testing.assert_allclose(loss.numpy(), tf.reduce_sum(eager_y.values).numpy(), rtol=1e-6)
    assert grad.shape == w.shape


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
    (dict(dataflow="fastest"), r"dataflow must be one of \('auto', 'sort', 'dense'\)"),
    (dict(accumulator="hash"), "accumulator must be one of"),
    (dict(temp_limit_bytes=-1), "temp_limit_bytes must be a whole number of bytes >= 0"),
    (dict(temp_limit_bytes=1.5), "temp_limit_bytes must be a whole number of bytes >= 0"),
    (dict(temp_limit_bytes="12MB"), "temp_limit_bytes must be a whole number of bytes >= 0"),
])
def test_conv_rejects_unknown_choices_in_python(kwargs, match):
    x = _sparse([0, 7], [1, 5, 5, 1])
    with pytest.raises(ValueError, match=match):
        ts.direct_conv(x, np.ones((3, 3, 1, 1)), **kwargs)


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


def test_backprop_op_rejects_output_keys_of_another_geometry():
    x = _sparse([0, 7], [1, 5, 5, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="output key out of range"):
        ts.raw_ops.direct_sparse_conv_backprop(
            in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape, filter=tf.ones((3, 3, 1, 1), tf.float64),
            filter_mask=tf.ones((3, 3, 1, 1), tf.bool), out_keys=tf.constant([0, 99], tf.int64),
            out_grad=tf.ones([2], tf.float64))


def test_k_from_rho_up_matches_the_op_where_rho_up_times_size_is_whole():
    """ceil(0.1 * 100) is 10 in double precision, but the op holds rho_up as float32 (0.1000000015)
    and keeps 11: the Python bound must say 11 too."""
    from tf_sparseconv.channel.direct_conv import k_from_rho_up
    assert k_from_rho_up(0.1, (10, 10)) == 11
    dense = np.zeros((1, 10, 10, 1), np.float32)
    dense[0, :, :, 0] = np.arange(1, 101, dtype=np.float32).reshape(10, 10)
    x = ts.from_dense(dense)
    y = ts.direct_conv(x, np.ones((1, 1, 1, 1), np.float32), selection="signed", rho_up=0.1)
    assert int(y.num_entries) == k_from_rho_up(0.1, (10, 10))
