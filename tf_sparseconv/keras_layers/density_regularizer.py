"""Adaptive density regularisation (Hackel et al. §3.5, Eq. 4).

The penalty lambda * sum((w + b)^2) over a layer's present filter weights pulls the
weights towards -b. With rho the layer's measured density and rho_up its bound:
    b = o + b1 * (rho - rho_up)    if rho > rho_up   (too dense: lower the weights, so
                                                       the following ReLU drops more)
    b = -b2 * (rho_up - rho)       otherwise          (resources unused: raise them)
"""
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class DensityRegularizer:
    def __init__(self, scale=0.1, o=0.1, b1=0.1, b2=0.1):
        for name, value in (("scale", scale), ("o", o), ("b1", b1), ("b2", b2)):
            if not value >= 0:
                raise ValueError(f"DensityRegularizer {name} must be >= 0, got {value}")
        self.scale, self.o, self.b1, self.b2 = float(scale), float(o), float(b1), float(b2)

    def bias(self, rho, rho_up):
        """Eq. 4's b for measured density rho and bound rho_up (tensors or floats)."""
        rho = tf.convert_to_tensor(rho, tf.float32)
        rho_up = tf.convert_to_tensor(rho_up, tf.float32)
        return tf.where(rho > rho_up, self.o + self.b1 * (rho - rho_up), -self.b2 * (rho_up - rho))

    def penalty(self, kernel, mask, rho, rho_up):
        """lambda * sum over present weights of (w + b)^2; the density is a measurement, so
        no gradient flows into it."""
        b = tf.stop_gradient(self.bias(rho, rho_up))
        return self.scale * tf.reduce_sum(mask * tf.square(kernel + tf.cast(b, kernel.dtype)))

    def get_config(self):
        return {"scale": self.scale, "o": self.o, "b1": self.b1, "b2": self.b2}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
