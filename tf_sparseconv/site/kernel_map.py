"""Kernel maps: which input site feeds which output site through which kernel offset.

kernel_map wraps the SiteKernelMap op (submanifold, strided and transposed geometry, as
spconv 2.x defines it); neighbour_table wraps SiteNeighbourTable, the output-major view
the GPU's half / bfloat16 convolution reads. along_map is what every layer that moves
between sites does: take the map cached under its indice_key (or build it), run a
computation along it, and hand the map on with the output so later layers reuse it.
"""
import os

import tensorflow as tf

from tf_sparseconv._op_library import ops as _ops
from tf_sparseconv.geometry import output_shape, per_dim
from tf_sparseconv.site.tensor import KernelMap, SiteSparseTensor, check_site_tensor


def kernel_map(x, kernel_size, strides=1, padding=0, dilation=1, mode="strided", builder="hash"):
    """The KernelMap of x's sites for one convolution geometry (see SiteKernelMap).

    builder: "hash" or "sort", how the GPU kernel builds the map (identical results;
    the CPU kernel has one builder and accepts either)."""
    check_site_tensor(x, "kernel_map")
    d = x.spatial_rank
    kernel_size = per_dim(kernel_size, d, "kernel_size", 1)
    strides = per_dim(strides, d, "strides", 1)
    padding = per_dim(padding, d, "padding", 0)
    dilation = per_dim(dilation, d, "dilation", 1)
    out_coords, out_shape, in_rows, out_rows, splits = _ops.site_kernel_map(
        x.coords, x.spatial_shape, x.batch_size, mode=mode, kernel_size=list(kernel_size), strides=list(strides),
        padding=list(padding), dilation=list(dilation), builder=builder)
    return KernelMap(in_rows, out_rows, splits, x.coords, out_coords, x.spatial_shape, out_shape, mode, kernel_size,
                     strides, padding, dilation, trusted=True)


def cached_kernel_map(x, indice_key, geometry):
    """x's map under indice_key (checked to have this geometry), or a new one."""
    mode, kernel_size, strides, padding, dilation = geometry
    if indice_key is not None and indice_key in x.kernel_maps:
        cached = x.kernel_maps[indice_key]
        if cached.geometry() != geometry:
            raise ValueError(f"the kernel map under indice_key {indice_key!r} was built for (mode, kernel_size, "
                             f"strides, padding, dilation) = {cached.geometry()}, but this layer needs {geometry}; "
                             "give layers of another geometry another indice_key")
        return cached
    return kernel_map(x, kernel_size, strides, padding, dilation, mode)


def neighbour_table(kmap, inverse=False, mask_groups=None):
    """SiteNeighbourTable of kmap (inverse=True: of the reversed map, output rows = its
    input sites), for maps of at most 32 kernel offsets: [num_out, volume + 2 * G] int32,
    the input row per output row and offset (-1: none), then per mask group (G of them,
    min(mask_groups, volume); None: the op's default, 1) the output rows sorted by their
    neighbour mask's bits of that group. SiteSparseConv reads it on the GPU for half and
    bfloat16, one pass per group."""
    num_in, num_out = tf.shape(kmap.in_coords)[0], tf.shape(kmap.out_coords)[0]
    groups = {} if mask_groups is None else {"mask_groups": mask_groups}
    if inverse:
        return _ops.site_neighbour_table(kmap.out_rows, kmap.in_rows, kmap.offset_splits, num_out, num_in,
                                         map_is_trusted=kmap.trusted, **groups)
    return _ops.site_neighbour_table(kmap.in_rows, kmap.out_rows, kmap.offset_splits, num_in, num_out,
                                     map_is_trusted=kmap.trusted, **groups)


def wants_tables(dtype, kmap):
    """Whether a convolution of dtype features over kmap (stored under an indice_key,
    so reused) should build its neighbour table: on a GPU, for half and bfloat16, whose
    output-stationary kernel then reads a ready table instead of building one per call;
    never for float, which runs on pairs (docs/gpu-kernels.md: the dataflows and what
    "auto" picks). The table is only read with a trusted map.
    TF_SPARSECONV_SITE_TABLES=always|never overrides (always: also on the CPU, whose
    kernel checks and ignores it; for tests)."""
    if not kmap.trusted or kmap.volume > 32:
        return False
    choice = os.environ.get("TF_SPARSECONV_SITE_TABLES", "auto")
    if choice not in ("auto", "always", "never"):
        raise ValueError(f"TF_SPARSECONV_SITE_TABLES must be auto, always or never, got {choice!r}")
    if choice != "auto":
        return choice == "always"
    return (dtype in (tf.float16, tf.bfloat16) and os.environ.get("TF_SPARSECONV_SITE_DATAFLOW", "auto") != "pairs"
            and bool(tf.config.list_logical_devices("GPU")))


def assert_rows_match(kmap_rows, features, indice_key):
    return tf.debugging.assert_equal(
        tf.shape(kmap_rows)[0], tf.shape(features)[0],
        message=f"the kernel map under indice_key {indice_key!r} belongs to other sites (site counts differ)")


def along_map(x, indice_key, geometry, compute):
    """The output sites of geometry's map over x (cached under indice_key) with features
    compute(kmap, num_out); the map is stored on the output under indice_key."""
    kmap = cached_kernel_map(x, indice_key, geometry)
    if indice_key is not None and kmap.neighbours is None and wants_tables(x.dtype, kmap):
        kmap = kmap.with_tables(neighbours=neighbour_table(kmap))
    with tf.control_dependencies([assert_rows_match(kmap.in_coords, x.features, indice_key)]):
        num_out = tf.shape(kmap.out_coords)[0]
    out = compute(kmap, num_out)
    maps = dict(x.kernel_maps)
    if indice_key is not None:
        maps[indice_key] = kmap
    static = x.static_spatial_shape
    if static.rank is not None:
        static = tf.TensorShape(output_shape(static.as_list(), geometry))
    return SiteSparseTensor(kmap.out_coords, out, kmap.out_spatial_shape, x.batch_size, maps, static)
