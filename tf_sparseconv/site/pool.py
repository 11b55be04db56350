"""Site pooling: max or average over the active sites of each window, and global pooling
per batch element.

These are not custom ops: site_pool runs TensorFlow's segment reductions
(unsorted_segment_max / unsorted_segment_mean) over the pairs of a strided kernel map,
global_pool over the batch index, so both run on every device and take TensorFlow's
gradients.
"""
import tensorflow as tf

from tf_sparseconv.geometry import conv_geometry, per_dim
from tf_sparseconv.site.kernel_map import along_map, site_checks
from tf_sparseconv.site.tensor import check_site_tensor


def _segment_max(values, segments, num_segments):
    """unsorted_segment_max whose segments holding a NaN are NaN, and whose segments of -inf
    alone are -inf: TensorFlow's own keeps or drops a NaN depending on where it sits, and
    starts from the lowest finite value, which it returns for -inf."""
    pooled = tf.math.unsorted_segment_max(values, segments, num_segments)
    if not values.dtype.is_floating:
        return pooled
    # 1 only where every value is -inf (an empty segment's minimum is the int32 maximum).
    all_minus_inf = tf.math.unsorted_segment_min(
        tf.cast(tf.equal(values, tf.constant(-float("inf"), values.dtype)), tf.int32), segments, num_segments) == 1
    pooled = tf.where(all_minus_inf, tf.constant(-float("inf"), values.dtype), pooled)
    nan = tf.math.unsorted_segment_max(tf.cast(tf.math.is_nan(values), tf.int32), segments, num_segments) > 0
    return tf.where(nan, tf.constant(float("nan"), values.dtype), pooled)


def site_pool(x, pool_size, strides=None, padding=0, mode="max", indice_key=None):
    """Max or average pooling over the active sites of each window (strided geometry;
    strides default to pool_size). Average divides by the number of active sites in the
    window, as MinkowskiEngine's average pooling does. The sites are checked by the
    kernel map (SiteKernelMap, or a cached map's checks). A window holding a NaN feature
    pools to NaN in either mode."""
    check_site_tensor(x, "site_pool")
    if mode not in ("max", "avg"):
        raise ValueError(f"site_pool mode must be 'max' or 'avg', got {mode!r}")
    d = x.spatial_rank
    pool_size = per_dim(pool_size, d, "pool_size")
    geometry = conv_geometry("strided", d, pool_size, pool_size if strides is None else strides, padding)
    reduce = _segment_max if mode == "max" else tf.math.unsorted_segment_mean
    return along_map(x, indice_key, geometry,
                     lambda kmap, num_out: reduce(tf.gather(x.features, kmap.in_rows), kmap.out_rows, num_out))


def global_pool(x, mode="mean"):
    """Per batch element: [batch_size, C] of the max, mean or sum over its sites (0 for
    a batch element without sites; NaN in a channel holding a NaN feature, in every
    mode). The sites are checked first (site_checks: batch indices and coordinates in
    range, each site once; InvalidArgumentError otherwise)."""
    check_site_tensor(x, "global_pool")
    if mode not in ("max", "mean", "sum"):
        raise ValueError(f"global_pool mode must be 'max', 'mean' or 'sum', got {mode!r}")
    with tf.control_dependencies(site_checks(x, "global_pool")):
        batch = tf.identity(x.coords[:, 0])
    if mode == "max":
        pooled = _segment_max(x.features, batch, x.batch_size)
        count = tf.math.unsorted_segment_sum(tf.ones_like(batch), batch, x.batch_size)
        return tf.where((count > 0)[:, None], pooled, tf.zeros_like(pooled))
    if mode == "mean":
        return tf.math.unsorted_segment_mean(x.features, batch, x.batch_size)
    return tf.math.unsorted_segment_sum(x.features, batch, x.batch_size)
