"""Adaptive density regularisation (Eq. 4) and warning-shot pruning (§3.6)."""
import numpy as np
import pytest
import tensorflow as tf
import keras

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl


@pytest.mark.parametrize("rho,rho_up,expected", [
    (0.30, 0.10, 0.1 + 0.1 * 0.20),   # too dense: o + b1 (rho - rho_up), positive
    (0.05, 0.10, -0.1 * 0.05),        # resources unused: -b2 (rho_up - rho), negative
    (0.10, 0.10, 0.0),                # at the bound: rho <= rho_up branch, zero
])
def test_eq4_bias_sign_and_size(rho, rho_up, expected):
    reg = kl.DensityRegularizer(scale=0.2, o=0.1, b1=0.1, b2=0.1)
    assert reg.bias(rho, rho_up).numpy() == pytest.approx(expected, abs=1e-7)


def test_eq4_asymmetric_parameters_act_separately():
    reg = kl.DensityRegularizer(scale=1.0, o=0.5, b1=2.0, b2=3.0)
    assert reg.bias(0.4, 0.2).numpy() == pytest.approx(0.5 + 2.0 * 0.2)
    assert reg.bias(0.1, 0.2).numpy() == pytest.approx(-3.0 * 0.1)


def test_penalty_counts_present_weights_only_and_is_lambda_times_sum_of_squares():
    reg = kl.DensityRegularizer(scale=0.3)
    kernel = tf.constant([[1.0, -2.0], [0.5, 4.0]])
    mask = tf.constant([[1.0, 1.0], [1.0, 0.0]])
    b = 0.1 + 0.1 * (0.5 - 0.2)
    expected = 0.3 * ((1.0 + b) ** 2 + (-2.0 + b) ** 2 + (0.5 + b) ** 2)
    assert reg.penalty(kernel, mask, 0.5, 0.2).numpy() == pytest.approx(expected, rel=1e-6)


def test_density_regularizer_rejects_negative_parameters():
    with pytest.raises(ValueError, match="b2 must be >= 0"):
        kl.DensityRegularizer(b2=-0.1)


def test_default_reduction_is_the_issue_text_sum():
    assert kl.DensityRegularizer().reduction == "sum"


def test_mean_reduction_divides_the_sum_by_the_present_weight_count():
    kernel = tf.constant([[1.0, -2.0], [0.5, 4.0]])
    mask = tf.constant([[1.0, 1.0], [1.0, 0.0]])
    b = 0.1 + 0.1 * (0.5 - 0.2)
    squares = (1.0 + b) ** 2 + (-2.0 + b) ** 2 + (0.5 + b) ** 2
    reg = kl.DensityRegularizer(scale=0.3, reduction="mean")
    assert reg.penalty(kernel, mask, 0.5, 0.2).numpy() == pytest.approx(0.3 * squares / 3, rel=1e-6)
    # Pruning everything leaves nothing to average: zero, not NaN.
    assert reg.penalty(kernel, tf.zeros_like(mask), 0.5, 0.2).numpy() == 0.0


def test_filter_reduction_sums_each_filter_and_averages_over_the_output_channels():
    """kernel [..., Cin, Cout]: the sum over each output channel's filter, averaged over the
    Cout filters, so that lambda does not grow with the layer's width."""
    rng = np.random.default_rng(7)
    kernel = rng.normal(0, 0.1, (3, 3, 2, 5)).astype(np.float32)
    mask = (rng.random(kernel.shape) < 0.7).astype(np.float32)
    b = -0.1 * (0.3 - 0.1)  # rho 0.1 under rho_up 0.3
    per_filter = (mask * (kernel + b) ** 2).sum(axis=(0, 1, 2))
    assert per_filter.shape == (5,)
    reg = kl.DensityRegularizer(scale=0.2, reduction="filter")
    assert reg.penalty(kernel, mask, 0.1, 0.3).numpy() == pytest.approx(0.2 * per_filter.mean(), rel=1e-5)
    summed = kl.DensityRegularizer(scale=0.2, reduction="sum").penalty(kernel, mask, 0.1, 0.3).numpy()
    assert summed == pytest.approx(5 * reg.penalty(kernel, mask, 0.1, 0.3).numpy(), rel=1e-5)


def test_reductions_scale_the_per_weight_gradient_but_keep_its_direction():
    """d/dw of each reduction is 2 lambda (w + b) divided by 1, Cout or the present count."""
    kernel = tf.Variable(np.linspace(-0.2, 0.3, 3 * 3 * 2 * 4, dtype=np.float32).reshape(3, 3, 2, 4))
    mask = np.ones(kernel.shape, np.float32)
    mask[0, 0] = 0.0  # 8 pruned: 64 present
    b = 0.1 + 0.1 * (0.4 - 0.2)
    expected = 2 * 0.3 * (kernel.numpy() + b) * mask
    for reduction, divisor in (("sum", 1), ("filter", 4), ("mean", 64)):
        with tf.GradientTape() as tape:
            penalty = kl.DensityRegularizer(scale=0.3, reduction=reduction).penalty(kernel, mask, 0.4, 0.2)
        np.testing.assert_allclose(tape.gradient(penalty, kernel).numpy(), expected / divisor, rtol=1e-5, atol=1e-8)


def test_density_regularizer_rejects_unknown_reduction():
    with pytest.raises(ValueError, match="reduction must be one of"):
        kl.DensityRegularizer(reduction="max")


def test_reduction_survives_config_and_layer_serialization():
    reg = kl.DensityRegularizer(scale=0.2, o=0.05, b1=0.3, b2=0.2, reduction="filter", include_bias=False)
    again = kl.DensityRegularizer.from_config(reg.get_config())
    assert (again.scale, again.o, again.b1, again.b2, again.reduction, again.include_bias) == (
        0.2, 0.05, 0.3, 0.2, "filter", False)
    layer = kl.DirectSparseConv(4, 3, rho_up=0.3, activation="relu", density_regularizer=reg)
    rebuilt = kl.DirectSparseConv.from_config(layer.get_config())
    assert rebuilt.density_regularizer.reduction == "filter" and rebuilt.density_regularizer.b1 == 0.3
    assert rebuilt.density_regularizer.include_bias is False


def test_penalty_includes_the_biases_by_default_as_the_paper_does():
    """§3.5 lowers or raises 'the values of filter weights and biases': every bias is pulled
    towards -b like a present weight, and counts as a term of the mean; include_bias=False
    leaves the biases out."""
    kernel = tf.constant([[1.0, -2.0], [0.5, 4.0]])
    mask = tf.constant([[1.0, 1.0], [1.0, 0.0]])
    bias = tf.constant([0.3, -0.7])
    b = 0.1 + 0.1 * (0.5 - 0.2)
    weights = (1.0 + b) ** 2 + (-2.0 + b) ** 2 + (0.5 + b) ** 2
    biases = (0.3 + b) ** 2 + (-0.7 + b) ** 2
    assert kl.DensityRegularizer().include_bias
    for reduction, divisor in (("sum", 1), ("filter", 2), ("mean", 5)):
        reg = kl.DensityRegularizer(scale=0.3, reduction=reduction)
        assert reg.penalty(kernel, mask, 0.5, 0.2, bias).numpy() == pytest.approx(
            0.3 * (weights + biases) / divisor, rel=1e-6)
        left_out = kl.DensityRegularizer(scale=0.3, reduction=reduction, include_bias=False)
        assert left_out.penalty(kernel, mask, 0.5, 0.2, bias).numpy() == pytest.approx(
            0.3 * weights / (3 if reduction == "mean" else divisor), rel=1e-6)
        # A layer without biases (use_bias=False) gives none.
        assert reg.penalty(kernel, mask, 0.5, 0.2, None).numpy() == pytest.approx(
            0.3 * weights / (3 if reduction == "mean" else divisor), rel=1e-6)


@pytest.mark.parametrize("start_bias,direction", [(0.5, "down"), (-0.5, "up")])
def test_regularised_bias_alone_moves_density_toward_rho_up(rng, start_bias, direction):
    """Only the biases train, only Eq. 4 acts: too dense, b > 0 pulls them below zero and the
    density falls; too sparse, b < 0 pulls them up and it rises."""
    dense = (rng.random((4, 12, 12, 1)) < 0.3).astype(np.float32)
    x = kl.as_keras_inputs(ts.from_dense(dense))
    layer = kl.DirectSparseConv(4, 3, rho_up=0.3, activation="relu",
                          density_regularizer=kl.DensityRegularizer(scale=4.0, reduction="filter"))
    layer(x)
    layer.kernel.assign(np.full(layer.kernel.shape, 0.01 * np.sign(start_bias), np.float32))
    layer.bias.assign(np.full(4, start_bias, np.float32))
    assert_regularizer_alone_moves_density(layer, x, layer.bias, 0.2, direction)
    # Without the biases in the penalty they get no gradient from it at all.
    layer.density_regularizer = kl.DensityRegularizer(scale=4.0, reduction="filter", include_bias=False)
    with tf.GradientTape() as tape:
        layer(x, training=True)
        loss = layer.losses[-1]
    assert tape.gradient(loss, layer.bias) is None


def test_layer_penalty_uses_the_density_before_k_selection(rng):
    """Eq. 4's rho is the ReLU's survivors before k-selection (after it the density could
    never exceed rho_up, and b would never be positive)."""
    dense = (rng.random((2, 9, 9, 1)) < 0.4).astype(np.float32)
    x = kl.as_keras_inputs(ts.from_dense(dense))
    reg = kl.DensityRegularizer(scale=0.5, reduction="filter")
    layer = kl.DirectSparseConv(3, 3, rho_up=0.1, activation="relu", density_regularizer=reg,
                          bias_initializer=keras.initializers.Constant(0.01))
    layer(x)
    layer.kernel.assign(np.full(layer.kernel.shape, 0.2, np.float32))  # every touched response positive
    rho = measured_density(layer, kl.from_keras_inputs(x))
    assert rho > 0.3  # far above rho_up: k-selection cuts, so b must carry the offset o
    y = kl.from_keras_inputs(layer(x, training=True))
    assert layer.k_bound == 9  # ceil(0.1 * 81)
    assert int(tf.shape(y.values)[0]) <= 2 * 3 * 9 < rho * 2 * 9 * 9 * 3  # the bound did cut
    b = 0.1 + 0.1 * (rho - 0.1)
    # 27 weights and 3 biases (Eq. 4 includes the biases by default), over Cout = 3 filters.
    expected = 0.5 * ((3 * 3 * 1 * 3) * (0.2 + b) ** 2 + 3 * (0.01 + b) ** 2) / 3
    assert float(layer.losses[-1]) == pytest.approx(expected, rel=1e-5)


def measured_density(layer, x):
    """Eq. 4's density: positive responses before k-selection / cells."""
    _, _, positive = ts.direct_conv(x, layer.kernel, layer.bias, tf.cast(layer.mask, tf.bool),
                                    selection="signed", rho_up=layer.rho_up, return_counts=True)
    return float(tf.reduce_sum(positive)) / float(np.prod(x.dense_shape.numpy()[:-1]) * layer.filters)


# Per-weight strengths equal across reductions: the kernel is [3, 3, 1, 4], 36 weights.
@pytest.mark.parametrize("reduction,scale", [("sum", 1.0), ("filter", 4.0), ("mean", 36.0)])
@pytest.mark.parametrize("start_bias,direction", [(1.0, "down"), (-1.0, "up")])
def test_regularizer_alone_moves_density_toward_rho_up(rng, start_bias, direction, reduction, scale):
    """A toy problem with no data loss: only Eq. 4 acts. Starting too dense (all responses
    positive) the density must fall; starting too sparse it must rise."""
    dense = (rng.random((4, 12, 12, 1)) < 0.3).astype(np.float32)
    x = kl.as_keras_inputs(ts.from_dense(dense))
    regularizer = kl.DensityRegularizer(scale=scale, reduction=reduction)
    layer = kl.DirectSparseConv(4, 3, rho_up=0.3, activation="relu", density_regularizer=regularizer,
                          kernel_initializer=keras.initializers.RandomNormal(0.0, 0.1),
                          bias_initializer=keras.initializers.Constant(start_bias), use_bias=True)
    layer(x)
    # Only the kernel is trained here, so hold the bias at a small value that lets the weights decide.
    layer.bias.assign(np.full(4, 0.05 * np.sign(start_bias), np.float32))
    layer.kernel.assign(np.full(layer.kernel.shape, 0.5 * np.sign(start_bias), np.float32))
    assert_regularizer_alone_moves_density(layer, x, layer.kernel, 0.05, direction)


def assert_regularizer_alone_moves_density(layer, x, variable, learning_rate, direction):
    """60 SGD steps on the layer's Eq. 4 penalty alone, training only `variable`: the
    density (rho_up 0.3) must start above the bound and fall ("down"), or start below it
    and rise ("up"), by more than 0.05."""
    sparse_x = kl.from_keras_inputs(x)
    before = measured_density(layer, sparse_x)
    optimizer = keras.optimizers.SGD(learning_rate)
    for _ in range(60):
        with tf.GradientTape() as tape:
            layer(x, training=True)
            loss = tf.add_n(layer.losses)
        optimizer.apply_gradients([(tape.gradient(loss, variable), variable)])
    after = measured_density(layer, sparse_x)
    if direction == "down":
        assert before > 0.3 and after < before - 0.05
    else:
        assert before < 0.3 and after > before + 0.05


def pruning_model():
    inputs = kl.sparse_input((6, 6, 1))
    h = kl.DirectSparseConv(2, 3, name="conv")(inputs)
    return keras.Model(inputs, kl.SparseToDense()(h))


def set_kernel(layer, values):
    layer.kernel.assign(np.asarray(values, np.float32).reshape(layer.kernel.shape))


def test_weight_small_at_two_consecutive_checks_is_pruned_at_the_second():
    model = pruning_model()
    layer = model.get_layer("conv")
    callback = kl.WarningShotPruning(epsilon=0.01)
    values = np.ones(layer.kernel.shape, np.float32)
    values.flat[3] = 0.001    # stays small: warned, then pruned
    values.flat[7] = -0.002   # crosses zero once: warned, then large again -> kept
    set_kernel(layer, values)
    assert callback.prune(model) == 0
    assert layer.warned.numpy().flat[3] == 1 and layer.warned.numpy().flat[7] == 1
    values.flat[7] = 0.8
    set_kernel(layer, values)
    assert callback.prune(model) == 1
    assert layer.mask.numpy().flat[3] == 0 and layer.kernel.numpy().flat[3] == 0.0
    assert layer.mask.numpy().flat[7] == 1 and layer.warned.numpy().flat[7] == 0
    assert kl.present_weight_count(model) == values.size - 1


def grid_dataset(rng, count=16):
    grids = (rng.random((count, 8, 8, 1)) < 0.3).astype(np.float32)
    labels = (grids[:, :4].sum(axis=(1, 2, 3)) > grids[:, 4:].sum(axis=(1, 2, 3))).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((grids, labels)).batch(8).map(
        lambda g, y: (kl.as_keras_inputs(ts.from_dense(g).with_shape([None, 8, 8, 1])), y))


def test_pruned_weights_stay_zero_through_training_and_present_count_never_grows(rng):
    inputs = kl.sparse_input((8, 8, 1))
    h = kl.DirectSparseConv(4, 3, activation="relu", name="conv")(inputs)
    h = keras.layers.Flatten()(kl.SparseToDense()(h))
    model = keras.Model(inputs, keras.layers.Dense(2)(h))
    model.compile(keras.optimizers.Adam(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callback = kl.WarningShotPruning(epsilon=0.2)  # large: many weights get pruned
    model.fit(grid_dataset(rng), epochs=6, verbose=0, callbacks=[callback])
    counts = [entry["present_weights"] for entry in callback.history]
    assert all(a >= b for a, b in zip(counts, counts[1:]))
    assert counts[-1] < counts[0], "the test needs pruning to happen"
    layer = model.get_layer("conv")
    pruned = layer.mask.numpy() == 0
    assert pruned.any()
    np.testing.assert_array_equal(layer.kernel.numpy()[pruned], 0.0)  # exact zero under Adam momentum


def test_pruning_callback_rejects_non_positive_epsilon():
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        kl.WarningShotPruning(epsilon=0.0)


def regularised_classifier(scale):
    inputs = kl.sparse_input((8, 8, 1))
    h = kl.DirectSparseConv(4, 3, rho_up=0.2, activation="relu", name="conv",
                      density_regularizer=kl.DensityRegularizer(scale, reduction="sum"))(inputs)
    h = keras.layers.Flatten()(kl.SparseToDense()(h))
    return keras.Model(inputs, keras.layers.Dense(2)(h))


def test_fine_tune_phase_turns_the_eq4_penalty_off_from_its_epoch(rng):
    """With a learning rate of 0 the weights stay put, so each epoch's training loss is the
    data loss plus (until the phase) the penalty; from the phase on it is the data loss
    alone, which evaluate() (no penalty outside training) measures on the same batches."""
    model = regularised_classifier(scale=5.0)
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset = grid_dataset(rng)
    data_loss = model.evaluate(dataset, verbose=0, return_dict=True)["loss"]
    losses = model.fit(dataset, epochs=4, verbose=0, callbacks=[kl.FineTunePhase(2)]).history["loss"]
    assert losses[0] == pytest.approx(losses[1]) and losses[0] > data_loss + 0.5
    assert losses[2] == pytest.approx(data_loss, rel=1e-5) and losses[3] == pytest.approx(data_loss, rel=1e-5)
    assert model.get_layer("conv").density_regularizer.scale == 5.0  # the saved config keeps the regulariser


def test_fine_tune_phase_fixes_the_masks_from_its_epoch(rng):
    model = regularised_classifier(scale=0.1)
    model.compile(keras.optimizers.Adam(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    pruning = kl.WarningShotPruning(epsilon=0.1)  # large: weights get pruned (without the phase, 36 -> 11 here)
    phase = kl.FineTunePhase(3, pruning)
    kernels = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: kernels.append(model.get_layer("conv").kernel.numpy().copy()))
    model.fit(grid_dataset(rng), epochs=6, verbose=0, callbacks=[pruning, phase, record])
    counts = [entry["present_weights"] for entry in pruning.history]
    assert counts[2] < counts[0], "the test needs pruning before the phase"
    assert counts[2:] == [counts[2]] * 4 and all(entry["pruned"] == 0 for entry in pruning.history[3:])
    mask = model.get_layer("conv").mask.numpy() > 0
    np.testing.assert_array_equal(kernels[-1][~mask], 0.0)
    assert not np.array_equal(kernels[2][mask], kernels[-1][mask])  # the present weights still train


def test_fine_tune_phase_needs_an_epoch_before_it():
    with pytest.raises(ValueError, match="start_epoch must be >= 1"):
        kl.FineTunePhase(0)


def test_penalty_with_a_density_per_channel_gives_each_filter_its_own_b():
    kernel = tf.constant([[1.0, -2.0], [0.5, 4.0]])  # [Cin = 2, Cout = 2]
    mask = tf.ones_like(kernel)
    bias = tf.constant([0.3, -0.7])
    rho = tf.constant([0.5, 0.05])  # channel 0 above rho_up = 0.2, channel 1 below
    b = np.array([0.1 + 0.1 * (0.5 - 0.2), -0.1 * (0.2 - 0.05)])
    filters = [(1.0 + b[0]) ** 2 + (0.5 + b[0]) ** 2 + (0.3 + b[0]) ** 2,
               (-2.0 + b[1]) ** 2 + (4.0 + b[1]) ** 2 + (-0.7 + b[1]) ** 2]
    reg = kl.DensityRegularizer(scale=0.3, reduction="filter", density="channel")
    assert reg.penalty(kernel, mask, rho, 0.2, bias).numpy() == pytest.approx(0.3 * sum(filters) / 2, rel=1e-6)
    np.testing.assert_allclose(reg.bias(rho, 0.2).numpy(), b, rtol=1e-6)


def test_layer_penalty_with_density_per_channel_uses_each_channels_survivors(rng):
    """One channel with every touched response positive (far above rho_up), one with none
    (density 0): the first filter is pulled down by o + b1 (rho_0 - rho_up), the second up by
    b2 rho_up; the layer-wide density would give both the same b."""
    dense = (rng.random((2, 9, 9, 1)) < 0.4).astype(np.float32)
    x = kl.as_keras_inputs(ts.from_dense(dense))
    layer = kl.DirectSparseConv(2, 3, rho_up=0.1, activation="relu",
                          density_regularizer=kl.DensityRegularizer(scale=0.5, reduction="sum", density="channel"))
    layer(x)
    kernel = np.zeros(layer.kernel.shape, np.float32)
    kernel[..., 0], kernel[..., 1] = 0.2, -0.2
    layer.kernel.assign(kernel)
    _, _, positive = ts.direct_conv(kl.from_keras_inputs(x), layer.kernel, layer.bias, tf.cast(layer.mask, tf.bool),
                                    selection="signed", rho_up=0.1, return_counts=True)
    rho = tf.reduce_sum(positive, axis=0).numpy() / (2 * 9 * 9)
    assert rho[0] > 0.3 and rho[1] == 0
    layer(x, training=True)
    b = [0.1 + 0.1 * (rho[0] - 0.1), -0.1 * 0.1]
    expected = 0.5 * (9 * (0.2 + b[0]) ** 2 + b[0] ** 2 + 9 * (-0.2 + b[1]) ** 2 + b[1] ** 2)
    assert float(layer.losses[-1]) == pytest.approx(expected, rel=1e-5)
    again = kl.DirectSparseConv.from_config(layer.get_config())
    assert again.density_regularizer.density == "channel"


def test_density_regularizer_rejects_unknown_density():
    with pytest.raises(ValueError, match="density must be one of"):
        kl.DensityRegularizer(density="batch")


@pytest.mark.parametrize("epsilon", [float("inf"), float("nan"), True, None, "0.1"])
def test_pruning_callback_rejects_an_epsilon_that_is_not_a_finite_number(epsilon):
    # an infinite epsilon flagged, and then pruned, every weight
    with pytest.raises(ValueError, match=r"WarningShotPruning: epsilon must be > 0 \(a finite number\)"):
        kl.WarningShotPruning(epsilon=epsilon)


@pytest.mark.parametrize("start_epoch", [1.5, True, None, "2", float("nan")])
def test_fine_tune_phase_start_epoch_is_an_int(start_epoch):
    # 1.5 started the phase at epoch 1, True at epoch 1; a string or NaN failed inside Python's comparison
    with pytest.raises(TypeError, match="FineTunePhase: start_epoch must be an int"):
        kl.FineTunePhase(start_epoch)


def test_fine_tune_phase_pruning_is_a_warning_shot_pruning_callback():
    # anything else was accepted and failed only when the phase began, epochs into training
    with pytest.raises(TypeError, match="FineTunePhase: pruning must be a WarningShotPruning callback or None"):
        kl.FineTunePhase(2, pruning="yes")
    assert kl.FineTunePhase(2, kl.WarningShotPruning()).pruning is not None
