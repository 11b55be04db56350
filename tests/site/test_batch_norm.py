"""The row batch-norm ops (RowBatchNorm, its gradient, RowScaleShift, RowNormalize) against a float64
NumPy reference, their checks, and FusedBatchNormalization against
keras.layers.BatchNormalization, the computation it replaces: outputs, moving statistics
and gradients on fresh random rows, float32 and float16 (against a float64 Keras
reference), on each device; the cases left to Keras' own computation; a batch without
rows; the GPU against the CPU and its reruns; the layer inside a site model and its .keras
round trip."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv import keras_layers as kl
from tf_sparseconv.site import batch_norm
from tf_sparseconv._op_library import ops
from tf_sparseconv.site.tensor import make_site_sparse
from tests.device import CPU, assert_on
from tests.site.helpers import random_sites


def rows(rng, n, c):
    """Rows with a mean and a spread of their own per channel (normalisation matters)."""
    return (rng.normal(0, 1, (n, c)) * rng.uniform(0.5, 3, c) + rng.uniform(-2, 2, c)).astype(np.float32)


def twin_layers(rng, c, dtype, **kwargs):
    """(ours, Keras') built with the same random gamma, beta and moving statistics."""
    ours = batch_norm.FusedBatchNormalization(dtype=dtype, **kwargs)
    theirs = keras.layers.BatchNormalization(dtype=dtype, **kwargs)
    for layer in (ours, theirs):
        layer.build((None, c))
    values = {"gamma": rng.uniform(0.5, 1.5, c), "beta": rng.normal(0, 0.5, c), "moving_mean": rng.normal(0, 1, c),
              "moving_variance": rng.uniform(0.5, 2, c)}
    for layer in (ours, theirs):
        for name, value in values.items():
            if getattr(layer, name, None) is not None:
                getattr(layer, name).assign(value.astype(np.float32))
    return ours, theirs


def call_with_gradients(layer, x, upstream, training):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)
        loss = tf.reduce_sum(tf.cast(y, tf.float64) * upstream)
    grads = tape.gradient(loss, [x, *layer.trainable_variables])
    return y.numpy().astype(np.float64), [g.numpy().astype(np.float64) for g in grads]


def numpy_batch_norm(x, gamma, beta, epsilon, dy):
    """float64 reference: (y, mean, biased variance, dx, dgamma, dbeta)."""
    x = x.astype(np.float64)
    mean, variance = x.mean(0), x.var(0)
    inv_std = 1 / np.sqrt(variance + epsilon)
    xhat = (x - mean) * inv_std
    dbeta, dgamma = dy.sum(0), (dy * xhat).sum(0)
    dx = gamma * inv_std * (dy - dbeta / len(x) - xhat * dgamma / len(x))
    return xhat * gamma + beta, mean, variance, dx, dgamma, dbeta


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-5), (np.float16, 4e-3)])
@pytest.mark.parametrize("n", [1, 7, 3000])  # 3000 rows: several chunks of the sums
# Columns: more than one tile of 32, read 1, 2 or 4 per access on the GPU (c % 4, c % 2).
@pytest.mark.parametrize("c", [37, 70, 136])
def test_row_ops_match_the_float64_reference(rng, device, dtype, tol, n, c):
    x = (rows(rng, n, c) + 100 * (dtype == np.float32)).astype(dtype)  # far from zero: the pivot matters
    gamma, beta = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.normal(0, 1, c).astype(np.float32)
    dy = rng.normal(0, 1, (n, c)).astype(dtype)
    want = numpy_batch_norm(x, gamma, beta, 1e-3, dy.astype(np.float64))
    with tf.device(device):
        y, mean, variance, inv_std = ops.row_batch_norm(x, gamma, beta, epsilon=1e-3)
        dx, dgamma, dbeta = ops.row_batch_norm_grad(dy, x, gamma, mean, inv_std)
        shifted = ops.row_scale_shift(x, gamma, beta)
        moving_mean, moving_variance = want[1] + rng.normal(0, 0.1, c), want[2] * rng.uniform(0.8, 1.2, c)
        normalized = ops.row_normalize(x, moving_mean.astype(np.float32), moving_variance.astype(np.float32), gamma,
                                       beta, epsilon=1e-3)
        assert_on(device, y, mean, dx, dgamma, shifted, normalized)
    assert y.dtype == dx.dtype == tf.as_dtype(dtype) and mean.dtype == dgamma.dtype == tf.float32
    scale = np.abs(want[0]).max()
    np.testing.assert_allclose(y.numpy(), want[0], atol=tol * scale)
    np.testing.assert_allclose(mean.numpy(), want[1], rtol=1e-5, atol=tol)
    np.testing.assert_allclose(variance.numpy(), want[2], rtol=1e-3, atol=tol)
    np.testing.assert_allclose(inv_std.numpy(), 1 / np.sqrt(want[2] + 1e-3), rtol=1e-3)
    for got, w in zip((dx, dgamma, dbeta), want[3:]):
        np.testing.assert_allclose(got.numpy(), w, atol=4 * tol * max(np.abs(w).max(), 1))
    np.testing.assert_allclose(shifted.numpy(), x.astype(np.float64) * gamma + beta,
                               atol=tol * np.abs(x.astype(np.float64) * gamma + beta).max())
    m32, v32 = moving_mean.astype(np.float32).astype(np.float64), moving_variance.astype(np.float32).astype(np.float64)
    want_normalized = (x.astype(np.float64) - m32) / np.sqrt(v32 + 1e-3) * gamma + beta
    assert normalized.dtype == tf.as_dtype(dtype)
    np.testing.assert_allclose(normalized.numpy(), want_normalized, atol=tol * np.abs(want_normalized).max())


def test_row_ops_gradients_match_numerical_gradients(rng, device):
    n, c = 40, 6
    x = rows(rng, n, c)
    gamma, beta = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.normal(0, 1, c).astype(np.float32)
    weights = tf.constant(rng.normal(0, 1, (n, c)).astype(np.float32))
    with tf.device(device):
        def loss_bn(x, gamma, beta):  # the statistics outputs are not differentiated
            return tf.reduce_sum(batch_norm.row_batch_norm(x, gamma, beta, 1e-3)[0] * weights)

        def loss_shift(x, gamma, beta):
            return tf.reduce_sum(batch_norm.row_scale_shift(x, gamma, beta) * weights)

        for loss in (loss_bn, loss_shift):
            theoretical, numerical = tf.test.compute_gradient(loss, [x, gamma, beta], delta=1e-2)
            for t, m in zip(theoretical, numerical):
                np.testing.assert_allclose(t, m, rtol=2e-2, atol=2e-2 * np.abs(m).max())

        def loss_normalize(x, mean, variance, gamma, beta):
            return tf.reduce_sum(batch_norm.row_normalize(x, mean, variance, gamma, beta, 1e-3) * weights)

        statistics = [x.mean(0) + rng.normal(0, 0.2, c).astype(np.float32), x.var(0) * rng.uniform(0.8, 1.2, c).astype(
            np.float32)]
        theoretical, numerical = tf.test.compute_gradient(loss_normalize, [x, *statistics, gamma, beta], delta=1e-2)
        for t, m in zip(theoretical, numerical):
            assert np.any(t)
            np.testing.assert_allclose(t, m, rtol=2e-2, atol=2e-2 * np.abs(m).max())


@pytest.mark.parametrize("call, message", [
    (lambda: ops.row_batch_norm(np.zeros(4, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32),
                                epsilon=1e-3), "must be rows"),
    (lambda: ops.row_batch_norm(np.zeros((3, 4), np.float32), np.ones(5, np.float32), np.zeros(4, np.float32),
                                epsilon=1e-3), "gamma must have one entry per column"),
    (lambda: ops.row_batch_norm(np.zeros((3, 4), np.float32), np.ones(4, np.float32), np.zeros(4, np.float32),
                                epsilon=0.0), "epsilon must be a finite number > 0"),
    (lambda: ops.row_batch_norm_grad(np.zeros((2, 4), np.float32), np.zeros((3, 4), np.float32),
                                     *[np.ones(4, np.float32)] * 3), "dy must have x's shape"),
    (lambda: ops.row_scale_shift(np.zeros((3, 4), np.float32), np.ones(4, np.float32), np.zeros(3, np.float32)),
     "shift must have one entry per column"),
    (lambda: ops.row_normalize(np.zeros((3, 4), np.float32), np.zeros(4, np.float32), np.ones(5, np.float32),
                               np.ones(4, np.float32), np.zeros(4, np.float32), epsilon=1e-3),
     "variance must have one entry per column"),
    (lambda: ops.row_normalize(np.zeros((3, 4), np.float32), *[np.ones(4, np.float32)] * 4, epsilon=-1.0),
     "epsilon must be a finite number > 0"),
])
def test_row_ops_refuse_bad_shapes_clearly(device, call, message):
    with tf.device(device), pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        call()


@pytest.mark.parametrize("c", [1, 4])  # 1 and 4 columns per access on the GPU
@pytest.mark.parametrize("spread", [3e18, 1e25])  # variance within float32's range, and beyond it
def test_rows_whose_float32_squares_overflow_normalise_right(rng, device, c, spread):
    """Rows of about 3e18 and 1e25: their summed squared deviations overflow float32 (the variance
    of 1e25 rows does too), while mean, inv_std and y are finite. The op sums in float64,
    so they come out right (the fuzz marked such rows not run before)."""
    n = 300
    x = (rng.normal(0, spread, (n, c)) + 3 * spread).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.normal(0, 1, c).astype(np.float32)
    with tf.device(device):
        y, mean, variance, inv_std = ops.row_batch_norm(x, gamma, beta, epsilon=1e-3)
        assert_on(device, y, mean, variance, inv_std)
    xs = x.astype(np.float64)
    want_mean, want_var = xs.mean(0), xs.var(0)
    want_inv = 1 / np.sqrt(want_var + 1e-3)
    want_y = (xs - want_mean) * want_inv * gamma + beta
    assert (np.abs(xs - want_mean) ** 2).sum(0).max() > np.finfo(np.float32).max  # float32 squares overflow
    np.testing.assert_allclose(y.numpy(), want_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mean.numpy(), want_mean, rtol=1e-6)
    np.testing.assert_allclose(inv_std.numpy(), want_inv, rtol=1e-5)
    if want_var.max() < np.finfo(np.float32).max:
        np.testing.assert_allclose(variance.numpy(), want_var, rtol=1e-5)
    else:
        assert np.all(np.isinf(variance.numpy()))  # beyond float32: rounded to inf, still the right side


@pytest.mark.parametrize("c", [1, 4])  # 1 and 4 columns per access on the GPU
def test_gradient_is_finite_where_float32_intermediates_would_overflow(rng, device, c):
    """dy near float32's largest value: sum(dy * (x - mean)) and gamma * inv_std^2 *
    dgamma / n overflow float32, while dgamma, dbeta and dx are finite (the fuzz case of
    seed 31). The op sums and forms dx in float64, so they come out finite and right."""
    n = 300
    x = rng.normal(0, 1e3, (n, c)).astype(np.float32)
    x[0] = 300  # about 0.3 standard deviations from the mean: dgamma about 1e38
    dy = rng.normal(0, 1e30, (n, c)).astype(np.float32)
    dy[0] = 3e38
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    mean = x.astype(np.float64).mean(0).astype(np.float32)
    inv_std = (1 / np.sqrt(x.astype(np.float64).var(0) + 1e-3)).astype(np.float32)
    with tf.device(device):
        dx, dgamma, dbeta = ops.row_batch_norm_grad(dy, x, gamma, mean, inv_std)
        assert_on(device, dx, dgamma, dbeta)
    g, m, inv, d, xs = (a.astype(np.float64) for a in (gamma, mean, inv_std, dy, x))
    xc = xs - m
    want_db = d.sum(0)
    want_dg = inv * (d * xc).sum(0)
    want_dx = g * inv * (d - want_db / n - xc * inv * want_dg / n)
    assert np.abs(d * xc).sum(0).max() > np.finfo(np.float32).max  # the float32 sum would overflow
    for got, want in ((dx, want_dx), (dgamma, want_dg), (dbeta, want_db)):
        got = got.numpy().astype(np.float64)
        assert np.all(np.isfinite(got)) and np.abs(want).max() < np.finfo(np.float32).max
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("c", [70, 136])  # 2 and 4 columns per access on the GPU
def test_gpu_rows_match_the_cpu_and_rerun_bit_identically(rng, gpu, c):
    n = 5000
    x, dy = rows(rng, n, c).astype(np.float16), rng.normal(0, 1, (n, c)).astype(np.float16)
    gamma, beta = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.normal(0, 1, c).astype(np.float32)
    results = {}
    for device in (CPU, gpu, gpu):
        with tf.device(device):
            y, mean, variance, inv_std = ops.row_batch_norm(x, gamma, beta, epsilon=1e-3)
            grads = ops.row_batch_norm_grad(dy, x, gamma, mean, inv_std)
            normalized = ops.row_normalize(x, mean + 0.1, variance * 1.1, gamma, beta, epsilon=1e-3)
        got = [t.numpy().astype(np.float64) for t in (y, mean, variance, *grads, normalized)]
        if device in results:
            for a, b in zip(got, results[device]):
                np.testing.assert_array_equal(a, b)
        results[device] = got
    for a, b in zip(results[gpu], results[CPU]):
        np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3 * max(np.abs(b).max(), 1))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("n", [7, 300])  # 7 rows: the biased and unbiased variance differ by 17 %
def test_float32_equals_keras_values_statistics_and_gradients(rng, device, training, n):
    c = 5
    with tf.device(device):
        ours, theirs = twin_layers(rng, c, "float32", momentum=0.7, epsilon=1e-3)
        start = ours.moving_mean.numpy().copy()
        x = rows(rng, n, c)
        upstream = rng.normal(0, 1, (n, c))
        y, grads = call_with_gradients(ours, x, upstream, training)
        want_y, want_grads = call_with_gradients(theirs, x, upstream, training)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    for got, want in zip(ours.get_weights(), theirs.get_weights()):  # the moving statistics
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if training:
        assert not np.allclose(ours.moving_mean.numpy(), start)  # the step moved the statistics


@pytest.mark.parametrize("training", [True, False])
def test_float16_rows_equal_keras_mixed_precision_against_float64(rng, device, training):
    """Half rows, float32 statistics and parameters (mixed_float16), against Keras' layer in
    float64 on the same (half-rounded) rows: within half precision's rounding."""
    n, c = 257, 8
    ours, _ = twin_layers(rng, c, "mixed_float16", momentum=0.5)
    reference = keras.layers.BatchNormalization(dtype="float64", momentum=0.5)
    reference.build((None, c))
    reference.set_weights([w.astype(np.float64) for w in ours.get_weights()])
    x = rows(rng, n, c).astype(np.float16)
    upstream = rng.normal(0, 1, (n, c))
    with tf.device(device):
        y, grads = call_with_gradients(ours, x, upstream, training)
    want_y, want_grads = call_with_gradients(reference, x.astype(np.float64), upstream, training)
    np.testing.assert_allclose(y, want_y, rtol=2e-3, atol=4e-3)
    for got, want in zip(grads, want_grads):  # dL/dx in half, the parameters' in float32
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3 * np.abs(want).max())
    for got, want in zip(ours.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert ours(tf.constant(x), training=False).dtype == tf.float16


@pytest.mark.parametrize("kwargs", [dict(dtype="float64"), dict(synchronized=True), dict(renorm=True),
                                    dict(center=False, scale=False)])
def test_other_cases_give_keras_values(rng, kwargs):
    """float64, cross-replica statistics and renorm take Keras' computation; without center
    and scale the fused op gets 1 and 0."""
    c = 4
    ours, theirs = twin_layers(rng, c, kwargs.pop("dtype", "float32"), **kwargs)
    x = rows(rng, 33, c).astype(ours.compute_dtype)
    upstream = rng.normal(0, 1, (33, c))
    for training in (True, False):
        y, grads = call_with_gradients(ours, x, upstream, training)
        want_y, want_grads = call_with_gradients(theirs, x, upstream, training)
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
        for got, want in zip(grads, want_grads):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("kwargs,match", [
    (dict(momentum=2.0), r"momentum must be in \[0, 1\] \(a finite number\), got 2.0"),
    (dict(momentum=-0.1), r"momentum must be in \[0, 1\]"),
    (dict(epsilon=-1.0), r"epsilon must be > 0 \(a finite number\), got -1.0"),
    (dict(epsilon=0.0, dtype="float64"), "epsilon must be > 0"),
    (dict(dtype="int32"), r"dtype must be a policy computing and storing variables in one of \('float16'"),
])
def test_settings_keras_would_turn_into_garbage_are_refused(kwargs, match):
    with pytest.raises(ValueError, match="bn: " + match):
        kl.FusedBatchNormalization(name="bn", **kwargs)


def test_a_batch_without_rows_keeps_the_moving_statistics(rng):
    ours, _ = twin_layers(rng, 3, "float32", momentum=0.5)
    before = [w.copy() for w in ours.get_weights()]
    y = ours(tf.zeros([0, 3]), training=True)
    assert y.shape == (0, 3)
    for got, want in zip(ours.get_weights(), before):
        np.testing.assert_array_equal(got, want)


def test_in_a_site_model_it_trains_and_round_trips(rng, tmp_path):
    shape = (8, 8, 8)
    coords, features = random_sites(rng, 2, shape, 0.2, 3)
    x = make_site_sparse(coords, features, shape, 2)
    inputs = kl.site_input(shape, 3)
    h = kl.SubMConv3D(6, 3, use_bias=False)(inputs)
    h = kl.SiteFeatures(batch_norm.FusedBatchNormalization(momentum=0.5))(h)
    model = keras.Model(inputs, h["features"])
    model.compile(optimizer="adam", loss="mse")
    assert not batch_norm.FusedBatchNormalization().supports_jit  # Keras must not XLA-compile custom ops
    target = rng.normal(0, 1, (len(coords), 6)).astype(np.float32)
    keras_x = kl.as_site_keras_inputs(x)
    model.train_on_batch(keras_x, target)
    out = model(keras_x, training=False).numpy()
    path = tmp_path / "m.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert any(isinstance(layer.layer, batch_norm.FusedBatchNormalization)
               for layer in loaded.layers if isinstance(layer, kl.SiteFeatures))
    np.testing.assert_allclose(loaded(keras_x, training=False).numpy(), out, rtol=1e-6, atol=1e-6)
