"""tf_sparseconv: trainable sparse CNNs for TensorFlow.

Two families:
- channel-sparse tensors (sorted int64 keys over {batch, x1..xd, channel} + values) and
  the direct sparse convolution of Hackel et al.: convolution that skips pruned weights,
  k-selection attention that bounds density, sparse ReLU and max-pooling, and
  sparsity-preserving gradients;
- site-sparse tensors (coordinates + a feature row per site) and gather-GEMM-scatter
  convolution: submanifold, strided, transposed and inverse, with cached kernel maps,
  pooling and density-bounded site selection.

Importing the package registers its Keras layers and losses, so a saved model loads with
`import tf_sparseconv; keras.models.load_model(path)`.
"""
from tf_sparseconv._native_logs import quiet_startup

with quiet_startup():
    from tf_sparseconv._op_library import ops as raw_ops  # noqa: F401  (loads and checks the op library)
from tf_sparseconv.channel import (ChannelSparseTensor, decode_keys, direct_conv, encode_keys, from_dense,
                                   from_sparse_tensor, gather_dense, k_from_rho_up, reorder, sparse_max_pool,
                                   sparse_relu, to_dense, to_sparse_tensor, validate)
from tf_sparseconv.site import (KernelMap, SiteSparseTensor, from_channel_sparse, global_pool, kernel_map,
                                make_site_sparse, neighbour_table, select_sites, site_conv, site_conv_transpose,
                                site_from_dense, site_inverse_conv, site_pool, site_to_dense, to_channel_sparse,
                                voxelize_sites)
from tf_sparseconv.host_syncs import deferred_read_back_count, host_sync_count  # noqa: E402
from tf_sparseconv import keras_layers, training  # noqa: F401,E402  (registers the Keras layers and losses)

__version__ = "0.1.0"

__all__ = [
    "ChannelSparseTensor", "from_dense", "to_dense", "gather_dense", "from_sparse_tensor",
    "to_sparse_tensor", "encode_keys", "decode_keys", "reorder", "validate", "direct_conv",
    "k_from_rho_up", "sparse_relu", "sparse_max_pool",
    "SiteSparseTensor", "KernelMap", "make_site_sparse", "kernel_map", "neighbour_table", "site_conv",
    "site_conv_transpose", "site_inverse_conv", "site_pool", "global_pool", "select_sites", "site_from_dense", "site_to_dense",
    "voxelize_sites", "to_channel_sparse", "from_channel_sparse", "host_sync_count", "deferred_read_back_count",
]
