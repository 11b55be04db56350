"""Sparse max-pooling (Hackel et al. §3.3): window = stride, output position floor(x / s)."""
import numbers
import operator

import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.channel.tensor import PADDING_KEY, ChannelSparseTensor
from tf_sparseconv.checks import check_every_op, made_by_library
from tf_sparseconv.geometry import pooled_shape
from tf_sparseconv.layer_config import flag

_INT32_MAX = 2**31 - 1


def _stride(value):
    """value as an int (TypeError for a bool, a float, a string: never truncated)."""
    if isinstance(value, bool):
        raise TypeError
    return operator.index(value)


def sparse_max_pool(x, strides, padded_output=False):
    """Pools x [B, R..., C] to [B, ceil(R/s)..., C]; `strides` is an int or one per dim.

    The gradient flows to the arg-max entry of each window (ties: the smaller key).
    padded_output: the result has as many entries as x (at most one per output cell), its
    live entries followed by padding (ChannelSparseTensor.padded): a size known before the
    op runs, so that on the GPU, for keys a library op made in the same traced graph, the op
    queues its work without waiting for the device.
    """
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"sparse_max_pool expects a ChannelSparseTensor, got {type(x).__name__}")
    try:
        if isinstance(strides, (str, bytes)):  # "22" would be two strides of 2
            raise TypeError
        strides = [_stride(strides)] * x.spatial_rank if isinstance(strides, numbers.Integral) else \
            [_stride(s) for s in strides]
    except TypeError:
        raise TypeError(f"sparse_max_pool: strides must be an int or one int per spatial dimension, "
                        f"got {strides!r}") from None
    if any(s > _INT32_MAX for s in strides):
        raise ValueError(f"sparse_max_pool: strides must be at most 2^31 - 1, got {strides}")
    padded_output = flag(padded_output, "padded_output", "sparse_max_pool")
    # The op checks the strides' count and values (InvalidArgumentError naming the bad one).
    trusted = not check_every_op() and made_by_library(x.keys, x.dense_shape)
    keys, values, dense_shape, _ = _ops.sparse_max_pool(x.keys, x.values, x.dense_shape, strides=strides,
                                                        padded_input=x.padded, padded_output=padded_output,
                                                        inputs_checked=trusted)
    shape = x.shape
    if shape.rank is not None and len(strides) == shape.rank - 2 and min(strides) >= 1:
        dims = shape.as_list()
        shape = tf.TensorShape([dims[0], *pooled_shape(dims[1:-1], strides), dims[-1]])
    return ChannelSparseTensor(keys, values, dense_shape, shape, padded_output)


@tf.RegisterGradient(OP_NAMESPACE + "SparseMaxPool")
def _sparse_max_pool_grad(op, _keys_grad, values_grad, _shape_grad, _argmax_grad):
    n = tf.shape(op.inputs[1], out_type=tf.int64)
    if op.get_attr("padded_output"):  # padding passes no gradient on (its argmax: its own position)
        values_grad = tf.where(op.outputs[0] == PADDING_KEY, tf.zeros_like(values_grad), values_grad)
    return [None, tf.scatter_nd(op.outputs[3][:, None], values_grad, n), None]
