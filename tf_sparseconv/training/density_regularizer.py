"""Adaptive density regularisation (Hackel et al. §3.5, Eq. 4).

The penalty lambda * sum((w + b)^2) over a layer's present filter weights (and, with
include_bias, its biases: §3.5 lowers "the values of filter weights and biases") pulls
them towards -b, where b compares the layer's density rho with its bound rho_up:
    b = o + b1 * (rho - rho_up)    if rho > rho_up   (too dense: lower the weights, so
                                                       the following ReLU drops more)
    b = -b2 * (rho_up - rho)       otherwise          (resources unused: raise them)
rho is measured by DirectSparseConv in the same training step, before k-selection: after
it, rho could never exceed rho_up and b would never carry the offset o.

The paper leaves open how the sum is normalised and which density is meant; `reduction`
("sum", "filter", "mean": the divisor 1, Cout or the number of terms) and `density`
("layer", or "channel": each output channel's own rho and b) are those choices. What each
does to training, with the measurements: docs/channel.md, "Eq. 4's choices".
"""
import keras
import tensorflow as tf

from tf_sparseconv.layer_config import choice, flag, real

REDUCTIONS = ("sum", "mean", "filter")
DENSITIES = ("layer", "channel")


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class DensityRegularizer:
    """Eq. 4 for one layer: scale is lambda, o, b1 and b2 are Eq. 4's; reduction,
    include_bias and density are the choices of the module docstring."""

    def __init__(self, scale=0.1, o=0.1, b1=0.1, b2=0.1, reduction="sum", include_bias=True, density="layer"):
        what = "DensityRegularizer"
        self.scale, self.o, self.b1, self.b2 = (real(value, name, what, 0.0) for name, value in
                                                (("scale", scale), ("o", o), ("b1", b1), ("b2", b2)))
        choice(reduction, "reduction", what, REDUCTIONS)
        choice(density, "density", what, DENSITIES)
        self.reduction = reduction
        self.include_bias = flag(include_bias, "include_bias", what)
        self.density = density

    def bias(self, rho, rho_up):
        """Eq. 4's b for measured density rho and bound rho_up (tensors or floats)."""
        rho = tf.convert_to_tensor(rho, tf.float32)
        rho_up = tf.convert_to_tensor(rho_up, tf.float32)
        return tf.where(rho > rho_up, self.o + self.b1 * (rho - rho_up), -self.b2 * (rho_up - rho))

    def penalty(self, kernel, mask, rho, rho_up, bias=None):
        """lambda * sum over present weights (and, with include_bias, the layer's biases) of
        (w + b)^2, divided by 1 ("sum"), by Cout, the kernel's last axis ("filter"), or by
        the number of terms ("mean"; 0 when none is left). rho is a scalar, or one density
        per output channel ([Cout], the kernel's last axis) giving each filter its own b. The
        density is a measurement, so no gradient flows into it."""
        b = tf.cast(tf.stop_gradient(self.bias(rho, rho_up)), kernel.dtype)
        mask = tf.cast(mask, kernel.dtype)
        total = tf.reduce_sum(mask * tf.square(kernel + b))
        terms = tf.reduce_sum(mask)
        if self.include_bias and bias is not None:
            total += tf.reduce_sum(tf.square(bias + b))
            terms += tf.cast(tf.size(bias), kernel.dtype)
        if self.reduction == "mean":
            total = tf.math.divide_no_nan(total, terms)
        elif self.reduction == "filter":
            total = total / tf.cast(tf.shape(kernel)[-1], kernel.dtype)
        return self.scale * total

    def get_config(self):
        return {"scale": self.scale, "o": self.o, "b1": self.b1, "b2": self.b2, "reduction": self.reduction,
                "include_bias": self.include_bias, "density": self.density}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
