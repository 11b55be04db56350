"""Conversions of the channel-sparse tensor: dense and tf.SparseTensor round trips, the key
layout, reorder, gradients, and the InvalidArgumentError paths of validation."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts

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
def test_from_dense_then_to_dense_returns_the_input(shape, fill, dtype, random_dense):
    dense = random_dense(shape, dtype=dtype, **fill)
    x = ts.from_dense(dense)
    assert x.dtype == dtype
    assert x.num_entries.numpy() == np.count_nonzero(dense)
    np.testing.assert_array_equal(ts.to_dense(x).numpy(), dense)


@pytest.mark.parametrize("shape", SHAPES)
def test_from_dense_keys_follow_the_formula_in_batch_channel_spatial_order(shape, fill, random_dense):
    dense = random_dense(shape, **fill)
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
def test_encode_keys_follows_the_formula_and_decode_keys_inverts_it(shape, rng):
    indices = np.stack([rng.integers(0, extent, size=20) for extent in shape], axis=1)
    keys = ts.encode_keys(indices, shape)
    np.testing.assert_array_equal(keys.numpy(), expected_keys(indices, shape))
    np.testing.assert_array_equal(ts.decode_keys(keys, shape).numpy(), indices)


@pytest.mark.parametrize("shape", SHAPES)
def test_to_sparse_tensor_equals_tf_sparse_from_dense(shape, fill, dtype, random_dense):
    dense = random_dense(shape, dtype=dtype, **fill)
    sp = ts.to_sparse_tensor(ts.from_dense(dense))
    reference = tf.sparse.reorder(tf.sparse.from_dense(dense))
    np.testing.assert_array_equal(sp.indices.numpy(), reference.indices.numpy())
    np.testing.assert_array_equal(sp.values.numpy(), reference.values.numpy())
    np.testing.assert_array_equal(sp.dense_shape.numpy(), reference.dense_shape.numpy())


@pytest.mark.parametrize("shape", SHAPES)
def test_from_sparse_tensor_of_to_sparse_tensor_is_identical(shape, fill, dtype, random_dense,
                                                            assert_same_channel_sparse):
    x = ts.from_dense(random_dense(shape, dtype=dtype, **fill))
    assert_same_channel_sparse(ts.from_sparse_tensor(ts.to_sparse_tensor(x)), x)


@pytest.mark.parametrize("shape", SHAPES)
def test_from_sparse_tensor_accepts_any_index_order(shape, dtype, random_dense, rng, assert_same_channel_sparse):
    dense = random_dense(shape, 0.4, dtype)
    canonical = tf.sparse.from_dense(dense)
    shuffle = rng.permutation(len(canonical.values))
    shuffled = tf.SparseTensor(tf.gather(canonical.indices, shuffle), tf.gather(canonical.values, shuffle),
                               canonical.dense_shape)
    assert_same_channel_sparse(ts.from_sparse_tensor(shuffled), ts.from_dense(dense))


@pytest.mark.parametrize("shape", SHAPES)
def test_reorder_sorts_shuffled_keys_and_permutes_values_with_them(shape, dtype, random_dense, rng,
                                                                  assert_same_channel_sparse):
    x = ts.from_dense(random_dense(shape, 0.4, dtype))
    shuffle = rng.permutation(int(x.num_entries))
    assert np.any(shuffle != np.arange(len(shuffle)))
    y = ts.reorder(tf.gather(x.keys, shuffle), tf.gather(x.values, shuffle), x.dense_shape)
    assert_same_channel_sparse(y, x)


@pytest.mark.parametrize("shape", SHAPES)
def test_gather_dense_reads_the_dense_values_at_the_entry_positions(shape, fill, dtype, random_dense, rng):
    x = ts.from_dense(random_dense(shape, dtype=dtype, **fill))
    source = rng.standard_normal(shape).astype(dtype)
    y = ts.gather_dense(x, source)
    np.testing.assert_array_equal(y.keys.numpy(), x.keys.numpy())
    positions = tuple(ts.decode_keys(x.keys, shape).numpy().T)
    np.testing.assert_array_equal(y.values.numpy(), source[positions])


@pytest.mark.parametrize("shape", SHAPES)
def test_empty_tensor_passes_validation_and_converts(shape, dtype, assert_same_channel_sparse):
    x = ts.validate(empty_channel_sparse(shape, dtype))
    np.testing.assert_array_equal(ts.to_dense(x).numpy(), np.zeros(shape, dtype))
    assert ts.to_sparse_tensor(x).indices.shape == (0, len(shape))
    assert_same_channel_sparse(ts.from_sparse_tensor(ts.to_sparse_tensor(x)), x)
    assert_same_channel_sparse(ts.from_dense(np.zeros(shape, dtype)), x)
    assert ts.reorder(x.keys, x.values, shape).num_entries.numpy() == 0


def test_validate_accepts_a_dense_shape_just_below_the_key_limit(assert_same_channel_sparse):
    dense_shape = [3 * 2**30, 2**31 - 1, 1]  # 1.5 * 2^61 * (2^31 - 1) keys < 2^63
    last_key = 3 * 2**30 * (2**31 - 1) - 1
    x = ts.ChannelSparseTensor(tf.constant([0, last_key], tf.int64), tf.constant([1.0, 2.0]),
                               tf.constant(dense_shape, tf.int64))
    assert_same_channel_sparse(ts.validate(x), x)


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


@pytest.mark.parametrize("function_and_input", [to_dense_wrt_values, from_dense_wrt_dense,
                                                gather_dense_wrt_dense, reorder_wrt_values])
@pytest.mark.parametrize("shape", GRADIENT_SHAPES)
def test_conversion_gradient_matches_numerical_jacobian(function_and_input, shape, random_dense, rng,
                                                        assert_gradient_matches_numerical):
    f, x = function_and_input(random_dense(shape, 0.5), rng)
    assert_gradient_matches_numerical(f, x)


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
