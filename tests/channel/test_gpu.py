"""GPU kernels against the CPU kernels: every op on the same random inputs on both devices
(keys exactly equal, values within float tolerance), gradients, bit-identical reruns (also
under op determinism), the CPU's error messages, a SavedModel, and float64 gradient checks.
Skipped when TensorFlow sees no GPU."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import _build_info

pytestmark = [pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                                 reason="no GPU visible to TensorFlow"),
              pytest.mark.usefixtures("strict_placement")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU, GPU = "/CPU:0", "/GPU:0"
RTOL = {np.float32: 1e-5, np.float64: 1e-12}
SHAPES = [pytest.param([2, 9, 3], id="1d"), pytest.param([3, 4, 5, 2], id="2d"),
          pytest.param([2, 3, 4, 2, 4], id="3d"), pytest.param([2, 2, 3, 2, 3, 1], id="4d")]
CONV_CASES = [
    # (batch, spatial, cin, cout, kernel, density, filter_density)
    pytest.param(1, (9,), 2, 3, (3,), 0.3, 1.0, id="1d"),
    pytest.param(2, (7, 6), 3, 4, (3, 3), 0.2, 0.5, id="2d"),
    pytest.param(3, (8, 5), 1, 2, (5, 3), 0.1, 0.7, id="2d-anisotropic-kernel"),
    pytest.param(2, (6, 5, 4), 2, 3, (3, 3, 3), 0.15, 0.5, id="3d"),
    pytest.param(1, (9, 9, 9), 1, 8, (3, 3, 3), 0.05, 0.1, id="3d-pruned"),
    pytest.param(2, (4, 3, 4, 3), 2, 2, (3, 1, 3, 3), 0.2, 0.6, id="4d"),
    pytest.param(3, (6, 7), 2, 3, (3, 3), 0.3, 0.8, id="2d-batch1-empty"),
    # more than 32 kernel offsets: the dense grid's neighbour masks share bits between offsets
    pytest.param(2, (8, 9, 7), 2, 3, (5, 5, 3), 0.04, 0.6, id="3d-75-offsets"),
    pytest.param(1, (5, 5, 4, 4), 1, 2, (3, 3, 3, 3), 0.05, 0.5, id="4d-81-offsets"),
    # R^d a multiple of 32: the dense grid's thread per site and 8 output channels (a partial last chunk)
    pytest.param(3, (8, 8), 3, 11, (3, 3), 0.2, 0.7, id="2d-site-chunks"),
    pytest.param(2, (4, 8, 8), 2, 9, (3, 3, 3), 0.1, 0.6, id="3d-site-chunks"),
    pytest.param(1, (8, 8, 8), 2, 3, (5, 5, 3), 0.03, 0.6, id="3d-75-offsets-site-chunks"),
]

# The direct convolution's two dataflows (`dataflow=`; `auto` picks the dense grid for every
# small grid here): each conv test runs its GPU calls with both forced, through gpu_dataflow.
DIRECT_DATAFLOWS = ["sort", "dense"]
gpu_dataflow = "auto"


def pytest_generate_tests(metafunc):
    if "conv" in metafunc.function.__name__:
        metafunc.parametrize("direct_dataflow", DIRECT_DATAFLOWS, indirect=True)


@pytest.fixture(autouse=True)
def direct_dataflow(request, monkeypatch):
    mode = getattr(request, "param", None)
    if mode is not None:
        monkeypatch.setattr(sys.modules[__name__], "gpu_dataflow", mode)
    return mode


def on(device, fn, *args, **kwargs):
    """fn(*args) with its numpy arguments turned into tensors on `device`, run there."""
    with tf.device(device):
        args = [tf.constant(a) if isinstance(a, np.ndarray) else a for a in args]
        return fn(*args, **kwargs)


def sparse_on(device, keys, values, dense_shape):
    with tf.device(device):
        return ts.ChannelSparseTensor(tf.constant(keys, tf.int64), tf.constant(values),
                                      tf.constant(dense_shape, tf.int64))


def assert_on_gpu(*tensors):
    for t in tensors:
        assert "GPU" in t.device, f"expected a GPU result, got one on {t.device}"


def assert_close(actual, expected, dtype):
    """Within rtol of the dtype, with an absolute floor at rtol * the largest magnitude (sums
    taken in another order may cancel differently)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    scale = np.max(np.abs(expected)) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=RTOL[dtype], atol=RTOL[dtype] * scale)


def assert_same_sparse(gpu, cpu, dtype):
    assert_on_gpu(gpu.keys, gpu.values)
    np.testing.assert_array_equal(gpu.keys.numpy(), cpu.keys.numpy())
    np.testing.assert_array_equal(gpu.dense_shape.numpy(), cpu.dense_shape.numpy())
    assert gpu.values.dtype == cpu.values.dtype
    assert_close(gpu.values.numpy(), cpu.values.numpy(), dtype)


def random_dense(rng, shape, density, dtype, empty_batch=None, tie_values=None):
    """Non-zeros with ~density; tie_values: draw them from this small set (ties)."""
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
    dense = random_dense(rng, shape, density, dtype, **kwargs)
    d = len(shape) - 2
    key_order = np.transpose(dense, (0, d + 1, *range(1, d + 1))).reshape(-1)
    keys = np.nonzero(key_order)[0].astype(np.int64)
    return keys, key_order[keys], np.array(shape, np.int64)


def random_filter(rng, kernel, cin, cout, filter_density, dtype):
    w = rng.standard_normal((*kernel, cin, cout)).astype(dtype)
    return w, rng.random(w.shape) < filter_density


def first_line(error):
    """The error's own first line, without TensorFlow's device-specific function-node prefix."""
    message = str(error.message).split(" [Op:")[0].splitlines()[0]
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)


# --- build ------------------------------------------------------------------------------------

def test_op_library_was_built_with_cuda():
    assert _build_info.CUDA, "the op library has no GPU kernels; rebuild with nvcc available"
    assert _build_info.CUDA_ARCHS


# --- conversions, validation, ReLU, max-pool: CPU == GPU --------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("density,empty_batch", [(0.0, None), (0.3, None), (0.3, 0), (1.0, None)],
                         ids=["empty", "sparse", "batch0-empty", "full"])
def test_conversions_relu_validate_match_cpu(rng, shape, density, empty_batch, dtype):
    dense = random_dense(rng, shape, density, dtype, empty_batch=empty_batch)
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
def test_encode_decode_and_reorder_match_cpu(rng, shape, dtype):
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


def test_encode_keys_of_the_largest_extents_match_cpu(rng):
    shape = [2, 3, 2**31 - 1, 2]
    indices = np.stack([rng.integers(0, extent, size=50) for extent in shape], axis=1)
    np.testing.assert_array_equal(on(GPU, ts.encode_keys, indices, shape).numpy(),
                                  on(CPU, ts.encode_keys, indices, shape).numpy())


MAX_POOL_CASES = [
    pytest.param([2, 11, 3], [3], id="1d-odd"),
    pytest.param([3, 7, 5, 2], [2, 3], id="2d-anisotropic-odd"),
    pytest.param([2, 5, 4, 4], [1, 2], id="2d-stride-1"),
    pytest.param([2, 3, 4, 1], [4, 5], id="2d-one-window"),
    pytest.param([2, 5, 7, 3, 2], [2, 3, 2], id="3d-anisotropic-odd"),
    pytest.param([2, 3, 5, 4, 3, 2], [2, 2, 3, 1], id="4d-anisotropic-odd"),
]


@pytest.mark.parametrize("shape,strides", MAX_POOL_CASES)
@pytest.mark.parametrize("values", ["distinct", "ties"])
def test_max_pool_matches_cpu_including_argmax_of_ties(rng, shape, strides, values, dtype):
    ties = [-1.0, 1.0, 2.0] if values == "ties" else None
    for density in (0.0, 0.6):
        keys, vals, dense_shape = random_sparse_components(rng, shape, density, dtype, tie_values=ties)
        results = {device: on(device, ts.raw_ops.sparse_max_pool, keys, vals, dense_shape, strides=strides)
                   for device in (CPU, GPU)}
        assert_on_gpu(results[GPU][1], results[GPU][3])
        for gpu_out, cpu_out in zip(results[GPU], results[CPU]):
            np.testing.assert_array_equal(gpu_out.numpy(), cpu_out.numpy())


def test_max_pool_of_many_entries_matches_cpu(rng, dtype):
    keys, vals, dense_shape = random_sparse_components(rng, [2, 40, 40, 30, 3], 0.2, dtype,
                                                       tie_values=[0.5, 1.0, 1.5, -2.0])
    results = {device: on(device, ts.raw_ops.sparse_max_pool, keys, vals, dense_shape, strides=[2, 3, 2])
               for device in (CPU, GPU)}
    for gpu_out, cpu_out in zip(results[GPU], results[CPU]):
        np.testing.assert_array_equal(gpu_out.numpy(), cpu_out.numpy())


# --- direct sparse convolution: CPU == GPU ----------------------------------------------------

def conv_inputs(rng, batch, spatial, cin, cout, kernel, density, filter_density, dtype, tie_values=None):
    empty_batch = 1 if batch == 3 else None
    keys, values, dense_shape = random_sparse_components(rng, (batch, *spatial, cin), density, dtype,
                                                         empty_batch=empty_batch, tie_values=tie_values)
    w, mask = random_filter(rng, kernel, cin, cout, filter_density, dtype)
    bias = rng.standard_normal(cout).astype(dtype)
    return keys, values, dense_shape, w, mask, bias


def run_conv(device, keys, values, dense_shape, w, mask, bias, **kwargs):
    """direct_conv on `device`; on the GPU with dataflow=gpu_dataflow unless kwargs name one."""
    if device == GPU:
        kwargs.setdefault("dataflow", gpu_dataflow)
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
@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", CONV_CASES)
def test_conv_matches_cpu(rng, batch, spatial, cin, cout, kernel, density, filter_density, selection, dtype):
    inputs = conv_inputs(rng, batch, spatial, cin, cout, kernel, density, filter_density, dtype)
    y_cpu, counts_cpu = run_conv(CPU, *inputs, **selection)
    y_gpu, counts_gpu = run_conv(GPU, *inputs, **selection)
    assert_same_sparse(y_gpu, y_cpu, dtype)
    assert_on_gpu(counts_gpu)
    np.testing.assert_array_equal(counts_gpu.numpy(), counts_cpu.numpy())


@pytest.mark.parametrize("selection", ["signed", "abs"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_conv_k_selection_ties_go_to_the_smaller_key_like_cpu(rng, selection, k, dtype):
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
    y_gpu, _ = run_conv(GPU, keys, values, dense_shape, w, mask, bias, selection=selection, k=k)
    assert_same_sparse(y_gpu, y_cpu, dtype)


def test_conv_k_selection_ties_at_zero_prefer_the_smaller_key():
    # Stored +0 and -0 entries are equal responses, as on the CPU.
    keys = np.array([1, 4, 7, 10], np.int64)
    values = np.array([3.0, -0.0, 0.0, 3.0])
    w, mask, bias = np.ones((1, 1, 1, 1)), np.ones((1, 1, 1, 1), bool), np.array([0.0])
    for selection in ("signed", "abs"):
        y_cpu, _ = run_conv(CPU, keys, values, np.array([1, 1, 12, 1]), w, mask, bias, selection=selection, k=3)
        y_gpu, _ = run_conv(GPU, keys, values, np.array([1, 1, 12, 1]), w, mask, bias, selection=selection, k=3)
        np.testing.assert_array_equal(y_cpu.keys.numpy(), [1, 4, 10])
        np.testing.assert_array_equal(y_gpu.keys.numpy(), y_cpu.keys.numpy())


@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", CONV_CASES)
def test_conv_values_are_bit_identical_to_cpu(rng, batch, spatial, cin, cout, kernel, density, filter_density,
                                              dtype):
    """Contributions are summed in the CPU's order with the CPU's roundings (no FMA)."""
    inputs = conv_inputs(rng, batch, spatial, cin, cout, kernel, density, filter_density, dtype)
    y_cpu, _ = run_conv(CPU, *inputs)
    y_gpu, _ = run_conv(GPU, *inputs)
    np.testing.assert_array_equal(y_gpu.values.numpy(), y_cpu.values.numpy())


def test_conv_of_an_empty_input_and_all_pruned_filter(rng, dtype):
    w, mask = random_filter(rng, (3, 3), 2, 3, 0.5, dtype)
    empty = (np.zeros([0], np.int64), np.zeros([0], dtype), np.array([2, 5, 5, 2], np.int64))
    for filter_mask in (mask, np.zeros_like(mask)):
        for kwargs in ({}, dict(selection="signed", k=3)):
            y_gpu, touched = run_conv(GPU, *empty, w, filter_mask, np.ones(3, dtype), **kwargs)
            assert y_gpu.keys.shape[0] == 0
            np.testing.assert_array_equal(touched.numpy(), np.zeros((2, 2, 3)))
    keys, values, dense_shape = random_sparse_components(rng, [2, 5, 5, 2], 0.4, dtype)
    y_gpu, touched = run_conv(GPU, keys, values, dense_shape, w, np.zeros_like(mask), np.ones(3, dtype))
    assert y_gpu.keys.shape[0] == 0 and not touched.numpy().any()


def test_gpu_dataflows_give_bit_identical_results(rng):
    inputs = conv_inputs(rng, 2, (9, 8, 7), 2, 3, (3, 3, 3), 0.1, 0.6, np.float32)
    results = [run_conv(GPU, *inputs, dataflow=dataflow)[0] for dataflow in ("auto", "sort", "dense")]
    for y in results[1:]:
        np.testing.assert_array_equal(y.keys.numpy(), results[0].keys.numpy())
        np.testing.assert_array_equal(y.values.numpy(), results[0].values.numpy())


def large_conv_inputs(rng, dtype):
    """Enough entries for many compaction tiles, sort passes and gradient parts per segment."""
    return conv_inputs(rng, 2, (40, 36, 32), 2, 4, (3, 3, 3), 0.03, 0.6, dtype)


@pytest.mark.parametrize("selection", [pytest.param({}, id="none"),
                                       pytest.param(dict(selection="signed", rho_up=0.01), id="signed"),
                                       pytest.param(dict(selection="abs", k=500), id="abs")])
def test_large_conv_matches_cpu(rng, selection, dtype):
    inputs = large_conv_inputs(rng, dtype)
    y_cpu, counts_cpu = run_conv(CPU, *inputs, **selection)
    y_gpu, counts_gpu = run_conv(GPU, *inputs, **selection)
    assert counts_cpu.numpy()[0].min() > 2048, "the case needs segments larger than a tile"
    assert_same_sparse(y_gpu, y_cpu, dtype)
    np.testing.assert_array_equal(counts_gpu.numpy(), counts_cpu.numpy())


# --- gradients ---------------------------------------------------------------------------------

def backprop(device, keys, values, dense_shape, w, mask, out_keys, out_grad, dataflow=None):
    """Raw backprop outputs (on the GPU with dataflow=gpu_dataflow unless given). The GPU sums
    dL/dx in the order of the CPU's search path (dataflow='sort'), so that CPU run is the
    bit-identical reference."""
    dataflow = dataflow or (gpu_dataflow if device == GPU else "auto")
    with tf.device(device):
        return [t.numpy() for t in ts.raw_ops.direct_sparse_conv_backprop(
            in_keys=tf.constant(keys), in_values=tf.constant(values), dense_shape=tf.constant(dense_shape),
            filter=tf.constant(w), filter_mask=tf.constant(mask), out_keys=tf.constant(out_keys),
            out_grad=tf.constant(out_grad), dataflow=dataflow)]


@pytest.mark.parametrize("selection", [pytest.param({}, id="none"),
                                       pytest.param(dict(selection="abs", k=4), id="abs-k4")])
@pytest.mark.parametrize("batch,spatial,cin,cout,kernel,density,filter_density", CONV_CASES)
def test_conv_backprop_matches_cpu(rng, batch, spatial, cin, cout, kernel, density, filter_density, selection,
                                   dtype):
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, batch, spatial, cin, cout, kernel, density,
                                                           filter_density, dtype)
    y, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias, **selection)
    out_keys = y.keys.numpy()
    out_grad = rng.standard_normal(len(out_keys)).astype(dtype)
    cpu = backprop(CPU, keys, values, dense_shape, w, mask, out_keys, out_grad, dataflow="sort")
    gpu = backprop(GPU, keys, values, dense_shape, w, mask, out_keys, out_grad)
    np.testing.assert_array_equal(gpu[0], cpu[0])  # in_grad: the CPU's summation order
    assert np.all(gpu[1][~mask] == 0)
    for g, c in zip(gpu[1:], cpu[1:]):
        assert_close(g, c, dtype)


def test_large_conv_backprop_matches_cpu(rng, dtype):
    keys, values, dense_shape, w, mask, bias = large_conv_inputs(rng, dtype)
    y, _ = run_conv(CPU, keys, values, dense_shape, w, mask, bias)
    out_grad = rng.standard_normal(y.keys.shape[0]).astype(dtype)
    cpu = backprop(CPU, keys, values, dense_shape, w, mask, y.keys.numpy(), out_grad, dataflow="sort")
    gpu = backprop(GPU, keys, values, dense_shape, w, mask, y.keys.numpy(), out_grad)
    np.testing.assert_array_equal(gpu[0], cpu[0])
    for g, c in zip(gpu[1:], cpu[1:]):
        assert_close(g, c, dtype)


def tape_gradients(device, fn, *arrays):
    with tf.device(device):
        variables = [tf.constant(a) for a in arrays]
        with tf.GradientTape() as tape:
            tape.watch(variables)
            out = fn(*variables)
            loss = tf.reduce_sum(out * out)
        return [g.numpy() for g in tape.gradient(loss, variables)]


def test_conv_relu_pool_gradients_on_gpu_match_cpu(rng, dtype):
    keys, values, dense_shape, w, mask, bias = conv_inputs(rng, 2, (8, 7, 6), 2, 3, (3, 3, 3), 0.15, 0.6, dtype)

    def net(v, filters, b):
        x = ts.ChannelSparseTensor(tf.constant(keys), v, tf.constant(dense_shape))
        y = ts.sparse_relu(ts.direct_conv(x, filters, b, tf.constant(mask), selection="signed", k=20,
                                          dataflow=gpu_dataflow))
        return ts.to_dense(ts.sparse_max_pool(y, 2))

    cpu = tape_gradients(CPU, net, values, w, bias)
    gpu = tape_gradients(GPU, net, values, w, bias)
    for g, c in zip(gpu, cpu):
        assert_close(g, c, dtype)


@pytest.mark.soft_placement
@pytest.mark.parametrize("spatial,kernel,cin,cout", [((7, 6), (3, 3), 2, 3), ((5, 4, 5), (3, 3, 3), 2, 2),
                                                     ((11,), (5,), 3, 2)])
def test_conv_gradient_matches_numerical_jacobian_on_gpu_float64(rng, spatial, kernel, cin, cout):
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


@pytest.mark.soft_placement
def test_relu_and_max_pool_gradients_match_numerical_jacobian_on_gpu_float64(rng):
    keys, values, dense_shape = random_sparse_components(rng, [2, 4, 5, 2], 0.6, np.float64)

    def on_gpu(y):
        assert_on_gpu(y)
        return y

    with tf.device(GPU):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))
        for f in (lambda v: on_gpu(ts.sparse_relu(x.with_values(v)).values),
                  lambda v: on_gpu(ts.sparse_max_pool(x.with_values(v), [2, 3]).values),
                  lambda v: on_gpu(ts.to_dense(x.with_values(v)))):
            theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(values)])
            assert np.any(theoretical[0])
            np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-6)


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


def test_gpu_results_are_bit_identical_across_runs(dtype):
    first, second = all_outputs(7, dtype), all_outputs(7, dtype)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_gpu_results_are_bit_identical_under_op_determinism():
    # enable_op_determinism cannot be turned off again: a process of its own.
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from tests.channel.test_gpu import all_outputs
        for dtype in (np.float32, np.float64):
            first, second = all_outputs(11, dtype), all_outputs(11, dtype)
            for a, b in zip(first, second):
                np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        print("bit-identical under op determinism")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bit-identical under op determinism" in result.stdout


# --- errors: the CPU's messages -----------------------------------------------------------------

def assert_same_error(fn, phrase):
    messages = {}
    for device in (CPU, GPU):
        with pytest.raises(tf.errors.InvalidArgumentError, match=phrase) as error:
            with tf.device(device):
                fn()
        messages[device] = first_line(error.value)
    assert messages[GPU] == messages[CPU]


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
def test_malformed_keys_give_the_cpu_error_on_gpu(keys, phrase):
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


@pytest.mark.parametrize("out_keys,phrase", [([0, 99], "output key out of range"), ([5, 2], "must be sorted"),
                                             ([4, 4], "must be unique")])
def test_backprop_output_keys_give_the_cpu_error_on_gpu(out_keys, phrase):
    assert_same_error(lambda: ts.raw_ops.direct_sparse_conv_backprop(
        in_keys=tf.constant([0, 7], tf.int64), in_values=tf.ones([2], tf.float64),
        dense_shape=tf.constant([1, 5, 5, 1], tf.int64), filter=tf.ones((3, 3, 1, 1), tf.float64),
        filter_mask=tf.ones((3, 3, 1, 1), tf.bool), out_keys=tf.constant(out_keys, tf.int64),
        out_grad=tf.ones([2], tf.float64)), phrase)


@pytest.mark.parametrize("where", ["values", "filter", "bias"])
def test_conv_nan_gives_the_cpu_error_on_gpu(where):
    def conv():
        values, w, b = np.ones(2), np.ones((3, 3, 1, 1)), np.zeros(1)
        {"values": values, "filter": w, "bias": b}[where].flat[-1] = np.nan
        x = sparse_of([0, 7], [1, 5, 5, 1])
        return ts.direct_conv(x.with_values(tf.constant(values)), tf.constant(w), tf.constant(b),
                              dataflow=gpu_dataflow)
    assert_same_error(conv, "contains NaN")
    if where != "bias":
        assert_same_error(lambda: ts.raw_ops.direct_sparse_conv_backprop(
            in_keys=tf.constant([0, 7], tf.int64),
            in_values=tf.constant([1.0, np.nan] if where == "values" else [1.0, 1.0], tf.float64),
            dense_shape=tf.constant([1, 5, 5, 1], tf.int64),
            filter=tf.constant(np.full((3, 3, 1, 1), np.nan if where == "filter" else 1.0)),
            filter_mask=tf.ones((3, 3, 1, 1), tf.bool), out_keys=tf.constant([0, 1], tf.int64),
            out_grad=tf.ones([2], tf.float64), dataflow=gpu_dataflow), "contains NaN")


def test_nan_values_give_the_cpu_error_on_gpu():
    for op in (ts.sparse_relu, lambda x: ts.sparse_max_pool(x, 2), ts.validate):
        assert_same_error(lambda: op(sparse_of([1, 6, 9], [1, 4, 4, 1], nan_at=1)), "contains NaN")


def test_encode_decode_reorder_errors_on_gpu():
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


# --- graphs and SavedModel ---------------------------------------------------------------------

@pytest.mark.soft_placement
def test_savedmodel_runs_on_gpu_like_eager_cpu(rng, tmp_path):
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


def test_unknown_direct_choices_are_rejected(rng):
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
def test_forward_in_example_groups_is_the_one_run_result(rng, selection, limit_mb, dtype):
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


def test_forward_in_example_groups_checks_keys_across_the_groups(rng):
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
