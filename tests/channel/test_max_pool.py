"""Sparse max-pooling (window = stride, output at floor(x / s), extents ceil(R / s)): values and
support against dense tf.nn.max_pool and a numpy reference, arg-max gradients and ties, on each
device; the GPU's outputs, arg-max of ties included, identical to the CPU's."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tests.channel.helpers import random_sparse_components
from tests.device import CPU, GPU, assert_on, assert_on_gpu, on

# (shape, strides, padding) where tf.nn.max_pool pools the same windows: VALID with extents
# divisible by the stride, or SAME with stride 2 (odd extents are padded by 1 at the end).
DENSE_AGREEING_CASES = [
    pytest.param([2, 12, 3], [3], "VALID", id="1d-valid"),
    pytest.param([2, 9, 2], 2, "SAME", id="1d-odd-same"),
    pytest.param([3, 6, 8, 2], [2, 2], "VALID", id="2d-valid"),
    pytest.param([2, 6, 9, 3], [2, 3], "VALID", id="2d-anisotropic-valid"),
    pytest.param([2, 7, 5, 2], 2, "SAME", id="2d-odd-same"),
    pytest.param([2, 4, 6, 4, 2], [2, 3, 2], "VALID", id="3d-anisotropic-valid"),
    pytest.param([1, 5, 3, 7, 4], 2, "SAME", id="3d-odd-same"),
]
CASES = [
    pytest.param([2, 11, 3], [3], id="1d-odd"),
    pytest.param([3, 7, 5, 2], [2, 3], id="2d-anisotropic-odd"),
    pytest.param([2, 5, 4, 4], [1, 2], id="2d-stride-1"),
    pytest.param([2, 3, 4, 1], [4, 5], id="2d-one-window"),
    pytest.param([2, 5, 7, 3, 2], [2, 3, 2], id="3d-anisotropic-odd"),
    pytest.param([2, 3, 5, 4, 3, 2], [2, 2, 3, 1], id="4d-anisotropic-odd"),
]
GRADIENT_CASES = [
    pytest.param([2, 6, 2], 3, id="1d"),
    pytest.param([2, 4, 5, 2], [2, 3], id="2d-anisotropic-odd"),
    pytest.param([1, 4, 3, 4, 2], 2, id="3d-odd"),
    pytest.param([1, 2, 3, 2, 2, 2], [2, 2, 1, 2], id="4d"),
]


def per_dimension(strides, spatial_rank):
    return [strides] * spatial_rank if isinstance(strides, int) else list(strides)


def reference_max_pool(dense, strides):
    """numpy: (max over the present (non-zero) entries of each window, non-empty-window mask)."""
    spatial, strides = dense.shape[1:-1], per_dimension(strides, dense.ndim - 2)
    pooled_extents = [-(-r // s) for r, s in zip(spatial, strides)]
    padding = [(0, 0)] + [(0, p * s - r) for r, s, p in zip(spatial, strides, pooled_extents)] + [(0, 0)]
    present = np.pad(dense != 0, padding, constant_values=False)
    values = np.pad(np.where(dense != 0, dense, -np.inf), padding, constant_values=-np.inf)
    windowed = [dense.shape[0]] + [n for p, s in zip(pooled_extents, strides) for n in (p, s)] + [dense.shape[-1]]
    window_axes = tuple(range(2, 2 * len(strides) + 1, 2))
    nonempty = present.reshape(windowed).any(axis=window_axes)
    maxima = values.reshape(windowed).max(axis=window_axes)
    return np.where(nonempty, maxima, 0).astype(dense.dtype), nonempty


def support_of(x):
    """Boolean dense mask of the positions that hold an entry."""
    support = np.zeros(x.dense_shape.numpy(), bool)
    support[tuple(ts.decode_keys(x.keys, x.dense_shape).numpy().T)] = True
    return support


def first_maximum_jacobian(x, y, strides):
    """numpy: J[j, i] = 1 where input entry i is the first maximum, in key order, of output entry j's window."""
    in_indices = ts.decode_keys(x.keys, x.dense_shape).numpy()
    in_indices[:, 1:-1] //= per_dimension(strides, x.spatial_rank)
    output_row = {tuple(index): j for j, index in enumerate(ts.decode_keys(y.keys, y.dense_shape).numpy())}
    values = x.values.numpy()
    first_maximum, tied_windows = {}, set()
    for i, window in enumerate(map(tuple, in_indices)):
        j = output_row[window]
        if j not in first_maximum or values[i] > values[first_maximum[j]]:
            first_maximum[j] = i
        elif values[i] == values[first_maximum[j]]:
            tied_windows.add(j)
    jacobian = np.zeros((len(y.values), len(values)))
    jacobian[list(first_maximum), list(first_maximum.values())] = 1
    return jacobian, tied_windows


@pytest.mark.parametrize("shape, strides, padding", DENSE_AGREEING_CASES)
def test_sparse_max_pool_equals_dense_tf_max_pool_on_positive_inputs(shape, strides, padding, fill, dtype,
                                                                     random_dense, device):
    dense = random_dense(shape, dtype=dtype, sign="positive", **fill)
    with tf.device(device):
        y = ts.sparse_max_pool(ts.from_dense(dense), strides)
        y_dense = ts.to_dense(y)
    assert y.dtype == dtype
    with tf.device(CPU):
        expected = tf.nn.max_pool(dense.astype(np.float32), strides, strides, padding)  # exact in float32
    np.testing.assert_array_equal(y_dense.numpy(), expected.numpy().astype(dtype))


@pytest.mark.parametrize("shape, strides", CASES)
def test_sparse_max_pool_output_extents_are_ceil_of_extent_over_stride(shape, strides, random_dense, device):
    with tf.device(device):
        y = ts.sparse_max_pool(ts.from_dense(random_dense(shape, 0.3)), strides)
    spatial_strides = per_dimension(strides, len(shape) - 2)
    expected = [shape[0]] + [int(np.ceil(r / s)) for r, s in zip(shape[1:-1], spatial_strides)] + [shape[-1]]
    np.testing.assert_array_equal(y.dense_shape.numpy(), expected)


@pytest.mark.parametrize("shape, strides", CASES)
def test_sparse_max_pool_support_is_exactly_the_nonempty_windows(shape, strides, fill, random_dense, device):
    dense = random_dense(shape, **fill)
    with tf.device(device):
        y = ts.validate(ts.sparse_max_pool(ts.from_dense(dense), strides))
    _, nonempty = reference_max_pool(dense, strides)
    assert int(y.num_entries) == np.count_nonzero(nonempty)
    np.testing.assert_array_equal(support_of(y), nonempty)


@pytest.mark.parametrize("sign", ["mixed", "negative"])
@pytest.mark.parametrize("shape, strides", CASES)
def test_sparse_max_pool_value_is_the_max_of_the_present_entries_even_if_negative(shape, strides, sign, fill,
                                                                                  dtype, random_dense, device):
    dense = random_dense(shape, dtype=dtype, sign=sign, **fill)
    with tf.device(device):
        y_dense = ts.to_dense(ts.sparse_max_pool(ts.from_dense(dense), strides))
    expected, nonempty = reference_max_pool(dense, strides)
    if sign == "negative":
        assert np.all(expected[nonempty] < 0)
    np.testing.assert_array_equal(y_dense.numpy(), expected)


@pytest.mark.parametrize("density", [
    pytest.param(0.002, id="stable-sort"),     # 720 entries per segment on a 300^2 pooled grid
    pytest.param(0.2, id="counting-sort")])    # 72,000 entries: the CPU orders them by counting
def test_sparse_max_pool_of_a_large_grid_keeps_the_first_maximum_of_each_window(density, rng):
    shape, strides = [2, 600, 600, 2], 2
    dense = np.where(rng.random(shape) < density, rng.choice([-1.0, 1.0, 2.0], shape), 0.0)
    x = ts.from_dense(dense)
    with tf.GradientTape() as tape:
        tape.watch(x.values)
        y = ts.sparse_max_pool(x, strides)
        total = tf.reduce_sum(y.values)
    expected, nonempty = reference_max_pool(dense, strides)
    np.testing.assert_array_equal(ts.to_dense(y).numpy(), expected)
    assert int(y.num_entries) == np.count_nonzero(nonempty)
    # dL/dx: 1 at each window's maximum of the smallest key (keys are sorted), else 0
    coords = ts.decode_keys(x.keys, x.dense_shape).numpy()
    window = np.stack([coords[:, 0], coords[:, -1], coords[:, 1] // 2, coords[:, 2] // 2], axis=1)
    values = x.values.numpy()
    first_max = {}
    for i in range(len(values)):
        w = tuple(window[i])
        if w not in first_max or values[i] > values[first_max[w]]:
            first_max[w] = i
    expected_grad = np.zeros(len(values))
    expected_grad[list(first_max.values())] = 1.0
    np.testing.assert_array_equal(tape.gradient(total, x.values).numpy(), expected_grad)


@pytest.mark.parametrize("side", [pytest.param(60_000, id="beyond-32-bit-positions"),
                                  pytest.param(60, id="32-bit-positions")])
def test_sparse_max_pool_of_sparse_entries_equals_a_reference_by_coordinates(side, rng, device):
    """A few hundred entries pooled by (2, 3, 2): on a 60,000 x 60,000 x 5 grid (more than
    2^32 positions per example: the CPU decodes by 64-bit divisions there, by multiplications
    below) and on a small one, against windows and maxima found from the coordinates."""
    shape, strides = [2, side, side, 5, 2], [2, 3, 2]
    per_segment = 150
    coords, values = [], []
    for b in range(shape[0]):
        for c in range(shape[-1]):
            # clusters of neighbouring cells around random anchors, so that windows hold several
            anchors = np.stack([rng.integers(0, side - 3, 50), rng.integers(0, side - 3, 50),
                                rng.integers(0, 4, 50)], 1)
            near = anchors[rng.integers(0, 50, 4 * per_segment)] + rng.integers(0, [3, 4, 2], (4 * per_segment, 3))
            cells = rng.permutation(np.unique(near, axis=0))[:per_segment]
            coords += [(b, *cell, c) for cell in cells]
            values += list(rng.choice([-1.0, 0.5, 2.0], len(cells)))  # ties within windows
    coords, values = np.array(coords, np.int64), np.array(values, np.float32)
    keys = ((coords[:, 0] * shape[-1] + coords[:, 4]) * side + coords[:, 1]) * side * 5 + coords[:, 2] * 5 \
        + coords[:, 3]
    order = np.argsort(keys)
    keys, values, coords = keys[order], values[order], coords[order]
    with tf.device(device):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(shape, tf.int64))
        y = ts.sparse_max_pool(x, strides)
        got = dict(zip(map(tuple, ts.decode_keys(y.keys, y.dense_shape).numpy()), y.values.numpy()))
    want = {}
    for (b, i, j, k, c), v in zip(coords, values):
        window = (b, i // 2, j // 3, k // 2, c)
        want[window] = max(want.get(window, -np.inf), v)
    assert got == pytest.approx(want)
    assert len(got) == len(want) < len(keys)  # some windows hold several entries


@pytest.mark.soft_placement
@pytest.mark.parametrize("shape, strides", [
    pytest.param([2, 9, 2], 3, id="1d"), pytest.param([2, 4, 6, 2], [2, 3], id="2d-anisotropic"),
    pytest.param([1, 4, 5, 4, 2], 2, id="3d-odd"),
])
def test_sparse_max_pool_gradient_of_tied_maxima_goes_to_the_smaller_key(shape, strides, rng, device):
    dense = np.where(rng.random(shape) < 0.7, rng.choice([-1.0, 1.0, 2.0], shape), 0.0)

    def pooled_values(v):
        values = ts.sparse_max_pool(x.with_values(v), strides).values
        assert_on(device, values)
        return values

    with tf.device(device):
        x = ts.from_dense(dense)
        y = ts.sparse_max_pool(x, strides)
        theoretical, _ = tf.test.compute_gradient(pooled_values, [x.values])
    expected, tied_windows = first_maximum_jacobian(x, y, strides)
    assert tied_windows, "the input must hold tied maxima"
    np.testing.assert_array_equal(theoretical[0], expected)


@pytest.mark.soft_placement
@pytest.mark.parametrize("shape, strides", GRADIENT_CASES)
def test_sparse_max_pool_gradient_matches_numerical_jacobian(shape, strides, random_dense,
                                                             assert_gradient_matches_numerical, device):
    with tf.device(device):
        x = ts.from_dense(random_dense(shape, 0.6))  # distinct values: no ties
        y = ts.sparse_max_pool(x, strides)
    assert int(y.num_entries) < int(x.num_entries), "the check needs windows with several entries"
    jacobian = assert_gradient_matches_numerical(
        lambda values: ts.sparse_max_pool(x.with_values(values), strides).values, x.values, device)
    np.testing.assert_array_equal(jacobian, first_maximum_jacobian(x, y, strides)[0])


@pytest.mark.parametrize("shape", [[1, 2**31, 1], [1, 2, 2**32 + 6, 1]], ids=["1d", "2d"])
def test_sparse_max_pool_rejects_spatial_extents_beyond_int32(shape):
    x = ts.ChannelSparseTensor(tf.constant([0], tf.int64), tf.constant([1.0]), tf.constant(shape, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"exceeds 2\^31 - 1"):
        ts.sparse_max_pool(x, [2] * (len(shape) - 2))


@pytest.mark.parametrize("strides, message", [
    pytest.param([2], "strides has 1 entries but the input has 2 spatial dimensions", id="too-few-strides"),
    pytest.param([2, 2, 2], "strides has 3 entries but the input has 2 spatial dimensions", id="too-many-strides"),
    pytest.param([2, 0], r"strides must be >= 1, got strides\[1\] = 0", id="zero-stride"),
    pytest.param([-1, 2], r"strides must be >= 1, got strides\[0\] = -1", id="negative-stride"),
])
def test_sparse_max_pool_rejects_bad_strides(strides, message, random_dense):
    x = ts.from_dense(random_dense([1, 4, 4, 2], 0.5))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ts.sparse_max_pool(x, strides)


@pytest.mark.parametrize("strides", [[[2], [2]], [2, "two"], None], ids=["nested", "string", "none"])
def test_sparse_max_pool_names_strides_that_are_not_ints(strides, random_dense):
    x = ts.from_dense(random_dense([1, 4, 4, 2], 0.5))
    with pytest.raises(TypeError, match="sparse_max_pool: strides must be an int or one int per spatial dimension"):
        ts.sparse_max_pool(x, strides)


@pytest.mark.parametrize("strides", [[2.5, 2], 2.0, True, [True, 2], "22", "2"],
                         ids=["float-entry", "float", "bool", "bool-entry", "string-of-two", "string-of-one"])
def test_sparse_max_pool_never_truncates_or_parses_strides(strides, random_dense):
    # Before: [2.5, 2] pooled by 2 (int() truncated), True by 1, "22" by [2, 2] (a string
    # iterated character by character) and "2" failed in the op with a count mismatch.
    x = ts.from_dense(random_dense([1, 4, 4, 2], 0.5))
    with pytest.raises(TypeError, match="sparse_max_pool: strides must be an int or one int per spatial dimension"):
        ts.sparse_max_pool(x, strides)


def test_sparse_max_pool_names_strides_beyond_int32(random_dense):
    # Before: TensorFlow's "Attr strides has value ... out of range for an int32" or, at 2^63, an OverflowError.
    x = ts.from_dense(random_dense([1, 4, 4, 2], 0.5))
    for strides in ([2**40, 1], [2**63, 1]):
        with pytest.raises(ValueError, match=r"sparse_max_pool: strides must be at most 2\^31 - 1"):
            ts.sparse_max_pool(x, strides)
    assert ts.sparse_max_pool(x, [np.int64(2), 1]).shape == (1, 2, 4, 2)


@pytest.mark.parametrize("keys, values, message", [
    pytest.param([6, 1], [1.0, 2.0], "keys must be sorted", id="unsorted-keys"),
    pytest.param([1, 6], [1.0, np.nan], "contains NaN", id="nan-value"),
])
def test_sparse_max_pool_rejects_malformed_input(keys, values, message):
    x = ts.ChannelSparseTensor(tf.constant(keys, tf.int64), tf.constant(values),
                               tf.constant([1, 4, 2, 1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ts.sparse_max_pool(x, 2)


@pytest.mark.parametrize("shape,strides", CASES)
@pytest.mark.parametrize("values", ["distinct", "ties"])
def test_max_pool_matches_cpu_including_argmax_of_ties(rng, shape, strides, values, dtype, gpu):
    ties = [-1.0, 1.0, 2.0] if values == "ties" else None
    for density in (0.0, 0.6):
        keys, vals, dense_shape = random_sparse_components(rng, shape, density, dtype, tie_values=ties)
        results = {device: on(device, ts.raw_ops.sparse_max_pool, keys, vals, dense_shape, strides=strides)
                   for device in (CPU, GPU)}
        assert_on_gpu(results[GPU][1], results[GPU][3])
        for gpu_out, cpu_out in zip(results[GPU], results[CPU]):
            np.testing.assert_array_equal(gpu_out.numpy(), cpu_out.numpy())


def test_max_pool_of_many_entries_matches_cpu(rng, dtype, gpu):
    keys, vals, dense_shape = random_sparse_components(rng, [2, 40, 40, 30, 3], 0.2, dtype,
                                                       tie_values=[0.5, 1.0, 1.5, -2.0])
    results = {device: on(device, ts.raw_ops.sparse_max_pool, keys, vals, dense_shape, strides=[2, 3, 2])
               for device in (CPU, GPU)}
    for gpu_out, cpu_out in zip(results[GPU], results[CPU]):
        np.testing.assert_array_equal(gpu_out.numpy(), cpu_out.numpy())


@pytest.mark.parametrize("shape", [[2**40, 1, 1], [2**29, 1, 1]], ids=["2^40", "2^29"])
def test_sparse_max_pool_refuses_huge_empty_shapes_before_sizing_tables(shape):
    # Used to size per-(batch, channel) tables from dense_shape alone (SIGSEGV, or gigabytes).
    x = ts.ChannelSparseTensor(tf.zeros([0], tf.int64), tf.zeros([0]), tf.constant(shape, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"max_pool input has B = .* \(2\^24\)"):
        ts.sparse_max_pool(x, [1])
