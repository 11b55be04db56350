"""Site pooling: max or average over the active sites of each window, and global pooling
per batch element.

These are not custom ops: site_pool runs TensorFlow's segment reductions
(unsorted_segment_max / unsorted_segment_mean) over the pairs of a strided kernel map,
global_pool over the batch index, so both run on every device and take TensorFlow's
gradients.
"""
import tensorflow as tf

from tf_sparseconv.geometry import conv_geometry, per_dim
from tf_sparseconv.site.kernel_map import along_map
from tf_sparseconv.site.tensor import check_site_tensor


def site_pool(x, pool_size, strides=None, padding=0, mode="max", indice_key=None):
    """Max or average pooling over the active sites of each window (strided geometry;
    strides default to pool_size). Average divides by the number of active sites in the
    window, as MinkowskiEngine's average pooling does."""
    check_site_tensor(x, "site_pool")
    if mode not in ("max", "avg"):
        raise ValueError(f"site_pool mode must be 'max' or 'avg', got {mode!r}")
    d = x.spatial_rank
    pool_size = per_dim(pool_size, d, "pool_size")
    geometry = conv_geometry("strided", d, pool_size, pool_size if strides is None else strides, padding)
    reduce = tf.math.unsorted_segment_max if mode == "max" else tf.math.unsorted_segment_mean
    return along_map(x, indice_key, geometry,
                      lambda kmap, num_out: reduce(tf.gather(x.features, kmap.in_rows), kmap.out_rows, num_out))


def global_pool(x, mode="mean"):
    """Per batch element: [batch_size, C] of the max, mean or sum over its sites (0 for
    a batch element without sites)."""
    check_site_tensor(x, "global_pool")
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
