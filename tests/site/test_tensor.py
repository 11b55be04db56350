"""The site-sparse tensor: its type checks, and the tensor in tf.function, tf.data and a
SavedModel."""
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv.site import site_conv
from tf_sparseconv.site.tensor import SiteSparseTensor, make_site_sparse
from tests.device import CPU
from tests.site.helpers import random_sites


def test_site_tensor_in_tf_function_tf_data_and_saved_model(rng, tmp_path):
    with tf.device(CPU):  # the CPU's sums, the same in every run (the GPU's may be added in another order)
        coords, features = random_sites(rng, 2, (6, 6, 6), 0.3, 2)
        x = make_site_sparse(coords, features, (6, 6, 6), 2)
        kernel = tf.Variable(rng.standard_normal((3, 3, 3, 2, 4)).astype(np.float32))
        down = tf.Variable(rng.standard_normal((3, 3, 3, 4, 2)).astype(np.float32))

        class Net(tf.Module):
            def __init__(self):
                self.kernel, self.down = kernel, down

            @tf.function(input_signature=[SiteSparseTensor.spec([6, 6, 6], 2)])
            def __call__(self, x):
                y = site_conv(x, self.kernel, subm=True, indice_key="s1")
                return site_conv(y, self.down, strides=2, padding=1).features

        net = Net()
        eager = site_conv(site_conv(x, kernel, subm=True), down, strides=2, padding=1).features.numpy()
        np.testing.assert_allclose(net(x).numpy(), eager, rtol=1e-5)
        tf.saved_model.save(net, str(tmp_path / "net"))
        np.testing.assert_allclose(tf.saved_model.load(str(tmp_path / "net"))(x).numpy(), eager, rtol=1e-5)
        dataset = tf.data.Dataset.from_tensors(x).repeat(2).map(lambda s: s.with_features(s.features * 2))
        for item in dataset:
            assert isinstance(item, SiteSparseTensor)
            np.testing.assert_array_equal(item.features.numpy(), features * 2)


def test_type_checks():
    with pytest.raises(TypeError, match="must be int32"):
        SiteSparseTensor(tf.zeros([1, 3], tf.int64), tf.zeros([1, 2]), tf.constant([4, 4]), tf.constant(1))
    with pytest.raises(ValueError, match="2 sites but 3 feature rows"):
        make_site_sparse(np.zeros((2, 3), np.int32), np.zeros((3, 2), np.float32), (4, 4), 1)
    with pytest.raises(ValueError, match="coords must be"):
        make_site_sparse(np.zeros((2, 4), np.int32), np.zeros((2, 2), np.float32), (4, 4), 1)
    # a batch of no samples, or of -1, was accepted (an op refused it later, or nothing did)
    for batch in (0, -1):
        with pytest.raises(ValueError, match=f"make_site_sparse: batch_size must be a scalar >= 1, got {batch}"):
            make_site_sparse(np.zeros((2, 3), np.int32), np.zeros((2, 2), np.float32), (4, 4), batch)
    with pytest.raises(TypeError, match=r"make_site_sparse: kernel_maps must be a dict of indice_key \(str\) -> "
                                        r"KernelMap, got list"):
        make_site_sparse(np.zeros((2, 3), np.int32), np.zeros((2, 2), np.float32), (4, 4), 1, kernel_maps=[1])
    # A component of the wrong rank is named, with the layout it needs.
    for parts, match in [
            ((np.zeros((1, 2, 3), np.int32), np.zeros((1, 2)), [4, 4], 1), r"coords must be \[N, 1 \+ d\]"),
            ((np.zeros((2, 3), np.int32), np.zeros(2), [4, 4], 1), r"features must be \[N, C\]"),
            ((np.zeros((2, 3), np.int32), np.zeros((2, 2)), [4, 4], [1]), "batch_size must be a scalar")]:
        with pytest.raises(ValueError, match=f"SiteSparseTensor {match}"):
            SiteSparseTensor(*(tf.constant(p, tf.int32) if i != 1 else tf.constant(p, tf.float32)
                               for i, p in enumerate(parts)))


@pytest.mark.parametrize("field,value,error,message", [
    # int64 2^32 + 1 used to wrap to 1 (then "duplicate sites" or a wrong site).
    ("coords", np.array([[0, 2**32 + 1, 0]]), ValueError, r"coords must lie in the int32 range.*got 4294967297"),
    ("coords", np.array([[0, 1.7, 0]]), TypeError, "coords must be integers \\(int32\\), got float64"),
    ("coords", np.array([[0, 1, 0]], bool), TypeError, "coords must be integers \\(int32\\), got bool"),
    # 2^31 used to wrap to -2^31 and fail as "Dimension -2147483648 must be >= 0".
    ("spatial_shape", np.array([2**31, 4]), ValueError, "spatial_shape must lie in the int32 range"),
    ("spatial_shape", (0, 4), ValueError, "spatial_shape must be a vector of extents >= 1, got \\[0, 4\\]"),
    ("batch_size", 1.5, TypeError, "batch_size must be integers"),
    ("features", np.array([[1 + 2j]]), TypeError, "features must be real numbers, got complex128"),
])
def test_make_site_sparse_refuses_what_a_cast_would_change(field, value, error, message):
    args = dict(coords=[[0, 1, 0]], features=[[1.0]], spatial_shape=(4, 4), batch_size=1)
    args[field] = value
    with pytest.raises(error, match=message):
        make_site_sparse(**args)


def test_make_site_sparse_checks_int64_coordinates_in_a_graph():
    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def coords_of(c):
        return make_site_sparse(c, tf.ones([tf.shape(c)[0], 1]), (4, 4), 1).coords

    np.testing.assert_array_equal(coords_of(tf.constant([[0, 3, 1]], tf.int64)).numpy(), [[0, 3, 1]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="coords must lie in the int32 range"):
        coords_of(tf.constant([[0, 2**32 + 1, 0]], tf.int64))


@pytest.mark.parametrize("bad", [2**32 + 1, 2**31, -2**31 - 1, -(2**40)])
def test_a_site_network_refuses_int64_coordinates_beyond_int32(rng, bad):
    # Beyond int32, a coordinate or batch index in a traced network fails the call with
    # InvalidArgumentError (the range check before the cast), never wraps into a site.
    kernel = tf.constant(rng.standard_normal((3, 3, 1, 2)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def conv(c):
        x = make_site_sparse(c, tf.ones([tf.shape(c)[0], 1]), (4, 4), 1)
        return site_conv(x, kernel, subm=True).features

    np.testing.assert_array_equal(conv(tf.constant([[0, 1, 1]], tf.int64)).numpy().shape, (1, 2))
    for row in ([0, bad, 1], [bad, 1, 1]):
        with pytest.raises(tf.errors.InvalidArgumentError, match="int32 range"):
            conv(tf.constant([[0, 0, 0], row], tf.int64))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_make_site_sparse_refuses_non_finite_features_unless_allowed(bad):
    features = np.array([[1.0, 2.0], [3.0, bad]], np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="make_site_sparse: features hold NaN or infinite"):
        make_site_sparse([[0, 1, 0], [0, 2, 2]], features, (4, 4), 1)
    x = make_site_sparse([[0, 1, 0], [0, 2, 2]], features, (4, 4), 1, non_finite="allow")
    np.testing.assert_array_equal(x.features.numpy(), features)
    with pytest.raises(ValueError, match="non_finite must be 'raise' or 'allow'"):
        make_site_sparse([[0, 1, 0]], [[1.0]], (4, 4), 1, non_finite="drop")


def test_a_tape_watching_the_given_features_sees_their_gradient(device, rng):
    # Eager make_site_sparse keeps the caller's features tensor (its finite check has run),
    # so watching that tensor around the ops that use it gives its gradient.
    coords, features = random_sites(rng, 1, (5, 5, 5), 0.3, 2)
    kernel = tf.constant(rng.standard_normal((3, 3, 3, 2, 3)).astype(np.float32))
    with tf.device(device):
        features = tf.constant(features)
        x = make_site_sparse(coords, features, (5, 5, 5), 1)
        assert x.features is features
        with tf.GradientTape() as tape:
            tape.watch(features)
            y = site_conv(x, kernel, subm=True).features
        grad = tape.gradient(y, features, output_gradients=tf.ones_like(y))
    # d(sum y)/d(x_i) = sum over the output sites j near i of kernel[i - j + 1].sum(over Cout).
    w = kernel.numpy().sum(-1)
    expected = np.zeros_like(grad.numpy())
    for i, ci in enumerate(coords):
        for cj in coords:
            k = ci[1:] - cj[1:] + 1
            if ci[0] == cj[0] and np.all((k >= 0) & (k <= 2)):
                expected[i] += w[tuple(k)]
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-5, atol=1e-5)
