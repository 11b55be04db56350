"""The site-sparse family (as spconv, MinkowskiEngine, TorchSparse): active sites with
integer coordinates and a feature row each, convolved by gather-GEMM-scatter along
cached kernel maps, and their Keras layers.

- tensor.py: SiteSparseTensor and KernelMap;
- kernel_map.py: building and caching kernel maps (SiteKernelMap, SiteNeighbourTable ops);
- conv.py: submanifold, strided, transposed and inverse convolution (SiteSparseConv op);
- pool.py: window and global pooling (TensorFlow segment ops); select.py: density-bounded sites;
- conversions.py: dense grids, point clouds and channel-sparse tensors to and from sites;
- keras_io.py: how the tensor and its maps travel between Keras layers (site_input);
- layers.py: the Keras layers.
"""
from tf_sparseconv.site.conv import site_conv, site_conv_transpose, site_inverse_conv
from tf_sparseconv.site.conversions import (from_channel_sparse, site_from_dense, site_to_dense, to_channel_sparse,
                                            voxelize_sites)
from tf_sparseconv.site.keras_io import as_site_keras_inputs, from_site_keras_inputs, site_input
from tf_sparseconv.site.kernel_map import kernel_map, neighbour_table
from tf_sparseconv.site.layers import (SiteAdd, SiteConcat, SiteConv, SiteConvTranspose, SiteFeatures, SiteGlobalPool,
                                       SiteInverseConv, SitePool, SiteSelect, SiteToPoints, SiteVoxelize, SparseToSite,
                                       SubMConv)
from tf_sparseconv.site.pool import global_pool, site_pool
from tf_sparseconv.site.select import select_sites
from tf_sparseconv.site.tensor import KernelMap, SiteSparseTensor, make_site_sparse

__all__ = ["SiteSparseTensor", "KernelMap", "make_site_sparse", "kernel_map", "neighbour_table", "site_conv",
           "site_conv_transpose", "site_inverse_conv", "site_pool", "global_pool", "select_sites", "site_from_dense",
           "site_to_dense", "voxelize_sites", "to_channel_sparse", "from_channel_sparse", "as_site_keras_inputs",
           "from_site_keras_inputs", "site_input", "SiteConv", "SubMConv", "SiteConvTranspose", "SiteInverseConv",
           "SitePool", "SiteGlobalPool", "SiteSelect", "SiteFeatures", "SiteConcat", "SiteAdd", "SiteVoxelize",
           "SiteToPoints", "SparseToSite"]
