"""Density-bounded sites: at most k sites per batch element, chosen by score."""
import tensorflow as tf

from tf_sparseconv.site.tensor import SiteSparseTensor, check_site_tensor


def select_sites(x, k, score=None):
    """Density-bounded sites (Hackel et al.'s k-selection carried over to sites): per
    batch element keep the k sites with the largest score (default: the L2 norm of the
    feature row), ties to the lower row, in their original order. The result has at
    most batch_size * k sites whatever the input, so memory downstream is capped before
    the model runs. Cached kernel maps are dropped: they index the sites before
    selection."""
    check_site_tensor(x, "select_sites")
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
