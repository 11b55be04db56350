"""DirectSparseConv's max_entries (issue 24): a user-given cap on the output's entries. With
padded_output the output's length is the smaller of the proven bound and the cap, and its live
entries, values and gradients are the exact call's; more kept entries than the cap are refused
with InvalidArgument, at once where the count is on the host, and where the GPU did not wait
for its count (a padded call of keys the library made) through the status output's capacity
slot, which to_dense's report raises by the end of the traced step. The writes past the cap
never happen: the output holds the first max_entries kept entries."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tf_sparseconv._op_library import ops as raw_ops
from tf_sparseconv.models.memory_bound import memory_bound
from tests.device import CPU
from tests.channel.helpers import random_filter, random_sparse_components
from tests.channel.test_padded_conv import (CASES, COUT, SHAPE, _assert_live_then_padding, _assert_same_output, _bound,
                                            _skip_bitmap_on_cpu)


def _case(rng, dtype=np.float32, shape=SHAPE, density=0.3):
    keys, values, dense_shape = random_sparse_components(rng, shape, density, dtype)
    w, mask = random_filter(rng, [3, 3, 3], shape[-1], COUT, 0.7, dtype)
    bias = rng.standard_normal(COUT).astype(dtype)
    return keys, values, dense_shape, w, mask, bias


def _conv(x, w, bias, mask, case, padded, max_entries=None):
    selection, k, activation, dataflow = CASES[case]
    return ts.direct_conv(x, w, bias, mask, selection=selection, k=k, activation=activation, dataflow=dataflow,
                          padded_output=padded, max_entries=max_entries)


# The cases whose output can be below its proven bound: without k-selection (a sparse input's
# touched set is a part of the grid), or with a k larger than any segment.
UNDER_BOUND = ["plain", "sort", "dense", "bitmap", "atomic", "k-large"]
SPARSE_SHAPE = [2, 9, 8, 7, 2]


@pytest.mark.parametrize("case", UNDER_BOUND)
@pytest.mark.parametrize("slack", [0, 3])
def test_a_capped_padded_output_is_the_exact_output_then_padding(rng, device, case, slack):
    """max_entries at the exact count, and a little above it: both below the proven bound, so
    the output's length is max_entries (the padded length without the cap is larger)."""
    _skip_bitmap_on_cpu(device, CASES[case][3])
    keys, values, dense_shape, w, mask, bias = _case(rng, shape=SPARSE_SHAPE, density=0.03)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        want = _conv(x, w, bias, mask, case, False)
        cap = int(want.num_entries) + slack
        bound = _bound(len(keys), mask, CASES[case][0], CASES[case][1], SPARSE_SHAPE)
        assert cap < bound, "the case must cap the padded length"
        got = _conv(x, w, bias, mask, case, True, max_entries=cap)
        exact_capped = _conv(x, w, bias, mask, case, False, max_entries=cap)
    assert got.padded and int(got.num_entries) == cap
    _assert_live_then_padding(got, want, CASES[case][3])
    np.testing.assert_array_equal(exact_capped.keys.numpy(), want.keys.numpy())
    _assert_same_output(ts.to_dense(got).numpy(), ts.to_dense(want).numpy(), CASES[case][3])


def test_a_cap_above_the_bound_leaves_the_bound(rng, device):
    keys, values, dense_shape, w, mask, bias = _case(rng)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        bound = _bound(len(keys), mask, "none", None)
        got = ts.direct_conv(x, w, bias, mask, padded_output=True, max_entries=bound + 100)
    assert int(got.num_entries) == bound


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("padded", [False, True])
def test_more_entries_than_max_entries_are_refused(rng, device, case, padded):
    """Eager calls of the user's keys: the count is on the host (the GPU checks the keys and
    waits for it), so the refusal comes at once, padded or not."""
    _skip_bitmap_on_cpu(device, CASES[case][3])
    keys, values, dense_shape, w, mask, bias = _case(rng)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        count = int(_conv(x, w, bias, mask, case, False).num_entries)
        assert count > 1
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"the output has {count} entries, more than max_entries = {count - 1}"):
            _conv(x, w, bias, mask, case, padded, max_entries=count - 1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_overflow_without_a_wait_keeps_the_first_entries_and_fills_the_capacity_slot(rng, device, case):
    """The raw op with inputs_checked (keys a library op made): on the GPU it does not wait for
    its count, writes the first max_entries kept entries and no more (the output's length is
    the cap), and reports the overflow in status (slot 5: kept entries, max_entries), which the
    status report turns into the error; the CPU knows its count and refuses at once."""
    _skip_bitmap_on_cpu(device, CASES[case][3])
    selection, k, activation, dataflow = CASES[case]
    keys, values, dense_shape, w, mask, bias = _case(rng)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        want = _conv(x, w, bias, mask, case, False)
        count = int(want.num_entries)
        cap = count // 2
        call = dict(in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape, filter=w, filter_mask=mask,
                    bias=bias, selection=selection, k=k or 0, dataflow=dataflow, activation=activation or "none",
                    padded_output=True, inputs_checked=True, max_entries=cap)
        message = f"the output has {count} entries, more than max_entries = {cap}"
        if device == CPU:
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                raw_ops.direct_sparse_conv(**call)
            return
        out_keys, out_values, _, _, _, status = raw_ops.direct_sparse_conv(**call)
        status = status.numpy()
        np.testing.assert_array_equal(status[20:24], [count, cap, -1, -1])
        assert np.all(status[:20] == -1)
        assert out_keys.shape == (cap,)
        np.testing.assert_array_equal(out_keys.numpy(), want.keys.numpy()[:cap])
        _assert_same_output(out_values.numpy(), want.values.numpy()[:cap], dataflow)
        with pytest.raises(tf.errors.InvalidArgumentError, match="conv_x: DirectSparseConv: " + message):
            raw_ops.direct_sparse_conv_report_status([status], sources=["conv_x"])


def _network(filters, masks, caps):
    """conv (no selection, capped) -> conv (k-selection) -> to_dense, with filter gradients."""
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = ts.direct_conv(x, filters[0], None, masks[0], activation="relu", padded_output=True,
                               max_entries=caps[0])
            h = ts.direct_conv(h, filters[1], None, masks[1], activation="relu", padded_output=True,
                               max_entries=caps[1])
            dense = ts.to_dense(h)
            loss = tf.reduce_sum(dense * tf.reshape(tf.range(1.0, 1.0 + tf.cast(tf.size(dense), tf.float32)) ** 0.5,
                                                    tf.shape(dense)))
        return dense, tape.gradient(loss, filters)
    return step


def _network_case(rng):
    keys, values, dense_shape = random_sparse_components(rng, [2, 10, 10, 10, 1], 0.05, np.float32)
    w1, m1 = random_filter(rng, [3, 3, 3], 1, 3, 0.8, np.float32)
    w2, m2 = random_filter(rng, [3, 3, 3], 3, 2, 0.8, np.float32)
    return (keys, values, dense_shape), [tf.Variable(w1), tf.Variable(w2)], [m1, m2]


def _live_counts(x, filters, masks):
    h = ts.direct_conv(x, filters[0], None, masks[0], activation="relu")
    return int(h.num_entries), int(ts.direct_conv(h, filters[1], None, masks[1], activation="relu").num_entries)


def test_a_traced_network_with_capped_convolutions_equals_the_uncapped_one(rng, device):
    (keys, values, dense_shape), filters, masks = _network_case(rng)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        counts = _live_counts(x, filters, masks)
        want, want_grads = _network(filters, masks, [None, None])(x)
        got, got_grads = _network(filters, masks, list(counts))(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    for g, e in zip(got_grads, want_grads):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("which", [0, 1])
def test_an_overflow_in_a_traced_step_is_refused_by_its_end(rng, device, which):
    """On the GPU the capped convolutions of a traced step wait for nothing: an overflow of
    either lands in its status and to_dense's report raises it when the step ends; the CPU
    raises at once. Either way the step fails with InvalidArgument naming the count."""
    (keys, values, dense_shape), filters, masks = _network_case(rng)
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        counts = list(_live_counts(x, filters, masks))
        caps = list(counts)
        caps[which] = counts[which] - 1
        # an overflow of the first leaves the second fewer entries: only the first's is reported
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"the output has {counts[which]} entries, more than max_entries = {caps[which]}"):
            _network(filters, masks, caps)(x)


def test_an_overflow_is_refused_where_the_output_never_reaches_to_dense(rng, device):
    """A traced function that hands the capped padded output back as it is: the convolution's
    own status report fails the call (on the GPU, which did not wait for the count); the CPU
    refuses at once. Within the cap the same function returns the exact entries, then padding."""
    (keys, values, dense_shape), filters, masks = _network_case(rng)

    @tf.function
    def capped(keys, values, dense_shape, cap):
        x = ts.ChannelSparseTensor(keys, values, dense_shape)
        y = ts.direct_conv(x, filters[0], None, masks[0], activation="relu", padded_output=True, max_entries=cap)
        return y.keys, y.values

    with tf.device(device):
        args = (tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        want = ts.direct_conv(ts.ChannelSparseTensor(*args), filters[0], None, masks[0], activation="relu")
        count = int(want.num_entries)
        got_keys, got_values = capped(*args, count + 2)
        np.testing.assert_array_equal(got_keys.numpy()[:count], want.keys.numpy())
        np.testing.assert_array_equal(got_keys.numpy()[count:], [2**63 - 1] * 2)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"the output has {count} entries, more than max_entries = {count - 1}"):
            capped(*args, count - 1)


def test_numeric_gradients_of_a_capped_output(rng):
    keys, values, dense_shape = random_sparse_components(rng, [1, 4, 3, 3, 2], 0.4, np.float64)
    w, mask = random_filter(rng, [3, 3, 3], 2, 2, 0.8)
    x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
    count = int(ts.direct_conv(x, w, None, mask).num_entries)

    def f(v, filters, bias):
        return ts.direct_conv(x.with_values(v), filters, bias, mask, padded_output=True, max_entries=count).values

    bias = tf.constant([0.3, -0.2], tf.float64)
    assert f(x.values, tf.constant(w), bias).shape == (count,)
    theoretical, numerical = tf.test.compute_gradient(f, [x.values, tf.constant(w), bias])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (True, TypeError), (2.5, TypeError),
                                        ("8", TypeError)])
def test_a_bad_max_entries_is_refused(rng, bad, error):
    keys, values, dense_shape, w, mask, bias = _case(rng)
    x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
    with pytest.raises(error, match="max_entries"):
        ts.direct_conv(x, w, bias, mask, max_entries=bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_entries must be >= 0"):
        raw_ops.direct_sparse_conv(in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape, filter=w,
                                   filter_mask=mask, bias=bias, max_entries=-1)
    with pytest.raises(ValueError, match="max_entries"):
        kl.DirectSparseConv(4, max_entries=0)


def _bounded_entries(conv):
    inputs = kl.sparse_input((8, 8, 8, 1))
    model = keras.Model(inputs, kl.SparseToDense()(conv(inputs)))
    return [b.output_entries for b in memory_bound(model, 2, device="cpu").layers if b.kind == "sparse_conv"]


def test_the_layer_keeps_max_entries_and_the_memory_bound_takes_it(rng):
    layer = kl.DirectSparseConv(4, max_entries=120, name="capped")
    assert kl.DirectSparseConv.from_config(layer.get_config()).max_entries == 120
    assert _bounded_entries(layer) == [120] and _bounded_entries(kl.DirectSparseConv(4)) == [2 * 4 * 512]
    model = keras.Sequential([keras.Input((8, 8, 8, 1)), kl.DenseToSparse(), layer, kl.SparseToDense()])
    dense = np.zeros((2, 8, 8, 8, 1), np.float32)
    dense[0, 3, 3, 3, 0] = 1.0
    model(dense)  # one entry reaches 27 positions in 4 channels: 108 entries, within the cap
    dense[1, 1::3, 1::3, 1::3, 0] = 1.0
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than max_entries = 120"):
        model(dense)
