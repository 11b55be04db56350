"""Keras 3 layers of both families (TensorFlow backend), gathered from the packages that
define them: tf_sparseconv.channel, tf_sparseconv.site, tf_sparseconv.training and
tf_sparseconv.models.preprocessing.

Between layers a channel-sparse batch is the dict made by `as_keras_inputs`; models start
from `sparse_input`, `PointCloudToSparse` (point clouds, normalised and voxelized in the
graph), `ImageToSparse`, `VoxelizePoints` or `DenseToSparse` and leave through
`SparseToDense`; `SparseToSite` hands a channel-sparse batch to site layers and
`ClassNames` keeps class names with a saved classifier.
A site-sparse batch is the dict made by `as_site_keras_inputs` (cached kernel maps
included); models start from `site_input` or `SiteVoxelize` and leave through
`SiteGlobalPool`, `SiteToPoints` or the dict's "features" rows.
"""
from tf_sparseconv.channel import (DenseToSparse, SparseConv, SparseMaxPool, SparseReLU, SparseToDense,
                                   as_keras_inputs, from_keras_inputs, sparse_input)
from tf_sparseconv.models.preprocessing import ImageToSparse, PointCloudToSparse, VoxelizePoints
from tf_sparseconv.models.serving import ClassNames
from tf_sparseconv.site import (SiteAdd, SiteConcat, SiteConv, SiteConvTranspose, SiteFeatures, SiteGlobalPool,
                                SiteInverseConv, SitePool, SiteSelect, SiteToPoints, SiteVoxelize, SparseToSite,
                                SubMConv, as_site_keras_inputs, from_site_keras_inputs, site_input)
from tf_sparseconv.training import (DensityRegularizer, FineTunePhase, WarningShotPruning, present_weight_count,
                                    sparse_conv_layers)

__all__ = ["SparseConv", "SparseReLU", "SparseMaxPool", "SparseToDense", "DenseToSparse", "VoxelizePoints",
           "PointCloudToSparse", "ImageToSparse", "SparseToSite", "ClassNames",
           "DensityRegularizer", "WarningShotPruning", "FineTunePhase", "present_weight_count", "sparse_conv_layers",
           "as_keras_inputs", "from_keras_inputs", "sparse_input",
           "SiteConv", "SubMConv", "SiteConvTranspose", "SiteInverseConv", "SitePool", "SiteGlobalPool", "SiteSelect",
           "SiteFeatures", "SiteConcat", "SiteAdd", "SiteVoxelize", "SiteToPoints",
           "as_site_keras_inputs", "from_site_keras_inputs", "site_input"]
