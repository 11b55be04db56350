"""Site-sparse convolution by gather-GEMM-scatter over a kernel map: submanifold,
strided, transposed and inverse, with the gradient of the SiteSparseConv op.

Conventions follow spconv 2.x (csrc/site/kernel_map/site_geometry.h):
`site_conv(..., subm=True)` is SubMConv, `site_conv` SparseConv, `site_conv_transpose`
SparseConvTranspose and `site_inverse_conv` SparseInverseConv. Kernels are TensorFlow-shaped
[k1, ..., kd, Cin, Cout]; spconv's [Cout, k1, ..., kd, Cin] is
`tf.transpose(w, [1, ..., d, d + 1, 0])`.
"""
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.geometry import conv_geometry
from tf_sparseconv.site.batch_norm import ROW_DTYPES, row_normalize, row_scale_shift
from tf_sparseconv.inputs import nan_checks
from tf_sparseconv.layer_config import flag
from tf_sparseconv.site.kernel_map import (along_map, assert_rows_match, check_dataflow, map_checks,
                                           pairs_from_table, reads_table, site_checks, with_inverse_table)
from tf_sparseconv.site.tensor import SiteSparseTensor, check_site_tensor


def _no_table():
    """SiteSparseConv's empty neighbours input."""
    return tf.zeros([0], tf.int32)


class Epilogue:
    """What a site convolution does to each output value v of column c before rounding it
    to the features' type (SiteSparseConv's epilogue): act(n(v) * scale[c] + bias[c]), with
    n(v) = (v - mean[c]) / sqrt(variance[c] + epsilon) where normalize = (mean, variance,
    epsilon) is given (a batch norm's moving statistics) and n(v) = v otherwise; scale and
    bias [Cout] or None (1 and 0); activation None or "relu". One pass with the products:
    on the GPU's output-stationary tiles it is applied as each row is stored."""

    def __init__(self, scale=None, bias=None, activation=None, normalize=None):
        if activation not in (None, "relu"):
            raise ValueError(f"site convolution: activation must be None or 'relu', got {activation!r}")
        self.mean = self.variance = None
        self.epsilon = 1e-3
        if normalize is not None:
            if not isinstance(normalize, (tuple, list)) or len(normalize) != 3:
                raise ValueError("site convolution: normalize must be (mean, variance, epsilon), got "
                                 f"{type(normalize).__name__}")
            self.mean, self.variance, epsilon = normalize
            if self.mean is None or self.variance is None:
                raise ValueError("site convolution: normalize needs both a mean and a variance")
            if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < float("inf"):
                raise ValueError(f"site convolution: normalize's epsilon must be a positive float, got {epsilon!r}")
            self.epsilon = float(epsilon)
        self.scale, self.bias, self.activation = scale, bias, activation

    def vectors(self, dtype, cout, what):
        """The op's epilogue input: [], [bias], [scale, bias] or [mean, variance, scale,
        bias], each [Cout] of the accumulator's dtype (float64 for float64 features, float32
        otherwise); absent ones that a longer form needs are 0 (bias) and 1 (scale)."""
        acc = tf.float64 if dtype == tf.float64 else tf.float32
        parts = [("mean", self.mean), ("variance", self.variance)] if self.variance is not None else []
        parts += [("scale", self.scale), ("bias", self.bias)]
        out = []
        for i, (name, v) in enumerate(parts):
            if v is None:
                if not any(later is not None for _, later in parts[:i]):
                    continue  # nothing before it: the shorter form
                v = tf.ones([cout], acc) if name == "scale" else tf.zeros([cout], acc)
            v = tf.cast(tf.convert_to_tensor(v), acc)
            if v.shape.rank != 1 or not v.shape.is_compatible_with([cout]):
                raise ValueError(f"{what}: the {name} must be [Cout] = [{cout}], got shape {v.shape}")
            out.append(v)
        return out

    def op_args(self, dtype, cout, what):
        return dict(epilogue=self.vectors(dtype, cout, what), epsilon=self.epsilon,
                    activation=self.activation or "none")

    def apply(self, out, what):
        """The same on a finished output (the matmul of a 1 x 1 kernel): one pass of the
        library's row ops (RowNormalize, RowScaleShift; float32 arithmetic) for half,
        bfloat16 and float32 rows, TensorFlow's element-wise ops for float64."""
        vectors = self.vectors(out.dtype, out.shape[-1], what)
        if vectors and out.dtype in ROW_DTYPES:
            if len(vectors) == 4:
                out = row_normalize(out, *vectors, self.epsilon)
            else:
                out = row_scale_shift(out, vectors[0] if len(vectors) == 2 else tf.ones_like(vectors[0]), vectors[-1])
        elif vectors:
            acc = tf.cast(out, vectors[0].dtype)
            if len(vectors) == 4:
                acc = (acc - vectors[0]) * tf.math.rsqrt(vectors[1] + self.epsilon)
            acc = acc * vectors[-2] + vectors[-1] if len(vectors) >= 2 else acc + vectors[0]
            out = tf.cast(acc, out.dtype)
        return tf.nn.relu(out) if self.activation == "relu" else out


def _conv(features, kernel, in_rows, out_rows, splits, num_out, trusted, neighbours=None, submanifold=False,
          dataflow="auto", table_map=False, epilogue=None, what="site_conv"):
    filters = tf.reshape(kernel, [-1, kernel.shape[-2], kernel.shape[-1]])
    fused = (epilogue or Epilogue()).op_args(features.dtype, kernel.shape[-1], what)
    if neighbours is None:
        neighbours = _no_table()
    elif table_map and submanifold and trusted and reads_table(
            features.dtype, kernel.shape[-2], kernel.shape[-1], dataflow):
        # The table alone is the map: the pairs' op (SiteTablePairs, or SiteKernelMap's read-back)
        # is not waited for, and in a traced function not run unless a gradient reads them.
        volume = filters.shape[0]
        return _ops.site_sparse_conv(features, filters, _no_table(), _no_table(), tf.zeros([volume + 1], tf.int32),
                                     num_out, neighbours, map_is_trusted=True, map_is_submanifold=True,
                                     map_is_table=True, dataflow=dataflow, **fused)
    return _ops.site_sparse_conv(features, filters, in_rows, out_rows, splits, num_out, neighbours,
                                 map_is_trusted=trusted, map_is_submanifold=submanifold, dataflow=dataflow, **fused)


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


def _pointwise(x, kernel, epilogue, indice_key):
    """A submanifold convolution whose kernel is one site (1 x ... x 1), as one matrix
    product of the feature rows, where no map is cached under indice_key: it needs no
    kernel map, so it builds none (a map build reads its pair counts back to the host).
    x's sites are checked as a map build would check them, unless x carries a trusted map
    of its sites (site_checks). None where a map is cached under indice_key: the caller
    then takes the map path (which checks its geometry and uses it)."""
    if indice_key is not None and indice_key in x.kernel_maps:
        return None
    checks = site_checks(x, "site_conv")
    if checks:  # untrusted sites: their features are refused NaN, as SiteSparseConv refuses them
        checks += nan_checks(x.features, "features", "site_conv")
    with tf.control_dependencies(checks):
        features = tf.identity(x.features)
    out = tf.matmul(features, tf.reshape(kernel, [kernel.shape[-2], kernel.shape[-1]]))
    return x.with_features(epilogue.apply(out, "site_conv"))


def site_conv(x, kernel, bias=None, strides=1, padding=0, dilation=1, subm=False, indice_key=None, dataflow="auto",
              scale=None, activation=None, normalize=None):
    """Sparse convolution of x with kernel [k1, ..., kd, Cin, Cout].

    subm=True: submanifold convolution, output sites = input sites (odd kernel; padding
    must be 0 or "same", dilation * (k - 1) / 2, which spconv accepts and ignores).
    Otherwise a strided convolution whose output sites are every site an input
    reaches. With indice_key, the map is taken from x.kernel_maps when there and stored
    on the output, so layers of one geometry share it and site_inverse_conv finds it. A
    submanifold 1 x ... x 1 kernel with no map under its key and dataflow "auto" is one
    matrix product of the rows (tf.matmul) and builds no map.
    On a GPU of sm_80 or later, float32 follows TensorFlow's TF32 switch
    (tf.config.experimental.enable_tensor_float_32_execution, on by default).
    dataflow: the GPU's, as spconv's algo= (SiteSparseConv; docs/gpu-kernels.md): "auto"
    (the default), "pairs" or "outputs"; the CPU runs "auto" and "pairs" and refuses
    "outputs". Under "auto" with half and bfloat16 on a GPU, or "outputs", a map under an
    indice_key gets its neighbour table once (KernelMap.neighbours), and the layers of that
    map run output-stationary from it.
    scale, bias [Cout], activation (None or "relu") and normalize ((mean, variance,
    epsilon), [Cout] each, or None): each output value v of column c becomes act(n(v) *
    scale[c] + bias[c]), n(v) = (v - mean[c]) / sqrt(variance[c] + epsilon) or v, in the op
    itself (Epilogue) before it is rounded to the features' type: a bias, a batch norm in
    inference (SiteConvBlock) and a ReLU cost no pass over the rows of their own.
    """
    check_site_tensor(x, "site_conv")
    epilogue = Epilogue(scale, bias, activation, normalize)
    check_dataflow(dataflow, "site_conv")
    subm = flag(subm, "subm", "site_conv")
    kernel = tf.convert_to_tensor(kernel)
    _check_kernel(x, kernel, "site_conv")
    d = x.spatial_rank
    geometry = conv_geometry("submanifold" if subm else "strided", d, kernel.shape[:d], strides, padding, dilation)
    if subm and dataflow == "auto" and all(k == 1 for k in geometry.kernel_size):
        out = _pointwise(x, kernel, epilogue, indice_key)
        if out is not None:
            return out
    # Only SiteKernelMap's own submanifold maps are promised mirrored to the op.
    table_ok = subm and reads_table(x.dtype, kernel.shape[-2], kernel.shape[-1], dataflow)
    return along_map(x, indice_key, geometry, lambda kmap, num_out: _conv(
        x.features, kernel, kmap.in_rows, kmap.out_rows, kmap.offset_splits, num_out, kmap.trusted, kmap.neighbours,
        submanifold=subm and kmap.trusted, dataflow=dataflow, table_map=pairs_from_table(kmap), epilogue=epilogue),
        dataflow, table_ok)


def site_conv_transpose(x, kernel, bias=None, strides=1, padding=0, dilation=1, indice_key=None, dataflow="auto",
                        scale=None, activation=None, normalize=None):
    """Transposed (generative) convolution: every site an input reaches through
    o = x * stride - padding + q * dilation becomes an output site (spconv's
    SparseConvTranspose). dataflow, scale, bias, activation and normalize: as for site_conv."""
    check_site_tensor(x, "site_conv_transpose")
    epilogue = Epilogue(scale, bias, activation, normalize)
    check_dataflow(dataflow, "site_conv_transpose")
    kernel = tf.convert_to_tensor(kernel)
    _check_kernel(x, kernel, "site_conv_transpose")
    d = x.spatial_rank
    geometry = conv_geometry("transposed", d, kernel.shape[:d], strides, padding, dilation)
    return along_map(x, indice_key, geometry, lambda kmap, num_out: _conv(
        x.features, kernel, kmap.in_rows, kmap.out_rows, kmap.offset_splits, num_out, kmap.trusted, kmap.neighbours,
        dataflow=dataflow, epilogue=epilogue, what="site_conv_transpose"), dataflow)


def site_inverse_conv(x, kernel, indice_key, bias=None, dataflow="auto", scale=None, activation=None,
                      normalize=None):
    """Inverse of the strided convolution stored under indice_key: back onto its input
    sites (spconv's SparseInverseConv). x must hold that convolution's output sites; the
    kernel [k1, ..., kd, Cin, Cout] has the strided layer's kernel size. dataflow: as for
    site_conv (the table is the reversed map's, KernelMap.inverse_neighbours); scale,
    bias, activation and normalize as for site_conv."""
    check_site_tensor(x, "site_inverse_conv")
    epilogue = Epilogue(scale, bias, activation, normalize)
    check_dataflow(dataflow, "site_inverse_conv")
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
    checks = map_checks(kmap, x, indice_key, inverse=True)
    kmap = with_inverse_table(kmap, x.dtype, dataflow)
    with tf.control_dependencies([assert_rows_match(kmap.out_coords, x.features, indice_key), *checks]):
        num_out = tf.shape(kmap.in_coords)[0]
    # Reversed pairs stay valid: every map SiteKernelMap builds has at most one pair per
    # input row and offset too (for an offset the output site fixes the input site and
    # back), so a trusted map is trusted both ways.
    out = _conv(x.features, kernel, kmap.out_rows, kmap.in_rows, kmap.offset_splits, num_out, kmap.trusted,
                kmap.inverse_neighbours, dataflow=dataflow, epilogue=epilogue, what="site_inverse_conv")
    known = tf.get_static_value(kmap.in_spatial_shape)
    static = tf.TensorShape([int(v) for v in known]) if known is not None else tf.TensorShape([None] * len(
        kmap.kernel_size))
    maps = dict(x.kernel_maps)
    maps[indice_key] = kmap  # with its inverse table, if one was built
    return SiteSparseTensor(kmap.in_coords, out, kmap.in_spatial_shape, x.batch_size, maps, static)


def _epilogue_grads(op, out_grad):
    """(the gradient of the products' sums z, [gradients of the epilogue's vectors]) from
    the gradient of y = act(n(z) * scale + shift) (Epilogue)."""
    features, filters, in_rows, out_rows, splits, num_out, neighbours, *vectors = op.inputs
    if op.get_attr("activation") in (b"relu", "relu"):
        out_grad = tf.where(op.outputs[0] > 0, out_grad, tf.zeros_like(out_grad))
    if not vectors:
        return out_grad, []
    pre_grad = tf.cast(out_grad, vectors[-1].dtype)  # of n(z) * scale + shift
    shift_grad = tf.reduce_sum(pre_grad, 0)
    if len(vectors) == 1:
        return out_grad, [shift_grad]
    # The scale's gradient needs n(z), which the op did not keep: the products again,
    # without the epilogue.
    attrs = {name: op.get_attr(name) for name in ("map_is_trusted", "map_is_submanifold", "map_is_table",
                                                  "dataflow", "cpu_products")}
    z = tf.cast(_ops.site_sparse_conv(features, filters, in_rows, out_rows, splits, num_out, neighbours, **attrs),
                pre_grad.dtype)
    scale = vectors[-2]
    if len(vectors) == 2:
        grads = [tf.reduce_sum(pre_grad * z, 0), shift_grad]
        return tf.cast(pre_grad * scale, out_grad.dtype), grads
    mean, variance = vectors[0], vectors[1]
    inverse = tf.math.rsqrt(variance + op.get_attr("epsilon"))  # n(z) = (z - mean) * inverse
    normalized_grad = pre_grad * scale
    centred_sum = tf.reduce_sum(normalized_grad * (z - mean), 0)
    grads = [-inverse * tf.reduce_sum(normalized_grad, 0),  # the mean's
             -0.5 * inverse ** 3 * centred_sum,  # the variance's
             tf.reduce_sum(pre_grad * (z - mean) * inverse, 0), shift_grad]
    return tf.cast(normalized_grad * inverse, out_grad.dtype), grads


@tf.RegisterGradient(OP_NAMESPACE + "SiteSparseConv")
def _site_sparse_conv_grad(op, out_grad):
    features, filters, in_rows, out_rows, splits, _, neighbours = op.inputs[:7]
    out_grad, epilogue_grads = _epilogue_grads(op, out_grad)
    # A map trusted forward is trusted reversed (see site_inverse_conv); the input gradient
    # runs the forward's dataflow, and both gradients its CPU products.
    choices = dict(map_is_trusted=op.get_attr("map_is_trusted"), cpu_products=op.get_attr("cpu_products"))
    dataflow = op.get_attr("dataflow")
    transposed = tf.transpose(filters, [0, 2, 1])
    if op.get_attr("map_is_table"):
        # The map is the table alone: the input gradient reads it as the forward did (its
        # offsets mirrored); the filter gradient takes its pairs (SiteTablePairs).
        features_grad = _ops.site_sparse_conv(out_grad, tf.reverse(transposed, [0]), in_rows, out_rows, splits,
                                              tf.shape(features)[0], neighbours, map_is_submanifold=True,
                                              map_is_table=True, dataflow=dataflow, **choices)
        in_rows, out_rows, splits = _ops.site_table_pairs(neighbours)
    elif op.get_attr("map_is_submanifold"):
        # The reversed pairs of offset q are the pairs of the mirrored offset
        # volume - 1 - q, so the input gradient is the forward's own convolution (its
        # pairs, and its neighbour table where it has one) with the transposed filters in
        # mirrored order.
        features_grad = _ops.site_sparse_conv(out_grad, tf.reverse(transposed, [0]), in_rows, out_rows, splits,
                                              tf.shape(features)[0], neighbours, map_is_submanifold=True,
                                              dataflow=dataflow, **choices)
    else:
        # The same gather-GEMM-scatter with the pairs reversed and each offset's filter
        # transposed (the forward's neighbour table is of no use to the reversed pairs).
        features_grad = _ops.site_sparse_conv(out_grad, transposed, out_rows, in_rows, splits,
                                              tf.shape(features)[0], _no_table(), dataflow=dataflow, **choices)
    filters_grad = _ops.site_sparse_conv_filter_grad(features, out_grad, in_rows, out_rows, splits, **choices)
    return [features_grad, filters_grad, None, None, None, None, None, *epilogue_grads]
