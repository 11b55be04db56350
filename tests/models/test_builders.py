"""The model builders' arguments: a bad size, count, density bound or option is a clear
error naming the builder and the argument, before any layer is built."""
import math

import numpy as np
import pytest

from tf_sparseconv import models


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(resolution=0, rhos=(0.5,)), ValueError, "octnet3: resolution must be >= 1, got 0"),
    (dict(resolution=-8, rhos=(0.5,)), ValueError, "octnet3: resolution must be >= 1, got -8"),
    (dict(resolution=8.5, rhos=(0.5,)), TypeError, "octnet3: resolution must be an int, got 8.5"),
    (dict(resolution=True, rhos=(0.5,)), TypeError, "octnet3: resolution must be an int, got True"),
    (dict(num_classes=0), ValueError, "octnet3: num_classes must be >= 1, got 0"),
    (dict(in_channels=0), ValueError, "octnet3: in_channels must be >= 1, got 0"),
    (dict(spatial_dims=0), ValueError, "octnet3: spatial_dims must be >= 1, got 0"),
    (dict(spatial_dims=5), ValueError, r"octnet3: spatial_dims must be 1 to 4"),
    (dict(resolution=32, spatial_dims=1), ValueError, r"octnet3: dense blocks are 2-D or 3-D .* spatial_dims=1"),
    (dict(rhos=(2.0, 1.0)), ValueError, r"octnet3: every rho must be a number in \(0, 1\]"),
    (dict(rhos=(math.nan, 1.0)), ValueError, r"octnet3: every rho must be a number in \(0, 1\]"),
    (dict(rhos=("a", "b")), ValueError, r"octnet3: every rho must be a number in \(0, 1\]"),
    (dict(rhos=0.5), TypeError, "octnet3: rhos must be a sequence of density bounds"),
    (dict(rhos="ab"), TypeError, "octnet3: rhos must be a sequence of density bounds"),
    (dict(selection="bad"), ValueError, "octnet3: selection must be one of"),
    (dict(dense_blocks=-1), ValueError, "octnet3: dense_blocks must be >= 0, got -1"),
    (dict(dense_blocks=1.5), TypeError, "octnet3: dense_blocks must be an int, got 1.5"),
    (dict(dense_blocks=5), ValueError, r"octnet3: 5 dense blocks pool the 8\^d grid .* more than its extent"),
])
def test_octnet3_refuses_bad_sizes_bounds_and_options(kwargs, error, message):
    # Before: resolution 0 / True and in_channels 0 built a model, a rho of NaN or 2 left its
    # block unbounded, an unknown selection was ignored where every rho is 1, dense_blocks=-1
    # was 0 and the rest failed inside Keras or Python (math domain error, 'float' object is
    # not iterable, "Received an invalid value for `units`").
    args = dict(resolution=16, num_classes=4)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        models.octnet3(**args)


def test_octnet3_of_few_cells_after_its_sparse_blocks_has_no_dense_blocks():
    # Before: math domain error (log2 of 0): 8 / 2^2 = 2 cells per axis are fewer than 4.
    model = models.octnet3(8, 3, rhos=(0.5, 0.5, 0.5), fc_units=8)
    assert not [layer for layer in model.layers if layer.name.startswith("conv")]
    assert models.octnet3(np.int64(16), 3, rhos=np.array([0.5, 1.0]), fc_units=8).output_shape == (None, 3)


@pytest.mark.parametrize("build", [models.site_resnet, models.site_unet])
@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_classes=0), ValueError, "num_classes must be >= 1, got 0"),
    (dict(resolution=0), ValueError, "resolution must be >= 1, got 0"),
    (dict(resolution=16.7), TypeError, "resolution must be an int, got 16.7"),
    (dict(resolution=(16.7, 16, 16)), TypeError, "resolution must be an int, got 16.7"),
    (dict(resolution="16"), TypeError, "resolution must be an int or a sequence of ints, got '16'"),
    (dict(spatial_dims=2.5), TypeError, "spatial_dims must be an int, got 2.5"),
    (dict(in_channels=0), ValueError, "in_channels must be >= 1, got 0"),
    (dict(channels=16), TypeError, "channels must be a sequence of channel counts"),
    (dict(point_features=3), ValueError, r"point_features=3 applies to point-cloud inputs: give points=True"),
    (dict(points=True, point_features=-1), ValueError, "point_features must be >= 0, got -1"),
    # a tuple resolution silently overrode spatial_dims
    (dict(resolution=(8, 8), spatial_dims=3), ValueError, r"resolution \(8, 8\) has 2 axes but spatial_dims is 3"),
])
def test_site_networks_refuse_bad_sizes_and_options(build, kwargs, error, message):
    # Before: resolution (16.7, 16, 16) was truncated to 16, in_channels 0 and point_features
    # without points=True were accepted (the latter ignored), and the rest failed in Python or
    # Keras ('float' object is not iterable, can't multiply sequence by non-int, object of type
    # 'int' has no len(), "Received an invalid value for `units`", SiteVoxelize.call()).
    args = dict(num_classes=3, resolution=8, channels=(4, 8))
    args.update(kwargs)
    with pytest.raises(error, match=f"{build.__name__}: {message}"):
        build(**args)


@pytest.mark.parametrize("build", [models.site_resnet, models.site_unet])
def test_site_networks_take_the_rank_from_a_tuple_resolution(build):
    for kwargs in (dict(resolution=(8, 8)), dict(resolution=(8, 8), spatial_dims=2),
                   dict(resolution=8, spatial_dims=2)):
        model = build(3, channels=(4, 8), **kwargs)
        assert tuple(model.input["shape_token"].shape) == (0, 8, 8) and tuple(model.input["coords"].shape) == (None, 3)


@pytest.mark.parametrize("kwargs, message", [(dict(select_k=0), "select_k must be >= 1, got 0"),
                                             (dict(blocks=-1), "blocks must be >= 0, got -1")])
def test_site_resnet_refuses_select_k_0_and_negative_blocks(kwargs, message):
    # Before: select_k=0 was ignored (no SiteSelect, where -1 was refused) and blocks=-1 meant 0.
    with pytest.raises(ValueError, match=f"site_resnet: {message}"):
        models.site_resnet(3, 8, channels=(4, 8), **kwargs)
    assert models.site_resnet(3, 8, channels=(4, 8), blocks=0).output_shape == (None, 3)
