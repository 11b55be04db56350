"""Sparse max-pooling (Hackel et al. §3.3): window = stride, output position floor(x / s)."""
import tensorflow as tf

from tf_sparseconv._op_library import ops as _ops
from tf_sparseconv.channel.tensor import ChannelSparseTensor


def sparse_max_pool(x, strides):
    """Pools x [B, R..., C] to [B, ceil(R/s)..., C]; `strides` is an int or one per dim.

    The gradient flows to the arg-max entry of each window (ties: the smaller key).
    """
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"sparse_max_pool expects a ChannelSparseTensor, got {type(x).__name__}")
    d = x.spatial_rank
    strides = [int(strides)] * d if isinstance(strides, int) else [int(s) for s in strides]
    keys, values, dense_shape, _ = _ops.sparse_max_pool(x.keys, x.values, x.dense_shape, strides=strides)
    return ChannelSparseTensor(keys, values, dense_shape, pooled_shape(x.shape, strides))


def pooled_shape(shape, strides):
    """Static shape after pooling: spatial extents ceil(R / s)."""
    if shape.rank is None:
        return tf.TensorShape(None)
    dims = shape.as_list()
    spatial = [None if r is None else -(-r // s) for r, s in zip(dims[1:-1], strides)]
    return tf.TensorShape([dims[0], *spatial, dims[-1]])


@tf.RegisterGradient("SparseMaxPool")
def _sparse_max_pool_grad(op, _keys_grad, values_grad, _shape_grad, _argmax_grad):
    n = tf.shape(op.inputs[1], out_type=tf.int64)
    return [None, tf.scatter_nd(op.outputs[3][:, None], values_grad, n), None]
