"""The channel layer name of tf_sparseconv 0.1, SparseConv (now DirectSparseConv), warns,
computes what DirectSparseConv computes, and a model saved with it (tests/fixtures, saved by
0.1) loads and gives the same outputs."""
import json
import os

import keras
import numpy as np
import pytest

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


def test_sparse_conv_is_direct_sparse_conv(random_dense):
    x = kl.as_keras_inputs(ts.from_dense(random_dense([2, 5, 5, 1], 0.4)))
    new = kl.DirectSparseConv(3, 3, rho_up=0.5)
    with pytest.warns(DeprecationWarning, match="use DirectSparseConv"):
        old = kl.SparseConv(3, 3, rho_up=0.5)
    assert isinstance(old, kl.DirectSparseConv)  # pruning, the memory bound and the reports count it
    expected = new(x)
    old(x)
    old.set_weights(new.get_weights())
    np.testing.assert_array_equal(old(x)["values"].numpy(), expected["values"].numpy())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_old_layer_config_round_trips():
    layer = kl.SparseConv(4, 3, rho_up=0.2, activation="relu")
    config = keras.saving.serialize_keras_object(layer)
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(config)))
    assert type(restored) is type(layer) and restored.get_config() == layer.get_config()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_model_saved_with_the_old_name_loads_and_computes_the_same():
    io = np.load(os.path.join(FIXTURES, "old_names_io.npz"))
    channel = keras.models.load_model(os.path.join(FIXTURES, "old_channel_names.keras"))
    out = channel(kl.as_keras_inputs(ts.from_dense(io["channel_in"])))
    np.testing.assert_allclose(out.numpy(), io["channel_out"], rtol=1e-6, atol=1e-7)
    assert sum(isinstance(layer, kl.DirectSparseConv) for layer in channel.layers) == 2
