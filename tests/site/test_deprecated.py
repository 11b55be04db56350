"""The site layer names of tf_sparseconv 0.1 (SiteConv, SubMConv, SiteConvTranspose,
SiteInverseConv, SitePool, dilation=) warn, compute what their new names compute, and a
model saved with them (tests/fixtures, saved by 0.1) loads and gives the same outputs."""
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tests.device import CPU
from tests.site.helpers import random_sites

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SHAPE = (6, 6, 6)


def site_batch(rng):
    coords, features = random_sites(rng, 2, SHAPE, 0.3, 3)
    return kl.as_site_keras_inputs(ts.make_site_sparse(coords, features, SHAPE, 2))


def same_outputs(old, new, x, pre=None):
    """old and new layers, given the same weights, compute the same site features."""
    h = pre(x) if pre is not None else x
    expected = new(h)
    old(h)
    old.set_weights(new.get_weights())
    np.testing.assert_allclose(old(h)["features"].numpy(), expected["features"].numpy(), rtol=1e-6)


def test_old_site_names_warn_and_equal_the_new_ones(rng):
    with tf.device(CPU):  # the CPU's sums, the same for the same weights
        x = site_batch(rng)
        down = kl.SparseConv3D(4, 2, strides=2, indice_key="d0")
        with pytest.warns(DeprecationWarning, match="SiteConv is deprecated"):
            old = kl.SiteConv(4, 3, subm=True, indice_key="s0")
        same_outputs(old, kl.SubMConv3D(4, 3, indice_key="s0"), x)
        with pytest.warns(DeprecationWarning, match="SubMConv is deprecated"):
            old = kl.SubMConv(4, 3, padding=1)
        assert isinstance(old, kl.SiteConv) and old.subm
        same_outputs(old, kl.SubMConv3D(4, 3), x)
        with pytest.warns(DeprecationWarning, match="dilation is deprecated, use dilation_rate"):
            old = kl.SiteConv(4, 3, strides=2, padding=1, dilation=2)
        same_outputs(old, kl.SparseConv3D(4, 3, strides=2, padding=1, dilation_rate=2), x)
        with pytest.warns(DeprecationWarning, match="SiteConvTranspose is deprecated"):
            old = kl.SiteConvTranspose(3, 2, strides=2)
        same_outputs(old, kl.SparseConvTranspose3D(3, 2, strides=2), x)
        with pytest.warns(DeprecationWarning, match="SiteInverseConv is deprecated"):
            old = kl.SiteInverseConv(3, "d0")
        same_outputs(old, kl.SparseInverseConv3D(3, indice_key="d0"), x, pre=down)
        for mode, new in (("max", kl.SiteMaxPooling3D), ("avg", kl.SiteAveragePooling3D)):
            with pytest.warns(DeprecationWarning, match="SitePool is deprecated"):
                old = kl.SitePool(2, mode=mode)
            np.testing.assert_array_equal(old(x)["features"].numpy(), new(2)(x)["features"].numpy())


def test_old_site_names_keep_their_checks():
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="strides must be 1"):
        kl.SiteConv(4, 3, subm=True, strides=2)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="odd kernel"):
        kl.SiteConv(4, 2, subm=True)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="mode must be one of"):
        kl.SitePool(2, mode="median")
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="takes its strides"):
        kl.SiteInverseConv(4, "d0", strides=2)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("make", [
    lambda: kl.SiteConv(4, 3, subm=True, padding=1, indice_key="s"),
    lambda: kl.SiteConv(4, 2, strides=2, dilation=1),
    lambda: kl.SiteConvTranspose(3, 3, strides=2, padding=1),
    lambda: kl.SiteInverseConv(5, "d", kernel_size=2),
    lambda: kl.SitePool((2, 2, 1), strides=1, mode="avg"),
], ids=["SiteConv-subm", "SiteConv", "SiteConvTranspose", "SiteInverseConv", "SitePool"])
def test_old_layer_configs_round_trip(make):
    layer = make()
    config = keras.saving.serialize_keras_object(layer)
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(config)))
    assert type(restored) is type(layer) and restored.get_config() == layer.get_config()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_model_saved_with_the_old_names_loads_and_computes_the_same():
    with tf.device(CPU):  # the outputs 0.1 saved, computed on the CPU in float32
        io = np.load(os.path.join(FIXTURES, "old_names_io.npz"))
        site = keras.models.load_model(os.path.join(FIXTURES, "old_site_names.keras"))
        x = kl.as_site_keras_inputs(ts.make_site_sparse(io["site_coords"], io["site_features"], (4, 4, 4), 2))
        np.testing.assert_allclose(site(x).numpy(), io["site_out"], rtol=1e-6, atol=1e-7)
        assert [type(layer).__name__ for layer in site.layers if "Site" in type(layer).__name__] == [
            "SiteConv", "SiteConv", "SiteConv", "SiteInverseConv", "SitePool", "SiteConvTranspose", "SitePool",
            "SiteGlobalPool"]
