"""Batch normalization of site feature rows by TensorFlow's fused kernel.

Keras 3's BatchNormalization computes its moments and its normalisation as a dozen separate
element-wise and reduction ops, each a pass over the [N, C] rows in float32 (after a cast of
float16 rows): on the lent H200 (2026-11-29, benchmarks/results/site_e2e_kernels.jsonl) they
were about half of a SparseResUNet42 training step's GPU time at 346k sites in float16.
FusedBatchNormalization keeps Keras' layer (its weights, configuration, moving-average rule
and mixed-precision behaviour) and computes the same values by one `FusedBatchNormV3` op
(cuDNN on the GPU) and its gradient op, on the rows viewed as a 4-D tensor. Wrap it like any
feature layer: SiteFeatures(FusedBatchNormalization(momentum=0.9)).

The fused op serves float16, bfloat16 and float32 rows over the last axis, without renorm,
mask or cross-replica statistics; anything else takes Keras' own computation, unchanged.
One improvement over Keras: a batch without rows leaves the moving statistics as they were
(Keras would make them NaN).
"""
import keras
import tensorflow as tf

FUSED_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


# How the [N, C] rows are shown to the fused op, per dtype: "NCHW" as [N, C, 1, 1], "NHWC"
# as [1, 1, N, C]; both are the rows' own memory (no copy). Chosen by measurement on the
# lent GPU (benchmarks/site_e2e_gpu.py --bn); the CPU kernels serve both.
DATA_FORMAT = {"float16": "NHWC", "bfloat16": "NHWC", "float32": "NCHW"}


def _rows_as_image(rows):
    """The rows as the fused op's 4-D input -> (tensor, data_format)."""
    data_format = DATA_FORMAT[rows.dtype.name]
    shape = tf.shape(rows)
    if data_format == "NCHW":
        return tf.reshape(rows, tf.concat([shape, [1, 1]], 0)), data_format
    return tf.reshape(rows, tf.concat([[1, 1], shape], 0)), data_format


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization over the last axis whose float16, bfloat16 and float32
    computation is TensorFlow's fused batch-norm kernel (one op forward, one backward)."""

    def _fused_applies(self, inputs, training, mask):
        x = tf.convert_to_tensor(inputs)
        return (keras.backend.backend() == "tensorflow" and mask is None and not self.renorm
                and not self.synchronized and x.dtype in FUSED_DTYPES and x.shape.rank is not None
                and x.shape.rank >= 2 and self.axis in (-1, x.shape.rank - 1)
                and (training is None or isinstance(training, bool)))

    def call(self, inputs, training=None, mask=None):
        if not self._fused_applies(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        x = tf.convert_to_tensor(inputs)
        channels = x.shape[-1]
        rows = tf.reshape(x, [-1, channels])
        image, data_format = _rows_as_image(rows)
        scale = self.gamma if self.scale else tf.ones([channels], tf.float32)
        offset = self.beta if self.center else tf.zeros([channels], tf.float32)
        scale, offset = tf.cast(scale, tf.float32), tf.cast(offset, tf.float32)
        if training and self.trainable:
            y, mean, unbiased, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                x=image, scale=scale, offset=offset, mean=tf.zeros([0], tf.float32),
                variance=tf.zeros([0], tf.float32), epsilon=self.epsilon, exponential_avg_factor=1.0,
                data_format=data_format, is_training=True)
            # The op hands back the Bessel-corrected variance; Keras' moving average takes
            # the biased one its normalisation used.
            n = tf.cast(tf.shape(rows)[0], tf.float32)
            variance = unbiased * tf.maximum(n - 1.0, 0.0) / tf.maximum(n, 1.0)
            momentum = tf.cast(self.momentum, tf.float32)
            moving_mean = tf.cast(self.moving_mean, tf.float32)
            moving_variance = tf.cast(self.moving_variance, tf.float32)
            has_rows = n > 0
            new_mean = tf.where(has_rows, moving_mean * momentum + mean * (1.0 - momentum), moving_mean)
            new_variance = tf.where(has_rows, moving_variance * momentum + variance * (1.0 - momentum),
                                    moving_variance)
            self.moving_mean.assign(tf.cast(new_mean, self.moving_mean.dtype))
            self.moving_variance.assign(tf.cast(new_variance, self.moving_variance.dtype))
        else:
            y, _, _, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                x=image, scale=scale, offset=offset, mean=tf.cast(self.moving_mean, tf.float32),
                variance=tf.cast(self.moving_variance, tf.float32), epsilon=self.epsilon,
                exponential_avg_factor=1.0, data_format=data_format, is_training=False)
        return tf.cast(tf.reshape(y, tf.shape(x)), self.compute_dtype)
