"""Conversions of the channel-sparse tensor: dense and tf.SparseTensor round trips, the key
layout, reorder and gradients on each device, the GPU's results identical to the CPU's, and the
InvalidArgumentError paths of validation (on the GPU with the CPU's messages)."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tests.channel.helpers import assert_same_sparse, random_array, random_sparse_components
from tests.device import CPU, GPU, assert_on_gpu, assert_same_error, on

SHAPES = [pytest.param([2, 9, 3], id="1d"), pytest.param([3, 4, 5, 2], id="2d"),
          pytest.param([2, 3, 4, 2, 4], id="3d"), pytest.param([2, 2, 3, 2, 3, 1], id="4d")]
GRADIENT_SHAPES = [pytest.param([2, 5, 2], id="1d"), pytest.param([2, 3, 3, 2], id="2d"),
                   pytest.param([1, 2, 3, 2, 2], id="3d"), pytest.param([1, 2, 2, 2, 2, 1], id="4d")]
VALID_SHAPE = [2, 3, 4, 2]  # keys in [0, 48)


def expected_keys(indices, dense_shape):
    """key = (b * C + c) * S + lin(x), in numpy, for [N, d+2] rows (b, x1..xd, c)."""
    indices = np.asarray(indices, np.int64).reshape(-1, len(dense_shape))
    spatial = tuple(dense_shape[1:-1])
    lin = np.ravel_multi_index(tuple(indices[:, 1:-1].T), spatial)
    return (indices[:, 0] * dense_shape[-1] + indices[:, -1]) * np.prod(spatial, dtype=np.int64) + lin


def empty_channel_sparse(shape, dtype):
    return ts.ChannelSparseTensor(tf.zeros([0], tf.int64), tf.zeros([0], dtype), tf.constant(shape, tf.int64))


@tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float64),
                              tf.TensorSpec([None], tf.int64)])
def validate_components(keys, values, dense_shape):
    """ts.validate with unknown static lengths, so that the ChannelSparseTensor constructor
    cannot reject a key/value length mismatch before the op sees it."""
    return ts.validate(ts.ChannelSparseTensor(keys, values, dense_shape))


# --- round trips and key layout -------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_from_dense_then_to_dense_returns_the_input(shape, fill, dtype, random_dense, device):
    dense = random_dense(shape, dtype=dtype, **fill)
    with tf.device(device):
        x = ts.from_dense(dense)
        x_dense = ts.to_dense(x)
    assert x.dtype == dtype
    assert x.num_entries.numpy() == np.count_nonzero(dense)
    np.testing.assert_array_equal(x_dense.numpy(), dense)


@pytest.mark.parametrize("shape", SHAPES)
def test_from_dense_keys_follow_the_formula_in_batch_channel_spatial_order(shape, fill, random_dense, device):
    dense = random_dense(shape, **fill)
    with tf.device(device):
        x = ts.from_dense(dense)
    nonzero = np.argwhere(dense != 0)  # rows (b, x1..xd, c)
    lin = np.ravel_multi_index(tuple(nonzero[:, 1:-1].T), shape[1:-1])
    by_batch_channel_spatial = np.lexsort((lin, nonzero[:, -1], nonzero[:, 0]))
    rows = nonzero[by_batch_channel_spatial]
    keys = expected_keys(rows, shape)
    assert np.all(np.diff(keys) > 0)
    np.testing.assert_array_equal(x.keys.numpy(), keys)
    np.testing.assert_array_equal(x.values.numpy(), dense[tuple(rows.T)])


@pytest.mark.parametrize("shape", SHAPES + [pytest.param([2, 2**31 - 1, 3], id="1d-largest-extent"),
                                            pytest.param([1, 3, 2**31 - 1, 2], id="2d-largest-extent")])
def test_encode_keys_follows_the_formula_and_decode_keys_inverts_it(shape, rng, device):
    indices = np.stack([rng.integers(0, extent, size=20) for extent in shape], axis=1)
    with tf.device(device):
        keys = ts.encode_keys(indices, shape)
        decoded = ts.decode_keys(keys, shape)
    np.testing.assert_array_equal(keys.numpy(), expected_keys(indices, shape))
    np.testing.assert_array_equal(decoded.numpy(), indices)


@pytest.mark.parametrize("shape", SHAPES)
def test_to_sparse_tensor_equals_tf_sparse_from_dense(shape, fill, dtype, random_dense, device):
    dense = random_dense(shape, dtype=dtype, **fill)
    with tf.device(device):
        sp = ts.to_sparse_tensor(ts.from_dense(dense))
    with tf.device(CPU):
        reference = tf.sparse.reorder(tf.sparse.from_dense(dense))
    np.testing.assert_array_equal(sp.indices.numpy(), reference.indices.numpy())
    np.testing.assert_array_equal(sp.values.numpy(), reference.values.numpy())
    np.testing.assert_array_equal(sp.dense_shape.numpy(), reference.dense_shape.numpy())


@pytest.mark.parametrize("shape", SHAPES)
def test_from_sparse_tensor_of_to_sparse_tensor_is_identical(shape, fill, dtype, random_dense,
                                                            assert_same_channel_sparse, device):
    with tf.device(device):
        x = ts.from_dense(random_dense(shape, dtype=dtype, **fill))
        assert_same_channel_sparse(ts.from_sparse_tensor(ts.to_sparse_tensor(x)), x)


@pytest.mark.parametrize("shape", SHAPES)
def test_from_sparse_tensor_accepts_any_index_order(shape, dtype, random_dense, rng, assert_same_channel_sparse,
                                                    device):
    dense = random_dense(shape, 0.4, dtype)
    with tf.device(device):
        canonical = tf.sparse.from_dense(dense)
        shuffle = rng.permutation(len(canonical.values))
        shuffled = tf.SparseTensor(tf.gather(canonical.indices, shuffle), tf.gather(canonical.values, shuffle),
                                   canonical.dense_shape)
        assert_same_channel_sparse(ts.from_sparse_tensor(shuffled), ts.from_dense(dense))


@pytest.mark.parametrize("shape", SHAPES)
def test_reorder_sorts_shuffled_keys_and_permutes_values_with_them(shape, dtype, random_dense, rng,
                                                                  assert_same_channel_sparse, device):
    with tf.device(device):
        x = ts.from_dense(random_dense(shape, 0.4, dtype))
        shuffle = rng.permutation(int(x.num_entries))
        assert np.any(shuffle != np.arange(len(shuffle)))
        y = ts.reorder(tf.gather(x.keys, shuffle), tf.gather(x.values, shuffle), x.dense_shape)
    assert_same_channel_sparse(y, x)


@pytest.mark.parametrize("shape", SHAPES)
def test_gather_dense_reads_the_dense_values_at_the_entry_positions(shape, fill, dtype, random_dense, rng,
                                                                    device):
    source = rng.standard_normal(shape).astype(dtype)
    with tf.device(device):
        x = ts.from_dense(random_dense(shape, dtype=dtype, **fill))
        y = ts.gather_dense(x, source)
    np.testing.assert_array_equal(y.keys.numpy(), x.keys.numpy())
    positions = tuple(ts.decode_keys(x.keys, shape).numpy().T)
    np.testing.assert_array_equal(y.values.numpy(), source[positions])


@pytest.mark.parametrize("shape", SHAPES)
def test_empty_tensor_passes_validation_and_converts(shape, dtype, assert_same_channel_sparse, device):
    with tf.device(device):
        x = ts.validate(empty_channel_sparse(shape, dtype))
        np.testing.assert_array_equal(ts.to_dense(x).numpy(), np.zeros(shape, dtype))
        assert ts.to_sparse_tensor(x).indices.shape == (0, len(shape))
        assert_same_channel_sparse(ts.from_sparse_tensor(ts.to_sparse_tensor(x)), x)
        assert_same_channel_sparse(ts.from_dense(np.zeros(shape, dtype)), x)
        assert ts.reorder(x.keys, x.values, shape).num_entries.numpy() == 0


def test_validate_accepts_a_dense_shape_just_below_the_key_limit(assert_same_channel_sparse, device):
    dense_shape = [3 * 2**30, 2**31 - 1, 1]  # 1.5 * 2^61 * (2^31 - 1) keys < 2^63
    last_key = 3 * 2**30 * (2**31 - 1) - 1
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant([0, last_key], tf.int64), tf.constant([1.0, 2.0]),
                                   tf.constant(dense_shape, tf.int64))
        assert_same_channel_sparse(ts.validate(x), x)


# --- the GPU's results against the CPU's ----------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("density,empty_batch", [(0.0, None), (0.3, None), (0.3, 0), (1.0, None)],
                         ids=["empty", "sparse", "batch0-empty", "full"])
def test_conversions_relu_validate_match_cpu(rng, shape, density, empty_batch, dtype, gpu):
    dense = random_array(rng, shape, density, dtype, empty_batch=empty_batch)
    cpu_x = on(CPU, ts.from_dense, dense)
    gpu_x = on(GPU, ts.from_dense, dense)
    assert_same_sparse(gpu_x, cpu_x, dtype)
    np.testing.assert_array_equal(gpu_x.values.numpy(), cpu_x.values.numpy())  # copies, no arithmetic
    assert_same_sparse(on(GPU, ts.validate, gpu_x), cpu_x, dtype)
    to_dense = on(GPU, ts.to_dense, gpu_x)
    assert_on_gpu(to_dense)
    np.testing.assert_array_equal(to_dense.numpy(), dense)
    source = rng.standard_normal(shape).astype(dtype)
    gathered = on(GPU, ts.gather_dense, gpu_x, source)
    np.testing.assert_array_equal(gathered.values.numpy(), on(CPU, ts.gather_dense, cpu_x, source).values.numpy())
    relu_gpu, relu_cpu = on(GPU, ts.sparse_relu, gpu_x), on(CPU, ts.sparse_relu, cpu_x)
    assert_same_sparse(relu_gpu, relu_cpu, dtype)
    _, _, kept_gpu = on(GPU, ts.raw_ops.sparse_relu, gpu_x.keys, gpu_x.values, gpu_x.dense_shape)
    _, _, kept_cpu = on(CPU, ts.raw_ops.sparse_relu, cpu_x.keys, cpu_x.values, cpu_x.dense_shape)
    np.testing.assert_array_equal(kept_gpu.numpy(), kept_cpu.numpy())


@pytest.mark.parametrize("shape", SHAPES)
def test_encode_decode_and_reorder_match_cpu(rng, shape, dtype, gpu):
    keys, values, dense_shape = random_sparse_components(rng, shape, 0.4, dtype)
    indices = on(CPU, ts.decode_keys, keys, dense_shape).numpy()
    decoded = on(GPU, ts.decode_keys, keys, dense_shape)
    assert_on_gpu(decoded)
    np.testing.assert_array_equal(decoded.numpy(), indices)
    encoded = on(GPU, ts.encode_keys, indices, dense_shape)
    assert_on_gpu(encoded)
    np.testing.assert_array_equal(encoded.numpy(), keys)
    shuffle = rng.permutation(len(keys))
    outputs = {}
    for device in (CPU, GPU):
        outputs[device] = [t.numpy() for t in on(device, ts.raw_ops.channel_sparse_reorder,
                                                  keys[shuffle], values[shuffle], dense_shape)]
    for gpu_out, cpu_out in zip(outputs[GPU], outputs[CPU]):
        np.testing.assert_array_equal(gpu_out, cpu_out)
    np.testing.assert_array_equal(outputs[GPU][0], keys)


def test_encode_keys_of_the_largest_extents_match_cpu(rng, gpu):
    shape = [2, 3, 2**31 - 1, 2]
    indices = np.stack([rng.integers(0, extent, size=50) for extent in shape], axis=1)
    np.testing.assert_array_equal(on(GPU, ts.encode_keys, indices, shape).numpy(),
                                  on(CPU, ts.encode_keys, indices, shape).numpy())


# --- gradients (float64, theoretical vs numerical Jacobian) ---------------------------------

def to_dense_wrt_values(dense, rng):
    x = ts.from_dense(dense)
    return lambda values: ts.to_dense(x.with_values(values)), x.values


def from_dense_wrt_dense(dense, rng):
    # Masking pins the support: the numerical Jacobian also perturbs the zeros of `dense`.
    present = tf.constant(dense != 0, tf.float64)
    return lambda d: ts.from_dense(d * present).values, dense


def gather_dense_wrt_dense(dense, rng):
    x = ts.from_dense(dense)
    return lambda d: ts.gather_dense(x, d).values, rng.standard_normal(dense.shape)


def reorder_wrt_values(dense, rng):
    x = ts.from_dense(dense)
    shuffle = rng.permutation(int(x.num_entries))
    shuffled_keys = tf.gather(x.keys, shuffle)
    return lambda values: ts.reorder(shuffled_keys, values, x.dense_shape).values, tf.gather(x.values, shuffle)


@pytest.mark.soft_placement
@pytest.mark.parametrize("function_and_input", [to_dense_wrt_values, from_dense_wrt_dense,
                                                gather_dense_wrt_dense, reorder_wrt_values])
@pytest.mark.parametrize("shape", GRADIENT_SHAPES)
def test_conversion_gradient_matches_numerical_jacobian(function_and_input, shape, random_dense, rng,
                                                        assert_gradient_matches_numerical, device):
    with tf.device(device):
        f, x = function_and_input(random_dense(shape, 0.5), rng)
    assert_gradient_matches_numerical(f, x, device)


# --- malformed input ------------------------------------------------------------------------

@pytest.mark.parametrize("keys, values, dense_shape, message", [
    pytest.param([5, 3, 9], [1.0, 2.0, 3.0], VALID_SHAPE, "keys must be sorted", id="unsorted-keys"),
    pytest.param([3, 5, 5], [1.0, 2.0, 3.0], VALID_SHAPE, "keys must be unique", id="duplicate-keys"),
    pytest.param([-1, 3], [1.0, 2.0], VALID_SHAPE, "key out of range", id="negative-key"),
    pytest.param([3, 48], [1.0, 2.0], VALID_SHAPE, "key out of range", id="key-equal-to-dense-size"),
    pytest.param([3, 5], [1.0], VALID_SHAPE, "one value per key", id="values-length-mismatch"),
    pytest.param([], [], [2, 0, 4, 2], "entries must be positive", id="zero-extent"),
    pytest.param([], [], [2, 3, -4, 2], "entries must be positive", id="negative-extent"),
    pytest.param([], [], [0, 3, 4, 2], "entries must be positive", id="zero-batch"),
    pytest.param([], [], [6, 8], "3 to 6 entries", id="dense-shape-rank-2"),
    pytest.param([], [], [1] * 7, "3 to 6 entries", id="dense-shape-rank-7"),
    pytest.param([], [], [2**20, 2**20, 2**20, 2**5, 2], "key overflow", id="key-overflow"),
    pytest.param([], [], [2**21, 2**21, 2**21], "key overflow", id="key-overflow-product-exactly-2^63"),
    pytest.param([], [], [1, 2**31, 1], r"exceeds 2\^31 - 1", id="extent-beyond-int32"),
    pytest.param([3, 5], [1.0, np.nan], VALID_SHAPE, "contains NaN", id="nan-value"),
])
def test_validate_rejects_malformed_tensor(keys, values, dense_shape, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        validate_components(tf.constant(keys, tf.int64), tf.constant(values, tf.float64),
                            tf.constant(dense_shape, tf.int64))


@pytest.mark.parametrize("convert", [ts.to_dense, lambda x: ts.gather_dense(x, np.zeros(VALID_SHAPE))],
                         ids=["to_dense", "gather_dense"])
def test_conversion_rejects_unsorted_keys(convert):
    x = ts.ChannelSparseTensor(tf.constant([5, 3], tf.int64), tf.constant([1.0, 2.0], tf.float64),
                               tf.constant(VALID_SHAPE, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="keys must be sorted"):
        convert(x)


@pytest.mark.parametrize("row, axis", [
    pytest.param([2, 1, 1, 0], 0, id="batch"), pytest.param([0, 3, 1, 0], 1, id="x1"),
    pytest.param([0, 1, 4, 0], 2, id="x2"), pytest.param([0, 1, 1, 2], 3, id="channel"),
    pytest.param([0, -1, 1, 0], 1, id="negative"),
])
def test_encode_keys_rejects_out_of_range_coordinate(row, axis):
    indices = [[1, 2, 3, 1], row]
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"index out of range: indices\[1, {axis}\]"):
        ts.encode_keys(indices, VALID_SHAPE)


def test_encode_keys_rejects_rows_of_the_wrong_width():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices must have shape \[N, 4\]"):
        ts.encode_keys([[0, 1, 1]], VALID_SHAPE)


@pytest.mark.parametrize("keys, message", [
    pytest.param([4, 1, 4], "duplicate key 4", id="duplicate"),
    pytest.param([4, 48, 1], "key out of range", id="out-of-range"),
])
def test_reorder_rejects_malformed_keys(keys, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ts.reorder(tf.constant(keys, tf.int64), tf.constant([1.0, 2.0, 3.0]), VALID_SHAPE)


@pytest.mark.parametrize("convert,argument", [
    (lambda v: ts.encode_keys(v, VALID_SHAPE), "indices"), (lambda v: ts.decode_keys(v, VALID_SHAPE), "keys"),
    (lambda v: ts.reorder(v, tf.constant([1.0]), VALID_SHAPE), "keys")], ids=["encode", "decode", "reorder"])
def test_key_functions_refuse_float_indices_and_keys(convert, argument):
    value = [[0, 1.5, 1, 0]] if argument == "indices" else [1.5]  # used to be truncated
    with pytest.raises(TypeError, match=f"{argument} must be integers \\(int64\\), got float32"):
        convert(value)


def test_key_functions_refuse_keys_beyond_int64():
    with pytest.raises(ValueError, match="keys must lie in the int64 range"):  # used to wrap to a negative key
        ts.decode_keys(np.array([2**63], np.uint64), VALID_SHAPE)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_from_dense_and_from_sparse_tensor_refuse_non_finite_values_unless_allowed(bad):
    dense = np.zeros(VALID_SHAPE, np.float32)
    dense[1, 2, 3, 0] = bad
    dense[0, 0, 1, 1] = 2.0
    for convert in (ts.from_dense, lambda d, **kw: ts.from_sparse_tensor(tf.sparse.from_dense(d), **kw)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="hold NaN or infinite values"):
            convert(dense)
        x = convert(dense, non_finite="allow")
        np.testing.assert_array_equal(ts.to_dense(x.with_values(tf.where(tf.math.is_finite(x.values), x.values, 7.0)))
                                      .numpy(), np.where(np.isfinite(dense), dense, 7.0))


def test_conversions_refuse_complex_values():
    # The imaginary part used to be dropped by a cast to float32.
    with pytest.raises(TypeError, match="from_dense: dense must be real numbers, got complex64"):
        ts.from_dense(np.ones(VALID_SHAPE, np.complex64))
    with pytest.raises(TypeError, match="from_sparse_tensor: values must be real numbers, got complex64"):
        ts.from_sparse_tensor(tf.SparseTensor([[0, 0, 0, 0]], tf.constant([1j], tf.complex64), VALID_SHAPE))


@pytest.mark.parametrize("keys,values,message", [
    ([3, 3], [1.0, 2.0], "keys must be unique: entries 0 and 1 share key 3"),  # used to surface in SparseToDense
    ([5, 3], [1.0, 2.0], "keys must be sorted"),
    ([1, 3], [np.nan, 2.0], "values contains NaN at position 0"),
])
def test_to_sparse_tensor_validates_its_input(keys, values, message):
    x = ts.ChannelSparseTensor(tf.constant(keys, tf.int64), tf.constant(values), tf.constant(VALID_SHAPE, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ts.to_sparse_tensor(x)


# --- malformed input on the GPU: the CPU's messages -------------------------------------------

BAD_KEYS = [pytest.param([3, 1, 5], "must be sorted", id="unsorted"),
            pytest.param([1, 3, 3], "must be unique", id="duplicate"),
            pytest.param([-1, 2], "out of range", id="negative"),
            pytest.param([2, 50], "out of range", id="beyond-the-layout"),
            pytest.param([2, 7, 30, 24], "out of range", id="last-out-of-range")]


def sparse_of(keys, shape, dtype=tf.float64, nan_at=None):
    values = np.ones(len(keys))
    if nan_at is not None:
        values[nan_at] = np.nan
    return ts.ChannelSparseTensor(tf.constant(keys, tf.int64), tf.constant(values, dtype),
                                  tf.constant(shape, tf.int64))


@pytest.mark.parametrize("keys,phrase", BAD_KEYS)
def test_malformed_keys_give_the_cpu_error_on_gpu(keys, phrase, gpu):
    shape = [1, 5, 5, 1]
    ops = [lambda: ts.direct_conv(sparse_of(keys, shape), tf.ones((3, 3, 1, 1), tf.float64)),
           lambda: ts.sparse_relu(sparse_of(keys, shape)),
           lambda: ts.sparse_max_pool(sparse_of(keys, shape), 2),
           lambda: ts.validate(sparse_of(keys, shape)),
           lambda: ts.to_dense(sparse_of(keys, shape)),
           lambda: ts.gather_dense(sparse_of(keys, shape), tf.zeros(shape, tf.float64)),
           lambda: ts.raw_ops.direct_sparse_conv_backprop(
               in_keys=tf.constant(keys, tf.int64), in_values=tf.ones([len(keys)], tf.float64),
               dense_shape=tf.constant(shape, tf.int64), filter=tf.ones((3, 3, 1, 1), tf.float64),
               filter_mask=tf.ones((3, 3, 1, 1), tf.bool), out_keys=tf.constant([0, 1], tf.int64),
               out_grad=tf.ones([2], tf.float64))]
    for op in ops:
        assert_same_error(op, phrase)


def test_nan_values_give_the_cpu_error_on_gpu(gpu):
    for op in (ts.sparse_relu, lambda x: ts.sparse_max_pool(x, 2), ts.validate):
        assert_same_error(lambda: op(sparse_of([1, 6, 9], [1, 4, 4, 1], nan_at=1)), "contains NaN")


def test_encode_decode_reorder_errors_on_gpu(gpu):
    shape = [2, 3, 4, 2]
    for row, axis in [([2, 1, 1, 0], 0), ([0, 3, 1, 0], 1), ([0, 1, 4, 0], 2), ([0, 1, 1, 2], 3),
                      ([0, -1, 1, 0], 1)]:
        assert_same_error(lambda: ts.encode_keys([[1, 2, 3, 1], [0, 0, 0, 0], row], shape),
                          rf"index out of range: indices\[2, {axis}\]")
    assert_same_error(lambda: ts.decode_keys([1, 48, 2], shape), "key out of range at entry 1")
    assert_same_error(lambda: ts.decode_keys([1, -3], shape), "key out of range at entry 1")
    assert_same_error(lambda: ts.reorder(tf.constant([4, 1, 4, 9], tf.int64), tf.ones([4]), shape),
                      "duplicate key 4")
    assert_same_error(lambda: ts.reorder(tf.constant([4, 48, 1], tf.int64), tf.ones([3]), shape),
                      "key out of range")


@pytest.mark.parametrize("shape", [[2, 3, 4], [2, 4, 3, 2], [2, 3, 4, 2, 1]], ids=["rank-3", "other-extents",
                                                                                  "rank-5"])
def test_gather_dense_refuses_a_dense_tensor_of_another_shape(shape, device):
    # Keys are read in dense's layout: another shape than x's would gather other positions.
    with tf.device(device):
        x = ts.from_dense(np.arange(1.0, 25.0).reshape(2, 3, 4, 1))
        with pytest.raises(tf.errors.InvalidArgumentError, match="gather_dense: dense must have x's dense_shape"):
            ts.gather_dense(x, np.ones(shape))


@pytest.mark.parametrize("rank", [2, 7])
def test_from_dense_names_the_dense_input_for_a_bad_rank(rank, device):
    with tf.device(device):
        with pytest.raises(tf.errors.InvalidArgumentError, match="dense must have rank 3 to 6 .*got shape"):
            ts.from_dense(np.ones([2] * rank))


def test_reorder_takes_real_values_as_from_sparse_tensor_does():
    # Before: integer values were TensorFlow's "Value for attr 'T' of int32 is not in the list
    # of allowed values: float, double", complex and string ones the same internal message.
    x = ts.reorder([1, 0], [1, 2], VALID_SHAPE)
    assert x.values.dtype == tf.float32 and x.values.numpy().tolist() == [2.0, 1.0]
    with pytest.raises(TypeError, match="reorder: values must be real numbers, got complex128"):
        ts.reorder([1, 0], np.array([1j, 2]), VALID_SHAPE)
    with pytest.raises(TypeError, match="reorder: values must be real numbers, got string"):
        ts.reorder([1, 0], ["a", "b"], VALID_SHAPE)


def test_gather_dense_refuses_complex_and_non_numeric_dense():
    # Before: a complex array lost its imaginary part (gathered 0 from 1j) and a string gave
    # "Cannot convert 'a' to EagerTensor of dtype float".
    x = ts.from_dense(np.ones(VALID_SHAPE, np.float32))
    with pytest.raises(TypeError, match="gather_dense: dense must be real numbers, got complex values"):
        ts.gather_dense(x, np.ones(VALID_SHAPE) * 1j)
    with pytest.raises(TypeError, match="gather_dense: dense must be real numbers, got string"):
        ts.gather_dense(x, "a")
    assert ts.gather_dense(x, 2 * np.ones(VALID_SHAPE, np.int32)).values.numpy().tolist() == [2.0] * x.values.shape[0]


@pytest.mark.parametrize("sp", ["abc", np.ones(VALID_SHAPE, np.float32)], ids=["string", "dense-array"])
def test_from_sparse_tensor_names_an_input_that_is_not_a_sparse_tensor(sp):
    # Before: AttributeError ("'str' object has no attribute 'values'").
    with pytest.raises(TypeError, match="from_sparse_tensor expects a tf.SparseTensor, got"):
        ts.from_sparse_tensor(sp)
