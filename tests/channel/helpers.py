"""Helpers shared by the channel tests (CPU and GPU): random inputs in the key layout, filters,
ChannelSparseTensors on a device, and the tolerances of GPU results against the CPU's.
Imported as `tests.channel.helpers`, so that a subprocess importing a test module finds it too."""
import numpy as np
import tensorflow as tf

import tf_sparseconv as ts
from tests.device import GPU, assert_on_gpu

# GPU against CPU, relative to the largest magnitude: sums taken in another order.
RTOL = {np.float32: 1e-5, np.float64: 1e-12}


def assert_close(actual, expected, dtype):
    """Within rtol of the dtype, with an absolute floor at rtol * the largest magnitude (sums
    taken in another order may cancel differently)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    scale = np.max(np.abs(expected)) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=RTOL[dtype], atol=RTOL[dtype] * scale)


def assert_close_on(device, actual, expected, dtype=np.float64, rtol=0.0, atol=0.0):
    """assert_allclose within rtol and atol; on the GPU, which sums gradients in another order,
    within no less than assert_close's tolerance."""
    if device == GPU:
        expected = np.asarray(expected)
        scale = np.max(np.abs(expected)) if expected.size else 0.0
        rtol, atol = max(rtol, RTOL[dtype]), max(atol, RTOL[dtype] * scale)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def assert_same_sparse(gpu, cpu, dtype):
    """A GPU result against the CPU's: keys and dense_shape equal, values within assert_close."""
    assert_on_gpu(gpu.keys, gpu.values)
    np.testing.assert_array_equal(gpu.keys.numpy(), cpu.keys.numpy())
    np.testing.assert_array_equal(gpu.dense_shape.numpy(), cpu.dense_shape.numpy())
    assert gpu.values.dtype == cpu.values.dtype
    assert_close(gpu.values.numpy(), cpu.values.numpy(), dtype)


def assert_exact_then_padding(got, want):
    """got (a padded output) holds want's entries (the exact output), then only padding."""
    from tf_sparseconv.channel.tensor import PADDING_KEY
    live = int(want.num_entries)
    assert int(got.live_entries) == live
    np.testing.assert_array_equal(got.keys.numpy()[:live], want.keys.numpy())
    np.testing.assert_array_equal(got.values.numpy()[:live], want.values.numpy())
    np.testing.assert_array_equal(got.keys.numpy()[live:], PADDING_KEY)
    np.testing.assert_array_equal(got.values.numpy()[live:], 0)


def sparse_on(device, keys, values, dense_shape):
    with tf.device(device):
        return ts.ChannelSparseTensor(tf.constant(keys, tf.int64), tf.constant(values),
                                      tf.constant(dense_shape, tf.int64))


def random_array(rng, shape, density, dtype, empty_batch=None, tie_values=None):
    """Standard-normal non-zeros with ~density; tie_values: draw them from this small set (ties)."""
    present = rng.random(shape) < density
    if empty_batch is not None:
        present[empty_batch] = False
    if tie_values is None:
        values = rng.standard_normal(shape)
    else:
        values = rng.choice(tie_values, shape)
    return np.where(present, values, 0.0).astype(dtype)


def random_sparse_components(rng, shape, density, dtype, **kwargs):
    """keys, values, dense_shape in numpy (keys from the layout formula, sorted)."""
    dense = random_array(rng, shape, density, dtype, **kwargs)
    d = len(shape) - 2
    key_order = np.transpose(dense, (0, d + 1, *range(1, d + 1))).reshape(-1)
    keys = np.nonzero(key_order)[0].astype(np.int64)
    return keys, key_order[keys], np.array(shape, np.int64)


def random_filter(rng, kernel, cin, cout, filter_density, dtype=np.float64):
    """A standard-normal filter [*kernel, cin, cout] and its mask (~filter_density present)."""
    w = rng.standard_normal((*kernel, cin, cout)).astype(dtype)
    return w, rng.random(w.shape) < filter_density
