"""Density-bounded site selection (select_sites): per batch element the k sites of largest
score, ties to the lower row, in their original order; on each device."""
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv.site import select_sites
from tf_sparseconv.site.tensor import make_site_sparse
from tests.device import assert_on
from tests.site.helpers import random_sites


@pytest.mark.soft_placement  # TensorFlow's sorts and segment reductions of int32 rows
def test_select_sites_keeps_the_k_largest_per_batch_element_in_order(rng, device):
    coords, features = random_sites(rng, 3, (10, 10), 0.4, 3)
    features[5] = features[6]  # a tie: the lower row wins
    k = 7
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
