"""tf_sparseconv: trainable sparse CNNs for TensorFlow.

Channel-sparse tensors (sorted int64 keys over {batch, x1..xd, channel} + values) and the
direct sparse convolution family of Hackel et al.: convolution that skips pruned
weights, k-selection attention that bounds density, sparse ReLU and max-pooling, and
sparsity-preserving gradients.
"""
from tf_sparseconv._op_library import ops as raw_ops  # noqa: F401  (loads and checks the op library)
from tf_sparseconv.channel_sparse_tensor import ChannelSparseTensor
from tf_sparseconv.ops.conversions import (decode_keys, encode_keys, from_dense, from_sparse_tensor,
                                           gather_dense, reorder, to_dense, to_sparse_tensor, validate)
from tf_sparseconv.ops.direct_conv import direct_conv, k_from_rho_up
from tf_sparseconv.ops.max_pool import sparse_max_pool
from tf_sparseconv.ops.relu import sparse_relu

__version__ = "0.1.0"

__all__ = [
    "ChannelSparseTensor", "from_dense", "to_dense", "gather_dense", "from_sparse_tensor",
    "to_sparse_tensor", "encode_keys", "decode_keys", "reorder", "validate", "direct_conv",
    "k_from_rho_up", "sparse_relu", "sparse_max_pool",
]
