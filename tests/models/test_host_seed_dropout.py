"""HostSeedDropout: Keras' Dropout's outputs for the same seed (eager and traced, each noise
shape), its seed state and seed ops on the host, and its config round trip."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv.models.host_seed_dropout import HostSeedDropout


@pytest.mark.parametrize("noise_shape", [None, (1, 16), (4, None)])
def test_the_outputs_are_keras_dropouts_for_the_same_seed(noise_shape):
    x = tf.random.normal([4, 16])
    keras_dropout = keras.layers.Dropout(0.4, noise_shape=noise_shape, seed=3)
    ours = HostSeedDropout(0.4, noise_shape=noise_shape, seed=3)
    for _ in range(3):  # the seed advances alike
        expected = keras_dropout(x, training=True).numpy()
        got = ours(x, training=True).numpy()
        np.testing.assert_array_equal(got, expected)
    assert (got == 0).any() and (got != 0).any()

    @tf.function
    def keras_step(t):
        return keras_dropout(t, training=True)

    @tf.function
    def our_step(t):
        return ours(t, training=True)

    for _ in range(2):
        np.testing.assert_array_equal(our_step(x).numpy(), keras_step(x).numpy())
    np.testing.assert_array_equal(ours(x, training=False).numpy(), x.numpy())


def test_the_seed_is_kept_and_drawn_on_the_host():
    layer = HostSeedDropout(0.5, seed=1)
    assert "CPU" in layer.seed_generator.state.value.device
    graph = tf.function(lambda t: layer(t, training=True)).get_concrete_function(tf.TensorSpec([2, 3])).graph
    seed_ops = [op for op in graph.get_operations() if op.type in ("FloorMod", "Cast", "AssignVariableOp")]
    assert seed_ops and all("CPU" in op.device for op in seed_ops)
    random_ops = [op for op in graph.get_operations() if op.type == "StatelessRandomUniformV2"]
    assert random_ops and all(op.device == "" for op in random_ops)  # on the inputs' device


def test_rates_zero_and_one_and_the_config_round_trip():
    x = tf.ones([2, 5])
    np.testing.assert_array_equal(HostSeedDropout(0.0)(x, training=True).numpy(), x.numpy())
    np.testing.assert_array_equal(HostSeedDropout(1.0)(x, training=True).numpy(), np.zeros([2, 5]))
    layer = HostSeedDropout(0.3, noise_shape=(1, None), seed=7, name="drop")
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(again) is HostSeedDropout
    assert (again.rate, again.noise_shape, again.seed, again.name) == (0.3, (1, None), 7, "drop")
    with pytest.raises(ValueError, match="rate"):
        HostSeedDropout(1.5)
