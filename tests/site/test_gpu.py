"""GPU kernels of the site-sparse family against the CPU kernels: kernel maps from both GPU
builders ('hash' and 'sort') identical to the CPU's (all modes, 1-D to 4-D, shuffled and
empty inputs), the convolution and its gradients within stated tolerances, bit-identical
reruns under op determinism, and the CPU's error messages for every bad input.
Skipped when TensorFlow sees no GPU."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv import _build_info
from tf_sparseconv._op_library import ops
from tf_sparseconv.site import kernel_map, neighbour_table, site_conv, site_conv_transpose, site_inverse_conv
from tf_sparseconv.site.tensor import make_site_sparse

from tests.site.helpers import hand_built

pytestmark = [pytest.mark.skipif(not tf.config.list_physical_devices("GPU"),
                                 reason="no GPU visible to TensorFlow"),
              pytest.mark.usefixtures("strict_placement")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU, GPU = "/CPU:0", "/GPU:0"
NO_NEIGHBOURS = tf.zeros([0], tf.int32)  # SiteSparseConv's neighbours input, not given
BUILDERS = ["hash", "sort"]
# GPU against CPU, relative to the largest magnitude of the CPU result. float32 and
# float64: sums in another order. float16 and bfloat16: both devices accumulate in
# float32 and round once at the end, so they differ by about one rounding of the output
# (2^-11 and 2^-8 relative), plus the float32 differences.
TOLERANCE = {tf.float32: 1e-5, tf.float64: 1e-12, tf.float16: 2e-3, tf.bfloat16: 1.6e-2}


@pytest.fixture(autouse=True)
def strict_float32():
    """float32 within 1e-5 of the CPU needs float32 products: TF32 (TensorFlow's default on
    sm_80 and later, which SiteSparseConv follows) is off in these tests, except where a
    test turns it on."""
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(previous)


def on_cpu(value, dtype):
    """value as a tensor of dtype, converted on the CPU (not every GPU Cast has every type)."""
    with tf.device(CPU):
        return tf.cast(tf.constant(np.asarray(value, np.float32)), dtype)


def random_sites(rng, batch, shape, density):
    """Unique random sites in shuffled order (nothing may rely on the order)."""
    occupied = rng.random((batch, *shape)) < density
    coords = np.argwhere(occupied).astype(np.int32)
    return coords[rng.permutation(len(coords))]


def raw_map(device, coords, shape, batch, mode, kernel, strides, padding, dilation, builder="hash"):
    with tf.device(device):
        outputs = ops.site_kernel_map(tf.constant(coords, tf.int32), tf.constant(shape, tf.int32),
                                      tf.constant(batch, tf.int32), mode=mode, kernel_size=list(kernel),
                                      strides=list(strides), padding=list(padding), dilation=list(dilation),
                                      builder=builder)
    return outputs


def assert_same_map(gpu, cpu):
    names = ("out_coords", "out_spatial_shape", "in_rows", "out_rows", "offset_splits")
    for name, g, c in zip(names, gpu, cpu):
        assert g.dtype == c.dtype, name
        np.testing.assert_array_equal(g.numpy(), c.numpy(), err_msg=name)


def assert_close(actual, expected, dtype, what=""):
    actual = np.asarray(actual.numpy(), np.float64)
    expected = np.asarray(expected.numpy(), np.float64)
    assert actual.shape == expected.shape, what
    scale = np.max(np.abs(expected)) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale,
                               err_msg=what)


def first_line(error):
    """The error's own first line, without TensorFlow's device-specific prefixes."""
    message = str(error.message).split(" [Op:")[0].splitlines()[0]
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)


def assert_same_error(fn, phrase):
    messages = {}
    for device in (CPU, GPU):
        with pytest.raises(tf.errors.InvalidArgumentError, match=phrase) as error:
            with tf.device(device):
                fn()
        messages[device] = first_line(error.value)
    assert messages[GPU] == messages[CPU]


def test_op_library_was_built_with_cuda():
    assert _build_info.CUDA, "the op library has no GPU kernels; rebuild with nvcc available"


# --- kernel maps: both GPU builders == CPU ------------------------------------------------------

MAP_CASES = [
    # (batch, shape, kernel, strides, padding, dilation, density)
    pytest.param(2, (40,), (3,), (1,), (0,), (1,), 0.4, id="1d"),
    pytest.param(2, (40,), (5,), (2,), (1,), (2,), 0.4, id="1d-dilated"),
    pytest.param(3, (13, 11), (3, 3), (2, 2), (1, 1), (1, 1), 0.3, id="2d"),
    pytest.param(1, (12, 9), (3, 5), (1, 2), (0, 1), (2, 1), 0.35, id="2d-anisotropic"),
    pytest.param(2, (24, 24, 24), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), 0.15, id="3d-multi-tile"),
    pytest.param(2, (9, 8, 7), (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1), 0.3, id="3d-k2s2"),
    pytest.param(1, (6, 5, 7), (3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1), 1.0, id="3d-full"),
    pytest.param(2, (6, 5, 6, 5), (3, 3, 3, 3), (2, 1, 2, 1), (1, 0, 1, 0), (1, 1, 1, 1), 0.2, id="4d"),
]


def geometry_for(mode, kernel, strides, padding, dilation):
    """Submanifold maps need odd kernels, stride 1 and padding 0."""
    if mode != "submanifold":
        return kernel, strides, padding, dilation
    d = len(kernel)
    return tuple(k | 1 for k in kernel), (1,) * d, (0,) * d, dilation


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("mode", ["submanifold", "strided", "transposed"])
@pytest.mark.parametrize("batch,shape,kernel,strides,padding,dilation,density", MAP_CASES)
def test_kernel_map_matches_cpu_exactly(rng, builder, mode, batch, shape, kernel, strides, padding, dilation,
                                        density):
    coords = random_sites(rng, batch, shape, density)
    geometry = geometry_for(mode, kernel, strides, padding, dilation)
    cpu = raw_map(CPU, coords, shape, batch, mode, *geometry)
    gpu = raw_map(GPU, coords, shape, batch, mode, *geometry, builder=builder)
    for t in (gpu[0], gpu[2], gpu[3]):
        assert "GPU" in t.device, f"expected a GPU result, got one on {t.device}"
    assert_same_map(gpu, cpu)
    assert int(cpu[4].numpy()[-1]) > 0 or len(coords) == 0


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("mode", ["submanifold", "strided", "transposed"])
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_kernel_map_of_no_sites_is_empty_on_gpu(builder, mode, d):
    geometry = geometry_for(mode, (3,) * d, (2,) * d, (1,) * d, (1,) * d)
    coords = np.zeros((0, d + 1), np.int32)
    cpu = raw_map(CPU, coords, (5,) * d, 2, mode, *geometry)
    gpu = raw_map(GPU, coords, (5,) * d, 2, mode, *geometry, builder=builder)
    assert_same_map(gpu, cpu)
    assert gpu[0].shape == (0, d + 1) and gpu[2].shape == (0,)
    np.testing.assert_array_equal(gpu[4].numpy(), np.zeros(3 ** d + 1))


@pytest.mark.parametrize("builder", BUILDERS)
def test_kernel_map_of_one_site_and_of_the_largest_batch_index(builder):
    coords = np.array([[4, 0, 6]], np.int32)
    for mode in ("submanifold", "strided", "transposed"):
        geometry = geometry_for(mode, (3, 3), (2, 2), (1, 1), (1, 1))
        assert_same_map(raw_map(GPU, coords, (3, 7), 5, mode, *geometry, builder=builder),
                        raw_map(CPU, coords, (3, 7), 5, mode, *geometry))


def test_sort_builder_searches_long_key_ranges_in_global_memory(rng):
    """A sparse row above a dense one: a chunk of 256 sorted sites of the sparse row spans
    2048 columns, so its queries shifted into the dense row range over more keys than a
    block stages in shared memory, and the search runs in global memory instead."""
    width = 6000
    sparse = np.stack([np.zeros(width // 8), np.zeros(width // 8), np.arange(0, width, 8)], 1)
    dense = np.stack([np.zeros(width), np.ones(width), np.arange(width)], 1)
    coords = np.concatenate([sparse, dense]).astype(np.int32)
    coords = coords[rng.permutation(len(coords))]
    geometry = ((3, 3), (1, 1), (0, 0), (1, 1))
    cpu = raw_map(CPU, coords, (3, width), 1, "submanifold", *geometry)
    for builder in BUILDERS:
        assert_same_map(raw_map(GPU, coords, (3, width), 1, "submanifold", *geometry, builder=builder), cpu)


def test_kernel_map_of_a_lidar_like_surface_matches_cpu(rng):
    """Many sites (tens of thousands) on a few planes: long runs of neighbours."""
    grid = np.zeros((1, 160, 160, 24), bool)
    grid[0, :, :, 2] = rng.random((160, 160)) < 0.9                      # ground
    grid[0, 40, :, :] = rng.random((160, 24)) < 0.7                       # a wall
    coords = np.argwhere(grid).astype(np.int32)
    coords = coords[rng.permutation(len(coords))]
    for mode, geometry in [("submanifold", ((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1))),
                           ("strided", ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))),
                           ("transposed", ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)))]:
        cpu = raw_map(CPU, coords, (160, 160, 24), 1, mode, *geometry)
        for builder in BUILDERS:
            assert_same_map(raw_map(GPU, coords, (160, 160, 24), 1, mode, *geometry, builder=builder), cpu)


def test_kernel_map_python_wrapper_passes_the_builder_through(rng):
    coords = random_sites(rng, 2, (8, 8, 8), 0.2)
    with tf.device(GPU):
        x = make_site_sparse(coords, np.ones((len(coords), 1), np.float32), (8, 8, 8), 2)
        maps = [kernel_map(x, 3, strides=2, padding=1, builder=b) for b in BUILDERS]
    for name in ("in_rows", "out_rows", "offset_splits", "out_coords"):
        np.testing.assert_array_equal(getattr(maps[0], name).numpy(), getattr(maps[1], name).numpy())


# --- convolution and gradients: GPU == CPU within tolerance --------------------------------------

CONV_CASES = [
    # (batch, shape, kernel, cin, cout, density, kwargs)
    pytest.param(2, (30,), (3,), 3, 5, 0.5, dict(subm=True), id="1d-subm"),
    pytest.param(2, (11, 12), (3, 3), 17, 20, 0.3, dict(strides=2, padding=1), id="2d-strided"),
    pytest.param(2, (9, 8, 9), (3, 3, 3), 8, 8, 0.25, dict(subm=True), id="3d-subm"),
    pytest.param(1, (20, 20, 20), (3, 3, 3), 70, 130, 0.12, dict(subm=True), id="3d-subm-wide-multi-tile"),
    pytest.param(2, (10, 9, 10), (2, 2, 2), 16, 32, 0.3, dict(strides=2), id="3d-k2s2"),
    pytest.param(2, (5, 4, 5, 4), (3, 3, 3, 3), 4, 3, 0.3, dict(subm=True), id="4d-subm"),
    # Rows of a multiple of 8 channels: the 16-byte loads of the tensor-core tiles, four
    # 32-channel steps, a second column tile with an 8-column tail.
    pytest.param(1, (16, 16, 16), (3, 3, 3), 128, 72, 0.1, dict(subm=True), id="3d-subm-c128-vector-loads"),
    # The pipelined tensor-core kernel (sm_80+, half and bfloat16): a 32-channel step and an
    # 8-channel tail, two 128-column tiles of which the second has 8 columns.
    pytest.param(1, (14, 14, 14), (3, 3, 3), 40, 136, 0.1, dict(subm=True), id="3d-subm-c40-c136-two-col-tiles"),
    # 256 channels both ways: two 128-column tiles, 128-byte row steps, forward and gradient.
    pytest.param(1, (12, 12, 12), (3, 3, 3), 256, 256, 0.12, dict(subm=True), id="3d-subm-c256"),
]
DTYPES = [tf.float32, tf.float64, tf.float16, tf.bfloat16]


def conv_and_gradients(device, coords, features, kernel, shape, batch, kwargs, upstream=None, transpose=False):
    """The features of site_conv (or site_conv_transpose) on `device`, and the gradients of
    sum(features * upstream) with respect to the input features and the kernel. features,
    kernel: tensors (of any dtype, on the CPU); upstream: a NumPy array."""
    if upstream is not None:
        upstream = on_cpu(upstream, features.dtype)
    with tf.device(device):
        x = make_site_sparse(coords, features, shape, batch)
        with tf.GradientTape() as tape:
            tape.watch([features, kernel])
            conv = site_conv_transpose if transpose else site_conv
            y = conv(x.with_features(features), kernel, **kwargs).features
        if upstream is None:
            return y, None, None
        df, dw = tape.gradient(y, [features, kernel], output_gradients=upstream)
    return y, df, dw


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("batch,shape,kernel,cin,cout,density,kwargs", CONV_CASES)
def test_conv_and_gradients_match_cpu(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs):
    coords = random_sites(rng, batch, shape, density)
    features = on_cpu(rng.standard_normal((len(coords), cin)), dtype)
    w = on_cpu(rng.standard_normal((*kernel, cin, cout)) / np.sqrt(np.prod(kernel) * cin), dtype)
    y_cpu, _, _ = conv_and_gradients(CPU, coords, features, w, shape, batch, kwargs)
    upstream = rng.standard_normal(y_cpu.shape)
    y_cpu, df_cpu, dw_cpu = conv_and_gradients(CPU, coords, features, w, shape, batch, kwargs, upstream)
    y_gpu, df_gpu, dw_gpu = conv_and_gradients(GPU, coords, features, w, shape, batch, kwargs, upstream)
    for t in (y_gpu, df_gpu, dw_gpu):
        assert "GPU" in t.device and t.dtype == dtype
    assert_close(y_gpu, y_cpu, dtype, "features")
    assert_close(df_gpu, df_cpu, dtype, "input gradient")
    assert_close(dw_gpu, dw_cpu, dtype, "kernel gradient")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
def test_transposed_and_inverse_conv_match_cpu(rng, dtype):
    coords = random_sites(rng, 2, (8, 7, 8), 0.3)
    features = on_cpu(rng.standard_normal((len(coords), 6)), dtype)
    w = on_cpu(rng.standard_normal((3, 3, 3, 6, 5)) / 9, dtype)
    kwargs = dict(strides=2, padding=1)
    y_cpu, _, _ = conv_and_gradients(CPU, coords, features, w, (8, 7, 8), 2, kwargs, transpose=True)
    upstream = rng.standard_normal(y_cpu.shape)
    cpu = conv_and_gradients(CPU, coords, features, w, (8, 7, 8), 2, kwargs, upstream, transpose=True)
    gpu = conv_and_gradients(GPU, coords, features, w, (8, 7, 8), 2, kwargs, upstream, transpose=True)
    for g, c, what in zip(gpu, cpu, ("features", "input gradient", "kernel gradient")):
        assert_close(g, c, dtype, what)
    with tf.device(CPU):
        w_back = tf.transpose(w, [0, 1, 2, 4, 3])
    results = {}
    for device in (CPU, GPU):
        with tf.device(device):
            x = make_site_sparse(coords, features, (8, 7, 8), 2)
            coarse = site_conv(x, w, strides=2, padding=1, indice_key="down")
            results[device] = site_inverse_conv(coarse, w_back, "down")
    np.testing.assert_array_equal(results[GPU].coords.numpy(), results[CPU].coords.numpy())
    assert_close(results[GPU].features, results[CPU].features, dtype, "inverse conv")


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda t: t.name)
def test_conv_with_no_pairs_or_no_outputs(dtype):
    features = tf.ones([4, 3], dtype)
    filters = tf.ones([2, 3, 5], dtype)
    for device in (CPU, GPU):
        with tf.device(device):
            y = ops.site_sparse_conv(features, filters, tf.zeros([0], tf.int32), tf.zeros([0], tf.int32),
                                     tf.constant([0, 0, 0]), tf.constant(6), NO_NEIGHBOURS)
            assert y.shape == (6, 5) and not np.any(y.numpy())
            y = ops.site_sparse_conv(tf.zeros([0, 3], dtype), filters, tf.zeros([0], tf.int32),
                                     tf.zeros([0], tf.int32), tf.constant([0, 0, 0]), tf.constant(0), NO_NEIGHBOURS)
            assert y.shape == (0, 5)
            dw = ops.site_sparse_conv_filter_grad(features, tf.ones([6, 5], dtype), tf.zeros([0], tf.int32),
                                                  tf.zeros([0], tf.int32), tf.constant([0, 0, 0]))
            assert dw.shape == (2, 3, 5) and not np.any(dw.numpy())


def test_empty_sites_give_empty_outputs_on_gpu():
    with tf.device(GPU):
        x = make_site_sparse(np.zeros((0, 4), np.int32), np.zeros((0, 3), np.float32), (4, 4, 4), 2)
        y = site_conv(x, np.ones((3, 3, 3, 3, 5), np.float32), strides=2, padding=1)
        assert y.features.shape == (0, 5) and y.coords.shape == (0, 4)
        assert site_conv(x, np.ones((3, 3, 3, 3, 5), np.float32), subm=True).features.shape == (0, 5)


@pytest.mark.soft_placement
def test_gradients_match_numerical_gradients_on_gpu_in_float64(rng):
    coords = random_sites(rng, 2, (5, 4, 5), 0.35)
    features = rng.standard_normal((len(coords), 2))
    kernel = rng.standard_normal((3, 3, 3, 2, 3))
    with tf.device(GPU):
        x = make_site_sparse(coords, features, (5, 4, 5), 2)
        for kwargs in (dict(subm=True), dict(strides=2, padding=1)):
            def f(features, kernel, kwargs=kwargs):
                y = site_conv(x.with_features(features), kernel, **kwargs).features
                assert "GPU" in y.device, f"expected a GPU result, got one on {y.device}"
                return y
            theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(features), tf.constant(kernel)])
            for t, n in zip(theoretical, numerical):
                assert np.any(t)
                np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


# --- determinism -------------------------------------------------------------------------------

def gpu_outputs(seed, dtype=tf.float32, dataflow="auto"):
    """Forward and gradients of a submanifold and a strided layer on the GPU, as numpy."""
    rng = np.random.default_rng(seed)
    coords = random_sites(rng, 2, (16, 16, 16), 0.2)
    features = on_cpu(rng.standard_normal((len(coords), 24)), dtype)
    kernel = on_cpu(rng.standard_normal((3, 3, 3, 24, 40)) / 10, dtype)
    outputs = []
    for kwargs in (dict(subm=True, dataflow=dataflow), dict(strides=2, padding=1, dataflow=dataflow)):
        y, _, _ = conv_and_gradients(GPU, coords, features, kernel, (16, 16, 16), 2, kwargs)
        upstream = np.linspace(-1, 1, int(np.prod(y.shape))).reshape(y.shape)
        outputs += [t.numpy() for t in conv_and_gradients(GPU, coords, features, kernel, (16, 16, 16), 2, kwargs,
                                                          upstream)]
    return outputs


def test_filter_gradient_is_bit_identical_across_runs():
    first, second = gpu_outputs(3), gpu_outputs(3)
    for i in (2, 5):  # the kernel gradients: fixed chunks, no atomics
        np.testing.assert_array_equal(first[i].view(np.uint8), second[i].view(np.uint8))


def test_gpu_results_are_bit_identical_under_op_determinism():
    # enable_op_determinism cannot be turned off again: a process of its own.
    script = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from tests.site.test_gpu import gpu_outputs
        first, second = gpu_outputs(5), gpu_outputs(5)
        for a, b in zip(first, second):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        # half: the default dataflow under determinism is the output-stationary kernel's
        first, second = gpu_outputs(5, tf.float16), gpu_outputs(5, tf.float16)
        forced = gpu_outputs(5, tf.float16, "outputs")
        for a, b, c in zip(first, second, forced):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
            np.testing.assert_array_equal(a.view(np.uint8), c.view(np.uint8))
        print("bit-identical under op determinism")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bit-identical under op determinism" in result.stdout


# --- errors: the CPU's messages -----------------------------------------------------------------

BAD_SITES = [
    pytest.param([[0, 1, 1], [0, 2, 2], [0, 1, 1]], "sites 0 and 2 have the same coordinates", id="duplicate"),
    pytest.param([[0, 1, 1], [0, 3, 3], [0, 2, 2], [0, 3, 3], [0, 1, 1]], "sites 1 and 3 have the same",
                 id="duplicates-lowest-later-row"),
    pytest.param([[0, 1, 1], [0, 2, 1], [0, 1, 1], [0, 2, 1], [0, 1, 1]], "sites 0 and 2 have the same",
                 id="triplicate"),
    pytest.param([[0, 1, 1], [0, 4, 2]], "coordinate 4 in spatial dimension 0, outside", id="coordinate"),
    pytest.param([[0, 1, 1], [0, 1, -2], [0, 9, 1]], "coordinate -2 in spatial dimension 1, outside",
                 id="first-of-two-coordinates"),
    pytest.param([[-1, 1, 1]], "batch index -1, outside", id="negative-batch"),
    pytest.param([[0, 1, 1], [2, 1, 1]], "batch index 2, outside", id="batch"),
    pytest.param([[0, 1, 1], [0, 1, 1], [0, 7, 1]], "coordinate 7 in spatial dimension 0",
                 id="range-before-duplicates"),
]


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("mode", ["submanifold", "strided", "transposed"])
@pytest.mark.parametrize("coords,phrase", BAD_SITES)
def test_bad_sites_give_the_cpu_error_on_gpu(coords, phrase, mode, builder):
    geometry = geometry_for(mode, (3, 3), (2, 2), (1, 1), (1, 1))
    coords = np.array(coords, np.int32)
    assert_same_error(lambda: ops.site_kernel_map(
        tf.constant(coords), tf.constant([4, 4]), tf.constant(2), mode=mode, kernel_size=list(geometry[0]),
        strides=list(geometry[1]), padding=list(geometry[2]), dilation=list(geometry[3]), builder=builder), phrase)


def test_bad_geometry_gives_the_cpu_error_on_gpu(rng):
    coords = random_sites(rng, 1, (4, 4), 0.5)

    def map_of(k, mode):
        x = make_site_sparse(coords, np.ones((len(coords), 2), np.float32), (4, 4), 1)
        return kernel_map(x, k, mode=mode)
    assert_same_error(lambda: map_of(2, "submanifold"), "needs an odd kernel")
    assert_same_error(lambda: map_of(7, "strided"), "output spatial extent")


MAP_ERRORS = [
    (dict(in_rows=[0, 1, 4]), r"in_rows\[2\] = 4 is outside \[0, 4\)"),
    (dict(out_rows=[0, 2, 0]), r"out_rows\[1\] = 2 is outside \[0, 2\)"),
    (dict(out_rows=[1, 1, 0]), "output row 1 appears twice for kernel offset 0"),
    (dict(offset_splits=[0, 3, 2]), "offset_splits must rise"),
    (dict(offset_splits=[0, 3]), "one entry per kernel offset plus one"),
    # The CPU's order: pair by pair, a pair's ranges before its repeat, then later errors.
    (dict(in_rows=[0, 1, 4], out_rows=[1, 1, 0]), "output row 1 appears twice for kernel offset 0"),
    (dict(in_rows=[0, 5, 1], out_rows=[0, 0, 1]), r"in_rows\[1\] = 5 is outside"),
    (dict(in_rows=[-1, 1, 2], out_rows=[0, 9, 1]), r"in_rows\[0\] = -1 is outside"),
    (dict(out_rows=[0, 1, -3]), r"out_rows\[2\] = -3 is outside"),
    (dict(in_rows=[0, 1, 2, 3], out_rows=[0, 1, 1, 1], offset_splits=[0, 3, 4]),
     "output row 1 appears twice for kernel offset 0"),
    (dict(in_rows=[0, 1, 2, 3], out_rows=[0, 1, 1, 1], offset_splits=[0, 2, 4]),
     "output row 1 appears twice for kernel offset 1"),
]
THREE_OFFSET_MAP_ERRORS = [
    # (in_rows, out_rows, splits, phrase) with three offsets
    ([0, 9, 2, 3], [0, 1, 0, 1], [0, 2, 1, 4], r"in_rows\[1\] = 9 is outside"),
    ([0, 1, 2, 9], [0, 1, 0, 1], [0, 2, 1, 4], "offset_splits must rise .*offset 1 spans \\[2, 1\\)"),
    ([0, 1, 2, 3], [0, 1, 0, 1], [0, 2, 5, 4], "offset 1 spans \\[2, 5\\)"),
    ([0, 1, 2, 3], [0, 1, 0, 1], [1, 2, 3, 4], "offset 0 spans \\[1, 4\\)"),
]


def test_conv_ops_give_the_cpu_errors_on_gpu(rng):
    features = rng.standard_normal((4, 2)).astype(np.float32)
    ok = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_out=2)

    def conv(kwargs, features=features, filters=None):
        kwargs = dict(ok, **kwargs)
        filters = tf.ones([2, 2, 3]) if filters is None else filters
        return ops.site_sparse_conv(tf.convert_to_tensor(features), filters, kwargs["in_rows"], kwargs["out_rows"],
                                    kwargs["offset_splits"], kwargs["num_out"], NO_NEIGHBOURS)

    def filter_grad(kwargs):
        kwargs = dict(ok, **kwargs)
        return ops.site_sparse_conv_filter_grad(tf.constant(features), tf.ones([kwargs["num_out"], 3]),
                                                kwargs["in_rows"], kwargs["out_rows"], kwargs["offset_splits"])

    for kwargs, phrase in MAP_ERRORS:
        assert_same_error(lambda: conv(kwargs), phrase)
        if "one entry per kernel offset" not in phrase:
            assert_same_error(lambda: filter_grad(kwargs), phrase)
    for in_rows, out_rows, splits, phrase in THREE_OFFSET_MAP_ERRORS:
        kwargs = dict(in_rows=in_rows, out_rows=out_rows, offset_splits=splits)
        assert_same_error(lambda: conv(kwargs, filters=tf.ones([3, 2, 3])), phrase)
        assert_same_error(lambda: filter_grad(kwargs), phrase)
    assert_same_error(lambda: conv({}, filters=tf.ones([2, 3, 3])), "Cin")
    nan = features.copy()
    nan[1, 1] = np.nan
    assert_same_error(lambda: conv({}, features=nan), "features row 1 column 1 is NaN")
    for dtype in (tf.float16, tf.bfloat16, tf.float64):
        typed_nan, typed_filters = on_cpu(nan, dtype), on_cpu(np.ones([2, 2, 3]), dtype)
        assert_same_error(lambda: conv({}, features=typed_nan, filters=typed_filters),
                          "features row 1 column 1 is NaN")
    # A bad map is reported before NaN features, as on the CPU.
    assert_same_error(lambda: conv(dict(out_rows=[1, 1, 0]), features=nan), "appears twice")


def test_repeated_output_row_among_many_pairs_reports_the_first(rng):
    """The bitmask flags some repeat; the error path finds the CPU's first one."""
    n, volume = 5000, 27
    pairs_per_offset = 150
    in_rows = np.concatenate([rng.permutation(n)[:pairs_per_offset] for _ in range(volume)]).astype(np.int32)
    out_rows = np.concatenate([rng.permutation(n)[:pairs_per_offset] for _ in range(volume)]).astype(np.int32)
    for p in (3001, 1201, 2501):  # repeat the previous pair's output row within offset p // 150
        out_rows[p] = out_rows[p - 1]
    splits = np.arange(0, volume * pairs_per_offset + 1, pairs_per_offset).astype(np.int32)
    features = tf.ones([n, 2])
    assert_same_error(lambda: ops.site_sparse_conv(features, tf.ones([volume, 2, 2]), in_rows, out_rows, splits, n,
                                                   NO_NEIGHBOURS),
                      "appears twice for kernel offset 8")


# --- trusted maps (map_is_trusted) ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kwargs", [dict(subm=True), dict(strides=2, padding=1)], ids=["subm", "strided"])
def test_trusted_map_on_gpu_matches_untrusted_map_and_cpu(rng, dtype, kwargs):
    coords = random_sites(rng, 2, (10, 9, 10), 0.3)
    features = on_cpu(rng.standard_normal((len(coords), 24)), dtype)
    w = on_cpu(rng.standard_normal((3, 3, 3, 24, 40)) / np.sqrt(27 * 24), dtype)
    geometry = dict(mode="submanifold") if kwargs.get("subm") else dict(strides=2, padding=1)
    results = {}
    upstream = None
    for device, trust in ((CPU, True), (GPU, True), (GPU, False)):
        with tf.device(device):
            x = make_site_sparse(coords, features, (10, 9, 10), 2)
            m = kernel_map(x, 3, **geometry)
            assert m.trusted
            m = m if trust else hand_built(m)
            with tf.GradientTape() as tape:
                tape.watch([features, w])
                y = site_conv(x.with_map("k", m), w, indice_key="k", **kwargs).features
            if upstream is None:
                upstream = on_cpu(rng.standard_normal(y.shape), dtype)
            results[device, trust] = [y, *tape.gradient(y, [features, w], output_gradients=upstream)]
    for what, cpu, trusted, untrusted in zip(("features", "input gradient", "kernel gradient"), results[CPU, True],
                                             results[GPU, True], results[GPU, False]):
        assert "GPU" in trusted.device
        assert_close(trusted, untrusted, dtype, what)
        assert_close(trusted, cpu, dtype, what)


def test_hand_built_bad_map_is_rejected_on_gpu(rng):
    coords = random_sites(rng, 1, (6, 6), 0.5)
    features = rng.standard_normal((len(coords), 2)).astype(np.float32)
    kernel = np.ones((3, 3, 2, 4), np.float32)
    with tf.device(CPU):
        good = kernel_map(make_site_sparse(coords, features, (6, 6), 1), 3, mode="submanifold")
    out_rows, splits = good.out_rows.numpy(), good.offset_splits.numpy()
    q = int(np.argmax(np.diff(splits) >= 2))
    out_rows[splits[q] + 1] = out_rows[splits[q]]
    in_rows = good.in_rows.numpy()
    in_rows[0] = len(coords) + 3
    for bad, phrase in ((dict(out_rows=out_rows), "appears twice"), (dict(in_rows=in_rows), r"in_rows\[0\] = ")):
        def call(bad=bad):
            x = make_site_sparse(coords, features, (6, 6), 1)
            m = hand_built(good, **{k: tf.constant(v) for k, v in bad.items()})
            return site_conv(x.with_map("k", m), kernel, subm=True, indice_key="k")
        assert_same_error(call, phrase)


def test_trusted_calls_check_splits_on_the_host_and_skip_the_nan_scan_on_gpu(rng):
    features = rng.standard_normal((4, 2)).astype(np.float32)
    rising = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], num_out=2, neighbours=NO_NEIGHBOURS)
    # Splits are checked on the host whatever the attr says.
    assert_same_error(lambda: ops.site_sparse_conv(features, tf.ones([2, 2, 3]), offset_splits=[0, 3, 2],
                                                   map_is_trusted=True, **rising), "offset_splits must rise")
    assert_same_error(lambda: ops.site_sparse_conv_filter_grad(features, tf.ones([2, 3]), rising["in_rows"],
                                                               rising["out_rows"], [0, 3, 2], map_is_trusted=True),
                      "offset_splits must rise")
    # NaN features: the CPU still rejects them; a trusted GPU call skips the scan (no
    # round trip) and the NaN reaches the output rows it feeds.
    nan = features.copy()
    nan[1, 1] = np.nan
    with tf.device(CPU), pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):
        ops.site_sparse_conv(nan, tf.ones([2, 2, 3]), offset_splits=[0, 2, 3], map_is_trusted=True, **rising)
    with tf.device(GPU):
        y = ops.site_sparse_conv(nan, tf.ones([2, 2, 3]), offset_splits=[0, 2, 3], map_is_trusted=True, **rising)
    assert np.all(np.isnan(y.numpy()[1])) and not np.any(np.isnan(y.numpy()[0]))


# --- float32 through TF32 -------------------------------------------------------------------------

# (cin, cout): 32-, 64- and 128-column tiles; channel steps of 16 with tails of 8; a second
# column tile of 4 columns; the filter gradient's tiles of 64 x 64, 128 x 128, 64 x 128 and
# 128 x 64 channels (the last with tails of 4 both ways).
TF32_CASES = [(8, 8), (24, 40), (128, 72), (40, 132), (100, 36)]


@pytest.mark.parametrize("cin,cout", TF32_CASES, ids=lambda v: str(v))
def test_float32_conv_uses_tf32_where_tensorflow_allows_it(rng, cin, cout):
    coords = random_sites(rng, 1, (14, 14, 14), 0.15)
    features64 = rng.standard_normal((len(coords), cin))
    kernel64 = rng.standard_normal((3, 3, 3, cin, cout)) / np.sqrt(27 * cin)
    upstream = None
    results = {}
    for name, device, dtype, tf32 in (("reference", CPU, tf.float64, False), ("strict", GPU, tf.float32, False),
                                      ("tf32", GPU, tf.float32, True)):
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
        features, kernel = on_cpu(features64, dtype), on_cpu(kernel64, dtype)
        if upstream is None:
            y, _, _ = conv_and_gradients(device, coords, features, kernel, (14, 14, 14), 1, dict(subm=True))
            upstream = rng.standard_normal(y.shape)
        results[name] = conv_and_gradients(device, coords, features, kernel, (14, 14, 14), 1, dict(subm=True),
                                           upstream)
    for i, what in enumerate(("features", "input gradient", "kernel gradient")):
        reference = results["reference"][i].numpy()
        strict, tf32 = results["strict"][i].numpy(), results["tf32"][i].numpy()
        scale = np.max(np.abs(reference))
        np.testing.assert_allclose(strict, reference, rtol=1e-5, atol=1e-5 * scale, err_msg=what)
        # TF32 keeps 10 of float32's 23 mantissa bits in each factor (relative rounding
        # 2^-11): products within about 2^-10, sums of them well within 5e-3 of the scale.
        np.testing.assert_allclose(tf32, reference, rtol=5e-3, atol=5e-3 * scale, err_msg=what)
        # Both kernels (the forward one computes the input gradient too) ran on TF32: the
        # results differ from the float32 products'.
        assert np.max(np.abs(tf32 - strict)) > 1e-6 * scale, what


# --- the output-stationary dataflow (dataflow="outputs") ------------------------------------------

def cpu_and_two_gpu_runs(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs, gpu_kwargs=None):
    """(cpu, first, second): conv_and_gradients on the CPU (kwargs) and twice on the GPU
    (kwargs and gpu_kwargs, e.g. a dataflow the CPU does not have), on random sites,
    features, kernel and upstream gradient; float runs with TF32 on."""
    tf.config.experimental.enable_tensor_float_32_execution(dtype == tf.float32)
    coords = random_sites(rng, batch, shape, density)
    features = on_cpu(rng.standard_normal((len(coords), cin)), dtype)
    w = on_cpu(rng.standard_normal((*kernel, cin, cout)) / np.sqrt(np.prod(kernel) * cin), dtype)
    y_cpu, _, _ = conv_and_gradients(CPU, coords, features, w, shape, batch, kwargs)
    upstream = rng.standard_normal(y_cpu.shape)
    on_gpu = dict(kwargs, **(gpu_kwargs or {}))
    return tuple(conv_and_gradients(device, coords, features, w, shape, batch, args, upstream)
                 for device, args in ((CPU, kwargs), (GPU, on_gpu), (GPU, on_gpu)))


def assert_gpu_matches_cpu(dtype, cpu, gpu):
    """Features and both gradients within the dtype's tolerance (TF32's for float)."""
    for what, c, g in zip(("features", "input gradient", "kernel gradient"), cpu, gpu):
        if dtype == tf.float32:
            scale = np.max(np.abs(c.numpy())) if c.shape.num_elements() else 0.0
            np.testing.assert_allclose(g.numpy(), c.numpy(), rtol=5e-3, atol=5e-3 * scale, err_msg=what)
        else:
            assert_close(g, c, dtype, what)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32], ids=lambda t: t.name)
@pytest.mark.parametrize("batch,shape,kernel,cin,cout,density,kwargs", CONV_CASES)
def test_output_stationary_dataflow_matches_cpu_and_repeats_bit_for_bit(rng, dtype, batch, shape, kernel, cin, cout,
                                                                         density, kwargs):
    cpu, first, second = cpu_and_two_gpu_runs(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs,
                                              dict(dataflow="outputs"))
    assert_gpu_matches_cpu(dtype, cpu, first)
    # Where the output-stationary kernel runs (whole 16-byte rows, at most 32 offsets),
    # every output row is stored once: no atomics, so no timing in the sums (forward and
    # input gradient, which runs the forward's dataflow). Other shapes run the pair tiles
    # and their atomics.
    vec = 4 if dtype == tf.float32 else 8
    if cin % vec == 0 and cout % vec == 0 and np.prod(kernel) <= 32:
        for what, g, again in zip(("features", "input gradient"), first, second):
            np.testing.assert_array_equal(g.numpy().view(np.uint8), again.numpy().view(np.uint8), err_msg=what)


@pytest.mark.parametrize("dtype,dataflow", [(tf.float16, "pairs"), (tf.bfloat16, "pairs"), (tf.float32, "pairs"),
                                            (tf.float32, "auto")], ids=lambda v: getattr(v, "name", v))
def test_the_pairs_run_from_a_given_table_where_the_dataflow_says_so(rng, dtype, dataflow):
    """dataflow="pairs" runs the pair tiles whatever the call is given, and so does "auto"
    for float (it reads a table for half types only): with a table, the result matches the
    CPU's as without one."""
    tf.config.experimental.enable_tensor_float_32_execution(dtype == tf.float32)
    coords = random_sites(rng, 2, (9, 8, 9), 0.25)
    features = on_cpu(rng.standard_normal((len(coords), 16)), dtype)
    w = on_cpu(rng.standard_normal((27, 16, 24)) / 20, dtype)
    with tf.device(CPU):
        x = make_site_sparse(coords, features, (9, 8, 9), 2)
        kmap = kernel_map(x, 3, mode="submanifold")
    results = {}
    for name, device, table in (("cpu", CPU, NO_NEIGHBOURS), ("plain", GPU, NO_NEIGHBOURS), ("table", GPU, None)):
        with tf.device(device):
            if table is None:
                table = neighbour_table(kmap)
            results[name] = ops.site_sparse_conv(features, w, kmap.in_rows, kmap.out_rows, kmap.offset_splits,
                                                 len(coords), table, map_is_trusted=True,
                                                 dataflow="auto" if device == CPU else dataflow)
    for name in ("plain", "table"):
        assert_gpu_matches_cpu(dtype, [results["cpu"]], [results[name]])


# --- neighbour tables (SiteNeighbourTable) and the convolution that reads them ---------------------

TABLE_CASES = [
    # (batch, shape, kernel, strides, padding, mode)
    pytest.param(2, (9, 8, 9), (3, 3, 3), (1, 1, 1), (0, 0, 0), "submanifold", id="3d-subm"),
    pytest.param(2, (10, 9, 10), (2, 2, 2), (2, 2, 2), (0, 0, 0), "strided", id="3d-k2s2"),
    pytest.param(3, (11, 12), (3, 3), (2, 2), (1, 1), "strided", id="2d-strided"),
    pytest.param(1, (40, 40, 40), (3, 3, 3), (1, 1, 1), (0, 0, 0), "submanifold", id="3d-subm-many-sites"),
]


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("batch,shape,kernel,strides,padding,mode", TABLE_CASES)
def test_neighbour_table_matches_cpu_exactly(rng, batch, shape, kernel, strides, padding, mode, inverse):
    coords = random_sites(rng, batch, shape, 0.05 if max(shape) > 20 else 0.3)
    with tf.device(CPU):
        x = make_site_sparse(coords, np.ones((len(coords), 1), np.float32), shape, batch)
        kmap = kernel_map(x, kernel, strides, padding, mode=mode)
    tables = {}
    for device in (CPU, GPU):
        with tf.device(device):
            tables[device] = neighbour_table(kmap, inverse=inverse).numpy()
    np.testing.assert_array_equal(tables[GPU], tables[CPU])
    assert tables[CPU].shape[1] == np.prod(kernel) + 2


@pytest.mark.parametrize("dataflow", ["auto", "outputs"])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=lambda t: t.name)
@pytest.mark.parametrize("batch,shape,kernel,cin,cout,density,kwargs", CONV_CASES)
def test_conv_from_a_given_table_matches_cpu(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs,
                                            dataflow):
    """The op given a table: the forward and (submanifold) the input gradient from the same
    table match the CPU's pairs, and repeat bit for bit; both dataflows read the table at
    every width, 256 channels included."""
    volume = int(np.prod(kernel))
    if volume > 32:
        pytest.skip("neighbour tables hold kernels of at most 32 offsets")
    subm = bool(kwargs.get("subm"))
    coords = random_sites(rng, batch, shape, density)
    features = on_cpu(rng.standard_normal((len(coords), cin)), dtype)
    w = on_cpu(rng.standard_normal((volume, cin, cout)) / np.sqrt(volume * cin), dtype)
    with tf.device(CPU):
        x = make_site_sparse(coords, features, shape, batch)
        kmap = kernel_map(x, kernel, kwargs.get("strides", 1), kwargs.get("padding", 0),
                          mode="submanifold" if subm else "strided")
        num_out = tf.shape(kmap.out_coords)[0]
        upstream = on_cpu(rng.standard_normal((int(num_out), cout)), dtype)

    def run(device, table, dataflow):
        with tf.device(device):
            with tf.GradientTape() as tape:
                tape.watch(features)
                y = ops.site_sparse_conv(features, w, kmap.in_rows, kmap.out_rows, kmap.offset_splits, num_out,
                                         table, map_is_trusted=True, map_is_submanifold=subm, dataflow=dataflow)
            return y, tape.gradient(y, features, output_gradients=upstream)
    with tf.device(GPU):
        table = neighbour_table(kmap)
    assert table.shape[1] == volume + 2
    cpu = run(CPU, NO_NEIGHBOURS, "auto")
    first, second = run(GPU, table, dataflow), run(GPU, table, dataflow)
    for what, c, g, again in zip(("features", "input gradient"), cpu, first, second):
        assert_close(g, c, dtype, what)
        if cin % 8 == 0 and cout % 8 == 0 and (what == "features" or subm):
            np.testing.assert_array_equal(g.numpy().view(np.uint8), again.numpy().view(np.uint8), err_msg=what)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32], ids=lambda t: t.name)
@pytest.mark.parametrize("batch,shape,kernel,cin,cout,density,kwargs", CONV_CASES)
def test_conv_from_neighbour_tables_matches_cpu_and_repeats_bit_for_bit(rng, dtype, batch, shape, kernel, cin, cout,
                                                                        density, kwargs):
    """Layers under an indice_key build the map's table once and run from it: half and
    bfloat16 under 'auto', float under 'outputs' (its TF32 table tiles)."""
    if np.prod(kernel) > 32:
        pytest.skip("neighbour tables hold kernels of at most 32 offsets")
    on_gpu = dict(dataflow="outputs" if dtype == tf.float32 else "auto")
    cpu, first, second = cpu_and_two_gpu_runs(rng, dtype, batch, shape, kernel, cin, cout, density,
                                              dict(kwargs, indice_key="k"), on_gpu)
    assert_gpu_matches_cpu(dtype, cpu, first)
    # Output-stationary from the table where its tiles apply (at any width): each output
    # row is stored once, so the forward repeats bit for bit.
    vec = 4 if dtype == tf.float32 else 8
    if cin % vec == 0 and cout % vec == 0:
        np.testing.assert_array_equal(first[0].numpy().view(np.uint8), second[0].numpy().view(np.uint8))
    # A submanifold layer's input gradient runs output-stationary from the same table
    # (mirrored offsets, map_is_submanifold): it repeats too.
    if kwargs.get("subm") and cin % vec == 0 and cout % vec == 0:
        np.testing.assert_array_equal(first[1].numpy().view(np.uint8), second[1].numpy().view(np.uint8))


@pytest.mark.parametrize("dataflow", ["auto", "pairs", "outputs"])
def test_layers_build_neighbour_tables_where_the_dataflow_reads_them(rng, dataflow):
    coords = random_sites(rng, 2, (9, 9, 9), 0.25)
    with tf.device(GPU):
        for dtype in (tf.float16, tf.bfloat16, tf.float32):
            built = dataflow == "outputs" or (dataflow == "auto" and dtype != tf.float32)
            x = make_site_sparse(coords, on_cpu(rng.standard_normal((len(coords), 8)), dtype), (9, 9, 9), 2)
            w = on_cpu(rng.standard_normal((3, 3, 3, 8, 8)), dtype)
            y = site_conv(x, w, subm=True, indice_key="s", dataflow=dataflow)
            assert (y.kernel_maps["s"].neighbours is not None) == built, dtype
            down = site_conv(y, on_cpu(rng.standard_normal((2, 2, 2, 8, 16)), dtype), strides=2, indice_key="d",
                             dataflow=dataflow)
            up = site_inverse_conv(down, on_cpu(rng.standard_normal((2, 2, 2, 16, 8)), dtype), "d",
                                   dataflow=dataflow)
            assert (up.kernel_maps["d"].inverse_neighbours is not None) == built, dtype
            # A map without indice_key is used once: no table.
            assert not site_conv(x, w, subm=True).kernel_maps


def test_neighbour_table_ops_give_the_cpu_errors_on_gpu(rng):
    ok = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_in=4, num_out=2)

    def table(**kwargs):
        return ops.site_neighbour_table(**dict(ok, **kwargs))
    assert_same_error(lambda: table(in_rows=[0, 1, 4]), "in_rows\\[2\\] = 4 is outside \\[0, 4\\)")
    assert_same_error(lambda: table(out_rows=[0, 2, 0]), "out_rows\\[1\\] = 2 is outside \\[0, 2\\)")
    assert_same_error(lambda: table(out_rows=[1, 1, 0]), "output row 1 appears twice for kernel offset 0")
    assert_same_error(lambda: table(offset_splits=[0, 3, 2]), "offset_splits must rise")
    assert_same_error(lambda: table(offset_splits=[0, 1, 2] + [3] * 31), "1 to 32 offsets")
    features = tf.constant(rng.standard_normal((4, 2)), tf.float32)
    conv = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_out=2)
    for width in (3, 5, 6):  # volume 2: the table has 2 + 2 columns
        assert_same_error(lambda: ops.site_sparse_conv(features, tf.ones([2, 2, 3]), **conv,
                                                       neighbours=tf.zeros([2, width], tf.int32),
                                                       map_is_trusted=True),
                          "neighbours must be SiteNeighbourTable's")
    with tf.device(CPU):
        good = table()
    assert_same_error(lambda: ops.site_sparse_conv(features, tf.ones([2, 2, 3]), **conv, neighbours=good),
                      "accepted with map_is_trusted only")
