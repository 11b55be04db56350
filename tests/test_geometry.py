"""tf_sparseconv.geometry: the output extents agree with what the ops produce (the
SiteKernelMap op's output spatial shape, SparseMaxPool's dense shape), padding names
resolve as documented, and bad geometry is refused before any op runs."""
import itertools

import numpy as np
import pytest

import tf_sparseconv as ts
from tf_sparseconv.geometry import (ConvGeometry, checked_output_shape, conv_geometry, output_shape, per_dim,
                                    pooled_shape, same_padding)


@pytest.mark.parametrize("mode", ["submanifold", "strided", "transposed"])
def test_output_shape_matches_the_kernel_map_op(mode, rng):
    spatial = (7, 5)
    coords = np.array([[0, 0, 0], [0, 3, 4], [0, 6, 1], [0, 2, 2]], np.int32)
    x = ts.make_site_sparse(coords, np.ones((len(coords), 1), np.float32), spatial, 1)
    kernels = (1, 3) if mode == "submanifold" else (1, 2, 3)
    strides = (1,) if mode == "submanifold" else (1, 2, 3)
    for k, s, p, dl in itertools.product(kernels, strides, (0, 1), (1, 2)):
        if mode == "submanifold" and p:
            continue
        geometry = conv_geometry(mode, 2, k, s, p, dl)
        expected = output_shape(spatial, geometry)
        if min(expected) < 1:
            continue
        kmap = ts.kernel_map(x, k, s, p, dl, mode=mode)
        assert tuple(kmap.out_spatial_shape.numpy()) == expected, geometry


def test_padding_names():
    assert conv_geometry("strided", 3, 3, 2, "valid").padding == (0, 0, 0)
    assert conv_geometry("strided", 2, (3, 5), 2, "same", (1, 2)).padding == (1, 4) == same_padding((3, 5), (1, 2))
    # "same" with an odd kernel gives ceil(r / s), as in Keras
    for r, s in itertools.product(range(1, 12), range(1, 4)):
        assert output_shape((r,), conv_geometry("strided", 1, 3, s, "same")) == (-(-r // s),)
    # a submanifold convolution accepts 0 or "same" and records 0
    assert conv_geometry("submanifold", 2, 3, padding="same") == ConvGeometry("submanifold", (3, 3), (1, 1), (0, 0),
                                                                               (1, 1))
    assert conv_geometry("submanifold", 2, 3) == ("submanifold", (3, 3), (1, 1), (0, 0), (1, 1))


@pytest.mark.parametrize("args, match", [
    (("submanifold", 2, 2), "odd kernel"),
    (("submanifold", 2, 3, 2), "strides must be 1"),
    (("submanifold", 2, 3, 1, 2), "padding must be 0 or"),
    (("strided", 2, (3, 3, 3)), r"kernel_size needs one entry per spatial dimension \(2\)"),
    (("strided", 2, 3, 0), "strides entries must be >= 1"),
    (("strided", 2, 3, 1, -1), "padding entries must be >= 0"),
    (("strided", 2, 3, 1, "full"), "padding must be an int, a tuple, 'valid' or 'same'"),
    (("sideways", 2, 3), "mode must be one of"),
])
def test_bad_geometry_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        conv_geometry(*args, what="layer")


def test_checked_output_shape_refuses_a_geometry_without_output_sites():
    assert checked_output_shape((8, None), conv_geometry("strided", 2, 3, 2)) == (3, None)
    with pytest.raises(ValueError, match="conv: kernel .* leave no output site on the spatial shape"):
        checked_output_shape((2, 8), conv_geometry("strided", 2, 3), "conv")


def test_per_dim():
    assert per_dim(2, 3, "strides") == (2, 2, 2)
    assert per_dim([1, 2], 2, "strides") == (1, 2)
    with pytest.raises(ValueError, match="pool: pool_size must be an int or a sequence of ints"):
        per_dim("two", 2, "pool_size", what="pool")


def test_pooled_shape_matches_sparse_max_pool(random_dense):
    x = ts.from_dense(random_dense([2, 7, 5, 4, 1], 0.5))
    for strides in ([2, 2, 2], [3, 1, 4]):
        assert tuple(ts.sparse_max_pool(x, strides).dense_shape.numpy()[1:-1]) == pooled_shape((7, 5, 4), strides)
    assert pooled_shape((None, 5), (2, 2)) == (None, 3)
