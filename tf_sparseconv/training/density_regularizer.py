"""Adaptive density regularisation (Hackel et al. §3.5, Eq. 4).

The penalty lambda * sum((w + b)^2) over a layer's present filter weights pulls the
weights towards -b. With rho the layer's measured density and rho_up its bound:
    b = o + b1 * (rho - rho_up)    if rho > rho_up   (too dense: lower the weights, so
                                                       the following ReLU drops more)
    b = -b2 * (rho_up - rho)       otherwise          (resources unused: raise them)

rho is measured by DirectSparseConv in the same training step, before k-selection (the ReLU's
survivors over all cells of the batch): measured after it, rho could never exceed rho_up
and b would never carry the offset o.

Reduction. The paper writes the penalty as a sum and gives lambda in {0.1, 0.2, 0.3} with
o = b1 = b2 = 0.1, but states neither how the sum is normalised nor the weights' scale.
`reduction` chooses what the squares are summed over, i.e. the per-weight gradient
2 lambda (w + b) / divisor:
    "sum"    (default; the issue's lambda * sum) divisor 1: lambda acts like a weight decay
             of 2 lambda = 0.6 towards -b. Against a cross-entropy gradient of 1e-2..1e-1
             per conv weight (OctNet3 16^3, batch 32) it dominates every weight: with
             lambda >= 0.1 all weights of a layer go to -b ~ -0.1..-0.15, larger than
             their Glorot scale, and since the layers' inputs are ReLU outputs (>= 0) every
             response dies; ModelNet40 16^3 fell to chance (0.091) with Adam and Adagrad.
    "filter" divisor Cout: the sum over each output channel's filter (the weights that
             produce one channel, the unit k-selection bounds per batch element),
             averaged over the layer's filters, so lambda does not grow with the layer's
             width. Per-weight strength 2 lambda / Cout (0.075 and 0.0375 for OctNet3's 8
             and 16 channels at lambda 0.3), the same order as the data gradient: the
             regulariser moves the density towards rho_up and prunes without destroying
             accuracy. experiments/pruning.py uses this.
    "mean"   divisor = the layer's present weights (fan-in * Cout, 216..6912 in OctNet3
             16^3): lambda <= 0.3 is then 100-1000x weaker than the data gradient and
             hardly moves the density (the measured rho stayed 2-4x above rho_up after 3
             epochs, as without regularisation); use lambda of order the weight count.
All three have the same minimiser for a layer on its own (every weight at -b); they differ
only in how strongly that pull competes with the data loss.

Terms. §3.5 encourages sparsity "by lowering the values (not magnitudes) of filter weights
and biases", so by default (include_bias=True) each of the layer's biases is pulled towards
-b like a present weight, one more term of its filter's sum. include_bias=False pulls the
weights only (what this project did until 2026-11-24; the Fig. 6 runs of that date are
marked lam_terms "weights" in experiments/results/).

Density. The paper compares "the density" with "the upper bound implied by the k-selection
filter"; k-selection bounds every (example, channel) on its own. density="layer" (default)
takes rho over all of the layer's output channels, one b for the whole layer; "channel"
takes each output channel's own rho (its survivors over the batch's cells) and pulls that
channel's filter and bias with its own b. Under "layer" a layer with two channels cut to k
and six dead reads as under its bound and every filter is pulled up by the same small b;
under "channel" the cut channels are pulled down and the dead ones up. Measured (ModelNet40
16^3, lambda 0.3, epsilon 0.03, 60 epochs): "channel" left one live channel per layer of
the first block, not more, and was faster and less accurate than "layer".
"""
import keras
import tensorflow as tf

REDUCTIONS = ("sum", "mean", "filter")
DENSITIES = ("layer", "channel")


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class DensityRegularizer:
    def __init__(self, scale=0.1, o=0.1, b1=0.1, b2=0.1, reduction="sum", include_bias=True, density="layer"):
        for name, value in (("scale", scale), ("o", o), ("b1", b1), ("b2", b2)):
            if not value >= 0:
                raise ValueError(f"DensityRegularizer {name} must be >= 0, got {value}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"DensityRegularizer reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.scale, self.o, self.b1, self.b2 = float(scale), float(o), float(b1), float(b2)
        if density not in DENSITIES:
            raise ValueError(f"DensityRegularizer density must be one of {DENSITIES}, got {density!r}")
        self.reduction = reduction
        self.include_bias = bool(include_bias)
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
