"""SiteConvBlock: a site convolution, its batch norm and a ReLU as one Keras layer.

Training (where the batch norm normalises by its batch's statistics) runs the three as
they would run one after the other. Inference hands the batch norm's moving statistics
and parameters to the convolution op, whose epilogue (SiteSparseConv) computes (v - mean)
/ sqrt(variance + epsilon) * gamma + beta and the ReLU as it stores each output value, so
a block is one op over the rows instead of three passes. The values
are the unfolded ones up to rounding: the epilogue works in float32 before the output is
rounded to float16, where the separate layers round the convolution's output first.
"""
import keras
import tensorflow as tf

from tf_sparseconv.site.conv_layers import _SiteConv
from tf_sparseconv.site.keras_io import SiteLayer

register = keras.saving.register_keras_serializable(package="tf_sparseconv")


def _layer(value, what, kind, name):
    if isinstance(value, dict):
        value = keras.saving.deserialize_keras_object(value)
    if not isinstance(value, kind):
        raise TypeError(f"{name}: {what} must be a {kind.__name__}, got {type(value).__name__}")
    return value


@register
class SiteConvBlock(SiteLayer):
    """conv -> norm -> activation over site features, the batch norm folded into the
    convolution in inference (module docstring).

    conv: a site convolution layer (SubMConv3D, SparseConv3D, SparseConvTranspose3D,
    SparseInverseConv3D, other ranks alike) without an activation of its own; norm: a
    keras.layers.BatchNormalization over the channels (FusedBatchNormalization too);
    activation: None or "relu". The weights stay the two layers' (a checkpoint of the
    block holds the conv's and the norm's variables under their names).

        x = SiteConvBlock(SubMConv3D(64, 3, use_bias=False, indice_key="subm1"),
                          FusedBatchNormalization(), activation="relu")(x)
    """

    def __init__(self, conv, norm, activation=None, **kwargs):
        conv = _layer(conv, "conv", _SiteConv, kwargs.get("name", "SiteConvBlock"))
        kwargs.setdefault("dtype", conv.dtype_policy)  # the conv's kernel is read under the block's autocast
        super().__init__(**kwargs)
        self.conv = conv
        self.norm = _layer(norm, "norm", keras.layers.BatchNormalization, self.name)
        if self.conv.activation not in (None, keras.activations.linear):
            raise ValueError(f"{self.name}: the convolution must have no activation of its own (it runs before the "
                             f"batch norm); give the block activation= instead")
        if activation not in (None, "relu"):
            raise ValueError(f"{self.name}: activation must be None or 'relu', got {activation!r}")
        self.activation = activation

    def build(self, input_shape):
        if not self.conv.built:
            self.conv.build(input_shape)
        if not self.norm.built:
            self.norm.build((None, self.conv.filters))
        if self.norm.axis not in (-1, 1):
            raise ValueError(f"{self.name}: the batch norm must normalise the channels (axis -1), got axis "
                             f"{self.norm.axis}")

    def _folded(self):
        """The norm's moving statistics and parameters as the convolution's epilogue
        (site_conv's normalize, scale and bias): ((mean - conv bias, variance, epsilon),
        gamma, beta), gamma and beta None where the norm has none. No arithmetic on the
        statistics outside the op (a few small ops per block would cost more calls than
        the folding saves), but the conv's bias if it has one."""
        norm = self.norm
        mean = norm.moving_mean
        if self.conv.bias is not None:
            mean = tf.cast(mean, tf.float32) - tf.cast(self.conv.bias, tf.float32)
        return ((mean, norm.moving_variance, norm.epsilon), norm.gamma if norm.scale else None,
                norm.beta if norm.center else None)

    def site_call(self, x, training=None):
        if training and self.norm.trainable:  # the batch's statistics (Keras' rule)
            y = self.conv.convolve(x, bias=self.conv.bias)
            features = self.norm(y.features, training=training)
            if self.activation == "relu":
                features = tf.nn.relu(features)
            return y.with_features(tf.cast(features, y.features.dtype))
        normalize, gamma, beta = self._folded()
        return self.conv.convolve(x, scale=gamma, bias=beta, activation=self.activation, normalize=normalize)

    def get_config(self):
        return {**super().get_config(), "conv": keras.saving.serialize_keras_object(self.conv),
                "norm": keras.saving.serialize_keras_object(self.norm), "activation": self.activation}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(config.pop("conv"), config.pop("norm"), **config)
