"""The site convolution's epilogue (SiteSparseConv's `epilogue`, `epsilon` and `activation`:
act(n(v) * scale + bias) per output column, n a batch norm's normalisation by given
statistics, inside the op) and SiteConvBlock (a convolution, its batch
norm and a ReLU, the batch norm folded into the epilogue in inference): the same values as
the separate ops on every convolution kind and device, rows without pairs, the GPU's
dataflows in half precision, float64 numeric gradients, bad epilogues refused, and the
block's inference, training, gradients and saving."""
import numpy as np
import pytest
import tensorflow as tf
import keras

from tf_sparseconv._op_library import ops
from tf_sparseconv.site import (FusedBatchNormalization, SiteConvBlock, SiteFeatures, SparseConv3D,
                                SparseInverseConv3D, SubMConv3D, site_conv, site_conv_transpose, site_input,
                                site_inverse_conv)
from tf_sparseconv.site.keras_io import as_site_keras_inputs
from tf_sparseconv.site.tensor import make_site_sparse

from tests.device import CPU, assert_on
from tests.site.helpers import random_sites

SHAPE, BATCH = (7, 6, 7), 2
KINDS = ["subm", "pointwise", "strided", "transpose", "inverse"]
PARTS = {"bias": dict(bias=True), "scale-bias": dict(scale=True, bias=True), "relu": dict(activation="relu"),
         "scale-relu": dict(scale=True, activation="relu"), "all": dict(scale=True, bias=True, activation="relu"),
         "normalize": dict(normalize=True), "normalize-bias-relu": dict(normalize=True, bias=True, activation="relu"),
         "batch-norm-relu": dict(normalize=True, scale=True, bias=True, activation="relu")}


def convolve(kind, x, kernel, **epilogue):
    """site_conv of one kind with the epilogue's keyword arguments."""
    if kind == "subm":
        return site_conv(x, kernel, subm=True, **epilogue)
    if kind == "pointwise":
        return site_conv(x, kernel[1:2, 1:2, 1:2], subm=True, **epilogue)
    if kind == "strided":
        return site_conv(x, kernel, strides=2, padding=1, **epilogue)
    if kind == "transpose":
        return site_conv_transpose(x, kernel, strides=2, **epilogue)
    down = site_conv(x, tf.ones([3, 3, 3, kernel.shape[-2], kernel.shape[-2]], kernel.dtype), strides=2,
                     indice_key="down")
    return site_inverse_conv(down, kernel, "down", **epilogue)


def epilogue_values(parts, rng, cout, dtype=np.float32):
    """site_conv's keyword arguments for PARTS[parts] with random vectors."""
    spec = PARTS[parts]
    out = {}
    if spec.get("scale"):
        out["scale"] = rng.uniform(-2.0, 2.0, cout).astype(dtype)
    if spec.get("bias"):
        out["bias"] = rng.standard_normal(cout).astype(dtype)
    if spec.get("activation"):
        out["activation"] = spec["activation"]
    if spec.get("normalize"):
        out["normalize"] = (rng.standard_normal(cout).astype(dtype), rng.uniform(0.2, 3.0, cout).astype(dtype),
                            float(rng.choice([1e-3, 1e-5, 0.5])))
    return out


def separately(z, scale=None, bias=None, activation=None, normalize=None):
    """The epilogue by NumPy on the convolution's plain output z."""
    z = np.asarray(z, np.float64)
    if normalize is not None:
        mean, variance, epsilon = normalize
        z = (z - mean) / np.sqrt(variance.astype(np.float64) + epsilon)
    if scale is not None:
        z = z * scale
    if bias is not None:
        z = z + bias
    return np.maximum(z, 0.0) if activation == "relu" else z


@pytest.mark.parametrize("parts", sorted(PARTS))
@pytest.mark.parametrize("kind", KINDS)
def test_the_epilogue_gives_the_separate_ops_values(rng, kind, parts, device):
    cin, cout = 4, 8
    coords, features = random_sites(rng, BATCH, SHAPE, 0.3, cin)
    kernel = rng.standard_normal((3, 3, 3, cin, cout)).astype(np.float32)
    epilogue = epilogue_values(parts, rng, cout)
    with tf.device(device):
        x = make_site_sparse(coords, features, SHAPE, BATCH)
        plain = convolve(kind, x, tf.constant(kernel))
        fused = convolve(kind, x, tf.constant(kernel), **epilogue)
        assert_on(device, fused.features)
    np.testing.assert_array_equal(fused.coords.numpy(), plain.coords.numpy())
    want = separately(plain.features.numpy(), **epilogue)
    scale = max(np.abs(want).max(), 1.0)
    np.testing.assert_allclose(fused.features.numpy(), want, rtol=1e-5, atol=1e-5 * scale)
    if epilogue.get("activation") == "relu":
        assert (fused.features.numpy() >= 0).all() and (fused.features.numpy() == 0).any()


def raw_conv(features, filters, in_rows, out_rows, splits, num_out, **kwargs):
    return ops.site_sparse_conv(features, filters, in_rows, out_rows, splits, num_out, tf.zeros([0], tf.int32),
                                **kwargs)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16])
def test_rows_without_pairs_get_the_epilogue_of_zero_sums(rng, dtype, device):
    """Output rows 1 and 3 have no pair: their values are act(0 * scale + shift) (and with
    statistics, act((0 - mean) / sqrt(variance + epsilon) * scale + shift))."""
    acc = tf.float64 if dtype == tf.float64 else tf.float32
    features = rng.standard_normal((3, 8))
    filters = rng.standard_normal((2, 8, 8))
    scale, shift = rng.uniform(0.5, 2.0, 8), rng.standard_normal(8)
    with tf.device(device):
        args = (tf.cast(features, dtype), tf.cast(filters, dtype), [0, 2, 1], [0, 2, 2], [0, 2, 3], 4)
        plain = raw_conv(*args)
        fused = raw_conv(*args, epilogue=[tf.cast(scale, acc), tf.cast(shift, acc)], activation="relu")
        mean, variance = rng.standard_normal(8), rng.uniform(0.5, 2.0, 8)
        normalized = raw_conv(*args, epilogue=[tf.cast(v, acc) for v in (mean, variance, scale, shift)],
                              epsilon=0.125, activation="relu")
    tolerance = dict(rtol=1e-3, atol=1e-3) if dtype == tf.float16 else dict(rtol=1e-6, atol=1e-6)
    got = tf.cast(fused, tf.float64).numpy()
    np.testing.assert_allclose(got[[1, 3]], np.broadcast_to(np.maximum(shift, 0.0), (2, 8)), **tolerance)
    got_normalized = tf.cast(normalized, tf.float64).numpy()
    np.testing.assert_allclose(got_normalized[[1, 3]], np.broadcast_to(
        np.maximum(-mean / np.sqrt(variance + 0.125) * scale + shift, 0.0), (2, 8)), **tolerance)
    plain = tf.cast(plain, tf.float64).numpy()
    for value, want in ((got, separately(plain, scale, shift, "relu")),
                        (got_normalized, separately(plain, scale, shift, "relu", (mean, variance, 0.125)))):
        np.testing.assert_allclose(value, want, atol=2e-2 * np.abs(want).max() if dtype == tf.float16 else 1e-5)


@pytest.mark.parametrize("dtype,dataflow", [(tf.float16, "pairs"), (tf.float16, "outputs"), (tf.bfloat16, "outputs"),
                                            (tf.float32, "pairs"), (tf.float32, "outputs")])
def test_the_gpu_dataflows_apply_the_epilogue_as_the_cpu(rng, gpu, dtype, dataflow):
    """Half precision from a neighbour table (the output-stationary tiles store each row
    through the epilogue), the pairs (the accumulator's conversion applies it) and float32
    (a pass after the pair tiles) against the CPU in float32."""
    cin, cout = 16, 24
    if dtype == tf.float32 and dataflow == "outputs":  # float's output-stationary tiles multiply in TF32 only
        tf.config.experimental.enable_tensor_float_32_execution(True)
    coords, features = random_sites(rng, BATCH, (10, 10, 10), 0.2, cin)
    kernel = (rng.standard_normal((3, 3, 3, cin, cout)) / np.sqrt(27 * cin)).astype(np.float32)
    epilogue = epilogue_values("batch-norm-relu", rng, cout)
    with tf.device(CPU):
        want = site_conv(make_site_sparse(coords, features, (10, 10, 10), BATCH), kernel, subm=True,
                         **epilogue).features.numpy()
        low_features, low_kernel = tf.cast(features, dtype), tf.cast(kernel, dtype)
    with tf.device(gpu):
        x = make_site_sparse(coords, low_features, (10, 10, 10), BATCH)
        got = site_conv(x, low_kernel, subm=True, indice_key="subm", dataflow=dataflow, **epilogue).features
        assert_on(gpu, got)
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tolerance = {tf.float16: 2e-2, tf.bfloat16: 6e-2, tf.float32: 2e-3 if tf32 else 1e-5}[dtype] * np.abs(want).max()
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want, atol=tolerance)
    assert (tf.cast(got, tf.float32).numpy() >= 0).all()


@pytest.mark.parametrize("cout", [1, 2, 3, 6, 8, 12])
@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64])
def test_the_pairs_epilogue_on_the_gpu_takes_every_vector_width(rng, gpu, dtype, cout):
    """The pass after the pair tiles reads 4, 2 or 1 adjacent values per thread as cout and
    the type allow (a double at most 2): every width against the CPU in the same type."""
    cin = 5
    coords, features = random_sites(rng, BATCH, (8, 8, 8), 0.3, cin)
    kernel = rng.standard_normal((3, 3, 3, cin, cout)) / np.sqrt(27 * cin)
    reference = tf.float32 if dtype == tf.float16 else dtype
    # A random normalisation can leave a single column at zero everywhere after the ReLU, and
    # zeros would compare equal whatever the GPU read: draw until a tenth of the outputs live.
    for _ in range(50):
        epilogue = epilogue_values("batch-norm-relu", rng, cout, np.float64 if dtype == tf.float64 else np.float32)
        with tf.device(CPU):
            want = site_conv(make_site_sparse(coords, tf.cast(features, reference), (8, 8, 8), BATCH),
                             tf.cast(kernel, reference), subm=True, **epilogue).features.numpy().astype(np.float64)
        if np.count_nonzero(want) >= 0.1 * want.size:
            break
    with tf.device(gpu):
        x = make_site_sparse(coords, tf.cast(features, dtype), (8, 8, 8), BATCH)
        got = site_conv(x, tf.cast(kernel, dtype), subm=True, indice_key="subm", dataflow="pairs", **epilogue).features
        assert_on(gpu, got)
    tf32 = dtype == tf.float32 and tf.config.experimental.tensor_float_32_execution_enabled()
    scale = np.abs(want).max()
    tolerance = {tf.float16: 2e-2, tf.float32: 2e-3 if tf32 else 1e-5, tf.float64: 1e-12}[dtype] * scale
    got = tf.cast(got, tf.float64).numpy()
    assert got.shape == want.shape and np.count_nonzero(want) >= 0.1 * want.size
    np.testing.assert_allclose(got, want, atol=tolerance)
    assert (got >= 0).all()


@pytest.mark.soft_placement
@pytest.mark.parametrize("kind,form", [("subm", "bias"), ("subm", "scale-bias"), ("strided", "scale-bias"),
                                       ("inverse", "scale-bias"), ("subm", "batch-norm"), ("strided", "batch-norm")])
def test_epilogue_gradients_match_numerical_gradients_in_float64(rng, kind, form, device):
    cin, cout = 2, 3
    coords, features = random_sites(rng, BATCH, (5, 4, 5), 0.35, cin, np.float64)
    kernel = rng.standard_normal((3, 3, 3, cin, cout))
    vectors = [rng.standard_normal(cout)]  # bias
    if form != "bias":
        vectors.insert(0, rng.uniform(0.5, 2.0, cout))  # scale
    if form == "batch-norm":
        vectors[:0] = [rng.standard_normal(cout), rng.uniform(0.5, 2.0, cout)]  # mean, variance

    def f(features, kernel, *vectors):
        epilogue = dict(bias=vectors[-1])
        if len(vectors) >= 2:
            epilogue["scale"] = vectors[-2]
        if len(vectors) == 4:
            epilogue["normalize"] = (vectors[0], vectors[1], 0.25)
        y = convolve(kind, x.with_features(features), kernel, **epilogue).features
        assert_on(device, y)
        return y

    with tf.device(device):
        x = make_site_sparse(coords, features, (5, 4, 5), BATCH)
        theoretical, numerical = tf.test.compute_gradient(
            f, [tf.constant(features), tf.constant(kernel), *map(tf.constant, vectors)])
    assert len(theoretical) == 2 + len(vectors)
    for t, n in zip(theoretical, numerical):
        assert np.any(t)
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


@pytest.mark.soft_placement
def test_relu_epilogue_gradients_are_those_of_the_separate_ops(rng, device):
    """The fused ReLU's gradient (masked by the output) equals autodiff of the separate
    ops; float64, so the comparison is exact up to rounding of the same sums."""
    cin, cout = 3, 5
    coords, features = random_sites(rng, BATCH, SHAPE, 0.35, cin, np.float64)
    kernel = tf.constant(rng.standard_normal((3, 3, 3, cin, cout)))
    scale, bias = tf.constant(rng.uniform(-2.0, 2.0, cout)), tf.constant(rng.standard_normal(cout))
    upstream = rng.standard_normal
    with tf.device(device):
        x = make_site_sparse(coords, features, SHAPE, BATCH)
        f = tf.constant(features)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([f, kernel, scale, bias])
            fused = site_conv(x.with_features(f), kernel, subm=True, scale=scale, bias=bias,
                              activation="relu").features
            plain = tf.nn.relu(site_conv(x.with_features(f), kernel, subm=True).features * scale + bias)
            weights = tf.constant(upstream(plain.shape))
            fused_loss, plain_loss = tf.reduce_sum(fused * weights), tf.reduce_sum(plain * weights)
        got = tape.gradient(fused_loss, [f, kernel, scale, bias])
        want = tape.gradient(plain_loss, [f, kernel, scale, bias])
    for g, w in zip(got, want):
        assert np.any(w.numpy())
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("epilogue,phrase", [
    (lambda: [tf.zeros([4], tf.float64)], "must be float for these features"),
    (lambda: [tf.zeros([5])], r"must be \[Cout\] = \[4\]"),
    (lambda: [tf.zeros([4, 1])], r"must be \[Cout\] = \[4\]"),
    (lambda: [tf.zeros([4])] * 3, "got 3 tensors"),
    (lambda: [tf.zeros([4])] * 5, "got 5 tensors"),
    (lambda: [tf.zeros([4]), tf.zeros([3]), tf.zeros([4]), tf.zeros([4])], r"variance must be \[Cout\] = \[4\]"),
])
def test_bad_epilogues_are_refused(epilogue, phrase, device):
    with tf.device(device):
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=phrase):
            raw_conv(tf.ones([2, 3]), tf.ones([1, 3, 4]), [0], [0], [0, 1], 2, epilogue=epilogue())


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_epsilon_is_refused(epsilon, device):
    with tf.device(device):
        with pytest.raises(tf.errors.InvalidArgumentError, match="epsilon must be a positive finite float"):
            raw_conv(tf.ones([2, 3]), tf.ones([1, 3, 4]), [0], [0], [0, 1], 2, epilogue=[tf.zeros([4])] * 4,
                     epsilon=epsilon)


def test_bad_epilogue_arguments_are_refused_by_the_wrappers(rng):
    coords, features = random_sites(rng, 1, SHAPE, 0.3, 2)
    x = make_site_sparse(coords, features, SHAPE, 1)
    kernel = tf.ones([3, 3, 3, 2, 4])
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        site_conv(x, kernel, subm=True, activation="tanh")
    with pytest.raises(ValueError, match=r"site_conv: the scale must be \[Cout\] = \[4\]"):
        site_conv(x, kernel, subm=True, scale=tf.ones([3]))
    with pytest.raises(ValueError, match=r"site_conv_transpose: the bias must be \[Cout\]"):
        site_conv_transpose(x, kernel, bias=tf.ones([2, 2]))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="activation"):
        raw_conv(tf.ones([2, 3]), tf.ones([1, 3, 4]), [0], [0], [0, 1], 2, activation="tanh")
    with pytest.raises(ValueError, match="normalize must be"):
        site_conv(x, kernel, subm=True, normalize=(tf.zeros([4]), tf.ones([4])))
    with pytest.raises(ValueError, match="epsilon must be a positive float"):
        site_conv(x, kernel, subm=True, normalize=(tf.zeros([4]), tf.ones([4]), 0.0))
    with pytest.raises(ValueError, match="needs both a mean and a variance"):
        site_conv(x, kernel, subm=True, normalize=(None, tf.ones([4]), 1e-3))


def test_a_conv_layer_runs_its_relu_inside_the_op(rng):
    """activation='relu' on a site convolution layer is the op's epilogue (no Relu op in the
    traced graph); any other activation still runs after the op."""
    coords, features = random_sites(rng, BATCH, SHAPE, 0.3, 4)
    x = as_site_keras_inputs(make_site_sparse(coords, features, SHAPE, BATCH))
    relu = SubMConv3D(6, 3, activation="relu", bias_initializer="random_normal")
    tanh = SubMConv3D(6, 3, activation="tanh", bias_initializer="random_normal")
    linear = SubMConv3D(6, 3, bias_initializer="random_normal")
    for layer in (relu, tanh, linear):
        layer(x)
    for layer in (tanh, linear):
        layer.set_weights(relu.get_weights())
    got = relu(x)["features"].numpy()
    plain = linear(x)["features"].numpy()
    np.testing.assert_allclose(got, np.maximum(plain, 0.0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tanh(x)["features"].numpy(), np.tanh(plain), rtol=1e-5, atol=1e-6)
    graph = tf.function(lambda: relu(x)["features"]).get_concrete_function().graph
    types = {op.type for op in graph.get_operations()}
    assert "Relu" not in types and "BiasAdd" not in types
    convs = [op for op in graph.get_operations() if op.type.endswith("SiteSparseConv")]
    assert [op.get_attr("activation") for op in convs] == [b"relu"]


def block_and_layers(rng, norm_class, activation, cin=4, cout=6, use_bias=True, dtype="float32"):
    """A SiteConvBlock on random sites, and a model of the same layers applied one after
    the other (SubMConv3D, SiteFeatures(norm), ReLU); random moving statistics and weights."""
    conv = SubMConv3D(cout, 3, use_bias=use_bias, bias_initializer="random_normal", indice_key="s", dtype=dtype)
    norm = norm_class(momentum=0.5, epsilon=1e-3, beta_initializer="random_normal",
                      gamma_initializer="random_uniform", dtype=dtype)
    block = SiteConvBlock(conv, norm, activation=activation)
    inputs = site_input(SHAPE, cin, dtype=dtype)
    block_model = keras.Model(inputs, block(inputs))
    norm.moving_mean.assign(rng.standard_normal(cout))
    norm.moving_variance.assign(rng.uniform(0.5, 2.0, cout))
    conv2 = SubMConv3D(cout, 3, use_bias=use_bias, indice_key="s", dtype=dtype)
    norm2 = norm_class(momentum=0.5, epsilon=1e-3, dtype=dtype)
    h = SiteFeatures(norm2)(conv2(inputs))
    if activation == "relu":
        h = SiteFeatures(keras.layers.ReLU())(h)
    layers_model = keras.Model(inputs, h)
    conv2.set_weights(conv.get_weights())
    norm2.set_weights(norm.get_weights())
    return block, block_model, layers_model


def site_batch(rng, cin=4, dtype=np.float32):
    coords, features = random_sites(rng, BATCH, SHAPE, 0.3, cin)
    return as_site_keras_inputs(make_site_sparse(coords, features.astype(dtype), SHAPE, BATCH))


@pytest.mark.parametrize("norm_class", [keras.layers.BatchNormalization, FusedBatchNormalization])
@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("use_bias", [True, False])
def test_block_inference_equals_the_separate_layers(rng, norm_class, activation, use_bias, device):
    with tf.device(device):
        block, block_model, layers_model = block_and_layers(rng, norm_class, activation, use_bias=use_bias)
        x = site_batch(rng)
        got = block_model(x, training=False)["features"]
        want = layers_model(x, training=False)["features"].numpy()
        assert_on(device, got)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    graph = tf.function(lambda: block_model(x, training=False)["features"]).get_concrete_function().graph
    convs = [op for op in graph.get_operations() if op.type.endswith("SiteSparseConv")]
    assert len(convs) == 1 and len(convs[0].inputs) == 11  # mean, variance, scale and shift in the epilogue
    assert not [op for op in graph.get_operations() if op.type.endswith("RowNormalize") or op.type == "Relu"]
    # nothing computed on the statistics before the op but the conv's bias taken from the mean
    arithmetic = {"Rsqrt", "Sqrt", "Mul", "AddV2", "Add", "RealDiv"}
    assert len([op for op in graph.get_operations() if op.type in arithmetic | {"Sub"}]) == int(use_bias)


@pytest.mark.parametrize("norm_class", [keras.layers.BatchNormalization, FusedBatchNormalization])
def test_block_training_equals_the_separate_layers_and_updates_the_statistics(rng, norm_class, device):
    with tf.device(device):
        block, block_model, layers_model = block_and_layers(rng, norm_class, "relu")
        x = site_batch(rng)
        with tf.GradientTape(persistent=True) as tape:
            got = block_model(x, training=True)["features"]
            want = layers_model(x, training=True)["features"]
            got_loss, want_loss = tf.reduce_sum(got * got), tf.reduce_sum(want * want)
        got_grads = tape.gradient(got_loss, block_model.trainable_weights)
        want_grads = tape.gradient(want_loss, layers_model.trainable_weights)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert len(got_grads) == len(want_grads) == 4  # kernel, bias, gamma, beta
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-4)
    norm = block.norm
    other = [layer.layer for layer in layers_model.layers if isinstance(layer, SiteFeatures)][0]
    np.testing.assert_allclose(norm.moving_mean.numpy(), other.moving_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norm.moving_variance.numpy(), other.moving_variance.numpy(), rtol=1e-5, atol=1e-6)


def test_block_with_a_frozen_norm_runs_folded_in_training(rng):
    """A batch norm that is not trainable normalises by its moving statistics (Keras' rule),
    so the block folds it in training too."""
    block, block_model, layers_model = block_and_layers(rng, FusedBatchNormalization, "relu")
    block.norm.trainable = False
    [layer for layer in layers_model.layers if isinstance(layer, SiteFeatures)][0].layer.trainable = False
    x = site_batch(rng)
    np.testing.assert_allclose(block_model(x, training=True)["features"].numpy(),
                               layers_model(x, training=False)["features"].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_block_in_half_precision_on_the_gpu_matches_the_separate_layers(rng, gpu, dtype):
    """The folded batch norm on the output-stationary tiles against the separate layers'
    half-precision rows (each rounded once more there)."""
    with tf.device(gpu):
        block, block_model, layers_model = block_and_layers(rng, FusedBatchNormalization, "relu", cin=16, cout=32,
                                                            dtype=dtype.name)
        x = site_batch(rng, cin=16, dtype=dtype.as_numpy_dtype)
        got = tf.cast(block_model(x, training=False)["features"], tf.float32)
        want = tf.cast(layers_model(x, training=False)["features"], tf.float32).numpy()
        assert_on(gpu, got)
    tolerance = (1e-2 if dtype == tf.float16 else 5e-2) * np.abs(want).max()
    np.testing.assert_allclose(got.numpy(), want, atol=tolerance)


def test_block_saves_and_loads(rng, tmp_path):
    block, block_model, _ = block_and_layers(rng, FusedBatchNormalization, "relu")
    x = site_batch(rng)
    path = str(tmp_path / "block.keras")
    block_model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(x, training=False)["features"].numpy(),
                               block_model(x, training=False)["features"].numpy(), rtol=1e-6, atol=1e-6)
    config = [layer for layer in loaded.layers if isinstance(layer, SiteConvBlock)][0].get_config()
    assert config["activation"] == "relu"


def test_block_arguments_are_checked():
    with pytest.raises(ValueError, match="no activation of its own"):
        SiteConvBlock(SubMConv3D(4, 3, activation="relu"), FusedBatchNormalization())
    with pytest.raises(TypeError, match="norm must be a BatchNormalization"):
        SiteConvBlock(SubMConv3D(4, 3), keras.layers.LayerNormalization())
    with pytest.raises(TypeError, match="conv must be a _SiteConv"):
        SiteConvBlock(keras.layers.Dense(4), FusedBatchNormalization())
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        SiteConvBlock(SubMConv3D(4, 3), FusedBatchNormalization(), activation="gelu")


def test_blocks_of_every_convolution_kind(rng):
    """Strided and inverse convolutions in blocks, folded, against their layers in sequence."""
    inputs = site_input(SHAPE, 4)
    down = SiteConvBlock(SparseConv3D(6, 2, strides=2, indice_key="d", use_bias=False), FusedBatchNormalization(),
                         activation="relu")
    up = SiteConvBlock(SparseInverseConv3D(4, indice_key="d"), keras.layers.BatchNormalization())
    model = keras.Model(inputs, up(down(inputs)))
    for norm in (down.norm, up.norm):
        norm.moving_mean.assign(rng.standard_normal(norm.moving_mean.shape))
        norm.moving_variance.assign(rng.uniform(0.5, 2.0, norm.moving_variance.shape))
    x = site_batch(rng)
    h = make_site_sparse(x["coords"], x["features"], SHAPE, BATCH)
    h = down.conv.convolve(h)
    h = h.with_features(tf.nn.relu(down.norm(h.features, training=False)))
    h = up.conv.convolve(h, bias=up.conv.bias)
    want = up.norm(h.features, training=False).numpy()
    np.testing.assert_allclose(model(x, training=False)["features"].numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_bias", [True, False])
def test_a_pointwise_block_normalises_in_one_row_op(rng, use_bias, device):
    """A 1 x 1 x 1 submanifold convolution is a matmul (no op of its own to take the
    epilogue): its block's inference applies the batch norm by one RowNormalize pass, not by
    TensorFlow's element-wise ops."""
    conv = SubMConv3D(6, 1, use_bias=use_bias, bias_initializer="random_normal")
    block = SiteConvBlock(conv, FusedBatchNormalization(beta_initializer="random_normal"), activation="relu")
    with tf.device(device):
        x = site_batch(rng)
        y = block(x, training=False)
        block.norm.moving_mean.assign(rng.standard_normal(6))
        block.norm.moving_variance.assign(rng.uniform(0.5, 2.0, 6))
        got = block(x, training=False)["features"].numpy()
        h = conv(x)
        want = np.maximum(block.norm(h["features"], training=False).numpy(), 0.0)
    assert y["features"].shape[-1] == 6
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    graph = tf.function(lambda: block(x, training=False)["features"]).get_concrete_function().graph
    types = [op.type for op in graph.get_operations()]
    assert sum(t.endswith("RowNormalize") for t in types) == 1
    assert not {"Rsqrt", "Mul", "RealDiv"} & set(types)
