"""Site-sparse convolution against dense references: tf.nn.convolution (1-3 spatial
dims), a NumPy shift-and-multiply convolution (4-D), dense gradients for the inverse
convolution, tf.nn.conv_transpose for the transposed one; float64 gradient checks and
the error paths of the kernel map and the convolution."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE
from tf_sparseconv.site import (kernel_map, site_conv, site_conv_transpose, site_inverse_conv)
from tf_sparseconv.site.tensor import make_site_sparse

from tests.site.helpers import hand_built, random_sites, rows_at, to_grid

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
    pad = [[0, 0]] + [[p, p] for p in padding] + [[0, 0]]
    return tf.nn.convolution(tf.pad(grid, pad), kernel, strides=strides, padding="VALID", dilations=dilation).numpy()


@pytest.mark.parametrize("shape,kernel_size,dilation", [
    ((11,), (3,), (1,)), ((9, 10), (3, 3), (1,2)), ((7, 8, 6), (3, 3, 3), (1, 1, 1)),
    ((8, 7, 9), (5, 3, 1), (1, 1, 1)), ((5, 4, 5, 4), (3, 3, 3, 3), (1, 1, 1, 1))])
def test_submanifold_conv_matches_dense_convolution_at_the_input_sites(rng, shape, kernel_size, dilation):
    batch, cin, cout = 2, 3, 4
    coords, features = random_sites(rng, batch, shape, 0.3, cin)
    kernel = rng.standard_normal((*kernel_size, cin, cout)).astype(np.float32)
    x = make_site_sparse(coords, features, shape, batch)
    y = site_conv(x, kernel, subm=True, dilation=dilation)
    np.testing.assert_array_equal(y.coords.numpy(), coords)
    same = [dl * (k - 1) // 2 for k, dl in zip(kernel_size, dilation)]
    grid = to_grid(coords, features, batch, shape)
    dense = numpy_conv(grid, kernel, [1] * len(shape), same, dilation) if len(shape) == 4 else \
        tf_dense_conv(grid, kernel, [1] * len(shape), same, dilation)
    np.testing.assert_allclose(y.features.numpy(), rows_at(dense, coords), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,kernel_size,strides,padding", [
    ((12,), (3,), (2,), (1,)), ((9, 10), (2, 2), (2, 2), (0, 0)), ((9, 8, 7), (3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ((8, 8, 8), (2, 3, 2), (2, 1, 2), (0, 1, 0)), ((6, 5, 6, 5), (3, 3, 3, 3), (2, 2, 2, 2), (1, 0, 1, 0))])
def test_strided_conv_matches_dense_convolution_on_every_reached_site(rng, shape, kernel_size, strides, padding):
    batch, cin, cout = 2, 3, 5
    coords, features = random_sites(rng, batch, shape, 0.25, cin)
    kernel = rng.standard_normal((*kernel_size, cin, cout)).astype(np.float32)
    x = make_site_sparse(coords, features, shape, batch)
    y = site_conv(x, kernel, strides=strides, padding=padding)
    dilation = [1] * len(shape)
    expected_sites = reached_sites(coords, batch, shape, kernel_size, strides, padding, dilation)
    np.testing.assert_array_equal(y.coords.numpy(), expected_sites)  # sorted by batch, then coordinates
    grid = to_grid(coords, features, batch, shape)
    dense = numpy_conv(grid, kernel, strides, padding, dilation) if len(shape) == 4 else \
        tf_dense_conv(grid, kernel, strides, padding, dilation)
    np.testing.assert_array_equal(y.spatial_shape.numpy(), dense.shape[1:-1])
    assert y.static_spatial_shape.as_list() == list(dense.shape[1:-1])
    np.testing.assert_allclose(y.features.numpy(), rows_at(dense, expected_sites), rtol=1e-4, atol=1e-4)


def test_numpy_reference_agrees_with_tf_convolution(rng):
    grid = rng.standard_normal((2, 7, 6, 5, 3))
    kernel = rng.standard_normal((3, 2, 3, 3, 4))
    np.testing.assert_allclose(numpy_conv(grid, kernel, (2, 1, 2), (1, 0, 1), (1, 1, 1)),
                               tf_dense_conv(grid, kernel, (2, 1, 2), (1, 0, 1), (1, 1, 1)), rtol=1e-10)


def test_transposed_conv_matches_tf_conv_transpose(rng):
    batch, shape, cin, cout, k, s = 2, (5, 4, 6), 3, 2, (3, 2, 3), (2, 2, 2)
    coords, features = random_sites(rng, batch, shape, 0.3, cin)
    kernel = rng.standard_normal((*k, cin, cout)).astype(np.float32)
    y = site_conv_transpose(make_site_sparse(coords, features, shape, batch), kernel, strides=s)
    out_shape = [(r - 1) * st + kk for r, st, kk in zip(shape, s, k)]
    dense = tf.nn.conv_transpose(to_grid(coords, features, batch, shape), np.swapaxes(kernel, -1, -2),
                                 [batch, *out_shape, cout], strides=s, padding="VALID").numpy()
    np.testing.assert_array_equal(y.spatial_shape.numpy(), out_shape)
    occupancy = tf.nn.conv_transpose(to_grid(coords, np.ones((len(coords), 1), np.float32), batch, shape),
                                     np.ones((*k, 1, 1), np.float32), [batch, *out_shape, 1], strides=s,
                                     padding="VALID").numpy()
    expected_sites = np.argwhere(occupancy[..., 0] > 0).astype(np.int32)
    np.testing.assert_array_equal(y.coords.numpy(), expected_sites)
    np.testing.assert_allclose(y.features.numpy(), rows_at(dense, expected_sites), rtol=1e-4, atol=1e-4)


def test_inverse_conv_is_the_input_gradient_of_the_strided_conv(rng):
    """SparseInverseConv with kernel W^T = d(strided conv with W)/d(input) applied to the
    coarse features, computed densely by TensorFlow."""
    batch, shape, cfine, ccoarse = 2, (8, 7, 8), 3, 4
    coords, features = random_sites(rng, batch, shape, 0.3, cfine)
    kernel = rng.standard_normal((3, 3, 3, cfine, ccoarse)).astype(np.float32)
    x = make_site_sparse(coords, features, shape, batch)
    coarse = site_conv(x, kernel, strides=2, padding=1, indice_key="down1")
    upstream = rng.standard_normal(coarse.features.shape).astype(np.float32)
    back = site_inverse_conv(coarse.with_features(tf.constant(upstream)), np.swapaxes(kernel, -1, -2), "down1")
    np.testing.assert_array_equal(back.coords.numpy(), coords)
    np.testing.assert_array_equal(back.spatial_shape.numpy(), shape)
    grid = tf.constant(to_grid(coords, features, batch, shape))
    with tf.GradientTape() as tape:
        tape.watch(grid)
        dense = tf.nn.conv3d(tf.pad(grid, [[0, 0], [1, 1], [1, 1], [1, 1], [0, 0]]), kernel,
                             strides=[1, 2, 2, 2, 1], padding="VALID", data_format="NDHWC")
    grad = tape.gradient(dense, grid, output_gradients=tf.scatter_nd(coarse.coords, upstream, dense.shape))
    np.testing.assert_allclose(back.features.numpy(), rows_at(grad.numpy(), coords), rtol=1e-4, atol=1e-4)


def test_kernel_map_is_reused_under_its_indice_key_and_geometry_is_checked(rng):
    coords, features = random_sites(rng, 1, (6, 6, 6), 0.3, 2)
    x = make_site_sparse(coords, features, (6, 6, 6), 1)
    kernel = rng.standard_normal((3, 3, 3, 2, 2)).astype(np.float32)
    y = site_conv(x, kernel, subm=True, indice_key="subm1")
    z = site_conv(y, kernel, subm=True, indice_key="subm1")
    assert z.kernel_maps["subm1"].in_rows is y.kernel_maps["subm1"].in_rows
    with pytest.raises(ValueError, match="indice_key 'subm1' was built for"):
        site_conv(y, kernel, strides=2, indice_key="subm1")
    # A map of other sites under the key: the site counts differ.
    other = make_site_sparse(coords[:-3], features[:-3], (6, 6, 6), 1).with_map("subm1", y.kernel_maps["subm1"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="belongs to other sites"):
        site_conv(other, kernel, subm=True, indice_key="subm1")


def test_submanifold_kernel_map_pairs_match_a_brute_force_search(rng):
    coords, _ = random_sites(rng, 2, (5, 6), 0.4, 1)
    x = make_site_sparse(coords, np.zeros((len(coords), 1), np.float32), (5, 6), 2)
    m = kernel_map(x, 3, mode="submanifold")
    splits = m.offset_splits.numpy()
    where = {tuple(c): i for i, c in enumerate(coords)}
    for q, (dx, dy) in enumerate(itertools.product(range(3), range(3))):
        expected = sorted((where[(b, u + dx - 1, v + dy - 1)], o) for o, (b, u, v) in enumerate(coords)
                          if (b, u + dx - 1, v + dy - 1) in where)
        got = sorted(zip(m.in_rows.numpy()[splits[q]:splits[q + 1]], m.out_rows.numpy()[splits[q]:splits[q + 1]]))
        assert got == expected


@pytest.mark.parametrize("subm", [True, False])
def test_gradients_match_numerical_gradients_in_float64(rng, subm):
    batch, shape, cin, cout = 2, (5, 4, 5), 2, 3
    coords, features = random_sites(rng, batch, shape, 0.35, cin, np.float64)
    kernel = rng.standard_normal((3, 3, 3, cin, cout))
    x = make_site_sparse(coords, features, shape, batch)
    kwargs = dict(subm=True) if subm else dict(strides=2, padding=1)

    def f(features, kernel):
        return site_conv(x.with_features(features), kernel, **kwargs).features

    theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(features), tf.constant(kernel)])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape,kernel_size,dilation", [
    ((9, 8), (3, 5), (2, 1)), ((5, 6, 5), (3, 1, 5), (1, 1, 1)), ((4, 3, 4, 3), (3, 3, 1, 3), (1, 1, 1, 2))])
def test_submanifold_input_gradient_runs_the_forward_pairs_mirrored(rng, shape, kernel_size, dilation):
    """The gradient of a submanifold op (map_is_submanifold) convolves over the forward's
    own pairs with the transposed filters in mirrored offset order; it must equal the
    gradient over the reversed pairs, and the numerical gradient, for kernels of unequal
    sides and dilations (where a wrong mirror would pair the wrong offsets)."""
    from tf_sparseconv._op_library import ops
    cin, cout = 3, 2
    coords, features = random_sites(rng, 2, shape, 0.4, cin, np.float64)
    x = make_site_sparse(coords, features, shape, 2)
    kmap = kernel_map(x, kernel_size, dilation=dilation, mode="submanifold")
    volume = int(np.prod(kernel_size))
    filters = rng.standard_normal((volume, cin, cout))
    n = len(coords)
    table = tf.zeros([0], tf.int32)

    def conv(mirrored):
        def f(features, filters):
            return ops.site_sparse_conv(features, filters, kmap.in_rows, kmap.out_rows, kmap.offset_splits, n, table,
                                        map_is_trusted=True, map_is_submanifold=mirrored)
        return f

    mirrored = tf.test.compute_gradient(conv(True), [tf.constant(features), tf.constant(filters)])
    reversed_pairs = tf.test.compute_gradient(conv(False), [tf.constant(features), tf.constant(filters)])
    for got, want in zip(mirrored[0], reversed_pairs[0]):  # theoretical
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for t, numerical in zip(mirrored[0], mirrored[1]):
        np.testing.assert_allclose(t, numerical, rtol=1e-6, atol=1e-6)
    # The second derivative (the gradient's own gradient is mirrored again) against the
    # first derivative's numerical gradient.
    dy = tf.constant(rng.standard_normal((n, cout)))

    def input_grad(features, filters):
        with tf.GradientTape() as tape:
            tape.watch(features)
            y = conv(True)(features, filters)
        return tape.gradient(y, features, output_gradients=dy)

    theoretical, numerical = tf.test.compute_gradient(input_grad, [tf.constant(features), tf.constant(filters)])
    np.testing.assert_allclose(theoretical[1], numerical[1], rtol=1e-6, atol=1e-6)


def test_map_is_submanifold_is_refused_for_maps_that_cannot_be(rng):
    from tf_sparseconv._op_library import ops
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


def test_transposed_and_inverse_gradients_match_numerical_gradients(rng):
    coords, features = random_sites(rng, 1, (6, 5, 6), 0.35, 2, np.float64)
    x = make_site_sparse(coords, features, (6, 5, 6), 1)
    coarse = site_conv(x, rng.standard_normal((2, 2, 2, 2, 3)), strides=2, indice_key="d")
    kernel = rng.standard_normal((2, 2, 2, 3, 2))

    def inverse(features, kernel):
        return site_inverse_conv(coarse.with_features(features), kernel, "d").features

    def transposed(features, kernel):
        return site_conv_transpose(x.with_features(features), kernel, strides=2, padding=1).features

    for f, start in ((inverse, coarse.features), (transposed, features)):
        k = kernel if f is inverse else np.swapaxes(kernel, -1, -2)
        theoretical, numerical = tf.test.compute_gradient(f, [tf.constant(start), tf.constant(k)])
        for t, n in zip(theoretical, numerical):
            np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype,tolerance", [(tf.float16, 2e-2), (tf.bfloat16, 6e-2)])
def test_half_precision_matches_float32_within_tolerance(rng, dtype, tolerance):
    coords, features = random_sites(rng, 2, (10, 10, 10), 0.2, 16)
    kernel = (rng.standard_normal((3, 3, 3, 16, 16)) / np.sqrt(27 * 16)).astype(np.float32)
    x = make_site_sparse(coords, features, (10, 10, 10), 2)
    reference = site_conv(x, kernel, subm=True).features.numpy()
    half = site_conv(x.with_features(tf.cast(features, dtype)), tf.cast(kernel, dtype), subm=True)
    assert half.features.dtype == dtype
    scale = np.abs(reference).max()
    np.testing.assert_allclose(tf.cast(half.features, tf.float32).numpy(), reference, atol=tolerance * scale)


def test_results_do_not_depend_on_the_thread_count(rng):
    coords, features = random_sites(rng, 2, (12, 12, 12), 0.2, 8)
    kernel = rng.standard_normal((3, 3, 3, 8, 8)).astype(np.float32)
    x = make_site_sparse(coords, features, (12, 12, 12), 2)

    @tf.function
    def f(features):
        return site_conv(x.with_features(features), kernel, strides=2, padding=1).features

    first = f(features).numpy()
    for _ in range(3):
        np.testing.assert_array_equal(f(features).numpy(), first)


def conv_and_gradients_with(cpu_products, coords, features, kernel, upstream):
    """SiteSparseConv of a submanifold map and both gradients, with the given cpu_products."""
    from tf_sparseconv._op_library import ops
    x = make_site_sparse(coords, features, (9, 9, 9), 2)
    kmap = kernel_map(x, 3, mode="submanifold")
    filters = tf.reshape(kernel, [27, kernel.shape[-2], kernel.shape[-1]])
    with tf.GradientTape() as tape:
        tape.watch([features, filters])
        y = ops.site_sparse_conv(features, filters, kmap.in_rows, kmap.out_rows, kmap.offset_splits,
                                 len(coords), tf.zeros([0], tf.int32), map_is_trusted=True, map_is_submanifold=True,
                                 cpu_products=cpu_products)
    return [t.numpy().astype(np.float64) for t in [y, *tape.gradient(y, [features, filters], output_gradients=upstream)]]


def test_avx2_products_match_the_portable_path(rng):
    """cpu_products='auto' (the AVX2 + FMA tiles where the CPU has them) against 'portable'
    (Eigen's GEMM), forward and both gradients (the gradients pass the attr on)."""
    occupied = rng.random((2, 9, 9, 9)) < 0.3
    coords = np.argwhere(occupied).astype(np.int32)
    # cin/cout: 16-column panels, an 8-column one and a masked tail; rows past whole tiles.
    for cin, cout, dtype in ((5, 37, tf.float32), (16, 16, tf.float32), (24, 8, tf.float16)):
        features = tf.cast(rng.standard_normal((len(coords), cin)), dtype)
        kernel = tf.cast(rng.standard_normal((3, 3, 3, cin, cout)) / np.sqrt(27 * cin), dtype)
        upstream = tf.cast(np.linspace(-1, 1, len(coords) * cout).reshape(len(coords), cout), dtype)
        auto = conv_and_gradients_with("auto", coords, features, kernel, upstream)
        portable = conv_and_gradients_with("portable", coords, features, kernel, upstream)
        for what, a, b in zip(("features", "input gradient", "kernel gradient"), auto, portable):
            # half: both round the same float32 sums to half once.
            tolerance = 2e-3 if dtype == tf.float16 else 1e-5  # fused multiply-adds and another sum order
            np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance * np.max(np.abs(b)),
                                       err_msg=f"{what}, {cin} -> {cout} {dtype.name}")


def test_cpu_products_choices_are_checked():
    from tf_sparseconv._op_library import ops
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="cpu_products"):
        ops.site_sparse_conv(tf.ones([2, 1]), tf.ones([1, 1, 1]), [0], [0], [0, 1], 2, tf.zeros([0], tf.int32),
                             cpu_products="fastest")


def test_empty_sites_give_empty_outputs():
    x = make_site_sparse(np.zeros((0, 4), np.int32), np.zeros((0, 3), np.float32), (4, 4, 4), 2)
    y = site_conv(x, np.ones((3, 3, 3, 3, 5), np.float32), strides=2, padding=1)
    assert y.features.shape == (0, 5) and y.coords.shape == (0, 4)
    assert site_conv(x, np.ones((3, 3, 3, 3, 5), np.float32), subm=True).features.shape == (0, 5)


@pytest.mark.parametrize("coords,match", [
    ([[0, 1, 1], [0, 2, 2], [0, 1, 1]], "sites 0 and 2 have the same coordinates"),
    ([[0, 1, 1], [0, 4, 2]], "coordinate 4 in spatial dimension 0, outside"),
    ([[-1, 1, 1]], "batch index -1, outside"),
    ([[2, 1, 1]], "batch index 2, outside"),
])
def test_bad_sites_are_rejected(coords, match):
    x = make_site_sparse(np.array(coords, np.int32), np.ones((len(coords), 1), np.float32), (4, 4), 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        kernel_map(x, 3, mode="submanifold")


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
    with pytest.raises(ValueError, match="kernel must be"):
        site_conv(x, np.ones((3, 2, 2), np.float32), subm=True)


def test_conv_op_rejects_maps_that_do_not_fit_the_features(rng):
    from tf_sparseconv._op_library import ops
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
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            site_conv(x.with_map("k", bad), kernel, subm=True, indice_key="k")
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):  # the filter gradient checks too
            from tf_sparseconv._op_library import ops
            ops.site_sparse_conv_filter_grad(x.features, tf.ones([len(coords), 4]), bad.in_rows, bad.out_rows,
                                             bad.offset_splits)


def test_cpu_checks_maps_even_when_trusted(rng):
    from tf_sparseconv._op_library import ops
    features = tf.constant(rng.standard_normal((4, 2)), tf.float32)
    bad = dict(in_rows=[0, 1, 2], out_rows=[1, 1, 0], offset_splits=[0, 2, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="output row 1 appears twice"):
        ops.site_sparse_conv(features, tf.ones([2, 2, 3]), **bad, num_out=2, neighbours=tf.zeros([0], tf.int32),
                             map_is_trusted=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="output row 1 appears twice"):
        ops.site_sparse_conv_filter_grad(features, tf.ones([2, 3]), **bad, map_is_trusted=True)


@pytest.mark.parametrize("kwargs", [dict(subm=True), dict(strides=2, padding=1)], ids=["subm", "strided"])
def test_trusted_map_gives_the_results_of_the_untrusted_map(rng, kwargs):
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


# --- neighbour tables (SiteNeighbourTable) ----------------------------------------------------------

def numpy_neighbour_table(in_rows, out_rows, splits, num_out):
    volume = len(splits) - 1
    table = np.full((num_out, volume + 2), -1, np.int64)
    masks = np.zeros(num_out, np.int64)
    for q in range(volume):
        for p in range(splits[q], splits[q + 1]):
            table[out_rows[p], q] = in_rows[p]
            masks[out_rows[p]] |= 1 << q
    order = np.argsort(masks, kind="stable")
    table[:, volume] = masks[order].astype(np.uint32).view(np.int32)
    table[:, volume + 1] = order
    return table


@pytest.mark.parametrize("mode,kernel,strides", [("submanifold", 3, 1), ("strided", 2, 2), ("strided", 3, 2)])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_neighbour_table_matches_numpy(rng, mode, kernel, strides, inverse):
    from tf_sparseconv.site import neighbour_table
    coords, features = random_sites(rng, 2, (7, 6, 7), 0.3, 1)
    x = make_site_sparse(coords, features, (7, 6, 7), 2)
    kmap = kernel_map(x, kernel, strides, mode=mode)
    in_rows, out_rows = kmap.in_rows.numpy(), kmap.out_rows.numpy()
    num_in, num_out = len(coords), int(kmap.out_coords.shape[0])
    if inverse:
        in_rows, out_rows, num_out = out_rows, in_rows, num_in
    expected = numpy_neighbour_table(in_rows, out_rows, kmap.offset_splits.numpy(), num_out)
    table = neighbour_table(kmap, inverse=inverse).numpy()
    np.testing.assert_array_equal(table, expected)
    # Every output row appears once among the sorted rows, its mask beside it, and the
    # masks hold every pair's offset bit.
    volume = kernel ** 3
    assert sorted(table[:, volume + 1]) == list(range(num_out))
    masks = table[:, volume].view(np.uint32)
    assert np.all(np.diff(masks) >= 0)
    expected_masks = np.zeros(num_out, np.uint32)
    for q in range(volume):
        expected_masks[table[:, q] >= 0] |= np.uint32(1 << q)
    np.testing.assert_array_equal(masks, expected_masks[table[:, volume + 1]])


def test_neighbour_table_of_one_offset():
    from tf_sparseconv._op_library import ops
    table = ops.site_neighbour_table(in_rows=[1, 0], out_rows=[0, 2], offset_splits=[0, 2], num_in=2, num_out=3)
    # input row per output row; then the rows sorted by mask (row 1 has none) beside their masks
    np.testing.assert_array_equal(table.numpy(), [[1, 0, 1], [-1, 1, 0], [0, 1, 2]])


def test_neighbour_table_rejects_bad_maps():
    from tf_sparseconv._op_library import ops
    ok = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_in=4, num_out=2)
    assert ops.site_neighbour_table(**ok).shape == (2, 2 + 2 * 1)
    cases = [
        (dict(in_rows=[0, 1, 4]), "in_rows\\[2\\] = 4 is outside \\[0, 4\\)"),
        (dict(out_rows=[1, 1, 0]), "output row 1 appears twice for kernel offset 0"),
        (dict(offset_splits=[0, 3, 2]), "offset_splits must rise"),
        (dict(offset_splits=[0, 1, 2] + [3] * 31), "1 to 32 offsets"),
        (dict(num_in=-1), "non-negative"),
    ]
    for kwargs, match in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            ops.site_neighbour_table(**dict(ok, **kwargs))


def test_conv_checks_a_given_neighbour_table_and_gives_the_same_values(rng):
    from tf_sparseconv._op_library import ops
    coords, features = random_sites(rng, 1, (6, 6, 6), 0.4, 4)
    x = make_site_sparse(coords, features, (6, 6, 6), 1)
    kmap = kernel_map(x, 3, mode="submanifold")
    filters = tf.constant(rng.standard_normal((27, 4, 5)), tf.float32)
    n = len(coords)
    from tf_sparseconv.site import neighbour_table
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
    from tf_sparseconv.site import neighbour_table
    maps = importlib.import_module("tf_sparseconv.site.kernel_map")
    coords, features = random_sites(rng, 2, (8, 8, 8), 0.3, 4, np.float16)
    x = make_site_sparse(coords, features, (8, 8, 8), 2)
    w = tf.constant(rng.standard_normal((3, 3, 3, 4, 4)) / 10, tf.float16)
    wd = tf.constant(rng.standard_normal((2, 2, 2, 4, 8)) / 10, tf.float16)
    wu = tf.constant(rng.standard_normal((2, 2, 2, 8, 4)) / 10, tf.float16)

    def net():
        y = site_conv(site_conv(x, w, subm=True, indice_key="s"), w, subm=True, indice_key="s")
        down = site_conv(y, wd, strides=2, indice_key="d")
        return y, site_inverse_conv(down, wu, "d")
    # On this CPU-only machine no table is built; where a GPU is visible, half types build
    # them under 'auto' (the CPU kernels check the tables and compute from the pairs).
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


def test_which_dataflows_build_neighbour_tables(monkeypatch, rng):
    import importlib
    maps = importlib.import_module("tf_sparseconv.site.kernel_map")
    coords, features = random_sites(rng, 1, (6, 6, 6), 0.4, 2)
    x = make_site_sparse(coords, features, (6, 6, 6), 1)
    small, large = kernel_map(x, 3, mode="submanifold"), kernel_map(x, 5, mode="submanifold")
    half = (tf.float16, tf.bfloat16)
    monkeypatch.setattr(maps, "gpu_visible", lambda: True)
    for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
        assert maps.wants_tables(dtype, small, "auto") == (dtype in half), dtype
        assert maps.wants_tables(dtype, small, "outputs"), dtype
        assert not maps.wants_tables(dtype, small, "pairs"), dtype
        assert not maps.wants_tables(dtype, large, "outputs"), "125 offsets: no table"
        assert not maps.wants_tables(dtype, hand_built(small), "outputs"), "a table is read with a trusted map only"
    monkeypatch.setattr(maps, "gpu_visible", lambda: False)
    assert not maps.wants_tables(tf.float16, small, "auto") and not maps.wants_tables(tf.float32, small, "outputs")


def test_dataflow_choices(rng):
    from tf_sparseconv._op_library import ops
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
    from tf_sparseconv._op_library import ops
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
