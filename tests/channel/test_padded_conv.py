"""DirectSparseConv with padded output (issue 24, step 3): its length is a bound known before
the op runs, its live entries are the exact output's and then padding follows; values and
gradients equal the exact call's; the data checks a GPU call leaves on the device (its
`status` output) surface as InvalidArgument where to_dense ends the sparse part, naming
the convolution; the Keras layer pads inside traced functions with padded_output="auto"."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tf_sparseconv._op_library import OP_NAMESPACE, ops as raw_ops
from tf_sparseconv.channel import keras_io
from tf_sparseconv.channel.tensor import PADDING_KEY
from tf_sparseconv.checks import padded_by_library, padded_convs_upstream
from tests.device import CPU
from tests.channel.helpers import assert_exact_then_padding, random_filter, random_sparse_components

SHAPE = [2, 6, 5, 4, 3]  # B, R1..R3, Cin
COUT = 2
# (selection, k, activation, dataflow) of the cases
CASES = {"plain": ("none", None, None, "auto"), "sort": ("none", None, None, "sort"),
         "dense": ("none", None, None, "dense"), "k-relu": ("abs", 5, "relu", "auto"),
         "k-signed-sort": ("signed", 9, None, "sort"), "k-large": ("signed", 1000, "relu", "dense"),
         "bitmap": ("none", None, None, "bitmap"), "k-relu-bitmap": ("signed", 7, "relu", "bitmap"),
         "atomic": ("none", None, None, "atomic"), "k-relu-atomic": ("signed", 7, "relu", "atomic")}


def _skip_bitmap_on_cpu(device, dataflow):
    if dataflow in ("bitmap", "atomic") and device == CPU:
        pytest.skip(f"the {dataflow} dataflow is the GPU's (the CPU refuses it)")


def _assert_same_output(got, want, dataflow):
    """Equal outputs; the atomic sums' values within rounding (their order varies run to run)."""
    if dataflow != "atomic":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _assert_live_then_padding(got, want, dataflow):
    """got (padded) holds want's entries, then only padding; the atomic sums' values within
    rounding (_assert_same_output compares them through to_dense)."""
    if dataflow != "atomic":
        assert_exact_then_padding(got, want)
        return
    live = int(want.num_entries)
    assert int(got.live_entries) == live
    np.testing.assert_array_equal(got.keys.numpy()[:live], want.keys.numpy())
    assert np.all(got.keys.numpy()[live:] == PADDING_KEY) and not np.any(got.values.numpy()[live:])


def _bound(n, mask, selection, k, shape=SHAPE, cout=COUT):
    """The capacity the op documents, computed here from the mask: the input's length times the
    most present weights of one input channel, capped by B * Cout * min(k, S)."""
    batch, spatial = shape[0], math.prod(shape[1:-1])
    max_row = int(mask.reshape(-1, shape[-1], cout).sum(axis=(0, 2)).max())
    per_segment = spatial if selection == "none" else min(k, spatial)
    return min(n * max_row, batch * cout * per_segment)


def _conv(x, w, bias, mask, case, padded):
    selection, k, activation, dataflow = CASES[case]
    return ts.direct_conv(x, w, bias, mask, selection=selection, k=k, activation=activation, dataflow=dataflow,
                          padded_output=padded)


@pytest.mark.parametrize("case", sorted(CASES))
def test_padded_output_is_the_exact_output_then_padding(rng, device, case, dtype):
    _skip_bitmap_on_cpu(device, CASES[case][3])
    keys, values, dense_shape = random_sparse_components(rng, SHAPE, 0.3, dtype)
    w, mask = random_filter(rng, [3, 3, 3], SHAPE[-1], COUT, 0.7, dtype)
    bias = rng.standard_normal(COUT).astype(dtype)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        want = _conv(x, w, bias, mask, case, False)
        got = _conv(x, w, bias, mask, case, True)
    assert got.padded and not want.padded
    selection, k, _, _ = CASES[case]
    assert int(got.num_entries) == _bound(len(keys), mask, selection, k)
    _assert_live_then_padding(got, want, CASES[case][3])
    _assert_same_output(ts.to_dense(got).numpy(), ts.to_dense(want).numpy(), CASES[case][3])


def test_the_capacity_counts_a_padded_inputs_whole_length(rng, device):
    """A padded input's capacity (not its live count) enters the bound, so the output's
    length is known from shapes alone; the live entries do not change."""
    keys, values, dense_shape = random_sparse_components(rng, SHAPE, 0.05, np.float64)
    w, mask = random_filter(rng, [3, 3, 3], SHAPE[-1], COUT, 0.7)
    pad = 4
    with tf.device(device):
        exact = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        padded = ts.ChannelSparseTensor(tf.constant(np.concatenate([keys, np.full(pad, PADDING_KEY, np.int64)])),
                                        tf.constant(np.concatenate([values, np.zeros(pad)])),
                                        tf.constant(dense_shape), padded=True)
        want = ts.direct_conv(exact, w, None, mask)
        got = ts.direct_conv(padded, w, None, mask, padded_output=True)
    assert int(got.num_entries) == _bound(len(keys) + pad, mask, "none", None)
    np.testing.assert_array_equal(got.without_padding().keys.numpy(), want.keys.numpy())
    np.testing.assert_array_equal(got.without_padding().values.numpy(), want.values.numpy())


@pytest.mark.parametrize("case", ["plain", "k-relu", "k-signed-sort", "dense"])
def test_gradients_equal_the_exact_calls(rng, device, case):
    _skip_bitmap_on_cpu(device, CASES[case][3])
    keys, values, dense_shape = random_sparse_components(rng, SHAPE, 0.3, np.float64)
    w, mask = random_filter(rng, [3, 3, 3], SHAPE[-1], COUT, 0.7)
    bias = rng.standard_normal(COUT)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        variables = [x.values, tf.constant(w), tf.constant(bias)]

        def grads(padded):
            with tf.GradientTape() as tape:
                tape.watch(variables)
                y = _conv(x.with_values(variables[0]), variables[1], variables[2], mask, case, padded)
                dense = ts.to_dense(y)
                weights = tf.cast(tf.reshape(tf.range(tf.size(dense)) % 7 - 3, tf.shape(dense)), dense.dtype)
                # the padding's values carry a gradient too (a loss over the raw values): ignored
                loss = tf.reduce_sum(dense * weights) + 5.0 * tf.reduce_sum(y.values)
            return [g.numpy() for g in tape.gradient(loss, variables)]

        want, got = grads(False), grads(True)
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)


def test_numeric_gradients_of_a_padded_output(rng):
    keys, values, dense_shape = random_sparse_components(rng, [1, 4, 3, 3, 2], 0.4, np.float64)
    w, mask = random_filter(rng, [3, 3, 3], 2, 2, 0.8)
    x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))

    def f(v, filters, bias):
        # no k-selection: its kept set may flip under the numeric step
        return ts.direct_conv(x.with_values(v), filters, bias, mask, padded_output=True).values

    bias = tf.constant([0.3, -0.2], tf.float64)
    theoretical, numerical = tf.test.compute_gradient(f, [x.values, tf.constant(w), bias])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


def _network(filters, masks, padded, dataflow="auto"):
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = ts.direct_conv(x, filters[0], None, masks[0], activation="relu", padded_output=padded,
                               dataflow=dataflow)
            h = ts.direct_conv(h, filters[1], None, masks[1], selection="signed", k=40, activation="relu",
                               padded_output=padded, dataflow=dataflow)
            h = ts.sparse_max_pool(h, 2, padded_output=padded)
            h = ts.direct_conv(h, filters[2], None, masks[2], selection="abs", k=7, activation="relu",
                               padded_output=padded, dataflow=dataflow)
            dense = ts.to_dense(h)
            weights = tf.reshape(tf.range(1.0, 1.0 + tf.cast(tf.size(dense), tf.float32)) ** 0.5, tf.shape(dense))
            loss = tf.reduce_sum(dense * weights) / tf.cast(tf.size(dense), tf.float32)
        return dense, tape.gradient(loss, filters)
    return step


def _network_case(rng, side=8):
    keys, values, dense_shape = random_sparse_components(rng, [2, side, side, side, 1], 0.2, np.float32)
    w1, m1 = random_filter(rng, [3, 3, 3], 1, 4, 0.8, np.float32)
    w2, m2 = random_filter(rng, [3, 3, 3], 4, 3, 0.8, np.float32)
    w3, m3 = random_filter(rng, [3, 3, 3], 3, 2, 0.8, np.float32)
    return (keys, values, dense_shape), [w1, w2, w3], [m1, m2, m3]


@pytest.mark.parametrize("side", [8, 24])
@pytest.mark.parametrize("dataflow", ["auto", "sort", "dense", "bitmap", "atomic"])
def test_a_traced_network_of_padded_convolutions_equals_the_exact_one(rng, device, dataflow, side):
    """conv -> conv -> pool -> conv -> to_dense in one tf.function: the same output and filter
    gradients with padded convolutions and pooling (on the GPU the ops after the first do not
    wait: their kept count stays on the device, and their kept entries are compacted into the
    padded output in one pass); one status check reads all three convolutions, and those after
    the first take keys the library made (inputs_checked). At 24^3 the compactions span many
    tiles of 2,048 positions (the first convolution's ReLU over up to 110,592 touched entries)."""
    _skip_bitmap_on_cpu(device, dataflow)
    (keys, values, dense_shape), ws, masks = _network_case(rng, side)
    filters = [tf.Variable(w) for w in ws]
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        want, want_grads = _network(filters, masks, False, dataflow)(x)
        padded = _network(filters, masks, True, dataflow)
        got, got_grads = padded(x)
    _assert_same_output(got.numpy(), want.numpy(), dataflow)
    for g, e in zip(got_grads, want_grads):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    graph = padded.get_concrete_function(x).graph
    convs = [op for op in graph.get_operations() if op.type == OP_NAMESPACE + "DirectSparseConv"]
    # Where a GPU is visible, the user's keys are checked on the host where they enter the
    # graph (ChannelSparseValidate), and the first convolution trusts them as well.
    host_checked = keras_io.gpu_visible()
    assert [op.get_attr("inputs_checked") for op in convs] == [host_checked, True, True]
    validates = [op for op in graph.get_operations() if op.type == OP_NAMESPACE + "ChannelSparseValidate"]
    assert len(validates) == int(host_checked) and all("CPU" in op.device for op in validates)
    assert all(op.get_attr("padded_output") for op in convs)
    reports = [op for op in graph.get_operations() if op.type == OP_NAMESPACE + "DirectSparseConvReportStatus"]
    assert len(reports) == 1 and len(reports[0].inputs) == 3 and not reports[0].outputs
    assert sorted(s.decode() for s in reports[0].get_attr("sources")) == sorted(op.name for op in convs)
    assert [t.op.name for t in reports[0].inputs] == [op.name for op in sorted(convs, key=lambda o: o.name)]
    # nothing waits for it: the dense output comes straight from ChannelSparseToDense
    assert not [op for op in graph.get_operations() if op.type == OP_NAMESPACE + "DirectSparseConvCheckStatus"]
    to_dense = [op for op in graph.get_operations() if op.type == OP_NAMESPACE + "ChannelSparseToDense"]
    assert len(to_dense) == 1
    assert {op.type for op in graph.get_operations() if reports[0] in op.control_inputs} == {"NoOp"}  # the end


def test_a_nan_filter_after_the_first_convolution_is_refused_by_the_end_of_the_sparse_part(rng, device):
    """On the GPU the second convolution does not wait: its NaN check lands in its status and
    to_dense's check raises it, naming the convolution; the CPU raises it at once."""
    (keys, values, dense_shape), ws, masks = _network_case(rng)
    ws[1] = ws[1].copy()
    flat = np.flatnonzero(masks[1])
    ws[1].reshape(-1)[flat[3]] = np.nan
    filters = [tf.Variable(w) for w in ws]
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"filter contains NaN at position {flat[3]}"):
            _network(filters, masks, True)(x)


def test_a_nan_before_a_deferred_relu_is_refused(rng, device):
    """Infinite values out of the first convolution (a diverged filter) make inf - inf in the
    second: its fused ReLU's NaN check is deferred on the GPU and still refused."""
    (keys, values, dense_shape), ws, masks = _network_case(rng)
    values = np.abs(values) + 1.0
    ws[0] = np.where(masks[0], np.float32(np.inf), np.float32(0.0)).astype(np.float32)
    ws[1] = np.where(np.arange(ws[1].size).reshape(ws[1].shape) % 2 == 0, 1.0, -1.0).astype(np.float32)
    masks[1] = np.ones_like(masks[1])
    filters = [tf.Variable(w) for w in ws]
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        with pytest.raises(tf.errors.InvalidArgumentError, match="before the ReLU is NaN"):
            _network(filters, masks, True)(x)


def _status(slot=None, first=-1, details=(0, 0, 0), limit=100):
    status = np.full(25, -1, np.int64)  # 5 checks' slots, the capacity slot, the limit
    status[24] = limit
    if slot is not None:
        status[4 * slot] = first
        status[4 * slot + 1:4 * slot + 4] = details
    return tf.constant(status)


@pytest.mark.parametrize("slot, first, details, message", [
    (0, 4, (250, 3, 0), "conv_a: input key out of range at entry 4: 250 is not in \\[0, 100\\)"),
    (0, 4, (7, 7, 0), "conv_a: input keys must be unique: entries 3 and 4 share key 7"),
    (1, 2, (0, 0, 0), "conv_a: input values contains NaN at position 2"),
    (2, 11, (0, 0, 0), "conv_a: filter contains NaN at position 11"),
    (3, 0, (0, 0, 0), "conv_a: bias contains NaN at position 0"),
    (4, 9, (0, 0, 0), "conv_a: DirectSparseConv with activation 'relu': an output value before the ReLU is NaN"),
    (5, 70, (64, -1, -1), "conv_a: DirectSparseConv: the output has 70 entries, more than max_entries = 64")])
def test_the_status_check_gives_each_failed_checks_message(device, slot, first, details, message):
    with tf.device(device):
        data = tf.ones([2, 3])
        passed = raw_ops.direct_sparse_conv_check_status(data, [_status(), _status()], sources=["conv_b", "conv_c"])
        np.testing.assert_array_equal(passed.numpy(), np.ones([2, 3]))
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            raw_ops.direct_sparse_conv_check_status(data, [_status(), _status(slot, first, details)],
                                                    sources=["conv_b", "conv_a"])


@pytest.mark.parametrize("slot, first, details, message", [
    (0, 4, (250, 3, 0), "conv_a: input key out of range at entry 4: 250 is not in \\[0, 100\\)"),
    (2, 11, (0, 0, 0), "conv_a: filter contains NaN at position 11"),
    (4, 9, (0, 0, 0), "conv_a: DirectSparseConv with activation 'relu': an output value before the ReLU is NaN")])
def test_the_status_report_gives_the_first_failed_checks_message(device, slot, first, details, message):
    """DirectSparseConvReportStatus: nothing where all passed; on the GPU the statuses are
    read back asynchronously, and the eager call still raises."""
    with tf.device(device):
        raw_ops.direct_sparse_conv_report_status([_status(), _status()], sources=["conv_b", "conv_c"])
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            raw_ops.direct_sparse_conv_report_status([_status(), _status(slot, first, details), _status(2, 1)],
                                                     sources=["conv_b", "conv_a", "conv_d"])


def test_the_status_report_raises_at_the_end_of_a_traced_function(device):
    """Nothing takes the report's output; the traced function keeps it (stateful) and fails
    with its error, though every output was computed."""
    @tf.function
    def step(status):
        raw_ops.direct_sparse_conv_report_status([_status(), status], sources=["conv_b", "conv_a"])
        return tf.ones([2]) * 3.0

    with tf.device(device):
        np.testing.assert_array_equal(step(_status()).numpy(), [3.0, 3.0])
        with pytest.raises(tf.errors.InvalidArgumentError, match="conv_a: bias contains NaN at position 0"):
            step(_status(3, 0))


def test_the_status_report_refuses_malformed_statuses(device):
    with tf.device(device):
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="sources"):
            raw_ops.direct_sparse_conv_report_status([_status(), _status()], sources=["a"])
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="shape"):
            raw_ops.direct_sparse_conv_report_status([tf.constant([-1, -1], tf.int64)], sources=["a"])


def test_the_status_check_refuses_malformed_statuses(device):
    with tf.device(device):
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="sources"):
            raw_ops.direct_sparse_conv_check_status(tf.ones([1]), [_status(), _status()], sources=["a"])
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="shape"):
            raw_ops.direct_sparse_conv_check_status(tf.ones([1]), [tf.constant([-1, -1], tf.int64)], sources=["a"])


def test_a_users_padding_in_the_backprops_output_keys_is_refused_unless_padded(rng, device):
    # sparse enough that the output's live entries stay below its bound: it ends in padding
    keys, values, dense_shape = random_sparse_components(rng, SHAPE, 0.05, np.float64)
    w, mask = random_filter(rng, [3, 3, 3], SHAPE[-1], COUT, 0.7)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        y = ts.direct_conv(x, w, None, mask, padded_output=True)
        args = dict(in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape, filter=tf.constant(w),
                    filter_mask=tf.constant(mask), out_keys=y.keys, out_grad=tf.ones_like(y.values))
        assert int(y.num_entries) > int(y.live_entries)
        with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
            raw_ops.direct_sparse_conv_backprop(**args)
        grads = raw_ops.direct_sparse_conv_backprop(**args, padded_output=True)
        live = int(y.live_entries)
        exact = raw_ops.direct_sparse_conv_backprop(**{**args, "out_keys": y.keys[:live],
                                                       "out_grad": tf.ones([live], tf.float64)})
    for g, e in zip(grads, exact):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12, atol=1e-12)


def test_padded_convolutions_are_found_upstream_in_a_traced_graph(rng):
    (keys, values, dense_shape), ws, masks = _network_case(rng)
    seen = {}

    @tf.function
    def f(x):
        h = ts.direct_conv(x, ws[0], None, masks[0], padded_output=True)
        seen["first"] = padded_by_library(h.keys)
        h = ts.sparse_relu(ts.direct_conv(h, ws[1], None, masks[1]))
        seen["exact"] = padded_by_library(h.keys)
        seen["upstream"] = [op.name for op in padded_convs_upstream(h.keys)]
        return ts.to_dense(h)

    x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
    f(x)
    assert seen["first"] and not seen["exact"]
    assert len(seen["upstream"]) == 1
    assert padded_convs_upstream(tf.constant([1], tf.int64)) == []  # eager: no graph


def test_the_keras_layer_auto_pads_inside_a_traced_model_only(rng, monkeypatch):
    monkeypatch.setattr(keras_io, "gpu_visible", lambda: True)  # "auto" pads where a GPU is seen
    (keys, values, dense_shape), _, _ = _network_case(rng)
    x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape),
                               tf.TensorShape([None, 8, 8, 8, 1]))
    inputs = kl.sparse_input([8, 8, 8, 1])
    h = kl.DirectSparseConv(4, 3, activation="relu", padded_output="auto")(inputs)
    h = kl.DirectSparseConv(3, 3, rho_up=0.1, activation="relu", padded_output="auto")(h)
    outputs = kl.SparseToDense()(kl.SparseMaxPool(2)(h))
    model = keras.Model(inputs, outputs)
    eager = model(kl.as_keras_inputs(x)).numpy()
    traced = tf.function(model)(kl.as_keras_inputs(x)).numpy()
    np.testing.assert_allclose(traced, eager, rtol=1e-6, atol=1e-6)
    layer = kl.DirectSparseConv(3, 3, padded_output="auto")
    assert kl.DirectSparseConv.from_config(layer.get_config()).padded_output == "auto"
    eager_out = layer(kl.as_keras_inputs(x))
    assert not padded_by_library(eager_out["keys"]) and PADDING_KEY not in eager_out["keys"].numpy()
    seen = []

    def conv_keys(inputs):
        y = layer(inputs)
        seen.append(padded_by_library(y["keys"]))
        return y["keys"]

    tf.function(conv_keys)(kl.as_keras_inputs(x))
    monkeypatch.setattr(keras_io, "gpu_visible", lambda: False)  # no GPU: nothing to spare, exact
    tf.function(conv_keys)(kl.as_keras_inputs(x))
    assert seen == [True, False]
    with pytest.raises(ValueError, match="padded_output"):
        kl.DirectSparseConv(3, 3, padded_output="yes")


def test_an_eager_keras_layer_hands_on_its_live_entries_only(rng):
    """A Keras dict carries no `padded` flag, and outside a traced graph no op can say that its
    keys end in padding: an eager layer with padded_output=True hands on the live entries, so
    the next layer does not take the padding for a user's out-of-range keys."""
    (keys, values, dense_shape), _, _ = _network_case(rng)
    x = kl.as_keras_inputs(ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape),
                                                  tf.TensorShape([None, 8, 8, 8, 1])))
    conv = kl.DirectSparseConv(4, 3, activation="relu", padded_output=True)
    h = conv(x)
    assert PADDING_KEY not in h["keys"].numpy()
    pooled = kl.SparseMaxPool(2, padded_output=True)(h)
    assert PADDING_KEY not in pooled["keys"].numpy()
    dense = kl.SparseToDense()(kl.DirectSparseConv(3, 3, padded_output=True)(pooled)).numpy()
    exact = ts.direct_conv(ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape)),
                           conv.kernel, conv.bias, tf.cast(conv.mask, tf.bool), activation="relu")
    np.testing.assert_array_equal(ts.to_dense(exact).numpy(), kl.SparseToDense()(h).numpy())
    assert dense.shape == (2, 4, 4, 4, 3)


def test_padded_output_of_the_functions_is_a_bool_not_a_truth_value(rng):
    """direct_conv and sparse_max_pool take padded_output True or False (a NumPy bool too); a
    string such as 'no', a number or None is refused, not taken by its truth value."""
    x = ts.from_dense(tf.constant(rng.standard_normal((1, 4, 4, 4, 1)).astype(np.float32)))
    filters = rng.standard_normal((3, 3, 3, 1, 2)).astype(np.float32)
    for flag in ("no", 1, 0.0, None):
        with pytest.raises(ValueError, match=f"direct_conv: padded_output must be True or False, got {flag!r}"):
            ts.direct_conv(x, filters, padded_output=flag)
        with pytest.raises(ValueError, match=f"sparse_max_pool: padded_output must be True or False, got {flag!r}"):
            ts.sparse_max_pool(x, 2, padded_output=flag)
    assert ts.direct_conv(x, filters, padded_output=np.bool_(True)).padded is True
    assert ts.sparse_max_pool(x, 2, padded_output=np.bool_(False)).padded is False
