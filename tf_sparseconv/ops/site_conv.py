"""Site-sparse convolution: kernel maps, gather-GEMM-scatter convolution (submanifold,
strided, transposed, inverse), pooling and density-bounded site selection.

Conventions follow spconv 2.x (csrc/site/kernel_map/site_geometry.h):
`site_conv(..., subm=True)` is SubMConv, `site_conv` SparseConv, `site_conv_transpose`
SparseConvTranspose and `site_inverse_conv` SparseInverseConv. Kernels are TensorFlow-shaped
[k1, ..., kd, Cin, Cout]; spconv's [Cout, k1, ..., kd, Cin] is
`tf.transpose(w, [1, ..., d, d + 1, 0])`.
"""
import numbers
import os

import tensorflow as tf

from tf_sparseconv._op_library import ops as _ops
from tf_sparseconv.site_sparse_tensor import KernelMap, SiteSparseTensor


def _per_dim(value, d, name, minimum):
    values = (int(value),) * d if isinstance(value, numbers.Integral) else tuple(int(v) for v in value)
    if len(values) != d:
        raise ValueError(f"{name} needs one entry per spatial dimension ({d}), got {values}")
    if any(v < minimum for v in values):
        raise ValueError(f"{name} entries must be >= {minimum}, got {values}")
    return values


def _check_site_tensor(x, what):
    if not isinstance(x, SiteSparseTensor):
        raise TypeError(f"{what} expects a SiteSparseTensor, got {type(x).__name__}")


def _static_out_shape(static, mode, kernel_size, strides, padding, dilation):
    if static.rank is None:
        return static
    dims = []
    for r, k, s, p, dl in zip(static.as_list(), kernel_size, strides, padding, dilation):
        if r is None or mode == "submanifold":
            dims.append(r)
        elif mode == "strided":
            dims.append((r + 2 * p - dl * (k - 1) - 1) // s + 1)
        else:
            dims.append((r - 1) * s - 2 * p + dl * (k - 1) + 1)
    return tf.TensorShape(dims)


def kernel_map(x, kernel_size, strides=1, padding=0, dilation=1, mode="strided", builder="hash"):
    """The KernelMap of x's sites for one convolution geometry (see SiteKernelMap).

    builder: "hash" or "sort", how the GPU kernel builds the map (identical results;
    the CPU kernel has one builder and accepts either)."""
    _check_site_tensor(x, "kernel_map")
    d = x.spatial_rank
    kernel_size = _per_dim(kernel_size, d, "kernel_size", 1)
    strides = _per_dim(strides, d, "strides", 1)
    padding = _per_dim(padding, d, "padding", 0)
    dilation = _per_dim(dilation, d, "dilation", 1)
    out_coords, out_shape, in_rows, out_rows, splits = _ops.site_kernel_map(
        x.coords, x.spatial_shape, x.batch_size, mode=mode, kernel_size=list(kernel_size), strides=list(strides),
        padding=list(padding), dilation=list(dilation), builder=builder)
    return KernelMap(in_rows, out_rows, splits, x.coords, out_coords, x.spatial_shape, out_shape, mode, kernel_size,
                     strides, padding, dilation, trusted=True)


def _cached_map(x, indice_key, geometry):
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


def _wants_tables(dtype, kmap):
    """Whether a convolution of dtype features over kmap (stored under an indice_key,
    so reused) should build its neighbour table: on a GPU, for half and bfloat16, whose
    output-stationary kernel from a ready table is the faster dataflow there up to 128
    output channels (H200, README; the op decides per call); never for float (its TF32
    kernel is faster on pairs). The table is only read with a trusted map.
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


def _no_table():
    """SiteSparseConv's empty neighbours input."""
    return tf.zeros([0], tf.int32)


def _conv(features, kernel, in_rows, out_rows, splits, num_out, trusted, neighbours=None, submanifold=False):
    filters = tf.reshape(kernel, [-1, kernel.shape[-2], kernel.shape[-1]])
    if neighbours is None:
        neighbours = _no_table()
    return _ops.site_sparse_conv(features, filters, in_rows, out_rows, splits, num_out, neighbours,
                                 map_is_trusted=trusted, map_is_submanifold=submanifold)


def _check_kernel(x, kernel, what):
    d = x.spatial_rank
    if kernel.shape.rank != d + 2:
        raise ValueError(f"{what}: the kernel must be [k1, ..., k{d}, Cin, Cout] for {d} spatial dimensions, "
                         f"got shape {kernel.shape}")
    if x.channels is not None and kernel.shape[-2] is not None and kernel.shape[-2] != x.channels:
        raise ValueError(f"{what}: the kernel takes {kernel.shape[-2]} input channels but the sites have "
                         f"{x.channels}")
    if kernel.dtype != x.dtype:
        raise TypeError(f"{what}: kernel dtype {kernel.dtype.name} differs from the features' {x.dtype.name}")


def _assert_rows_match(kmap_rows, features, indice_key):
    return tf.debugging.assert_equal(
        tf.shape(kmap_rows)[0], tf.shape(features)[0],
        message=f"the kernel map under indice_key {indice_key!r} belongs to other sites (site counts differ)")


def _with_bias(out, bias):
    return out if bias is None else tf.nn.bias_add(out, tf.convert_to_tensor(bias, out.dtype))


def _along_map(x, indice_key, geometry, compute):
    """The output sites of geometry's map over x (cached under indice_key) with features
    compute(kmap, num_out); the map is stored on the output under indice_key."""
    kmap = _cached_map(x, indice_key, geometry)
    if indice_key is not None and kmap.neighbours is None and _wants_tables(x.dtype, kmap):
        kmap = kmap.with_tables(neighbours=neighbour_table(kmap))
    with tf.control_dependencies([_assert_rows_match(kmap.in_coords, x.features, indice_key)]):
        num_out = tf.shape(kmap.out_coords)[0]
    out = compute(kmap, num_out)
    maps = dict(x.kernel_maps)
    if indice_key is not None:
        maps[indice_key] = kmap
    static = _static_out_shape(x.static_spatial_shape, *geometry)
    return SiteSparseTensor(kmap.out_coords, out, kmap.out_spatial_shape, x.batch_size, maps, static)


def site_conv(x, kernel, bias=None, strides=1, padding=0, dilation=1, subm=False, indice_key=None):
    """Sparse convolution of x with kernel [k1, ..., kd, Cin, Cout].

    subm=True: submanifold convolution, output sites = input sites (odd kernel; padding
    must be 0 or the "same" padding dilation * (k - 1) / 2, which spconv accepts and
    ignores). Otherwise a strided convolution whose output sites are every site an input
    reaches. With indice_key, the map is taken from x.kernel_maps when there and stored
    on the output, so layers of one geometry share it and site_inverse_conv finds it.
    On a GPU of sm_80 or later, float32 follows TensorFlow's TF32 switch
    (tf.config.experimental.enable_tensor_float_32_execution, on by default). For half
    and bfloat16 on a GPU, a map under an indice_key gets its neighbour table once
    (KernelMap.neighbours), and the layers of that map run output-stationary from it.
    """
    _check_site_tensor(x, "site_conv")
    kernel = tf.convert_to_tensor(kernel)
    _check_kernel(x, kernel, "site_conv")
    d = x.spatial_rank
    kernel_size = tuple(int(k) for k in kernel.shape[:d])
    dilation = _per_dim(dilation, d, "dilation", 1)
    if subm:
        same = tuple(dl * (k - 1) // 2 for k, dl in zip(kernel_size, dilation))
        pad = _per_dim(padding, d, "padding", 0)
        if pad not in ((0,) * d, same):
            raise ValueError(f"a submanifold convolution keeps its sites: padding must be 0 or {same}, got {pad}")
        if _per_dim(strides, d, "strides", 1) != (1,) * d:
            raise ValueError("a submanifold convolution keeps its sites: strides must be 1")
        geometry = ("submanifold", kernel_size, (1,) * d, (0,) * d, dilation)
    else:
        geometry = ("strided", kernel_size, _per_dim(strides, d, "strides", 1), _per_dim(padding, d, "padding", 0),
                    dilation)
    # Only SiteKernelMap's own submanifold maps are promised mirrored to the op.
    return _along_map(x, indice_key, geometry, lambda kmap, num_out: _with_bias(
        _conv(x.features, kernel, kmap.in_rows, kmap.out_rows, kmap.offset_splits, num_out, kmap.trusted,
              kmap.neighbours, submanifold=subm and kmap.trusted), bias))


def site_conv_transpose(x, kernel, bias=None, strides=1, padding=0, dilation=1, indice_key=None):
    """Transposed (generative) convolution: every site an input reaches through
    o = x * stride - padding + q * dilation becomes an output site (spconv's
    SparseConvTranspose)."""
    _check_site_tensor(x, "site_conv_transpose")
    kernel = tf.convert_to_tensor(kernel)
    _check_kernel(x, kernel, "site_conv_transpose")
    d = x.spatial_rank
    geometry = ("transposed", tuple(int(k) for k in kernel.shape[:d]), _per_dim(strides, d, "strides", 1),
                _per_dim(padding, d, "padding", 0), _per_dim(dilation, d, "dilation", 1))
    return _along_map(x, indice_key, geometry, lambda kmap, num_out: _with_bias(
        _conv(x.features, kernel, kmap.in_rows, kmap.out_rows, kmap.offset_splits, num_out, kmap.trusted,
              kmap.neighbours), bias))


def site_inverse_conv(x, kernel, indice_key, bias=None):
    """Inverse of the strided convolution stored under indice_key: back onto its input
    sites (spconv's SparseInverseConv). x must hold that convolution's output sites; the
    kernel [k1, ..., kd, Cin, Cout] has the strided layer's kernel size."""
    _check_site_tensor(x, "site_inverse_conv")
    if indice_key not in x.kernel_maps:
        raise KeyError(f"site_inverse_conv: no kernel map under indice_key {indice_key!r}; the strided convolution "
                       f"it inverts must have been given that key (maps here: {sorted(x.kernel_maps)})")
    kmap = x.kernel_maps[indice_key]
    if kmap.mode != "strided":
        raise ValueError(f"site_inverse_conv inverts a strided convolution; the map under {indice_key!r} is "
                         f"{kmap.mode!r}")
    kernel = tf.convert_to_tensor(kernel)
    _check_kernel(x, kernel, "site_inverse_conv")
    if tuple(int(k) for k in kernel.shape[:x.spatial_rank]) != kmap.kernel_size:
        raise ValueError(f"site_inverse_conv: kernel size {tuple(kernel.shape[:x.spatial_rank])} differs from the "
                         f"strided convolution's {kmap.kernel_size} under {indice_key!r}")
    if kmap.inverse_neighbours is None and _wants_tables(x.dtype, kmap):
        kmap = kmap.with_tables(inverse_neighbours=neighbour_table(kmap, inverse=True))
    with tf.control_dependencies([_assert_rows_match(kmap.out_coords, x.features, indice_key)]):
        num_out = tf.shape(kmap.in_coords)[0]
    # Reversed pairs stay valid: every map SiteKernelMap builds has at most one pair per
    # input row and offset too (for an offset the output site fixes the input site and
    # back), so a trusted map is trusted both ways.
    out = _with_bias(_conv(x.features, kernel, kmap.out_rows, kmap.in_rows, kmap.offset_splits, num_out,
                           kmap.trusted, kmap.inverse_neighbours), bias)
    known = tf.get_static_value(kmap.in_spatial_shape)
    static = tf.TensorShape([int(v) for v in known]) if known is not None else tf.TensorShape([None] * len(
        kmap.kernel_size))
    maps = dict(x.kernel_maps)
    maps[indice_key] = kmap  # with its inverse table, if one was built
    return SiteSparseTensor(kmap.in_coords, out, kmap.in_spatial_shape, x.batch_size, maps, static)


def site_pool(x, pool_size, strides=None, padding=0, mode="max", indice_key=None):
    """Max or average pooling over the active sites of each window (strided geometry;
    strides default to pool_size). Average divides by the number of active sites in the
    window, as MinkowskiEngine's average pooling does."""
    _check_site_tensor(x, "site_pool")
    if mode not in ("max", "avg"):
        raise ValueError(f"site_pool mode must be 'max' or 'avg', got {mode!r}")
    d = x.spatial_rank
    pool_size = _per_dim(pool_size, d, "pool_size", 1)
    strides = pool_size if strides is None else _per_dim(strides, d, "strides", 1)
    geometry = ("strided", pool_size, strides, _per_dim(padding, d, "padding", 0), (1,) * d)
    reduce = tf.math.unsorted_segment_max if mode == "max" else tf.math.unsorted_segment_mean
    return _along_map(x, indice_key, geometry,
                      lambda kmap, num_out: reduce(tf.gather(x.features, kmap.in_rows), kmap.out_rows, num_out))


def global_pool(x, mode="mean"):
    """Per batch element: [batch_size, C] of the max, mean or sum over its sites (0 for
    a batch element without sites)."""
    _check_site_tensor(x, "global_pool")
    batch = x.coords[:, 0]
    if mode == "max":
        pooled = tf.math.unsorted_segment_max(x.features, batch, x.batch_size)
        count = tf.math.unsorted_segment_sum(tf.ones_like(batch), batch, x.batch_size)
        return tf.where((count > 0)[:, None], pooled, tf.zeros_like(pooled))
    if mode == "mean":
        return tf.math.unsorted_segment_mean(x.features, batch, x.batch_size)
    if mode == "sum":
        return tf.math.unsorted_segment_sum(x.features, batch, x.batch_size)
    raise ValueError(f"global_pool mode must be 'max', 'mean' or 'sum', got {mode!r}")


def select_sites(x, k, score=None):
    """Density-bounded sites (Hackel et al.'s k-selection carried over to sites): per
    batch element keep the k sites with the largest score (default: the L2 norm of the
    feature row), ties to the lower row, in their original order. The result has at
    most batch_size * k sites whatever the input, so memory downstream is capped before
    the model runs. Cached kernel maps are dropped: they index the sites before
    selection."""
    _check_site_tensor(x, "select_sites")
    k = int(k)
    if k < 1:
        raise ValueError(f"select_sites needs k >= 1, got {k}")
    if score is None:
        score = tf.norm(tf.cast(x.features, tf.float32), axis=1)
    score = tf.convert_to_tensor(score)
    batch = x.coords[:, 0]
    by_score = tf.argsort(score, direction="DESCENDING", stable=True)
    order = tf.gather(by_score, tf.argsort(tf.gather(batch, by_score), stable=True))
    sorted_batch = tf.gather(batch, order)
    position = tf.range(tf.shape(order)[0])
    first = tf.math.unsorted_segment_min(position, sorted_batch, x.batch_size)
    rank = position - tf.gather(first, sorted_batch)
    kept = tf.sort(tf.boolean_mask(order, rank < k))
    return SiteSparseTensor(tf.gather(x.coords, kept), tf.gather(x.features, kept), x.spatial_shape, x.batch_size,
                            {}, x.static_spatial_shape)


@tf.RegisterGradient("SiteSparseConv")
def _site_sparse_conv_grad(op, out_grad):
    features, filters, in_rows, out_rows, splits, _, neighbours = op.inputs
    # A map trusted forward is trusted reversed (see site_inverse_conv).
    trusted = op.get_attr("map_is_trusted")
    transposed = tf.transpose(filters, [0, 2, 1])
    if op.get_attr("map_is_submanifold"):
        # The reversed pairs of offset q are the pairs of the mirrored offset
        # volume - 1 - q, so the input gradient is the forward's own convolution (its
        # pairs, and its neighbour table where it has one) with the transposed filters in
        # mirrored order.
        features_grad = _ops.site_sparse_conv(out_grad, tf.reverse(transposed, [0]), in_rows, out_rows, splits,
                                              tf.shape(features)[0], neighbours, map_is_trusted=trusted,
                                              map_is_submanifold=True)
    else:
        # The same gather-GEMM-scatter with the pairs reversed and each offset's filter
        # transposed (the forward's neighbour table is of no use to the reversed pairs).
        features_grad = _ops.site_sparse_conv(out_grad, transposed, out_rows, in_rows, splits,
                                              tf.shape(features)[0], _no_table(), map_is_trusted=trusted)
    filters_grad = _ops.site_sparse_conv_filter_grad(features, out_grad, in_rows, out_rows, splits,
                                                     map_is_trusted=trusted)
    return [features_grad, filters_grad, None, None, None, None, None]
