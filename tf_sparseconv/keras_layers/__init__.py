"""Keras 3 layers over the channel-sparse and the site-sparse ops (TensorFlow backend).

Between layers a channel-sparse batch is the dict made by `as_keras_inputs`; models start
from `sparse_input`, `PointCloudToSparse` (point clouds, normalised and voxelized in the
graph), `ImageToSparse`, `VoxelizePoints` or `DenseToSparse` and leave through
`SparseToDense`; `SparseToSite` hands a channel-sparse batch to site layers and
`ClassNames` keeps class names with a saved classifier.
A site-sparse batch is the dict made by `as_site_keras_inputs` (cached kernel maps
included); models start from `site_input` or `SiteVoxelize` and leave through
`SiteGlobalPool`, `SiteToPoints` or the dict's "features" rows.
"""
from tf_sparseconv.keras_layers.conv import SparseConv
from tf_sparseconv.keras_layers.density_regularizer import DensityRegularizer
from tf_sparseconv.keras_layers.fine_tune import FineTunePhase
from tf_sparseconv.keras_layers.layers import DenseToSparse, SparseMaxPool, SparseReLU, SparseToDense, VoxelizePoints
from tf_sparseconv.keras_layers.preprocessing import ClassNames, ImageToSparse, PointCloudToSparse, SparseToSite
from tf_sparseconv.keras_layers.pruning import WarningShotPruning, present_weight_count, sparse_conv_layers
from tf_sparseconv.keras_layers.site_inputs import as_site_keras_inputs, from_site_keras_inputs, site_input
from tf_sparseconv.keras_layers.site_layers import (SiteAdd, SiteConcat, SiteConv, SiteConvTranspose, SiteFeatures,
                                                    SiteGlobalPool, SiteInverseConv, SitePool, SiteSelect,
                                                    SiteToPoints, SiteVoxelize, SubMConv)
from tf_sparseconv.keras_layers.sparse_inputs import as_keras_inputs, from_keras_inputs, sparse_input

__all__ = ["SparseConv", "SparseReLU", "SparseMaxPool", "SparseToDense", "DenseToSparse", "VoxelizePoints",
           "PointCloudToSparse", "ImageToSparse", "SparseToSite", "ClassNames",
           "DensityRegularizer", "WarningShotPruning", "FineTunePhase", "present_weight_count", "sparse_conv_layers",
           "as_keras_inputs", "from_keras_inputs", "sparse_input",
           "SiteConv", "SubMConv", "SiteConvTranspose", "SiteInverseConv", "SitePool", "SiteGlobalPool", "SiteSelect",
           "SiteFeatures", "SiteConcat", "SiteAdd", "SiteVoxelize", "SiteToPoints",
           "as_site_keras_inputs", "from_site_keras_inputs", "site_input"]
