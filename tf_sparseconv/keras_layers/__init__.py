"""Keras 3 layers of both families (TensorFlow backend), gathered from the packages that
define them: tf_sparseconv.channel, tf_sparseconv.site, tf_sparseconv.training and
tf_sparseconv.models.

Between layers a channel-sparse batch is the dict made by `as_keras_inputs`; models start
from `sparse_input`, `PointCloudToSparse` (point clouds, normalised and voxelized in the
graph), `ImageToSparse`, `VoxelizePoints` or `DenseToSparse`, run `DirectSparseConv`,
`SparseReLU` and `SparseMaxPool`, and leave through `SparseToDense`; `SparseToSite`
hands a channel-sparse batch to site layers and `ClassNames` keeps class names with a
saved classifier. `HostSeedDropout` is Keras' Dropout with its seed drawn on the host (the
models' dense heads use it: no copy back from the GPU per step).
A site-sparse batch is the dict made by `as_site_keras_inputs` (cached kernel maps
included); models start from `site_input` or `SiteVoxelize`, run `SubMConv3D`,
`SparseConv3D`, `SparseConvTranspose3D`, `SparseInverseConv3D`, `SiteMaxPooling3D`,
`SiteAveragePooling3D` (1-D, 2-D and 4-D forms too), `SiteFeatures` (feature-row layers,
e.g. `FusedBatchNormalization`) and `SiteConvBlock` (convolution, batch norm and ReLU, folded
into one op in inference), and leave through
`SiteGlobalPool`, `SiteToPoints` or the dict's "features" rows.

Deprecated names, kept one release (they warn): SparseConv (-> DirectSparseConv), SiteConv,
SubMConv, SiteConvTranspose, SiteInverseConv, SitePool.
"""
from tf_sparseconv.channel import (DenseToSparse, DirectSparseConv, SparseConv, SparseMaxPool, SparseReLU,
                                   SparseToDense, as_keras_inputs, from_keras_inputs, sparse_input)
from tf_sparseconv.models.host_seed_dropout import HostSeedDropout
from tf_sparseconv.models.preprocessing import ImageToSparse, PointCloudToSparse, VoxelizePoints
from tf_sparseconv.models.serving import ClassNames
from tf_sparseconv.site import (FusedBatchNormalization, SiteAdd, SiteAveragePooling1D, SiteAveragePooling2D,
                                SiteAveragePooling3D, SiteAveragePooling4D, SiteConcat, SiteConv, SiteConvBlock,
                                SiteConvTranspose, SiteFeatures, SiteGlobalPool, SiteInverseConv, SiteMaxPooling1D,
                                SiteMaxPooling2D, SiteMaxPooling3D, SiteMaxPooling4D, SitePool, SiteSelect,
                                SiteToPoints, SiteVoxelize,
                                SparseConv1D, SparseConv2D, SparseConv3D, SparseConv4D, SparseConvTranspose1D,
                                SparseConvTranspose2D, SparseConvTranspose3D, SparseConvTranspose4D,
                                SparseInverseConv1D, SparseInverseConv2D, SparseInverseConv3D, SparseInverseConv4D,
                                SparseToSite, SubMConv, SubMConv1D, SubMConv2D, SubMConv3D, SubMConv4D,
                                as_site_keras_inputs, from_site_keras_inputs, site_input)
from tf_sparseconv.site import DEPRECATED_LAYERS as _SITE_DEPRECATED
from tf_sparseconv.site import LAYERS as _SITE_LAYERS
from tf_sparseconv.training import (DensityRegularizer, FineTunePhase, WarningShotPruning, present_weight_count,
                                    sparse_conv_layers)

__all__ = ["DirectSparseConv", "SparseReLU", "SparseMaxPool", "SparseToDense", "DenseToSparse", "VoxelizePoints",
           "PointCloudToSparse", "ImageToSparse", "ClassNames", "HostSeedDropout",
           "DensityRegularizer", "WarningShotPruning", "FineTunePhase", "present_weight_count", "sparse_conv_layers",
           "as_keras_inputs", "from_keras_inputs", "sparse_input",
           *_SITE_LAYERS, "as_site_keras_inputs", "from_site_keras_inputs", "site_input",
           "SparseConv", *_SITE_DEPRECATED]
