"""Keras 3 layers over the channel-sparse ops (TensorFlow backend).

Between layers a channel-sparse batch is the dict made by `as_keras_inputs`; models start
from `sparse_input`, `VoxelizePoints` or `DenseToSparse` and leave through `SparseToDense`.
"""
from tf_sparseconv.keras_layers.conv import SparseConv
from tf_sparseconv.keras_layers.density_regularizer import DensityRegularizer
from tf_sparseconv.keras_layers.layers import DenseToSparse, SparseMaxPool, SparseReLU, SparseToDense, VoxelizePoints
from tf_sparseconv.keras_layers.pruning import WarningShotPruning, present_weight_count, sparse_conv_layers
from tf_sparseconv.keras_layers.sparse_inputs import as_keras_inputs, from_keras_inputs, sparse_input

__all__ = ["SparseConv", "SparseReLU", "SparseMaxPool", "SparseToDense", "DenseToSparse", "VoxelizePoints",
           "DensityRegularizer", "WarningShotPruning", "present_weight_count", "sparse_conv_layers",
           "as_keras_inputs", "from_keras_inputs", "sparse_input"]
