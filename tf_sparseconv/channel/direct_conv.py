"""Direct sparse convolution with k-selection attention (Hackel et al. Alg. 1, §3.2)."""
import math

import numpy as np
import tensorflow as tf

from tf_sparseconv._op_library import ops as _ops
from tf_sparseconv.channel.tensor import ChannelSparseTensor

SELECTION_MODES = ("none", "signed", "abs")
ACCUMULATORS = ("auto", "dense", "merge")


def k_from_rho_up(rho_up, spatial_shape):
    """k = ceil(rho_up * R1 * ... * Rd): the per-(batch, channel) entry bound.

    rho_up is rounded to float32 first, as the op's attr holds it: ceil(0.1 * 100) is 10
    in double precision but 11 from float32 0.1, and the bound must be the op's."""
    if not 0.0 < rho_up <= 1.0:
        raise ValueError(f"rho_up must be in (0, 1], got {rho_up}")
    return int(math.ceil(float(np.float32(rho_up)) * math.prod(int(r) for r in spatial_shape)))


def direct_conv(x, filters, bias=None, filter_mask=None, *, selection="none", k=None,
                rho_up=None, accumulator="auto", return_counts=False):
    """Convolves a ChannelSparseTensor [B, R..., Cin] with a [K..., Cin, Cout] filter.

    Stride 1, 'same' zero padding, odd kernel sizes, cross-correlation as in
    tf.nn.convolution, restricted to the touched set: every position that a present
    entry reaches through a present (filter_mask true) weight. `selection` 'signed' or
    'abs' keeps at most k entries per (batch, output channel); give k or rho_up.
    `accumulator` picks how the CPU kernel sums ('auto', 'dense', 'merge': the same
    values); the GPU kernel has one, sort-based, way and ignores it.

    Returns a ChannelSparseTensor [B, R..., Cout]; with return_counts also two [B, Cout]
    int64 tensors measured before k-selection: the support size (touched entries) and the
    number of entries > 0 (what a following ReLU keeps; the density of Eq. 4).
    """
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"direct_conv expects a ChannelSparseTensor, got {type(x).__name__}")
    if selection not in SELECTION_MODES:
        raise ValueError(f"selection must be one of {SELECTION_MODES}, got {selection!r}")
    if accumulator not in ACCUMULATORS:
        raise ValueError(f"accumulator must be one of {ACCUMULATORS}, got {accumulator!r}")
    filters = tf.convert_to_tensor(filters, dtype=x.dtype)
    cout = tf.shape(filters)[-1]
    if bias is None:
        bias = tf.zeros([cout], dtype=x.dtype)
    if filter_mask is None:
        filter_mask = tf.ones_like(filters, dtype=tf.bool)
    keys, values, dense_shape, touched, positive = _ops.direct_sparse_conv(
        in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape, filter=filters,
        filter_mask=tf.cast(filter_mask, tf.bool), bias=tf.convert_to_tensor(bias, dtype=x.dtype),
        selection=selection, k=0 if k is None else int(k),
        rho_up=0.0 if rho_up is None else float(rho_up), accumulator=accumulator)
    out_shape = x.shape if x.shape.rank is None else x.shape[:-1].concatenate([filters.shape[-1]])
    y = ChannelSparseTensor(keys, values, dense_shape, out_shape)
    return (y, touched, positive) if return_counts else y


@tf.RegisterGradient("DirectSparseConv")
def _direct_sparse_conv_grad(op, _keys_grad, values_grad, _shape_grad, _touched_grad, _positive_grad):
    in_keys, in_values, dense_shape, filters, filter_mask, _bias = op.inputs
    in_grad, filter_grad, bias_grad = _ops.direct_sparse_conv_backprop(
        in_keys=in_keys, in_values=in_values, dense_shape=dense_shape, filter=filters,
        filter_mask=filter_mask, out_keys=op.outputs[0], out_grad=values_grad,
        accumulator=op.get_attr("accumulator"))
    return [None, in_grad, None, filter_grad, None, bias_grad]
