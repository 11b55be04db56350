"""Sparse ReLU: drops entries <= 0, so activations get sparser, never denser."""
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.channel.tensor import PADDING_KEY, ChannelSparseTensor
from tf_sparseconv.checks import check_every_op, made_by_library
from tf_sparseconv.layer_config import flag


def sparse_relu(x, padded_output=False):
    """x's entries > 0 (a NaN value is InvalidArgument).

    padded_output: the result has as many entries as x, its kept entries followed by padding
    (ChannelSparseTensor.padded): a size known before the op runs, so that on the GPU, for
    keys a library op made in the same traced graph, the op queues its work without waiting
    for the device. It then checks nothing: a NaN value (which a library op's output holds
    only where that op's own arithmetic overflowed) is kept, for the next convolution's check
    or the result to show, instead of refused at once.
    """
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"sparse_relu expects a ChannelSparseTensor, got {type(x).__name__}")
    padded_output = flag(padded_output, "padded_output", "sparse_relu")
    trusted = not check_every_op() and made_by_library(x.keys, x.dense_shape)
    keys, values, _ = _ops.sparse_relu(x.keys, x.values, x.dense_shape, padded_input=x.padded,
                                       padded_output=padded_output, inputs_checked=trusted)
    return ChannelSparseTensor(keys, values, x.dense_shape, x.shape, padded_output)


@tf.RegisterGradient(OP_NAMESPACE + "SparseRelu")
def _sparse_relu_grad(op, _keys_grad, values_grad, _kept_grad):
    n = tf.shape(op.inputs[1], out_type=tf.int64)
    if op.get_attr("padded_output"):  # padding passes no gradient on (its kept: its own position)
        values_grad = tf.where(op.outputs[0] == PADDING_KEY, tf.zeros_like(values_grad), values_grad)
    return [None, tf.scatter_nd(op.outputs[2][:, None], values_grad, n), None]
