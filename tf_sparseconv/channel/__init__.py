"""The channel-sparse family (Hackel et al.): tensors of sorted int64 keys over
{batch, x1..xd, channel} with a value each, the direct sparse convolution with
k-selection, sparse ReLU and max-pooling, and their Keras layers.

- tensor.py: ChannelSparseTensor;
- conversions.py, direct_conv.py, max_pool.py, relu.py: the op wrappers and their gradients;
- keras_io.py: how the tensor travels between Keras layers (as_keras_inputs, sparse_input);
- conv_layer.py: DirectSparseConv; layers.py: ReLU, pooling and the dense <-> sparse layers;
- deprecated.py: SparseConv, the old name of DirectSparseConv (one release);
- demo.py: `python -m tf_sparseconv.channel.demo`.
"""
from tf_sparseconv.channel.conv_layer import DirectSparseConv
from tf_sparseconv.channel.conversions import (decode_keys, encode_keys, from_dense, from_sparse_tensor, gather_dense,
                                               reorder, to_dense, to_sparse_tensor, validate)
from tf_sparseconv.channel.deprecated import SparseConv
from tf_sparseconv.channel.direct_conv import direct_conv, k_from_rho_up
from tf_sparseconv.channel.keras_io import as_keras_inputs, from_keras_inputs, sparse_input
from tf_sparseconv.channel.layers import DenseToSparse, SparseMaxPool, SparseReLU, SparseToDense
from tf_sparseconv.channel.max_pool import sparse_max_pool
from tf_sparseconv.channel.relu import sparse_relu
from tf_sparseconv.channel.tensor import ChannelSparseTensor

__all__ = ["ChannelSparseTensor", "from_dense", "to_dense", "gather_dense", "from_sparse_tensor", "to_sparse_tensor",
           "encode_keys", "decode_keys", "reorder", "validate", "direct_conv", "k_from_rho_up", "sparse_relu",
           "sparse_max_pool", "DirectSparseConv", "SparseReLU", "SparseMaxPool", "SparseToDense", "DenseToSparse",
           "as_keras_inputs", "from_keras_inputs", "sparse_input", "SparseConv"]
