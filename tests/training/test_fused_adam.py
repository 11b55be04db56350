"""FusedAdam against Keras' Adam: the same weights and moments after several steps (plain,
AdamW with biases excluded, a learning-rate schedule, float64, eager and traced, under
MirroredStrategy over two logical CPUs), the cases it hands to Keras' Adam (amsgrad, sparse
gradients), fewer ops in a traced step, and a saved model that loads with its optimizer."""
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv.training.optimizers import FusedAdam

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def full_float32_products():
    """The optimizers are compared, not the products: on a GPU TensorFlow's TF32 matmuls
    (10-bit mantissas) turn the two optimizers' last-bit differences into differences of 1e-4
    within six steps (seen on a lent H200), so the models' products run in full float32."""
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(before)


def make_model(seed, dtype="float32"):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((5,), dtype=dtype), keras.layers.Dense(7, activation="relu", dtype=dtype),
                              keras.layers.Dense(3, dtype=dtype)])
    return model


def train(optimizer, steps=6, dtype="float32", traced=False, seed=0):
    """Weights and optimizer variables after `steps` steps on fresh random batches."""
    model = make_model(seed, dtype)
    rng = np.random.default_rng(seed)
    batches = [(rng.normal(size=(8, 5)).astype(dtype), rng.normal(size=(8, 3)).astype(dtype)) for _ in range(steps)]

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    if traced:
        step = tf.function(step)
    for x, y in batches:
        step(tf.constant(x), tf.constant(y))
    return [w.numpy() for w in model.weights], [v.numpy() for v in optimizer.variables]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("options", [
    dict(learning_rate=0.01),
    dict(learning_rate=0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-5),
    dict(learning_rate=0.01, weight_decay=0.5),
    dict(learning_rate=keras.optimizers.schedules.CosineDecay(0.02, decay_steps=5), weight_decay=0.1),
])
def test_same_steps_as_keras_adam(options, traced):
    def make(cls):
        opt = cls(**options)
        if "weight_decay" in options:
            opt.exclude_from_weight_decay(var_names=["bias"])
        return opt

    weights, state = train(make(FusedAdam), traced=traced)
    want_weights, want_state = train(make(keras.optimizers.Adam), traced=traced)
    assert len(state) == len(want_state)
    for got, want in zip(weights + state, want_weights + want_state):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    # the steps moved the weights (the comparison is not between two untouched models)
    assert not np.allclose(weights[0], make_model(0).weights[0].numpy())


def test_float64_follows_the_adam_formula():
    # Keras' Adam rounds beta_1 and beta_2 to float32 before its float64 powers; the fused
    # step keeps them in float64, so float64 is checked against the formula itself.
    rng = np.random.default_rng(2)
    start, grads = rng.normal(size=(4, 3)), rng.normal(size=(5, 4, 3))
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-7
    variable = keras.Variable(start, dtype="float64")
    optimizer = FusedAdam(learning_rate=lr, beta_1=b1, beta_2=b2, epsilon=eps)
    want, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    for t, g in enumerate(grads, 1):
        optimizer.apply_gradients([(tf.constant(g), variable)])
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        want -= lr * np.float32(lr) / lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps)
    # (the learning rate is a float32 variable in every Keras optimizer)
    np.testing.assert_allclose(variable.numpy(), want, rtol=1e-12)


def test_amsgrad_takes_keras_path():
    # On the CPU, where two trainings of the same steps give the same bits: a GPU's matmuls
    # may round one ulp apart between runs (a lent H200, 2026-11-30: 3.7e-9 in one weight),
    # and this test asks for Keras' own arithmetic, bit for bit.
    with tf.device("/CPU:0"):
        weights, state = train(FusedAdam(learning_rate=0.01, amsgrad=True), traced=True)
        want_weights, want_state = train(keras.optimizers.Adam(learning_rate=0.01, amsgrad=True), traced=True)
    assert len(state) == len(want_state)  # the maximum of the second moments included
    for got, want in zip(weights + state, want_weights + want_state):
        np.testing.assert_array_equal(got, want)


def test_sparse_gradients_take_keras_path():
    def run(cls):
        keras.utils.set_random_seed(1)
        table = keras.Variable(np.random.default_rng(1).normal(size=(10, 4)).astype("float32"))
        opt = cls(learning_rate=0.05)
        for ids in ([1, 3, 3], [0, 9], [3]):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table.value, ids) ** 2)
            grad = tape.gradient(loss, table.value)
            assert isinstance(grad, tf.IndexedSlices)
            opt.apply_gradients([(grad, table)])
        return table.numpy()

    np.testing.assert_allclose(run(FusedAdam), run(keras.optimizers.Adam), rtol=1e-6)


def count_ops(optimizer):
    model = make_model(0)
    x, y = tf.zeros((8, 5)), tf.zeros((8, 3))

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    graph = step.get_concrete_function(x, y).graph.as_graph_def()
    return sum(len(f.node_def) for f in graph.library.function) + len(graph.node)


def test_a_traced_step_has_fewer_ops():
    schedule = keras.optimizers.schedules.CosineDecay(0.02, decay_steps=5)
    fused = count_ops(FusedAdam(schedule, weight_decay=0.1))
    plain = count_ops(keras.optimizers.Adam(schedule, weight_decay=0.1))
    assert fused < 0.6 * plain, (fused, plain)


def test_saved_with_the_model(tmp_path):
    model = make_model(0)
    model.compile(FusedAdam(0.01, weight_decay=0.2), "mse")
    model.fit(np.ones((8, 5), "float32"), np.ones((8, 3), "float32"), epochs=2, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.optimizer, FusedAdam) and loaded.optimizer.weight_decay == pytest.approx(0.2)
    for got, want in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


MIRRORED = """
import sys
import numpy as np, tensorflow as tf, keras
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, sys.argv[1])
from tf_sparseconv.training.optimizers import FusedAdam
x = np.random.default_rng(0).normal(size=(16, 5)).astype("float32")
y = np.random.default_rng(1).normal(size=(16, 3)).astype("float32")
result = []
for cls in (FusedAdam, keras.optimizers.Adam):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, activation="relu"), keras.layers.Dense(3)])
        opt = cls(0.01, weight_decay=0.3)
        opt.exclude_from_weight_decay(var_names=["bias"])
        model.compile(opt, "mse")
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    result.append([w.numpy() for w in model.weights + opt.variables])
for got, want in zip(*result):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
print("equal", len(result[0]))
"""


def test_mirrored_replicas_match_keras_adam():
    run = subprocess.run([sys.executable, "-c", MIRRORED, REPO], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "equal" in run.stdout, run.stdout


def test_a_keras_adam_checkpoint_resumes_under_fused_adam(tmp_path):
    # --backup-dir folders written before the trainer used FusedAdam (Keras' Adam) keep working
    def compiled(optimizer):
        model = make_model(0)
        model.compile(optimizer, "mse")
        return model

    old = compiled(keras.optimizers.Adam(0.01))
    old.fit(np.ones((8, 5), "float32"), np.ones((8, 3), "float32"), epochs=2, verbose=0)
    old.save_weights(tmp_path / "backup.weights.h5")
    new = compiled(FusedAdam(0.01))
    new.optimizer.build(new.trainable_variables)
    new.load_weights(tmp_path / "backup.weights.h5")
    assert new.optimizer.iterations.numpy() == 2
    for got, want in zip(new.optimizer.variables, old.optimizer.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("options,message", [
    (dict(beta_1=1.0), r"beta_1 must be in \[0, 1\)"),      # trained to NaN (1 - beta_1^t = 0)
    (dict(beta_2=2.0), r"beta_2 must be in \[0, 1\)"),      # trained to NaN
    (dict(beta_1=-0.1), r"beta_1 must be in \[0, 1\)"),
    (dict(epsilon=0.0), "epsilon must be > 0"),            # 0 / 0 = NaN where a gradient is 0 from the start
    (dict(epsilon=-1.0), "epsilon must be > 0"),
    (dict(epsilon=None), "epsilon must be a number"),      # failed in the first step, inside TensorFlow
    (dict(beta_1=lambda: 0.9), "beta_1 must be a number"),  # failed in the first step, inside TensorFlow
    (dict(learning_rate=-1.0), "learning_rate must be >= 0"),  # climbed the loss
    (dict(learning_rate=float("nan")), "learning_rate must be >= 0"),
    (dict(weight_decay=-0.1), "weight_decay must be >= 0"),    # grew the weights
    (dict(weight_decay="a"), "weight_decay must be a number"),
    (dict(amsgrad="no"), "amsgrad must be True or False"),    # a true string: amsgrad ran
])
def test_refuses_hyperparameters_that_would_train_to_nan_or_not_as_asked(options, message):
    with pytest.raises(ValueError, match="FusedAdam: " + message):
        FusedAdam(**options)


def test_still_takes_schedules_tensors_and_its_own_config():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    FusedAdam(schedule, beta_1=tf.constant(0.9), weight_decay=0.0)
    FusedAdam(lambda: 0.01, np.float32(0.8), amsgrad=np.bool_(True))
    config = FusedAdam(weight_decay=0.01).get_config()
    assert FusedAdam.from_config(config).get_config() == config
