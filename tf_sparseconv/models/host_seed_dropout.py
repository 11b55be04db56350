"""HostSeedDropout: Keras' Dropout with its seed drawn on the host.

Keras' Dropout keeps its seed generator's state in a variable on the GPU, and TensorFlow's
stateless random ops take their seed in host memory: every training step copies the seed back
from the GPU, and the dropout waits for the GPU to reach that copy, in stream order behind all
the work queued before it. This layer keeps the state in host memory and draws the seed there;
the mask is drawn on the device of the inputs as before, from the same seed sequence, so its
outputs are Keras' Dropout's for the same seed.
"""
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class HostSeedDropout(keras.layers.Dropout):
    """keras.layers.Dropout (same arguments and config) whose seed is made on the host."""

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        with tf.device("/cpu:0"):  # the seed generator's state variable
            super().__init__(rate, noise_shape=noise_shape, seed=seed, **kwargs)

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        if self.rate == 1.0:
            return tf.zeros_like(inputs)
        with tf.device("/cpu:0"):
            seed = self.seed_generator.next()
            if seed.dtype != tf.int32:  # as Keras' TensorFlow backend casts it
                seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
        noise_shape = None if self.noise_shape is None else [
            tf.shape(inputs)[i] if size is None else size for i, size in enumerate(self.noise_shape)]
        return tf.nn.experimental.stateless_dropout(inputs, rate=self.rate, noise_shape=noise_shape, seed=seed)
