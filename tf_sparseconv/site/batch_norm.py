"""Batch normalization of site feature rows by the library's row batch-norm ops.

Keras 3's BatchNormalization computes its moments and its normalisation as a dozen separate
element-wise and reduction ops, each a pass over the [N, C] rows in float32 (after a cast of
float16 rows): on the lent H200 (2026-11-29, benchmarks/results/site_e2e_kernels.jsonl) they
were about half of a SparseResUNet42 training step's GPU time at 346k sites in float16, and
TensorFlow's own FusedBatchNormV3 still transposed the rows for cuDNN (NCHW) on each call.
FusedBatchNormalization keeps Keras' layer (its weights, configuration, moving-average rule
and mixed-precision behaviour) and computes the same values by the ops of
csrc/site/batch_norm: RowBatchNorm (training: one pass for the statistics, one for the
rows), its gradient RowBatchNormGrad (two passes) and RowNormalize (inference: one pass,
the moving statistics folded in the op rather than by four element-wise ops before it),
float32 statistics and sums whatever the rows' type, no host round trip. Wrap it like any
feature layer: SiteFeatures(FusedBatchNormalization(momentum=0.9)).

The ops serve float16, bfloat16 and float32 rows over the last axis, without renorm or
mask; anything else takes Keras' own computation, unchanged. With synchronized=True under a
strategy of several replicas, a training call all-reduces one vector per layer (the rows'
sums, their squares' sums and their count, synchronized_row_statistics) and normalises by
RowNormalize with the global statistics; its gradient is one all-reduce more. Keras' own
synchronized computation all-reduces three tensors forward and two backward, each a
collective that every replica waits for (five per layer and step against two). The
statistics outputs are not differentiated (as Keras' moving averages are not). One
improvement over Keras: a batch without rows leaves the moving statistics as they were
(Keras would make them NaN).
"""
import keras
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.layer_config import FLOATS, dtype_policy, real

ROW_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


def row_batch_norm(x, gamma, beta, epsilon):
    """Rows x [N, C] normalised with their own statistics per column:
    -> (y [N, C] of x's type, mean [C], biased variance [C]) (statistics in float32)."""
    y, mean, variance, _ = _ops.row_batch_norm(x, gamma, beta, epsilon=epsilon)
    return y, mean, variance


def row_scale_shift(x, scale, shift):
    """x * scale + shift per column of rows x [N, C], computed in float32."""
    return _ops.row_scale_shift(x, scale, shift)


def row_normalize(x, mean, variance, gamma, beta, epsilon):
    """Rows x [N, C] normalised with given statistics (inference): (x - mean) * gamma /
    sqrt(variance + epsilon) + beta per column, computed in float32, in one op."""
    return _ops.row_normalize(x, mean, variance, gamma, beta, epsilon=epsilon)


def synchronized_row_statistics(rows, shift, context):
    """Statistics per column of the rows [N, C] of every replica, by one all-reduce in the
    replica context: -> (mean [C], biased variance [C], rows of all replicas), float32.

    The sums are of rows - shift, shift [C] being the same on every replica (the layer's
    moving mean): once it nears the mean, the variance E[(x - s)^2] - E[x - s]^2 no longer
    cancels away its digits as E[x^2] - E[x]^2 does for rows far from zero. Differentiable:
    the gradient all-reduces the sums' gradients (tf.distribute's rule for a SUM)."""
    channels = rows.shape[-1]
    centred = tf.cast(rows, tf.float32) - tf.stop_gradient(shift)
    local = tf.concat([tf.reduce_sum(centred, 0), tf.reduce_sum(tf.square(centred), 0),
                       tf.cast(tf.shape(rows)[:1], tf.float32)], 0)
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
    count = total[2 * channels]
    offset = tf.math.divide_no_nan(total[:channels], count)
    variance = tf.maximum(tf.math.divide_no_nan(total[channels:2 * channels], count) - tf.square(offset), 0.0)
    return shift + offset, variance, count


@tf.RegisterGradient(OP_NAMESPACE + "RowBatchNorm")
def _row_batch_norm_grad(op, dy, *statistics_grads):
    x, gamma, _ = op.inputs
    _, mean, _, inv_std = op.outputs
    dx, dgamma, dbeta = _ops.row_batch_norm_grad(dy, x, gamma, mean, inv_std)
    return [dx, dgamma, dbeta]


@tf.RegisterGradient(OP_NAMESPACE + "RowScaleShift")
def _row_scale_shift_grad(op, dy):
    x, scale, shift = op.inputs
    dy32 = tf.cast(dy, tf.float32)
    return [_ops.row_scale_shift(dy, scale, tf.zeros_like(shift)), tf.reduce_sum(dy32 * tf.cast(x, tf.float32), 0),
            tf.reduce_sum(dy32, 0)]


@tf.RegisterGradient(OP_NAMESPACE + "RowNormalize")
def _row_normalize_grad(op, dy):
    x, mean, variance, gamma, _ = op.inputs
    inv_std = 1.0 / tf.sqrt(variance + op.get_attr("epsilon"))
    scale = gamma * inv_std
    dy32 = tf.cast(dy, tf.float32)
    dbeta = tf.reduce_sum(dy32, 0)
    centred = tf.reduce_sum(dy32 * (tf.cast(x, tf.float32) - mean), 0)
    return [_ops.row_scale_shift(dy, scale, tf.zeros_like(scale)), -dbeta * scale,
            -0.5 * centred * gamma * inv_std ** 3, centred * inv_std, dbeta]


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization over the last axis whose float16, bfloat16 and float32
    computation is the library's row batch-norm ops (one op forward, one backward)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Keras takes these and computes garbage: integer rows, NaN for epsilon <= 0, moving
        # statistics running away for a momentum outside [0, 1].
        dtype_policy(self, FLOATS)
        real(self.momentum, "momentum", self.name, 0.0, 1.0)
        real(self.epsilon, "epsilon", self.name, 0.0, low_open=True)
        self.supports_jit = False  # custom ops: Keras must not XLA-compile a model using them

    def _rows_apply(self, inputs, training, mask):
        x = tf.convert_to_tensor(inputs)
        return (keras.backend.backend() == "tensorflow" and mask is None and not self.renorm
                and x.dtype in ROW_DTYPES and x.shape.rank is not None
                and x.shape.rank >= 2 and self.axis in (-1, x.shape.rank - 1)
                and (training is None or isinstance(training, bool)))

    def call(self, inputs, training=None, mask=None):
        if not self._rows_apply(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        x = tf.convert_to_tensor(inputs)
        channels = x.shape[-1]
        rows = tf.reshape(x, [-1, channels])
        gamma = tf.cast(self.gamma, tf.float32) if self.scale else tf.ones([channels], tf.float32)
        beta = tf.cast(self.beta, tf.float32) if self.center else tf.zeros([channels], tf.float32)
        if training and self.trainable:
            context = tf.distribute.get_replica_context() if self.synchronized else None
            if context is not None and context.num_replicas_in_sync > 1:
                mean, variance, count = synchronized_row_statistics(rows, tf.cast(self.moving_mean, tf.float32),
                                                                    context)
                y = row_normalize(rows, mean, variance, gamma, beta, self.epsilon)
                has_rows = count > 0
            else:  # one replica (or a cross-replica call, as Keras): the batch's own statistics
                y, mean, variance = row_batch_norm(rows, gamma, beta, self.epsilon)
                has_rows = tf.shape(rows)[0] > 0
            momentum = tf.cast(self.momentum, tf.float32)
            for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
                old = tf.cast(moving, tf.float32)
                moving.assign(tf.cast(tf.where(has_rows, old * momentum + batch * (1.0 - momentum), old),
                                      moving.dtype))
        else:
            y = row_normalize(rows, tf.cast(self.moving_mean, tf.float32), tf.cast(self.moving_variance, tf.float32),
                              gamma, beta, self.epsilon)
        return tf.cast(tf.reshape(y, tf.shape(x)), self.compute_dtype)
