"""Site-sparse convolution against dense references on each device: tf.nn.convolution (1-3
spatial dims), a NumPy shift-and-multiply convolution (4-D), dense gradients for the inverse
convolution, tf.nn.conv_transpose for the transposed one; float64 gradient checks; the
CPU's own products, checks and dataflows; and the GPU against the CPU: the convolution and
its gradients in every dtype within stated tolerances, TF32, the output-stationary dataflow
and neighbour tables, bit-identical reruns under op determinism, the CPU's error messages
for every bad input and trusted maps."""
import itertools
import resource

import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops
from tf_sparseconv.site import (kernel_map, neighbour_table, site_conv, site_conv_transpose, site_inverse_conv,
                               site_pool)
from tf_sparseconv.site.tensor import make_site_sparse

from tests.device import CPU, GPU, assert_on, assert_same_error, run_in_own_process
from tests.site.helpers import hand_built, random_coords, random_sites, rows_at, to_grid

CONV, FILTER_GRAD = OP_NAMESPACE + "SiteSparseConv", OP_NAMESPACE + "SiteSparseConvFilterGrad"  # graphs' op types


def numpy_conv(grid, kernel, strides, padding, dilation):
    """Dense convolution of any dimension: out[o] = sum_q x[o * s - p + q * dl] @ W[q]."""
    d = grid.ndim - 2
    pad = [(0, 0)] + [(p, p) for p in padding] + [(0, 0)]
    xp = np.pad(grid, pad)
    out_shape = [(xp.shape[1 + j] - dilation[j] * (kernel.shape[j] - 1) - 1) // strides[j] + 1 for j in range(d)]
    out = np.zeros((grid.shape[0], *out_shape, kernel.shape[-1]), np.float64)
    for q in itertools.product(*[range(k) for k in kernel.shape[:d]]):
        window = tuple(slice(q[j] * dilation[j], q[j] * dilation[j] + strides[j] * (out_shape[j] - 1) + 1,
                             strides[j]) for j in range(d))
        out += xp[(slice(None), *window)].astype(np.float64) @ kernel[q].astype(np.float64)
    return out


def reached_sites(coords, batch, shape, kernel_size, strides, padding, dilation):
    """Output sites of a strided convolution: where the dense conv of the occupancy with
    a kernel of ones is non-zero."""
    occupancy = to_grid(coords, np.ones((len(coords), 1), np.float64), batch, shape)
    ones = np.ones((*kernel_size, 1, 1))
    return np.argwhere(numpy_conv(occupancy, ones, strides, padding, dilation)[..., 0] > 0).astype(np.int32)


def tf_dense_conv(grid, kernel, strides, padding, dilation):
    """tf.nn.convolution on the CPU (the reference, whichever device the test is about)."""
    pad = [[0, 0]] + [[p, p] for p in padding] + [[0, 0]]
    with tf.device(CPU):
        return tf.nn.convolution(tf.pad(grid, pad), kernel, strides=strides, padding="VALID",
                                 dilations=dilation).numpy()


# float32 on the GPU: TensorFlow's default lets the products run in TF32 (10 of float32's 23
# mantissa bits in each factor), within 5e-3 of the largest magnitude, as the GPU tests below allow.
TF32_TOLERANCE = 5e-3


def assert_close_on(device, actual, expected, rtol, atol):
    """assert_allclose within rtol and atol; a float32 result of the GPU with TF32 on, within
    TF32_TOLERANCE of the largest magnitude."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if device == GPU and actual.dtype == np.float32 and tf.config.experimental.tensor_float_32_execution_enabled():
        scale = np.max(np.abs(expected)) if expected.size else 0.0
        rtol, atol = max(rtol, TF32_TOLERANCE), max(atol, TF32_TOLERANCE * scale)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def random_conv_on(device, rng, batch, shape, density, cin, cout, kernel_size, **kwargs):
    """Random sites with cin channels and a float32 kernel to cout, and their site_conv(**kwargs)
    on `device`: (coords, features, kernel, output)."""
    coords, features = random_sites(rng, batch, shape, density, cin)
    kernel = rng.standard_normal((*kernel_size, cin, cout)).astype(np.float32)
    with tf.device(device):
        y = site_conv(make_site_sparse(coords, features, shape, batch), kernel, **kwargs)
    return coords, features, kernel, y


@pytest.mark.parametrize("shape,kernel_size,dilation", [
    ((11,), (3,), (1,)), ((9, 10), (3, 3), (1,2)), ((7, 8, 6), (3, 3, 3), (1, 1, 1)),
    ((8, 7, 9), (5, 3, 1), (1, 1, 1)), ((5, 4, 5, 4), (3, 3, 3, 3), (1, 1, 1, 1))])
def test_submanifold_conv_matches_dense_convolution_at_the_input_sites(rng, shape, kernel_size, dilation, device):
    batch = 2
    coords, features, kernel, y = random_conv_on(device, rng, batch, shape, 0.3, 3, 4, kernel_size, subm=True,
                                                 dilation=dilation)
    np.testing.assert_array_equal(y.coords.numpy(), coords)
    same = [dl * (k - 1) // 2 for k, dl in zip(kernel_size, dilation)]
    grid = to_grid(coords, features, batch, shape)
    dense = numpy_conv(grid, kernel, [1] * len(shape), same, dilation) if len(shape) == 4 else \
        tf_dense_conv(grid, kernel, [1] * len(shape), same, dilation)
    assert_close_on(device, y.features.numpy(), rows_at(dense, coords), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,kernel_size,strides,padding", [
    ((12,), (3,), (2,), (1,)), ((9, 10), (2, 2), (2, 2), (0, 0)), ((9, 8, 7), (3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ((8, 8, 8), (2, 3, 2), (2, 1, 2), (0, 1, 0)), ((6, 5, 6, 5), (3, 3, 3, 3), (2, 2, 2, 2), (1, 0, 1, 0))])
def test_strided_conv_matches_dense_convolution_on_every_reached_site(rng, shape, kernel_size, strides, padding,
                                                                      device):
    batch = 2
    coords, features, kernel, y = random_conv_on(device, rng, batch, shape, 0.25, 3, 5, kernel_size, strides=strides,
                                                 padding=padding)
    dilation = [1] * len(shape)
    expected_sites = reached_sites(coords, batch, shape, kernel_size, strides, padding, dilation)
    np.testing.assert_array_equal(y.coords.numpy(), expected_sites)  # sorted by batch, then coordinates
    grid = to_grid(coords, features, batch, shape)
    dense = numpy_conv(grid, kernel, strides, padding, dilation) if len(shape) == 4 else \
        tf_dense_conv(grid, kernel, strides, padding, dilation)
    np.testing.assert_array_equal(y.spatial_shape.numpy(), dense.shape[1:-1])
    assert y.static_spatial_shape.as_list() == list(dense.shape[1:-1])
    assert_close_on(device, y.features.numpy(), rows_at(dense, expected_sites), rtol=1e-4, atol=1e-4)


def test_numpy_reference_agrees_with_tf_convolution(rng):
    grid = rng.standard_normal((2, 7, 6, 5, 3))
    kernel = rng.standard_normal((3, 2, 3, 3, 4))
    np.testing.assert_allclose(numpy_conv(grid, kernel, (2, 1, 2), (1, 0, 1), (1, 1, 1)),
                               tf_dense_conv(grid, kernel, (2, 1, 2), (1, 0, 1), (1, 1, 1)), rtol=1e-10)


def test_transposed_conv_matches_tf_conv_transpose(rng, device):
    batch, shape, cin, cout, k, s = 2, (5, 4, 6), 3, 2, (3, 2, 3), (2, 2, 2)
    coords, features = random_sites(rng, batch, shape, 0.3, cin)
    kernel = rng.standard_normal((*k, cin, cout)).astype(np.float32)
    with tf.device(device):
        y = site_conv_transpose(make_site_sparse(coords, features, shape, batch), kernel, strides=s)
    out_shape = [(r - 1) * st + kk for r, st, kk in zip(shape, s, k)]
    with tf.device(CPU):
        dense = tf.nn.conv_transpose(to_grid(coords, features, batch, shape), np.swapaxes(kernel, -1, -2),
                                     [batch, *out_shape, cout], strides=s, padding="VALID").numpy()
        occupancy = tf.nn.conv_transpose(to_grid(coords, np.ones((len(coords), 1), np.float32), batch, shape),
                                         np.ones((*k, 1, 1), np.float32), [batch, *out_shape, 1], strides=s,
                                         padding="VALID").numpy()
    np.testing.assert_array_equal(y.spatial_shape.numpy(), out_shape)
    expected_sites = np.argwhere(occupancy[..., 0] > 0).astype(np.int32)
    np.testing.assert_array_equal(y.coords.numpy(), expected_sites)
    assert_close_on(device, y.features.numpy(), rows_at(dense, expected_sites), rtol=1e-4, atol=1e-4)


def test_inverse_conv_is_the_input_gradient_of_the_strided_conv(rng, device):
    """SparseInverseConv with kernel W^T = d(strided conv with W)/d(input) applied to the
    coarse features, computed densely by TensorFlow."""
    batch, shape, cfine, ccoarse = 2, (8, 7, 8), 3, 4
    coords, features = random_sites(rng, batch, shape, 0.3, cfine)
    kernel = rng.standard_normal((3, 3, 3, cfine, ccoarse)).astype(np.float32)
    with tf.device(device):
        x = make_site_sparse(coords, features, shape, batch)
        coarse = site_conv(x, kernel, strides=2, padding=1, indice_key="down1")
        upstream = rng.standard_normal(coarse.features.shape).astype(np.float32)
        back = site_inverse_conv(coarse.with_features(tf.constant(upstream)), np.swapaxes(kernel, -1, -2), "down1")
    np.testing.assert_array_equal(back.coords.numpy(), coords)
    np.testing.assert_array_equal(back.spatial_shape.numpy(), shape)
    with tf.device(CPU):
        grid = tf.constant(to_grid(coords, features, batch, shape))
        with tf.GradientTape() as tape:
            tape.watch(grid)
            dense = tf.nn.conv3d(tf.pad(grid, [[0, 0], [1, 1], [1, 1], [1, 1], [0, 0]]), kernel,
                                 strides=[1, 2, 2, 2, 1], padding="VALID", data_format="NDHWC")
        grad = tape.gradient(dense, grid, output_gradients=tf.scatter_nd(coarse.coords, upstream, dense.shape))
    assert_close_on(device, back.features.numpy(), rows_at(grad.numpy(), coords), rtol=1e-4, atol=1e-4)


def test_kernel_map_is_reused_under_its_indice_key_and_geometry_is_checked(rng, device):
    coords, features = random_sites(rng, 1, (6, 6, 6), 0.3, 2)
    kernel = rng.standard_normal((3, 3, 3, 2, 2)).astype(np.float32)
    with tf.device(device):
        x = make_site_sparse(coords, features, (6, 6, 6), 1)
        y = site_conv(x, kernel, subm=True, indice_key="subm1")
        z = site_conv(y, kernel, subm=True, indice_key="subm1")
        assert z.kernel_maps["subm1"].in_rows is y.kernel_maps["subm1"].in_rows
        with pytest.raises(ValueError, match="indice_key 'subm1' was built for"):
            site_conv(y, kernel, strides=2, indice_key="subm1")
        # A map of other sites under the key: the site counts differ.
        other = make_site_sparse(coords[:-3], features[:-3], (6, 6, 6), 1).with_map("subm1", y.kernel_maps["subm1"])
        with pytest.raises(tf.errors.InvalidArgumentError, match="belongs to other sites"):
            site_conv(other, kernel, subm=True, indice_key="subm1")


@pytest.mark.parametrize("shape", [(9,), (6, 7), (5, 6, 4)])
def test_pointwise_submanifold_conv_is_a_matrix_product_without_a_map(rng, shape, device, monkeypatch):
    """A 1 x ... x 1 submanifold kernel builds no map (so no pair count is read back) and
    gives each site's row times the kernel, plus the bias; the gradients are numerical's."""
    batch, cin, cout = 2, 3, 4
    d = len(shape)
    coords, features = random_sites(rng, batch, shape, 0.4, cin, np.float64)
    kernel = rng.standard_normal((*([1] * d), cin, cout))
    bias = rng.standard_normal(cout)
    built = []
    real = ops.site_kernel_map
    monkeypatch.setattr(ops, "site_kernel_map", lambda *a, **k: built.append(k) or real(*a, **k))
    with tf.device(device):
        # A model's tensor: its sites were checked by a submanifold 3^d map carried along.
        x = site_conv(make_site_sparse(coords, features, shape, batch), np.zeros((*([3] * d), cin, cin)), subm=True,
                      indice_key="subm")
        built.clear()
        x = x.with_features(tf.constant(features))
        y = site_conv(x, kernel, bias, subm=True, indice_key="pointwise")
        assert not built and "pointwise" not in y.kernel_maps and "subm" in y.kernel_maps
        assert y.coords is x.coords
        np.testing.assert_allclose(y.features.numpy(), features @ kernel.reshape(cin, cout) + bias, rtol=1e-12)

        def f(features, kernel):
            return site_conv(x.with_features(features), kernel, subm=True).features

        theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(features), tf.constant(kernel)])
    for t, n in zip(theoretical, numerical):
        assert np.any(t)
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


def test_pointwise_submanifold_conv_still_checks_unchecked_sites(rng, device):
    """Without a trusted map of its sites, the pointwise path checks them as a map build
    would: a site outside the grid or a repeated site is InvalidArgumentError."""
    kernel = np.ones((1, 1, 1, 2, 3), np.float32)
    for coords, message in (([[0, 1, 1, 1], [0, 4, 1, 1]], "out of range|outside"),
                            ([[0, 1, 1, 1], [0, 1, 1, 1]], "twice|duplicate|repeat")):
        with tf.device(device), pytest.raises(tf.errors.InvalidArgumentError, match=message):
            site_conv(make_site_sparse(coords, np.ones((2, 2), np.float32), (4, 4, 4), 1), kernel, subm=True)


def test_pointwise_submanifold_conv_refuses_nan_features_of_unchecked_sites(device):
    """As SiteSparseConv does on the map path on the CPU: a NaN among the features of sites
    not yet checked is InvalidArgumentError naming the features (the 3 x 3 x 3 kernel for
    comparison), eager and traced; finite features pass. On the GPU the 3 x 3 x 3 kernel's map
    is SiteKernelMap's own (trusted), so the op skips its NaN scan and the NaN the caller let
    in (non_finite="allow") reaches the output of its own site only (site_conv_op.cc)."""
    coords = [[0, 1, 2, 0], [0, 3, 0, 2], [1, 1, 2, 0]]
    features = np.ones((3, 2), np.float32)
    features[1, 0] = np.nan

    def conv(f, k):
        x = make_site_sparse(coords, f, (4, 3, 3), 2, non_finite="allow")
        return site_conv(x, tf.ones((k, k, k, 2, 1)), subm=True).features

    for k in (1, 3):
        for run in (conv, tf.function(conv)):
            if k == 3 and "GPU" in device:
                with tf.device(device):
                    out = run(tf.constant(features), k).numpy()
                np.testing.assert_array_equal(out, [[2.0], [np.nan], [2.0]])
                continue
            with tf.device(device), pytest.raises(tf.errors.InvalidArgumentError, match="features"):
                run(tf.constant(features), k)
    with tf.device(device):
        np.testing.assert_array_equal(conv(tf.ones((3, 2)), 1).numpy(), np.full((3, 1), 2.0))


def test_pointwise_submanifold_conv_with_a_named_dataflow_takes_the_map_path(rng, monkeypatch):
    """dataflow 'pairs' or 'outputs' names the convolution op's dataflow: a 1 x 1 x 1 kernel
    then runs the op over a map as any other (and the CPU refuses 'outputs' as for any kernel)."""
    coords, features = random_sites(rng, 1, (5, 5, 5), 0.4, 2)
    kernel = rng.standard_normal((1, 1, 1, 2, 3)).astype(np.float32)
    built = []
    real = ops.site_kernel_map
    monkeypatch.setattr(ops, "site_kernel_map", lambda *a, **k: built.append(k) or real(*a, **k))
    with tf.device(CPU):
        x = make_site_sparse(coords, features, (5, 5, 5), 1)
        y = site_conv(x, kernel, subm=True, dataflow="pairs")
        assert len(built) == 1
        np.testing.assert_allclose(y.features.numpy(), features @ kernel.reshape(2, 3), rtol=1e-5, atol=1e-5)
        with pytest.raises(tf.errors.InvalidArgumentError, match="outputs"):
            site_conv(x, kernel, subm=True, dataflow="outputs").features.numpy()


def test_pointwise_submanifold_conv_uses_a_map_cached_under_its_key(rng, device):
    """A map already under the key is used (and its geometry checked), as for any kernel."""
    coords, features = random_sites(rng, 1, (5, 5, 5), 0.4, 2)
    kernel = rng.standard_normal((1, 1, 1, 2, 3)).astype(np.float32)
    with tf.device(device):
        x = make_site_sparse(coords, features, (5, 5, 5), 1)
        x = x.with_map("k", kernel_map(x, 1, mode="submanifold"))
        y = site_conv(x, kernel, subm=True, indice_key="k")
        assert y.kernel_maps["k"] is not None
        np.testing.assert_allclose(y.features.numpy(), features @ kernel.reshape(2, 3), rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="indice_key 'k' was built for"):
            site_conv(x, np.ones((3, 3, 3, 2, 3), np.float32), subm=True, indice_key="k")


@pytest.mark.soft_placement
@pytest.mark.parametrize("subm", [True, False])
def test_gradients_match_numerical_gradients_in_float64(rng, subm, device):
    batch, shape, cin, cout = 2, (5, 4, 5), 2, 3
    coords, features = random_sites(rng, batch, shape, 0.35, cin, np.float64)
    kernel = rng.standard_normal((3, 3, 3, cin, cout))
    kwargs = dict(subm=True) if subm else dict(strides=2, padding=1)

    def f(features, kernel):
        y = site_conv(x.with_features(features), kernel, **kwargs).features
        assert_on(device, y)
        return y

    with tf.device(device):
        x = make_site_sparse(coords, features, shape, batch)
        theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(features), tf.constant(kernel)])
    for t, n in zip(theoretical, numerical):
        assert np.any(t)
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.soft_placement
@pytest.mark.parametrize("shape,kernel_size,dilation", [
    ((9, 8), (3, 5), (2, 1)), ((5, 6, 5), (3, 1, 5), (1, 1, 1)), ((4, 3, 4, 3), (3, 3, 1, 3), (1, 1, 1, 2))])
def test_submanifold_input_gradient_runs_the_forward_pairs_mirrored(rng, shape, kernel_size, dilation, device):
    """The gradient of a submanifold op (map_is_submanifold) convolves over the forward's
    own pairs with the transposed filters in mirrored offset order; it must equal the
    gradient over the reversed pairs, and the numerical gradient, for kernels of unequal
    sides and dilations (where a wrong mirror would pair the wrong offsets)."""
    cin, cout = 3, 2
    coords, features = random_sites(rng, 2, shape, 0.4, cin, np.float64)
    with tf.device(device):
        x = make_site_sparse(coords, features, shape, 2)
        kmap = kernel_map(x, kernel_size, dilation=dilation, mode="submanifold")
        table = tf.zeros([0], tf.int32)
    volume = int(np.prod(kernel_size))
    filters = rng.standard_normal((volume, cin, cout))
    n = len(coords)

    def conv(mirrored):
        def f(features, filters):
            y = ops.site_sparse_conv(features, filters, kmap.in_rows, kmap.out_rows, kmap.offset_splits, n, table,
                                     map_is_trusted=True, map_is_submanifold=mirrored)
            assert_on(device, y)
            return y
        return f

    with tf.device(device):
        mirrored = tf.test.compute_gradient(conv(True), [tf.constant(features), tf.constant(filters)])
        reversed_pairs = tf.test.compute_gradient(conv(False), [tf.constant(features), tf.constant(filters)])
    for got, want in zip(mirrored[0], reversed_pairs[0]):  # theoretical
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for t, numerical in zip(mirrored[0], mirrored[1]):
        np.testing.assert_allclose(t, numerical, rtol=1e-6, atol=1e-6)
    # The second derivative (the gradient's own gradient is mirrored again) against the
    # first derivative's numerical gradient.
    dy = rng.standard_normal((n, cout))

    def input_grad(features, filters):
        with tf.GradientTape() as tape:
            tape.watch(features)
            y = conv(True)(features, filters)
        return tape.gradient(y, features, output_gradients=tf.constant(dy))

    with tf.device(device):
        theoretical, numerical = tf.test.compute_gradient(input_grad, [tf.constant(features), tf.constant(filters)])
    np.testing.assert_allclose(theoretical[1], numerical[1], rtol=1e-6, atol=1e-6)


def test_map_is_submanifold_is_refused_without_map_is_trusted(rng):
    """The gradient relies on mirrored offsets, which the op does not check: a map whose
    offsets are not mirrored used to get a wrong input gradient."""
    features = tf.constant(rng.standard_normal((3, 2)), tf.float32)
    not_mirrored = dict(in_rows=[0, 1, 2], out_rows=[1, 2, 0], offset_splits=[0, 2, 3, 3], num_out=3,
                        neighbours=tf.zeros([0], tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="map_is_submanifold needs map_is_trusted"):
        ops.site_sparse_conv(features, tf.ones([3, 2, 2]), **not_mirrored, map_is_submanifold=True)
    # Without the claim the gradient runs over the reversed pairs: the adjoint of the forward.
    f = tf.constant(rng.standard_normal((3, 2)))
    w = tf.constant(rng.standard_normal((3, 2, 2)))
    theoretical, numerical = tf.test.compute_gradient(lambda f: ops.site_sparse_conv(f, w, **not_mirrored), [f])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-6)


def test_map_is_submanifold_is_refused_for_maps_that_cannot_be(rng):
    coords, features = random_sites(rng, 1, (6, 6), 0.5, 2)
    x = make_site_sparse(coords, features, (6, 6), 1)
    down = kernel_map(x, 3, 2, mode="strided")
    num_out = tf.shape(down.out_coords)[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="map_is_submanifold promises a submanifold map"):
        ops.site_sparse_conv(x.features, tf.ones([9, 2, 3]), down.in_rows, down.out_rows, down.offset_splits, num_out,
                             tf.zeros([0], tf.int32), map_is_trusted=True, map_is_submanifold=True)
    even = kernel_map(x, 2, 2, mode="strided")
    with pytest.raises(tf.errors.InvalidArgumentError, match="4 offsets"):
        ops.site_sparse_conv(x.features, tf.ones([4, 2, 3]), even.in_rows, even.out_rows, even.offset_splits,
                             len(coords), tf.zeros([0], tf.int32), map_is_trusted=True, map_is_submanifold=True)


@pytest.mark.soft_placement
def test_transposed_and_inverse_gradients_match_numerical_gradients(rng, device):
    coords, features = random_sites(rng, 1, (6, 5, 6), 0.35, 2, np.float64)
    with tf.device(device):
        x = make_site_sparse(coords, features, (6, 5, 6), 1)
        coarse = site_conv(x, rng.standard_normal((2, 2, 2, 2, 3)), strides=2, indice_key="d")
    kernel = rng.standard_normal((2, 2, 2, 3, 2))

    def inverse(features, kernel):
        y = site_inverse_conv(coarse.with_features(features), kernel, "d").features
        assert_on(device, y)
        return y

    def transposed(features, kernel):
        y = site_conv_transpose(x.with_features(features), kernel, strides=2, padding=1).features
        assert_on(device, y)
        return y

    for f, start in ((inverse, coarse.features), (transposed, features)):
        k = kernel if f is inverse else np.swapaxes(kernel, -1, -2)
        with tf.device(device):
            theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(start), tf.constant(k)])
        for t, n in zip(theoretical, numerical):
            np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype,tolerance", [(tf.float16, 2e-2), (tf.bfloat16, 6e-2)])
def test_half_precision_matches_float32_within_tolerance(rng, dtype, tolerance, device):
    coords, features = random_sites(rng, 2, (10, 10, 10), 0.2, 16)
    kernel = (rng.standard_normal((3, 3, 3, 16, 16)) / np.sqrt(27 * 16)).astype(np.float32)
    with tf.device(CPU):  # the float32 reference; the casts there (not every GPU Cast has every type)
        reference = site_conv(make_site_sparse(coords, features, (10, 10, 10), 2), kernel, subm=True).features.numpy()
        half_features, half_kernel = tf.cast(features, dtype), tf.cast(kernel, dtype)
    with tf.device(device):
        half = site_conv(make_site_sparse(coords, half_features, (10, 10, 10), 2), half_kernel, subm=True)
    assert half.features.dtype == dtype
    scale = np.abs(reference).max()
    np.testing.assert_allclose(half.features.numpy().astype(np.float32), reference, atol=tolerance * scale)


def test_results_do_not_depend_on_the_thread_count(rng, tmp_path):
    with tf.device(CPU):  # the CPU kernel's thread pool
        coords, features = random_sites(rng, 2, (12, 12, 12), 0.2, 8)
        kernel = rng.standard_normal((3, 3, 3, 8, 8)).astype(np.float32)
        x = make_site_sparse(coords, features, (12, 12, 12), 2)

        @tf.function
        def f(features):
            return site_conv(x.with_features(features), kernel, strides=2, padding=1).features

        first = f(features).numpy()
        for _ in range(3):
            np.testing.assert_array_equal(f(features).numpy(), first)
    # The pool's size is fixed before TensorFlow starts: processes of their own with 1 and 4 threads.
    np.savez(tmp_path / "case.npz", coords=coords, features=features, kernel=kernel)
    for threads in (1, 4):
        run_in_own_process(f"""
            import numpy as np, tensorflow as tf
            tf.config.threading.set_intra_op_parallelism_threads({threads})
            from tf_sparseconv.site import site_conv
            from tf_sparseconv.site.tensor import make_site_sparse
            case = np.load({str(tmp_path / "case.npz")!r})
            with tf.device("/CPU:0"):
                x = make_site_sparse(case["coords"], case["features"], (12, 12, 12), 2)
                y = site_conv(x, case["kernel"], strides=2, padding=1).features
            np.save({str(tmp_path / f"threads{threads}.npy")!r}, y.numpy())
        """)
        np.testing.assert_array_equal(np.load(tmp_path / f"threads{threads}.npy"), first, err_msg=f"{threads} threads")


def conv_and_gradients_with(cpu_products, coords, features, kernel, upstream):
    """SiteSparseConv of a submanifold map and both gradients, with the given cpu_products."""
    x = make_site_sparse(coords, features, (9, 9, 9), 2)
    kmap = kernel_map(x, 3, mode="submanifold")
    filters = tf.reshape(kernel, [27, kernel.shape[-2], kernel.shape[-1]])
    with tf.GradientTape() as tape:
        tape.watch([features, filters])
        y = ops.site_sparse_conv(features, filters, kmap.in_rows, kmap.out_rows, kmap.offset_splits,
                                 len(coords), tf.zeros([0], tf.int32), map_is_trusted=True, map_is_submanifold=True,
                                 cpu_products=cpu_products)
    return [t.numpy().astype(np.float64) for t in [y, *tape.gradient(y, [features, filters], output_gradients=upstream)]]


def cpu_has(feature):
    """Whether this machine's CPU lists the flag (Linux /proc/cpuinfo; False elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(feature in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


@pytest.mark.parametrize("products", ["auto", "avx2"])
def test_tiled_products_match_the_portable_path(rng, products):
    """cpu_products='auto' (the AVX-512 or AVX2 + FMA tiles, the widest the CPU has) and
    'avx2' (at most the AVX2 tiles) against 'portable' (Eigen's GEMM), forward and both
    gradients (the gradients pass the attr on)."""
    with tf.device(CPU):  # the CPU kernel's products
        occupied = rng.random((2, 9, 9, 9)) < 0.3
        coords = np.argwhere(occupied).astype(np.int32)
        # cin/cout: 16-column panels, an 8-column one and a masked tail; rows past whole tiles.
        for cin, cout, dtype in ((5, 37, tf.float32), (16, 16, tf.float32), (24, 8, tf.float16)):
            features = tf.cast(rng.standard_normal((len(coords), cin)), dtype)
            kernel = tf.cast(rng.standard_normal((3, 3, 3, cin, cout)) / np.sqrt(27 * cin), dtype)
            upstream = tf.cast(np.linspace(-1, 1, len(coords) * cout).reshape(len(coords), cout), dtype)
            auto = conv_and_gradients_with(products, coords, features, kernel, upstream)
            portable = conv_and_gradients_with("portable", coords, features, kernel, upstream)
            for what, a, b in zip(("features", "input gradient", "kernel gradient"), auto, portable):
                # half: both round the same float32 sums to half once.
                tolerance = 2e-3 if dtype == tf.float16 else 1e-5  # fused multiply-adds and another sum order
                np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance * np.max(np.abs(b)),
                                           err_msg=f"{what}, {cin} -> {cout} {dtype.name}")


@pytest.mark.skipif(not cpu_has("avx512f"), reason="needs a CPU with AVX-512")
def test_avx512_tiles_give_the_avx2_tiles_bits(rng):
    """The AVX-512 tiles sum each output element's terms in the AVX2 tiles' order with the
    same fused multiply-adds: the same bits, forward and both gradients, for widths that
    take every panel kind of both (32-, 16- and 8-column panels, masked tails) and row
    counts past whole tiles."""
    with tf.device(CPU):
        occupied = rng.random((2, 9, 9, 9)) < 0.3
        coords = np.argwhere(occupied).astype(np.int32)
        for cin, cout in ((5, 37), (16, 16), (33, 70), (64, 8), (3, 1)):
            features = tf.constant(rng.standard_normal((len(coords), cin)), tf.float32)
            kernel = tf.constant(rng.standard_normal((3, 3, 3, cin, cout)) / np.sqrt(27 * cin), tf.float32)
            upstream = tf.constant(rng.standard_normal((len(coords), cout)), tf.float32)
            wide = conv_and_gradients_with("auto", coords, features, kernel, upstream)
            narrow = conv_and_gradients_with("avx2", coords, features, kernel, upstream)
            for what, a, b in zip(("features", "input gradient", "kernel gradient"), wide, narrow):
                np.testing.assert_array_equal(a, b, err_msg=f"{what}, {cin} -> {cout}")


def test_cpu_products_choices_are_checked():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="cpu_products"):
        ops.site_sparse_conv(tf.ones([2, 1]), tf.ones([1, 1, 1]), [0], [0], [0, 1], 2, tf.zeros([0], tf.int32),
                             cpu_products="fastest")


def test_empty_sites_give_empty_outputs(device):
    with tf.device(device):
        x = make_site_sparse(np.zeros((0, 4), np.int32), np.zeros((0, 3), np.float32), (4, 4, 4), 2)
        y = site_conv(x, np.ones((3, 3, 3, 3, 5), np.float32), strides=2, padding=1)
        assert y.features.shape == (0, 5) and y.coords.shape == (0, 4)
        assert site_conv(x, np.ones((3, 3, 3, 3, 5), np.float32), subm=True).features.shape == (0, 5)


def test_bad_geometry_is_rejected(rng):
    coords, features = random_sites(rng, 1, (4, 4), 0.5, 2)
    x = make_site_sparse(coords, features, (4, 4), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="needs an odd kernel"):
        kernel_map(x, 2, mode="submanifold")
    with pytest.raises(tf.errors.InvalidArgumentError, match="output spatial extent"):
        kernel_map(x, 7, mode="strided")
    with pytest.raises(ValueError, match="padding must be 0 or"):
        site_conv(x, np.ones((3, 3, 2, 2), np.float32), subm=True, padding=2)
    with pytest.raises(ValueError, match="input channels"):
        site_conv(x, np.ones((3, 3, 5, 2), np.float32), subm=True)
    with pytest.raises(ValueError, match="site_conv: subm must be True or False, got 'no'"):
        site_conv(x, np.ones((3, 3, 2, 2), np.float32), subm="no")
    with pytest.raises(ValueError, match="kernel must be"):
        site_conv(x, np.ones((3, 2, 2), np.float32), subm=True)


@pytest.mark.parametrize("bias", [np.ones((1, 2), np.float32), np.ones(3, np.float32)], ids=["rank-2", "length-3"])
def test_convolutions_name_a_bias_that_is_not_one_per_output_channel(bias, rng, device):
    coords, features = random_sites(rng, 1, (5, 5), 0.5, 2)
    kernel = np.ones((3, 3, 2, 2), np.float32)
    with tf.device(device):
        x = make_site_sparse(coords, features, (5, 5), 1)
        with pytest.raises(ValueError, match=r"site_conv: the bias must be \[Cout\]"):
            site_conv(x, kernel, bias, subm=True)
        with pytest.raises(ValueError, match=r"site_conv_transpose: the bias must be \[Cout\]"):
            site_conv_transpose(x, kernel, bias)
        y = site_conv(x, kernel, strides=2, indice_key="down")
        with pytest.raises(ValueError, match=r"site_inverse_conv: the bias must be \[Cout\]"):
            site_inverse_conv(y, kernel, "down", bias=bias)


def test_conv_op_rejects_maps_that_do_not_fit_the_features(rng):
    features = tf.constant(rng.standard_normal((4, 2)), tf.float32)
    filters = tf.ones([2, 2, 3])
    ok = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_out=2,
              neighbours=tf.zeros([0], tf.int32))
    assert ops.site_sparse_conv(features, filters, **ok).shape == (2, 3)
    cases = [
        (dict(ok, in_rows=[0, 1, 4]), "in_rows\\[2\\] = 4 is outside \\[0, 4\\)"),
        (dict(ok, out_rows=[0, 2, 0]), "out_rows\\[1\\] = 2 is outside \\[0, 2\\)"),
        (dict(ok, out_rows=[1, 1, 0]), "output row 1 appears twice for kernel offset 0"),
        (dict(ok, offset_splits=[0, 3, 2]), "offset_splits must rise"),
        (dict(ok, offset_splits=[0, 3]), "one entry per kernel offset plus one"),
    ]
    for kwargs, match in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            ops.site_sparse_conv(features, filters, **kwargs)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="Cin"):
        ops.site_sparse_conv(features, tf.ones([2, 3, 3]), **ok)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN"):
        ops.site_sparse_conv(tf.tensor_scatter_nd_update(features, [[1, 1]], [np.nan]), filters, **ok)


# --- trusted maps (map_is_trusted) ------------------------------------------------------------

def test_only_maps_from_the_kernel_map_op_are_trusted(rng):
    coords, features = random_sites(rng, 2, (6, 5, 6), 0.3, 3)
    x = make_site_sparse(coords, features, (6, 5, 6), 2)
    built = kernel_map(x, 3, mode="submanifold")
    assert built.trusted
    assert not hand_built(built).trusted


def test_hand_built_bad_map_is_still_rejected(rng):
    coords, features = random_sites(rng, 1, (6, 6), 0.5, 2)
    x = make_site_sparse(coords, features, (6, 6), 1)
    good = kernel_map(x, 3, mode="submanifold")
    out_rows = good.out_rows.numpy()
    splits = good.offset_splits.numpy()
    q = int(np.argmax(np.diff(splits) >= 2))  # an offset with two pairs or more
    repeated = out_rows.copy()
    repeated[splits[q] + 1] = repeated[splits[q]]
    out_of_range = good.in_rows.numpy().copy()
    out_of_range[0] = len(coords) + 3
    kernel = np.ones((3, 3, 2, 4), np.float32)
    for bad, match in ((hand_built(good, out_rows=tf.constant(repeated)), "appears twice"),
                       (hand_built(good, in_rows=tf.constant(out_of_range)), "in_rows\\[0\\] = .* is outside")):
        # Under an indice_key a hand-built map must be SiteKernelMap's for its geometry.
        with pytest.raises(tf.errors.InvalidArgumentError, match="hand-built kernel map under indice_key 'k'"):
            site_conv(x.with_map("k", bad), kernel, subm=True, indice_key="k")
        # The op itself checks the rows of an untrusted map.
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            ops.site_sparse_conv(x.features, tf.reshape(kernel, [9, 2, 4]), bad.in_rows, bad.out_rows,
                                 bad.offset_splits, len(coords), tf.zeros([0], tf.int32))
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):  # the filter gradient checks too
            ops.site_sparse_conv_filter_grad(x.features, tf.ones([len(coords), 4]), bad.in_rows, bad.out_rows,
                                             bad.offset_splits)


def test_cpu_checks_maps_even_when_trusted(rng):
    with tf.device(CPU):  # the GPU skips these checks for a trusted map
        features = tf.constant(rng.standard_normal((4, 2)), tf.float32)
        bad = dict(in_rows=[0, 1, 2], out_rows=[1, 1, 0], offset_splits=[0, 2, 3])
        with pytest.raises(tf.errors.InvalidArgumentError, match="output row 1 appears twice"):
            ops.site_sparse_conv(features, tf.ones([2, 2, 3]), **bad, num_out=2, neighbours=tf.zeros([0], tf.int32),
                                 map_is_trusted=True)
        with pytest.raises(tf.errors.InvalidArgumentError, match="output row 1 appears twice"):
            ops.site_sparse_conv_filter_grad(features, tf.ones([2, 3]), **bad, map_is_trusted=True)


@pytest.mark.parametrize("kwargs", [dict(subm=True), dict(strides=2, padding=1)], ids=["subm", "strided"])
def test_trusted_map_gives_the_results_of_the_untrusted_map(rng, kwargs):
    with tf.device(CPU):  # the CPU's sums, bit for bit (the GPU's, within tolerance: further down)
        coords, features = random_sites(rng, 2, (7, 6, 7), 0.3, 5)
        x = make_site_sparse(coords, features, (7, 6, 7), 2)
        kernel = tf.constant(rng.standard_normal((3, 3, 3, 5, 6)), tf.float32)
        geometry = dict(mode="submanifold") if kwargs.get("subm") else dict(strides=2, padding=1)
        trusted = kernel_map(x, 3, **geometry)
        results = []
        for m in (trusted, hand_built(trusted)):
            f = tf.constant(features)
            with tf.GradientTape() as tape:
                tape.watch([f, kernel])
                y = site_conv(x.with_features(f).with_map("k", m), kernel, indice_key="k", **kwargs)
                inverse = site_inverse_conv(y, tf.transpose(kernel, [0, 1, 2, 4, 3]), "k") if not kwargs.get(
                    "subm") else y
                loss = tf.reduce_sum(y.features * y.features) + tf.reduce_sum(inverse.features)
            results.append([y.features, inverse.features, *tape.gradient(loss, [f, kernel])])
        for i, (a, b) in enumerate(zip(*results)):
            if i == 2 and kwargs.get("subm"):
                # A trusted submanifold map's input gradient runs its own pairs mirrored
                # (map_is_submanifold), the hand-built one's the reversed pairs: other sum orders.
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)
            else:
                np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_gradient_ops_inherit_map_is_trusted(rng):
    coords, features = random_sites(rng, 1, (6, 6), 0.5, 2)
    x = make_site_sparse(coords, features, (6, 6), 1)
    kernel = tf.constant(rng.standard_normal((3, 3, 2, 3)), tf.float32)
    for m, expected in ((kernel_map(x, 3, mode="submanifold"), True),
                        (hand_built(kernel_map(x, 3, mode="submanifold")), False)):
        @tf.function
        def grads(f, m=m):
            with tf.GradientTape() as tape:
                tape.watch([f, kernel])
                y = site_conv(x.with_features(f).with_map("k", m), kernel, subm=True, indice_key="k")
                loss = tf.reduce_sum(y.features)
            return tape.gradient(loss, [f, kernel])

        graph = grads.get_concrete_function(tf.constant(features)).graph
        conv_ops = [op for op in graph.get_operations() if op.type in (CONV, FILTER_GRAD)]
        assert len(conv_ops) == 3  # forward, input gradient, filter gradient
        assert all(op.get_attr("map_is_trusted") == expected for op in conv_ops)
        # Only a trusted submanifold map is promised mirrored, and its input gradient keeps the promise.
        assert all(op.get_attr("map_is_submanifold") == expected for op in conv_ops if op.type == CONV)
    strided = tf.function(lambda f: site_conv(x.with_features(f), kernel, strides=2).features)
    graph = strided.get_concrete_function(tf.constant(features)).graph
    strided_ops = [op for op in graph.get_operations() if op.type == CONV]
    assert len(strided_ops) == 1 and not strided_ops[0].get_attr("map_is_submanifold")


def test_trust_survives_the_keras_dict(rng):
    from tf_sparseconv.site.keras_io import as_site_keras_inputs, from_site_keras_inputs
    coords, features = random_sites(rng, 1, (6, 6), 0.5, 2)
    x = make_site_sparse(coords, features, (6, 6), 1)
    built = kernel_map(x, 3, strides=2, padding=1)
    y = x.with_map("trusted", built).with_map("hand", hand_built(built))
    back = from_site_keras_inputs(as_site_keras_inputs(y))
    assert back.kernel_maps["trusted"].trusted and not back.kernel_maps["hand"].trusted
    assert back.kernel_maps["trusted"].geometry() == built.geometry() == back.kernel_maps["hand"].geometry()


# --- cached maps belong to their sites ----------------------------------------------------------

def two_site_sets(rng):
    """x and y: the same sites in other orders, so each row of y is another site than x's
    row (a map of x read with y's features used to give wrong rows without a word: only
    the counts were compared)."""
    coords = random_coords(rng, 1, (6, 6), 0.5)
    features = rng.standard_normal((len(coords), 2)).astype(np.float32)
    return make_site_sparse(coords, features, (6, 6), 1), make_site_sparse(coords[::-1].copy(), features, (6, 6), 1)


@pytest.mark.parametrize("layer", ["subm", "strided", "transposed", "pool"])
def test_a_cached_map_of_other_sites_is_refused(rng, layer):
    x, y = two_site_sets(rng)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)
    call = {"subm": lambda t: site_conv(t, w, subm=True, indice_key="k"),
            "strided": lambda t: site_conv(t, w, strides=2, padding=1, indice_key="k"),
            "transposed": lambda t: site_conv_transpose(t, w, strides=2, indice_key="k"),
            "pool": lambda t: site_pool(t, 2, indice_key="k")}[layer]
    m = call(x).kernel_maps["k"]
    call(x.with_map("k", m))  # its own sites
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="indice_key 'k' belongs to other sites \\(its input sites' coordinates differ"):
        call(y.with_map("k", m))
    with pytest.raises(tf.errors.InvalidArgumentError, match="its input site count differs"):
        call(make_site_sparse(y.coords[1:], y.features[1:], (6, 6), 1, {"k": m}))
    with pytest.raises(tf.errors.InvalidArgumentError, match="its input spatial shape differs"):
        call(make_site_sparse(x.coords, x.features, (6, 7), 1, {"k": m}))
    with pytest.raises(tf.errors.InvalidArgumentError, match="belongs to other sites"):
        tf.function(lambda t: call(t).features)(y.with_map("k", m))


def test_inverse_conv_refuses_a_map_of_other_output_sites(rng):
    x, _ = two_site_sets(rng)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)
    down = site_conv(x, w, strides=2, padding=1, indice_key="d")
    site_inverse_conv(down, w, "d")
    moved = make_site_sparse(down.coords.numpy()[::-1].copy(), down.features, down.spatial_shape, 1,
                             down.kernel_maps)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="indice_key 'd' belongs to other sites \\(its output sites' coordinates differ"):
        site_inverse_conv(moved, w, "d")


def test_a_cached_map_crosses_a_tf_function_boundary_by_value(rng):
    x, _ = two_site_sets(rng)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)
    with tf.device(CPU):
        h = site_conv(x, w, subm=True, indice_key="k")
        eager = site_conv(h, w, subm=True, indice_key="k").features
        traced = tf.function(lambda t: site_conv(t, w, subm=True, indice_key="k").features)
        np.testing.assert_array_equal(traced(h).numpy(), eager.numpy())
        graph = traced.get_concrete_function(h).graph
    # Inside the function the map's sites and the tensor's are two placeholders: compared.
    assert "coordinates differ from these" in str(graph.as_graph_def())


def test_cached_maps_along_the_layers_of_a_model_are_not_rechecked(rng):
    x, _ = two_site_sets(rng)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)

    def unet(t):
        h = site_conv(site_conv(t, w, subm=True, indice_key="s0"), w, subm=True, indice_key="s0")
        down = site_conv(site_conv(h, w, strides=2, padding=1, indice_key="d"), w, subm=True, indice_key="s1")
        down = site_conv(down, w, subm=True, indice_key="s1")
        up = site_inverse_conv(down, w, "d")
        return site_conv(up, w, subm=True, indice_key="s0").features

    graph_text = str(tf.function(unet).get_concrete_function(x).graph.as_graph_def())
    # Every map is the tensors' own: no coordinate comparison, and three maps built once each.
    assert "coordinates differ" not in graph_text and "hand-built" not in graph_text
    ops_of_graph = tf.function(unet).get_concrete_function(x).graph.get_operations()
    assert sum(op.type == OP_NAMESPACE + "SiteKernelMap" for op in ops_of_graph) == 3


def test_a_hand_built_map_is_checked_against_its_stated_geometry(rng):
    x, _ = two_site_sets(rng)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)
    same = kernel_map(x, 3, strides=1, padding=1)  # the strided 3x3 map: other pairs than the submanifold one
    false = hand_built(same, mode="submanifold", padding=(0, 0))
    with pytest.raises(tf.errors.InvalidArgumentError, match="hand-built kernel map under indice_key 'k'"):
        site_conv(x.with_map("k", false), w, subm=True, indice_key="k")
    stride_two = kernel_map(x, 3, strides=2, padding=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"stated \(mode, kernel_size, strides, padding, "
                                                             r"dilation\) = \('strided', \(3, 3\), \(1, 1\)"):
        site_conv(x.with_map("k", hand_built(stride_two, strides=(1, 1))), w, padding=1, indice_key="k")
    # A hand-built copy of SiteKernelMap's map passes and gives its results.
    honest = site_conv(x.with_map("k", hand_built(same)), w, padding=1, indice_key="k").features
    np.testing.assert_allclose(honest.numpy(), site_conv(x, w, padding=1).features.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("field", ["out_coords", "in_rows", "in_coords"])
def test_a_hand_built_map_of_another_rank_is_refused_with_the_map_message(rng, field):
    # Parts of another rank used to fail inside TensorFlow's Equal ("Incompatible shapes").
    x, _ = two_site_sets(rng)
    w = tf.constant(rng.standard_normal((3, 3, 2, 2)), tf.float32)
    same = kernel_map(x, 3, strides=1, padding=1)
    bad = hand_built(same, **{field: getattr(same, field)[None]})
    with pytest.raises(tf.errors.InvalidArgumentError, match="kernel map under indice_key 'k'.*(differ|belongs)"):
        site_conv(x.with_map("k", bad), w, padding=1, indice_key="k")


# --- neighbour tables and dataflows -------------------------------------------------------------

def test_conv_checks_a_given_neighbour_table_and_gives_the_same_values(rng):
    with tf.device(CPU):  # the CPU checks a table and computes from the pairs
        coords, features = random_sites(rng, 1, (6, 6, 6), 0.4, 4)
        x = make_site_sparse(coords, features, (6, 6, 6), 1)
        kmap = kernel_map(x, 3, mode="submanifold")
        filters = tf.constant(rng.standard_normal((27, 4, 5)), tf.float32)
        n = len(coords)
        table = neighbour_table(kmap)
        args = (x.features, filters, kmap.in_rows, kmap.out_rows, kmap.offset_splits, n)
        plain = ops.site_sparse_conv(*args, tf.zeros([0], tf.int32), map_is_trusted=True)
        np.testing.assert_array_equal(ops.site_sparse_conv(*args, table, map_is_trusted=True).numpy(), plain.numpy())
        with pytest.raises(tf.errors.InvalidArgumentError, match="neighbours must be SiteNeighbourTable's"):
            ops.site_sparse_conv(*args, table[:, :-1], map_is_trusted=True)
        with pytest.raises(tf.errors.InvalidArgumentError, match="neighbours must be SiteNeighbourTable's"):
            ops.site_sparse_conv(*args, table[1:], map_is_trusted=True)
        with pytest.raises(tf.errors.InvalidArgumentError, match="accepted with map_is_trusted only"):
            ops.site_sparse_conv(*args, table)


def test_layers_build_neighbour_tables_once_per_keyed_map_and_carry_them(monkeypatch, rng):
    import importlib
    from tf_sparseconv.site.keras_io import as_site_keras_inputs, from_site_keras_inputs
    maps = importlib.import_module("tf_sparseconv.site.kernel_map")
    coords, features = random_sites(rng, 2, (8, 8, 8), 0.3, 4, np.float16)
    with tf.device(CPU):  # the CPU kernels check the tables and compute from the pairs
        x = make_site_sparse(coords, features, (8, 8, 8), 2)
        w = tf.constant(rng.standard_normal((3, 3, 3, 4, 4)) / 10, tf.float16)
        wd = tf.constant(rng.standard_normal((2, 2, 2, 4, 8)) / 10, tf.float16)
        wu = tf.constant(rng.standard_normal((2, 2, 2, 8, 4)) / 10, tf.float16)

        def net():
            y = site_conv(site_conv(x, w, subm=True, indice_key="s"), w, subm=True, indice_key="s")
            down = site_conv(y, wd, strides=2, indice_key="d")
            return y, site_inverse_conv(down, wu, "d")
        # Without a GPU no table is built; where one is visible, half types build them under
        # 'auto'. The layers are made to believe each in turn.
        monkeypatch.setattr(maps, "gpu_visible", lambda: False)
        y, up = net()
        assert y.kernel_maps["s"].neighbours is None and up.kernel_maps["d"].inverse_neighbours is None
        monkeypatch.setattr(maps, "gpu_visible", lambda: True)
        y_t, up_t = net()
        np.testing.assert_array_equal(y_t.features.numpy(), y.features.numpy())
        np.testing.assert_array_equal(up_t.features.numpy(), up.features.numpy())
        s, d = y_t.kernel_maps["s"], up_t.kernel_maps["d"]
        np.testing.assert_array_equal(s.neighbours.numpy(), neighbour_table(s).numpy())
        np.testing.assert_array_equal(d.neighbours.numpy(), neighbour_table(d).numpy())
        np.testing.assert_array_equal(d.inverse_neighbours.numpy(), neighbour_table(d, inverse=True).numpy())
        # Through the Keras dict and back, the tables stay with their maps.
        back = from_site_keras_inputs(as_site_keras_inputs(up_t))
        np.testing.assert_array_equal(back.kernel_maps["d"].inverse_neighbours.numpy(), d.inverse_neighbours.numpy())
        # 'pairs' never reads a table, so none is built.
        assert site_conv(x, w, subm=True, indice_key="s", dataflow="pairs").kernel_maps["s"].neighbours is None


def test_dataflow_choices(rng):
    with tf.device(CPU):  # the CPU's dataflows
        coords, features = random_sites(rng, 2, (6, 6, 6), 0.4, 3)
        x = make_site_sparse(coords, features, (6, 6, 6), 2)
        w = tf.constant(rng.standard_normal((3, 3, 3, 3, 4)), tf.float32)
        auto = site_conv(x, w, subm=True).features.numpy()
        # The CPU has one dataflow: 'pairs' is it, 'outputs' is refused.
        np.testing.assert_array_equal(site_conv(x, w, subm=True, dataflow="pairs").features.numpy(), auto)
        with pytest.raises(tf.errors.InvalidArgumentError, match="dataflow='outputs' runs on the GPU only"):
            site_conv(x, w, subm=True, dataflow="outputs")
        for call in (lambda: site_conv(x, w, subm=True, dataflow="fastest"),
                     lambda: site_conv_transpose(x, w, strides=2, dataflow="fastest"),
                     lambda: site_inverse_conv(site_conv(x, w, strides=2, indice_key="d"), tf.transpose(
                         w, [0, 1, 2, 4, 3]), "d", dataflow="Auto")):
            with pytest.raises(ValueError, match="dataflow must be 'auto', 'pairs' or 'outputs'"):
                call()
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="dataflow"):
            ops.site_sparse_conv(x.features, tf.reshape(w, [27, 3, 4]), [0], [0], tf.constant([0] + [1] * 27), 2,
                                 tf.zeros([0], tf.int32), dataflow="fastest")


def test_the_gradients_run_the_forward_dataflow_and_cpu_products(rng):
    coords, features = random_sites(rng, 2, (6, 6, 6), 0.4, 3)
    x = make_site_sparse(coords, features, (6, 6, 6), 2)
    filters = tf.constant(rng.standard_normal((27, 3, 4)), tf.float32)
    for mode in ("submanifold", "strided"):
        kmap = kernel_map(x, 3, 2 if mode == "strided" else 1, mode=mode)
        num_out = tf.shape(kmap.out_coords)[0]

        @tf.function
        def gradients(features, kmap=kmap, num_out=num_out, mode=mode):
            with tf.GradientTape() as tape:
                tape.watch([features, filters])
                y = ops.site_sparse_conv(features, filters, kmap.in_rows, kmap.out_rows, kmap.offset_splits,
                                         num_out, tf.zeros([0], tf.int32), map_is_trusted=True,
                                         map_is_submanifold=mode == "submanifold", dataflow="pairs",
                                         cpu_products="portable")
            return tape.gradient(y, [features, filters])
        graph = gradients.get_concrete_function(tf.TensorSpec([None, 3], tf.float32)).graph
        ops_of = {kind: [op for op in graph.get_operations() if op.type == kind] for kind in (CONV, FILTER_GRAD)}
        assert len(ops_of[CONV]) == 2 and len(ops_of[FILTER_GRAD]) == 1, mode
        for op in ops_of[CONV]:  # the forward and the input gradient
            assert op.get_attr("dataflow") == b"pairs" and op.get_attr("cpu_products") == b"portable", mode
        assert ops_of[FILTER_GRAD][0].get_attr("cpu_products") == b"portable", mode


# === the GPU against the CPU ======================================================================

NO_NEIGHBOURS = tf.zeros([0], tf.int32)  # SiteSparseConv's neighbours input, not given
# GPU against CPU, relative to the largest magnitude of the CPU result. float32 and
# float64: sums in another order. float16 and bfloat16: both devices accumulate in
# float32 and round once at the end, so they differ by about one rounding of the output
# (2^-11 and 2^-8 relative), plus the float32 differences. The gpu tests run float32
# without TF32 (tests/site/conftest.py), except where a test turns it on.
TOLERANCE = {tf.float32: 1e-5, tf.float64: 1e-12, tf.float16: 2e-3, tf.bfloat16: 1.6e-2}


def on_cpu(value, dtype):
    """value as a tensor of dtype, converted on the CPU (not every GPU Cast has every type)."""
    with tf.device(CPU):
        return tf.cast(tf.constant(np.asarray(value, np.float32)), dtype)


def assert_close(actual, expected, dtype, what=""):
    actual = np.asarray(actual.numpy(), np.float64)
    expected = np.asarray(expected.numpy(), np.float64)
    assert actual.shape == expected.shape, what
    scale = np.max(np.abs(expected)) if expected.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale,
                               err_msg=what)


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
def test_conv_and_gradients_match_cpu(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs, gpu):
    coords = random_coords(rng, batch, shape, density)
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
def test_transposed_and_inverse_conv_match_cpu(rng, dtype, gpu):
    coords = random_coords(rng, 2, (8, 7, 8), 0.3)
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
def test_conv_with_no_pairs_or_no_outputs(dtype, gpu):
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


# --- determinism -------------------------------------------------------------------------------

def gpu_outputs(seed, dtype=tf.float32, dataflow="auto"):
    """Forward and gradients of a submanifold and a strided layer on the GPU, as numpy."""
    rng = np.random.default_rng(seed)
    coords = random_coords(rng, 2, (16, 16, 16), 0.2)
    features = on_cpu(rng.standard_normal((len(coords), 24)), dtype)
    kernel = on_cpu(rng.standard_normal((3, 3, 3, 24, 40)) / 10, dtype)
    outputs = []
    for kwargs in (dict(subm=True, dataflow=dataflow), dict(strides=2, padding=1, dataflow=dataflow)):
        y, _, _ = conv_and_gradients(GPU, coords, features, kernel, (16, 16, 16), 2, kwargs)
        upstream = np.linspace(-1, 1, int(np.prod(y.shape))).reshape(y.shape)
        outputs += [t.numpy() for t in conv_and_gradients(GPU, coords, features, kernel, (16, 16, 16), 2, kwargs,
                                                          upstream)]
    return outputs


def test_filter_gradient_is_bit_identical_across_runs(gpu):
    first, second = gpu_outputs(3), gpu_outputs(3)
    for i in (2, 5):  # the kernel gradients: fixed chunks, no atomics
        np.testing.assert_array_equal(first[i].view(np.uint8), second[i].view(np.uint8))


def test_gpu_results_are_bit_identical_under_op_determinism(gpu):
    # enable_op_determinism cannot be turned off again: a process of its own.
    output = run_in_own_process("""
        import numpy as np, tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from tests.site.test_conv import gpu_outputs
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
    assert "bit-identical under op determinism" in output


# --- errors: the CPU's messages -----------------------------------------------------------------

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


def test_conv_ops_give_the_cpu_errors_on_gpu(rng, gpu):
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


def test_repeated_output_row_among_many_pairs_reports_the_first(rng, gpu):
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


def test_gpu_map_check_memory_follows_the_pairs_not_num_out(rng, gpu):
    """The GPU's repeat check used a bitmask of num_out * volume bits: 8 GiB here (2^16
    output rows, 2^20 offsets) for a map of 40 pairs; it now sorts the pairs where the
    bitmask would be much larger than they are, with the CPU's errors."""
    num_in, num_out, volume, pairs = 8, 1 << 16, 1 << 20, 40
    owners = np.sort(rng.choice(volume, pairs // 4, replace=False))
    splits = np.searchsorted(np.repeat(owners, 4), np.arange(volume + 1)).astype(np.int32)
    in_rows = rng.integers(0, num_in, pairs).astype(np.int32)
    out_rows = np.concatenate([rng.choice(num_out, 4, replace=False) for _ in owners]).astype(np.int32)
    repeated = out_rows.copy()
    repeated[4 * 3 + 2] = repeated[4 * 3]  # within the fourth used offset
    features = rng.standard_normal((num_in, 1))  # float64: no TF32 products
    filters = rng.standard_normal((volume, 1, 1))

    def conv(rows):
        return ops.site_sparse_conv(features, filters, in_rows, rows, splits, num_out, NO_NEIGHBOURS)

    assert_same_error(lambda: conv(repeated), f"output row {repeated[12]} appears twice for kernel offset {owners[3]}")
    bad_range = out_rows.copy()
    bad_range[5] = num_out
    assert_same_error(lambda: conv(bad_range), rf"out_rows\[5\] = {num_out} is outside")
    tf.config.experimental.reset_memory_stats("GPU:0")
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    with tf.device(GPU):
        got = conv(out_rows)
    peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] - before
    with tf.device(CPU):
        want = conv(out_rows)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    assert peak < 64 << 20, f"{peak / 2**20:.0f} MiB"  # the offset table and the sort: tens of MiB, not 8 GiB


# --- trusted maps on the GPU ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kwargs", [dict(subm=True), dict(strides=2, padding=1)], ids=["subm", "strided"])
def test_trusted_map_on_gpu_matches_untrusted_map_and_cpu(rng, dtype, kwargs, gpu):
    coords = random_coords(rng, 2, (10, 9, 10), 0.3)
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


def test_hand_built_bad_map_is_rejected_on_gpu(rng, gpu):
    coords = random_coords(rng, 1, (6, 6), 0.5)
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
            m = hand_built(good, **{k: tf.constant(v) for k, v in bad.items()})
            return ops.site_sparse_conv(features, tf.reshape(kernel, [9, 2, 4]), m.in_rows, m.out_rows,
                                        m.offset_splits, len(coords), NO_NEIGHBOURS)
        assert_same_error(call, phrase)


def test_trusted_calls_check_splits_on_the_host_and_skip_the_nan_scan_on_gpu(rng, gpu):
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
def test_float32_conv_uses_tf32_where_tensorflow_allows_it(rng, cin, cout, gpu):
    coords = random_coords(rng, 1, (14, 14, 14), 0.15)
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

OUTPUTS_REFUSED = r"dataflow='outputs' \(output-stationary tiles on tensor cores\) does not apply to this convolution"


def outputs_apply(dtype, volume, cin, cout):
    """Whether the GPU's output-stationary tiles take this convolution, so that the op runs
    dataflow='outputs' rather than refusing it: sm_80 and later, half or bfloat16 (float
    with TF32 on), rows of whole 16-byte vectors, at most 32 offsets."""
    details = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
    if details.get("compute_capability", (0, 0))[0] < 8 or dtype == tf.float64 or volume > 32:
        return False
    if dtype == tf.float32 and not tf.config.experimental.tensor_float_32_execution_enabled():
        return False
    vec = 4 if dtype == tf.float32 else 8
    return cin % vec == 0 and cout % vec == 0

def cpu_and_two_gpu_runs(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs, gpu_kwargs=None):
    """(cpu, first, second): conv_and_gradients on the CPU (kwargs) and twice on the GPU
    (kwargs and gpu_kwargs, e.g. a dataflow the CPU does not have), on random sites,
    features, kernel and upstream gradient; float runs with TF32 on."""
    tf.config.experimental.enable_tensor_float_32_execution(dtype == tf.float32)
    coords = random_coords(rng, batch, shape, density)
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
                                                                         density, kwargs, gpu):
    tf.config.experimental.enable_tensor_float_32_execution(dtype == tf.float32)
    if not outputs_apply(dtype, int(np.prod(kernel)), cin, cout):
        # Shapes the tiles do not take: refused, not run on the pairs in its place.
        with pytest.raises(tf.errors.InvalidArgumentError, match=OUTPUTS_REFUSED):
            cpu_and_two_gpu_runs(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs,
                                 dict(dataflow="outputs"))
        return
    cpu, first, second = cpu_and_two_gpu_runs(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs,
                                              dict(dataflow="outputs"))
    assert_gpu_matches_cpu(dtype, cpu, first)
    # Every output row is stored once: no atomics, so no timing in the sums (forward and
    # input gradient, which runs the forward's dataflow).
    for what, g, again in zip(("features", "input gradient"), first, second):
        np.testing.assert_array_equal(g.numpy().view(np.uint8), again.numpy().view(np.uint8), err_msg=what)


def test_output_stationary_dataflow_refuses_double_and_names_auto(rng, gpu):
    coords = random_coords(rng, 2, (9, 8, 9), 0.25)
    features = on_cpu(rng.standard_normal((len(coords), 8)), tf.float64)
    w = on_cpu(rng.standard_normal((3, 3, 3, 8, 8)), tf.float64)
    with tf.device(gpu):
        x = make_site_sparse(coords, features, (9, 8, 9), 2)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=OUTPUTS_REFUSED + r": .*no such kernel for double; use dataflow='auto'"):
            site_conv(x, w, subm=True, dataflow="outputs")
        # 'auto' runs the pairs on the same call.
        y = site_conv(x, w, subm=True)
    with tf.device(CPU):
        expected = site_conv(make_site_sparse(coords, features, (9, 8, 9), 2), w, subm=True)
    np.testing.assert_allclose(y.features.numpy(), expected.features.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,dataflow", [(tf.float16, "pairs"), (tf.bfloat16, "pairs"), (tf.float32, "pairs"),
                                            (tf.float32, "auto")], ids=lambda v: getattr(v, "name", v))
def test_the_pairs_run_from_a_given_table_where_the_dataflow_says_so(rng, dtype, dataflow, gpu):
    """dataflow="pairs" runs the pair tiles whatever the call is given, and so does "auto"
    for float (it reads a table for half types only): with a table, the result matches the
    CPU's as without one."""
    tf.config.experimental.enable_tensor_float_32_execution(dtype == tf.float32)
    coords = random_coords(rng, 2, (9, 8, 9), 0.25)
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


# --- the convolution from neighbour tables ---------------------------------------------------------

@pytest.mark.parametrize("dataflow", ["auto", "outputs"])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16], ids=lambda t: t.name)
@pytest.mark.parametrize("batch,shape,kernel,cin,cout,density,kwargs", CONV_CASES)
def test_conv_from_a_given_table_matches_cpu(rng, dtype, batch, shape, kernel, cin, cout, density, kwargs,
                                            dataflow, gpu):
    """The op given a table: the forward and (submanifold) the input gradient from the same
    table match the CPU's pairs, and repeat bit for bit; both dataflows read the table at
    every width, 256 channels included."""
    volume = int(np.prod(kernel))
    if volume > 32:
        pytest.skip("neighbour tables hold kernels of at most 32 offsets")
    subm = bool(kwargs.get("subm"))
    coords = random_coords(rng, batch, shape, density)
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
    if dataflow == "outputs" and not outputs_apply(dtype, volume, cin, cout):
        with pytest.raises(tf.errors.InvalidArgumentError, match=OUTPUTS_REFUSED):
            run(GPU, table, dataflow)
        return
    cpu = run(CPU, NO_NEIGHBOURS, "auto")
    first, second = run(GPU, table, dataflow), run(GPU, table, dataflow)
    for what, c, g, again in zip(("features", "input gradient"), cpu, first, second):
        assert_close(g, c, dtype, what)
        if cin % 8 == 0 and cout % 8 == 0 and (what == "features" or subm):
            np.testing.assert_array_equal(g.numpy().view(np.uint8), again.numpy().view(np.uint8), err_msg=what)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32], ids=lambda t: t.name)
@pytest.mark.parametrize("batch,shape,kernel,cin,cout,density,kwargs", CONV_CASES)
def test_conv_from_neighbour_tables_matches_cpu_and_repeats_bit_for_bit(rng, dtype, batch, shape, kernel, cin, cout,
                                                                        density, kwargs, gpu):
    """Layers under an indice_key build the map's table once and run from it: half and
    bfloat16 under 'auto', float under 'outputs' (its TF32 table tiles)."""
    if np.prod(kernel) > 32:
        pytest.skip("neighbour tables hold kernels of at most 32 offsets")
    on_gpu = dict(dataflow="outputs" if dtype == tf.float32 else "auto")
    tf.config.experimental.enable_tensor_float_32_execution(dtype == tf.float32)
    if dtype == tf.float32 and not outputs_apply(dtype, int(np.prod(kernel)), cin, cout):
        with pytest.raises(tf.errors.InvalidArgumentError, match=OUTPUTS_REFUSED):
            cpu_and_two_gpu_runs(rng, dtype, batch, shape, kernel, cin, cout, density, dict(kwargs, indice_key="k"),
                                 on_gpu)
        return
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
def test_layers_build_neighbour_tables_where_the_dataflow_reads_them(rng, dataflow, gpu):
    tf.config.experimental.enable_tensor_float_32_execution(True)  # float's 'outputs' multiplies in TF32
    coords = random_coords(rng, 2, (9, 9, 9), 0.25)
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


def test_map_check_memory_follows_the_pairs_not_num_out(rng):
    """num_out = 2^31 - 1 used to size an 8 GB check vector before anything was read."""
    coords, features = random_sites(rng, 1, (6, 6), 0.5, 2)
    x = make_site_sparse(coords, features, (6, 6), 1)
    good = kernel_map(x, 3, mode="submanifold")
    out_rows, splits = good.out_rows.numpy(), good.offset_splits.numpy()
    q = int(np.argmax(np.diff(splits) >= 2))
    repeated = out_rows.copy()
    repeated[splits[q] + 1] = repeated[splits[q]]
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with tf.device(CPU):
        for rows, match in ((repeated, "appears twice"), (out_rows, None)):
            args = (good.in_rows, tf.constant(rows), good.offset_splits)
            if match is None:  # the check passes without a table over num_out; the table op then sizes its output
                table = ops.site_neighbour_table(*args, len(coords), 2 * len(out_rows) + 5000)
                assert table.shape[0] == 2 * len(out_rows) + 5000
                continue
            with pytest.raises(tf.errors.InvalidArgumentError, match=match):
                ops.site_sparse_conv(x.features, tf.ones([9, 2, 3]), *args, 2**31 - 1, tf.zeros([0], tf.int32))
            with pytest.raises(tf.errors.InvalidArgumentError, match=match):
                ops.site_neighbour_table(*args, len(coords), 2**31 - 1)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 1 << 20  # under 1 GiB more
