"""Density-bounded site selection (select_sites): per batch element the k sites of largest
score, ties to the lower row, in their original order; on each device."""
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv.site import select_sites
from tf_sparseconv.site.tensor import SiteSparseTensor, make_site_sparse
from tests.device import assert_on
from tests.site.helpers import random_sites


@pytest.mark.soft_placement  # TensorFlow's sorts and segment reductions of int32 rows
def test_select_sites_keeps_the_k_largest_per_batch_element_in_order(rng, device):
    coords, features = random_sites(rng, 3, (10, 10), 0.4, 3)
    k = 7
    rows = np.flatnonzero(coords[:, 0] == 0)
    cut = rows[np.argsort(-np.linalg.norm(features[rows], axis=1))][k - 1:k + 1]  # ranks k and k + 1
    features[cut.max()] = features[cut.min()]  # a tie across the cut: the lower row wins
    with tf.device(device):
        x = make_site_sparse(coords, features, (10, 10), 3)
        y = select_sites(x, k)
    assert_on(device, y.features)
    norms = np.linalg.norm(features, axis=1)
    expected = []
    for b in range(3):
        rows = np.flatnonzero(coords[:, 0] == b)
        ranked = sorted(rows, key=lambda r: (-norms[r], r))
        expected += ranked[:k]
    expected = np.sort(expected)
    np.testing.assert_array_equal(y.coords.numpy(), coords[expected])
    np.testing.assert_array_equal(y.features.numpy(), features[expected])
    assert y.coords.shape[0] <= 3 * k
    with pytest.raises(ValueError, match="k >= 1"):
        select_sites(x, 0)


def test_select_sites_refuses_bad_k_and_scores(rng):
    coords, features = random_sites(rng, 2, (6, 6), 0.4, 2)
    x = make_site_sparse(coords, features, (6, 6), 2)
    n = len(coords)
    # k beyond int32 used to wrap (2^32: keep nothing) or overflow (2^63); any k above the
    # site count keeps every site.
    for k in (n + 1, 2**32, 2**63):
        np.testing.assert_array_equal(select_sites(x, k).coords.numpy(), coords)
    for k in (2.5, True, "3"):
        with pytest.raises(TypeError, match="select_sites: k must be an int"):
            select_sites(x, k)
    with pytest.raises(ValueError, match=f"score has {n - 1} values for {n} sites"):
        select_sites(x, 2, score=np.ones(n - 1, np.float32))
    with pytest.raises(TypeError, match="score must be real numbers, got complex64"):
        select_sites(x, 2, score=np.ones(n, np.complex64))
    nan_score = np.ones(n, np.float32)
    nan_score[3] = np.nan  # its rank would be arbitrary
    with pytest.raises(tf.errors.InvalidArgumentError, match="select_sites: scores hold NaN"):
        select_sites(x, 2, score=nan_score)
    short = tf.function(lambda s: select_sites(x, 2, score=s).coords,
                        input_signature=[tf.TensorSpec([None], tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="score must have one value per site"):
        short(tf.ones([n - 1]))


@pytest.mark.parametrize("coords,message", [
    ([[0, 1, 1], [0, 1, 1]], "sites 0 and 1 have the same coordinates"),
    ([[0, 1, 1], [-1, 2, 2]], "site 1 has batch index -1"),  # used to fail in GatherV2
    ([[0, 1, 1], [2, 2, 2]], "site 1 has batch index 2"),  # used to fail in UnsortedSegmentMin
    ([[0, 1, 1], [0, 2, 6]], "site 1 has coordinate 6 in spatial dimension 1"),
])
def test_select_sites_refuses_invalid_sites(coords, message):
    x = SiteSparseTensor(tf.constant(coords, tf.int32), tf.ones([2, 1]), tf.constant([6, 6]), tf.constant(2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        select_sites(x, 1)
