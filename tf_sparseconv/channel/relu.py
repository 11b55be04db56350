"""Sparse ReLU: drops entries <= 0, so activations get sparser, never denser."""
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.channel.tensor import ChannelSparseTensor


def sparse_relu(x):
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"sparse_relu expects a ChannelSparseTensor, got {type(x).__name__}")
    keys, values, _ = _ops.sparse_relu(x.keys, x.values, x.dense_shape, padded_input=x.padded)
    return ChannelSparseTensor(keys, values, x.dense_shape, x.shape)


@tf.RegisterGradient(OP_NAMESPACE + "SparseRelu")
def _sparse_relu_grad(op, _keys_grad, values_grad, _kept_grad):
    n = tf.shape(op.inputs[1], out_type=tf.int64)
    return [None, tf.scatter_nd(op.outputs[2][:, None], values_grad, n), None]
