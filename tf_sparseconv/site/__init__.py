"""The site-sparse family (as spconv, MinkowskiEngine, TorchSparse): active sites with
integer coordinates and a feature row each, convolved by gather-GEMM-scatter along
cached kernel maps, and their Keras layers.

- tensor.py: SiteSparseTensor and KernelMap;
- kernel_map.py: building and caching kernel maps (SiteKernelMap, SiteNeighbourTable ops);
- conv.py: submanifold, strided, transposed and inverse convolution (SiteSparseConv op);
- pool.py: window and global pooling (TensorFlow segment ops); select.py: density-bounded sites;
- conversions.py: dense grids, point clouds and channel-sparse tensors to and from sites;
- keras_io.py: how the tensor and its maps travel between Keras layers (site_input);
- conv_layers.py, pool_layers.py: SubMConv3D, SparseConv3D, SparseConvTranspose3D,
  SparseInverseConv3D, SiteMaxPooling3D, SiteAveragePooling3D (and 1-D, 2-D, 4-D), SiteGlobalPool;
- layers.py: the other Keras layers (in and out, selection, feature-row layers, merges);
- batch_norm.py: FusedBatchNormalization, Keras' batch norm of feature rows by the
  library's row ops (wrap it in SiteFeatures);
- conv_block.py: SiteConvBlock, a convolution, its batch norm and a ReLU as one layer, the
  batch norm folded into the convolution's epilogue in inference;
- deprecated.py: the layer names of 0.1 (SiteConv, SubMConv, SiteConvTranspose,
  SiteInverseConv, SitePool), one release.
"""
from tf_sparseconv.site.batch_norm import FusedBatchNormalization
from tf_sparseconv.site.conv import site_conv, site_conv_transpose, site_inverse_conv
from tf_sparseconv.site.conv_block import SiteConvBlock
from tf_sparseconv.site.conv_layers import (SparseConv1D, SparseConv2D, SparseConv3D, SparseConv4D,
                                            SparseConvTranspose1D, SparseConvTranspose2D, SparseConvTranspose3D,
                                            SparseConvTranspose4D, SparseInverseConv1D, SparseInverseConv2D,
                                            SparseInverseConv3D, SparseInverseConv4D, SubMConv1D, SubMConv2D,
                                            SubMConv3D, SubMConv4D)
from tf_sparseconv.site.conversions import (from_channel_sparse, site_from_dense, site_to_dense, to_channel_sparse,
                                            voxelize_sites)
from tf_sparseconv.site.deprecated import SiteConv, SiteConvTranspose, SiteInverseConv, SitePool, SubMConv
from tf_sparseconv.site.keras_io import as_site_keras_inputs, from_site_keras_inputs, site_input
from tf_sparseconv.site.kernel_map import kernel_map, neighbour_table
from tf_sparseconv.site.layers import (SiteAdd, SiteConcat, SiteFeatures, SiteSelect, SiteToPoints, SiteVoxelize,
                                       SparseToSite)
from tf_sparseconv.site.pool import global_pool, site_pool
from tf_sparseconv.site.pool_layers import (SiteAveragePooling1D, SiteAveragePooling2D, SiteAveragePooling3D,
                                            SiteAveragePooling4D, SiteGlobalPool, SiteMaxPooling1D, SiteMaxPooling2D,
                                            SiteMaxPooling3D, SiteMaxPooling4D)
from tf_sparseconv.site.select import select_sites
from tf_sparseconv.site.tensor import KernelMap, SiteSparseTensor, make_site_sparse

LAYERS = ["SubMConv1D", "SubMConv2D", "SubMConv3D", "SubMConv4D", "SparseConv1D", "SparseConv2D", "SparseConv3D",
          "SparseConv4D", "SparseConvTranspose1D", "SparseConvTranspose2D", "SparseConvTranspose3D",
          "SparseConvTranspose4D", "SparseInverseConv1D", "SparseInverseConv2D", "SparseInverseConv3D",
          "SparseInverseConv4D", "SiteMaxPooling1D", "SiteMaxPooling2D", "SiteMaxPooling3D", "SiteMaxPooling4D",
          "SiteAveragePooling1D", "SiteAveragePooling2D", "SiteAveragePooling3D", "SiteAveragePooling4D",
          "SiteGlobalPool", "SiteSelect", "SiteFeatures", "FusedBatchNormalization", "SiteConvBlock", "SiteConcat",
          "SiteAdd", "SiteVoxelize", "SiteToPoints", "SparseToSite"]
DEPRECATED_LAYERS = ["SiteConv", "SubMConv", "SiteConvTranspose", "SiteInverseConv", "SitePool"]

__all__ = ["SiteSparseTensor", "KernelMap", "make_site_sparse", "kernel_map", "neighbour_table", "site_conv",
           "site_conv_transpose", "site_inverse_conv", "site_pool", "global_pool", "select_sites", "site_from_dense",
           "site_to_dense", "voxelize_sites", "to_channel_sparse", "from_channel_sparse", "as_site_keras_inputs",
           "from_site_keras_inputs", "site_input", *LAYERS, *DEPRECATED_LAYERS]
