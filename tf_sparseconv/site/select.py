"""Density-bounded sites: at most k sites per batch element, chosen by score."""
import tensorflow as tf

from tf_sparseconv.inputs import int_attr, nan_checks, real_tensor
from tf_sparseconv.site.kernel_map import site_checks
from tf_sparseconv.site.tensor import SiteSparseTensor, check_site_tensor

# Site counts are int32: a larger k keeps every site.
_MAX_K = 2**31 - 1


def check_k(k, what):
    """k as an int >= 1: TypeError for a bool, float or other non-integer (never
    truncated), ValueError below 1."""
    k = int_attr(k, "k", what)
    if k < 1:
        raise ValueError(f"{what} needs k >= 1, got {k}")
    return k


def select_sites(x, k, score=None):
    """Density-bounded sites (Hackel et al.'s k-selection carried over to sites): per
    batch element keep the k sites with the largest score (default: the L2 norm of the
    feature row), ties to the lower row, in their original order. The result has at
    most batch_size * k sites whatever the input, so memory downstream is capped before
    the model runs. Cached kernel maps are dropped: they index the sites before
    selection.

    k: an int >= 1 (TypeError for other types, ValueError below 1; any k above the site
    count keeps every site). score: one real number per site ([N]); NaN scores, whose
    rank would be arbitrary, and invalid sites (site_checks) are InvalidArgumentError."""
    check_site_tensor(x, "select_sites")
    k = min(check_k(k, "select_sites"), _MAX_K)
    if score is None:
        score = tf.norm(tf.cast(x.features, tf.float32), axis=1)
    else:
        score = real_tensor(score, "score", "select_sites")
        if score.shape.rank is not None and score.shape.rank != 1:
            raise ValueError(f"select_sites: score must be one value per site ([N]), got shape {score.shape}")
    n_sites, n_scores = x.coords.shape[0], score.shape[0] if score.shape.rank else None
    if n_sites is not None and n_scores is not None and n_sites != n_scores:
        raise ValueError(f"select_sites: score has {n_scores} values for {n_sites} sites")
    checks = site_checks(x, "select_sites") + nan_checks(score, "scores", "select_sites")
    checks.append(tf.debugging.assert_equal(tf.size(score), tf.shape(x.coords)[0],
                                            message="select_sites: score must have one value per site"))
    with tf.control_dependencies(checks):
        score = tf.reshape(score, [-1])
        batch = tf.identity(x.coords[:, 0])
    by_score = tf.argsort(score, direction="DESCENDING", stable=True)
    order = tf.gather(by_score, tf.argsort(tf.gather(batch, by_score), stable=True))
    sorted_batch = tf.gather(batch, order)
    position = tf.range(tf.shape(order)[0])
    first = tf.math.unsorted_segment_min(position, sorted_batch, x.batch_size)
    rank = position - tf.gather(first, sorted_batch)
    kept = tf.sort(tf.boolean_mask(order, rank < k))
    return SiteSparseTensor(tf.gather(x.coords, kept), tf.gather(x.features, kept), x.spatial_shape, x.batch_size,
                            {}, x.static_spatial_shape)
