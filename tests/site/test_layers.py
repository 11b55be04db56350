"""Site-sparse Keras layers against the raw ops they wrap; the dict transport with cached
kernel maps; functional and subclassed models with fit, checkpoints, .keras and
SavedModel round trips; the MinkUNet- and ResNet-style builders; configuration errors;
the training entry point with --model site-resnet."""
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv import keras_layers as kl
from tf_sparseconv.training import train
from tf_sparseconv.models import site_resnet, site_unet
from tf_sparseconv.site import global_pool, select_sites, site_conv, site_conv_transpose, site_inverse_conv, site_pool
from tf_sparseconv.site.conversions import voxelize_sites
from tf_sparseconv.site.tensor import make_site_sparse
from tests.device import CPU, gpu_visible
from tests.site.helpers import random_sites

SHAPE = (8, 8, 8)


def sites(rng, batch=2, channels=3, density=0.2):
    coords, features = random_sites(rng, batch, SHAPE, density, channels)
    order = np.lexsort(coords.T[::-1])  # any order works; sorted reads better in failures
    return make_site_sparse(coords[order], features[order], SHAPE, batch)


def clouds(rng, batch, points=64):
    """Three learnable classes (flat, elongated, round blobs) and per-point labels (z > 0)."""
    labels = np.arange(batch) % 3
    c = rng.normal(0, 0.35, (batch, points, 3))
    c[labels == 0, :, 2] *= 0.05
    c[labels == 1, :, :2] *= 0.1
    c = np.clip(c, -1, 1).astype(np.float32)
    return c, labels, (c[..., 2] > 0).astype(np.int64)


def assert_round_trips(model, x, expected, tmp_path):
    """The model saved to a .keras file and loaded, and exported as a SavedModel and loaded,
    give the expected outputs on x."""
    # On a GPU the exported graph may pick other kernels (TF32 matmuls and convolutions,
    # atomics in another order) than the eager call: agreement to about 1e-3 there.
    tolerance = dict(rtol=2e-3, atol=1e-3) if gpu_visible() else dict(rtol=1e-5, atol=1e-6)
    model.save(str(tmp_path / "m.keras"))
    restored = keras.models.load_model(str(tmp_path / "m.keras"))
    np.testing.assert_allclose(restored(x).numpy(), expected, **tolerance)
    model.export(str(tmp_path / "exported"), verbose=False)
    exported = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_allclose(exported.serve(x).numpy(), expected, **tolerance)


def compiled(model, lr=0.1):
    # Plain SGD: no optimizer slots to build and trace, so these tests stay fast.
    model.compile(keras.optimizers.SGD(lr), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def assert_same_sites(actual, expected, rtol=1e-5):
    np.testing.assert_array_equal(actual.coords.numpy(), expected.coords.numpy())
    np.testing.assert_allclose(actual.features.numpy(), expected.features.numpy(), rtol=rtol, atol=1e-5)
    np.testing.assert_array_equal(actual.spatial_shape.numpy(), expected.spatial_shape.numpy())
    assert actual.static_spatial_shape.as_list() == expected.spatial_shape.numpy().tolist()


def test_convolution_layers_equal_the_raw_ops(rng):
    x = sites(rng)
    subm = kl.SubMConv3D(4, 3, indice_key="s0", activation="relu", bias_initializer="random_normal")
    down = kl.SparseConv3D(5, 3, strides=2, padding="same", indice_key="d0")
    again = kl.SubMConv3D(4, 3, indice_key="s0", use_bias=False)
    up = kl.SparseInverseConv3D(4, indice_key="d0")
    transposed = kl.SparseConvTranspose3D(2, 2, strides=2, indice_key="t0")

    h = subm(kl.as_site_keras_inputs(x))
    g = down(h)
    u = up(g)
    t = transposed(g)
    a = again(u)

    y1 = site_conv(x, subm.kernel, subm.bias, subm=True, indice_key="s0")
    y1 = y1.with_features(tf.nn.relu(y1.features))
    y2 = site_conv(y1, down.kernel, down.bias, strides=2, padding=1, indice_key="d0")
    y3 = site_inverse_conv(y2, up.kernel, "d0", up.bias)
    y4 = site_conv_transpose(y2, transposed.kernel, transposed.bias, strides=2, indice_key="t0")
    y5 = site_conv(y3, again.kernel, subm=True, indice_key="s0")
    for got, expected in ((h, y1), (g, y2), (u, y3), (t, y4), (a, y5)):
        assert_same_sites(kl.from_site_keras_inputs(got), expected)
    assert up.kernel.shape == (3, 3, 3, 5, 4)  # the strided layer's kernel size, from its map
    assert sorted(t["maps"]) == ["d0", "s0", "t0"] and sorted(a["maps"]) == ["d0", "s0"]
    # The cached maps travel as tensors; the geometry token holds the static geometry
    # (mode 4: strided, 1, plus 3 for a map of the SiteKernelMap op, which stays trusted).
    np.testing.assert_array_equal(g["maps"]["d0"]["in_rows"].numpy(), y2.kernel_maps["d0"].in_rows.numpy())
    assert g["maps"]["d0"]["geometry"].shape == (0, 4, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 8, 8, 8)
    assert kl.from_site_keras_inputs(g).kernel_maps["d0"].trusted
    assert g["shape_token"].shape == (0, 4, 4, 4) and u["shape_token"].shape == (0, 8, 8, 8)
    assert g["batch_size"].shape == (2, 0)


def test_pool_select_global_pool_features_and_merge_layers_equal_the_raw_ops(rng):
    x = sites(rng, batch=3, channels=4, density=0.3)
    d = kl.as_site_keras_inputs(x)
    for layer, mode in ((kl.SiteMaxPooling3D, "max"), (kl.SiteAveragePooling3D, "avg")):
        assert_same_sites(kl.from_site_keras_inputs(layer(2, indice_key="p")(d)), site_pool(x, 2, mode=mode))
    for mode in ("max", "mean", "sum"):
        # On a GPU the segment sums add with atomics, in another order at every call: float32
        # agreement relative to the largest pooled value.
        expected = global_pool(x, mode).numpy()
        np.testing.assert_allclose(kl.SiteGlobalPool(mode)(d).numpy(), expected, rtol=1e-5,
                                   atol=1e-5 * np.abs(expected).max())
    assert_same_sites(kl.from_site_keras_inputs(kl.SiteSelect(5)(d)), select_sites(x, 5))
    dense = keras.layers.Dense(6)
    wrapped = kl.SiteFeatures(dense)(d)
    np.testing.assert_allclose(wrapped["features"].numpy(), dense(x.features).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(wrapped["coords"].numpy(), x.coords.numpy())
    bn = kl.SiteFeatures(keras.layers.BatchNormalization(epsilon=1e-6))(d, training=True)
    normed = (x.features.numpy() - x.features.numpy().mean(0)) / x.features.numpy().std(0)
    np.testing.assert_allclose(bn["features"].numpy(), normed, rtol=1e-3, atol=1e-4)
    concat = kl.SiteConcat()([d, wrapped])
    np.testing.assert_allclose(concat["features"].numpy(), np.concatenate(
        [x.features.numpy(), wrapped["features"].numpy()], 1), rtol=1e-6)
    np.testing.assert_allclose(kl.SiteAdd()([d, d])["features"].numpy(), 2 * x.features.numpy(), rtol=1e-6)
    other = kl.as_site_keras_inputs(select_sites(x, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match="other sites than input 0"):
        kl.SiteAdd()([d, other])
    # the same sites in a batch of another size: the merged tensor would keep input 0's
    bigger = kl.as_site_keras_inputs(make_site_sparse(x.coords, x.features, x.static_spatial_shape.as_list(),
                                                      x.batch_size + 1))
    for merge in (kl.SiteAdd(), kl.SiteConcat()):
        with pytest.raises(tf.errors.InvalidArgumentError, match="input 1 has another batch size than input 0"):
            merge([d, bigger])


def test_voxelize_layer_matches_voxelize_sites_and_to_points_gathers_rows(rng):
    points = rng.uniform(-1.2, 1.2, (2, 40, 4)).astype(np.float32)  # x, y, z and one point feature
    points[1, -5:] = np.nan  # padding
    sites_dict, point_to_site = kl.SiteVoxelize(4, return_point_map=True)(points)
    got = kl.from_site_keras_inputs(sites_dict)
    flat = points.reshape(-1, 4)
    xyz = np.clip(flat[:, :3], -1, 1 - 0.25)  # outside points: border cells; the NaN padding stays NaN
    features = np.concatenate([np.ones((80, 1), np.float32), flat[:, 3:]], 1)
    expected, expected_map = voxelize_sites(xyz, 0.5, (4, 4, 4), np.repeat([0, 1], 40), 2, features,
                                            origin=[-1, -1, -1], non_finite="drop")
    assert_same_sites(got, expected)
    np.testing.assert_array_equal(point_to_site.numpy().reshape(-1), expected_map.numpy())
    assert (point_to_site.numpy()[1, -5:] == -1).all() and got.channels == 2
    per_point = kl.SiteToPoints()([sites_dict, point_to_site]).numpy()
    rows = got.features.numpy()
    np.testing.assert_array_equal(per_point[0], rows[point_to_site.numpy()[0]])
    np.testing.assert_array_equal(per_point[1, -5:], 0)


@pytest.mark.parametrize("points", [np.zeros((2, 5, 3), np.complex64), np.full((1, 1, 3), "a")],
                         ids=["complex", "string"])
def test_voxelize_layer_refuses_points_that_are_not_real_numbers(points):
    with pytest.raises(TypeError, match="vox: points must be real numbers, got (complex64|string)"):
        kl.SiteVoxelize(4, name="vox")(points)


def test_to_points_of_a_batch_without_sites_gives_zero_rows():
    # Every point outside the grid: no sites, every point maps to -1.
    sites_dict, point_to_site = kl.SiteVoxelize(4, clip=False, return_point_map=True)(np.full((2, 5, 3), 5.0,
                                                                                              np.float32))
    assert sites_dict["features"].shape[0] == 0
    np.testing.assert_array_equal(kl.SiteToPoints()([sites_dict, point_to_site]).numpy(), np.zeros((2, 5, 1)))


def test_to_points_refuses_rows_outside_the_sites_and_other_inputs():
    x = kl.as_site_keras_inputs(make_site_sparse(np.array([[0, 1, 1, 1], [1, 0, 0, 0]], np.int32),
                                                 np.ones((2, 3), np.float32), SHAPE, 2))
    layer = kl.SiteToPoints(name="to_points")
    for rows in ([[0, 2]], [[-2, 1]]):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"to_points: point_to_site holds rows outside \[-1, number of sites\)"):
            layer([x, tf.constant(rows)])
    with pytest.raises(TypeError, match="to_points: point_to_site must hold integer site rows .*, got float32"):
        layer([x, tf.constant([[0.0, 1.0]])])
    with pytest.raises(TypeError, match=r"to_points: SiteToPoints takes \[sites, point_to_site\]"):
        layer(x)
    np.testing.assert_array_equal(layer([x, tf.constant([[1, -1]], tf.int64)]).numpy(), [[[1, 1, 1], [0, 0, 0]]])


def test_site_features_refuses_a_layer_that_drops_rows_when_the_row_count_is_known_only_at_run_time(rng):
    x = kl.as_site_keras_inputs(sites(rng))
    layer = kl.SiteFeatures(keras.layers.Lambda(lambda f: tf.boolean_mask(f, f[:, 0] > 0)), name="rows")

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def call(features):
        return layer({**x, "features": features})["features"]

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"rows: the wrapped layer .* must map \[N, C\] rows to .* rows \(row counts differ\)"):
        call(x["features"])
    np.testing.assert_array_equal(call(tf.abs(x["features"]) + 1).numpy(), tf.abs(x["features"]).numpy() + 1)


def test_site_features_adds_no_row_check_around_row_wise_layers(rng):
    """Batch norm, activations, Dense, dropout map each row on their own: no run-time check of
    the row count (host ops in every traced site network); any other layer gets one."""
    x = kl.as_site_keras_inputs(sites(rng))

    def asserts(inner):
        layer = kl.SiteFeatures(inner)
        fn = tf.function(lambda f: layer({**x, "features": f})["features"])
        graph = fn.get_concrete_function(tf.TensorSpec([None, 3], tf.float32)).graph
        return sum(op.type == "Assert" for op in graph.get_operations())

    for inner in (keras.layers.ReLU(), keras.layers.BatchNormalization(), keras.layers.Dense(4),
                  keras.layers.Dropout(0.5), keras.layers.Activation("tanh")):
        assert asserts(inner) == 0, inner
    assert asserts(keras.layers.Lambda(lambda f: f * 2)) == 1


def small_unet_by_hand(spatial_shape=SHAPE, channels=3, dtype="float32"):
    """subm (s0) -> strided (d0) -> subm (s1) -> SparseInverseConv3D (d0) -> concat skip."""
    inputs = kl.site_input(spatial_shape, channels, dtype=dtype)
    skip = kl.SubMConv3D(4, 3, indice_key="s0", name="stem", dtype=dtype)(inputs)
    h = kl.SparseConv3D(6, 2, strides=2, indice_key="d0", name="down", dtype=dtype)(skip)
    h = kl.SubMConv3D(6, 3, indice_key="s1", name="mid", dtype=dtype)(h)
    h = kl.SparseInverseConv3D(4, indice_key="d0", name="up", dtype=dtype)(h)
    h = kl.SiteConcat(name="skip", dtype=dtype)([h, skip])
    return keras.Model(inputs, h["features"])


def test_inverse_conv_finds_the_map_through_a_functional_model(rng):
    model = small_unet_by_hand()
    x = sites(rng)
    k = {name: model.get_layer(name) for name in ("stem", "down", "mid", "up")}
    assert k["up"].kernel.shape == (2, 2, 2, 6, 4)
    y0 = site_conv(x, k["stem"].kernel, k["stem"].bias, subm=True, indice_key="s0")
    y = site_conv(y0, k["down"].kernel, k["down"].bias, strides=2, indice_key="d0")
    y = site_conv(y, k["mid"].kernel, k["mid"].bias, subm=True, indice_key="s1")
    y = site_inverse_conv(y, k["up"].kernel, "d0", k["up"].bias)
    expected = tf.concat([y.features, y0.features], 1).numpy()
    np.testing.assert_allclose(model(kl.as_site_keras_inputs(x)).numpy(), expected, rtol=1e-5, atol=1e-6)
    # The same inside tf.function on tf.data batches (the maps flow as graph tensors).
    dataset = tf.data.Dataset.from_tensors(x).map(kl.as_site_keras_inputs)
    graph = tf.function(model)
    for batch in dataset:
        np.testing.assert_allclose(graph(batch).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_neighbour_tables_flow_through_a_functional_model_and_its_export(monkeypatch, rng, tmp_path):
    # The layers build tables for half types where a GPU is visible (dataflow 'auto'); made
    # to believe one is here, they build them on the CPU, so the Keras dicts carry them
    # between layers (and the CPU kernels check them and compute from the pairs, which
    # gives the results of a model without tables bit for bit).
    import importlib
    maps = importlib.import_module("tf_sparseconv.site.kernel_map")
    with tf.device(CPU):
        x = sites(rng)
        x = kl.as_site_keras_inputs(x.with_features(tf.cast(x.features, tf.float16)))
        monkeypatch.setattr(maps, "gpu_visible", lambda: False)
        plain = small_unet_by_hand(dtype="float16")
        expected = plain(x).numpy()
        monkeypatch.setattr(maps, "gpu_visible", lambda: True)
        model = small_unet_by_hand(dtype="float16")
        model.set_weights(plain.get_weights())
        h = x
        for name in ("stem", "down", "mid", "up"):  # the layers' own calls, eagerly: their dicts
            h = model.get_layer(name)(h)
            if name == "mid":
                assert "neighbours" in h["maps"]["s1"] and "neighbours" in h["maps"]["d0"]
        assert "inverse_neighbours" in h["maps"]["d0"]
        np.testing.assert_array_equal(model(x).numpy(), expected)
        np.testing.assert_array_equal(tf.function(model)(x).numpy(), expected)
        model.export(str(tmp_path / "exported"), verbose=False)
        exported = tf.saved_model.load(str(tmp_path / "exported"))
        np.testing.assert_array_equal(exported.serve(x).numpy(), expected)


def test_resnet_on_points_fits_and_round_trips_through_keras_file_and_export(rng, tmp_path):
    keras.utils.set_random_seed(1)
    points, labels, _ = clouds(rng, 24)
    model = compiled(site_resnet(3, 8, channels=(8, 16), points=True, dropout=0))
    assert model.output_shape == (None, 3)
    losses = model.fit(points, labels, batch_size=8, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    # Eager calls (no tracing): inference batch norm with the moving statistics fit left.
    expected = model(points).numpy()
    assert_round_trips(model, points, expected, tmp_path)


def test_unet_on_points_fits_and_lowers_the_loss(rng):
    keras.utils.set_random_seed(1)
    points, _, point_labels = clouds(rng, 24)
    model = compiled(site_unet(2, 8, channels=(8, 16), points=True))
    assert model.output_shape == (None, None, 2)
    assert sum(isinstance(layer, kl.SparseInverseConv3D) for layer in model.layers) == 1
    losses = model.fit(points, point_labels, batch_size=8, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses


class SubclassedSegmenter(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.voxelize = kl.SiteVoxelize(8, return_point_map=True)
        self.stem = kl.SubMConv3D(8, 3, indice_key="s0")
        self.bn = kl.SiteFeatures(keras.layers.BatchNormalization())
        self.relu = kl.SiteFeatures(keras.layers.ReLU())
        self.down = kl.SparseConv3D(8, 2, strides=2, indice_key="d0")
        self.up = kl.SparseInverseConv3D(8, indice_key="d0", activation="relu")
        self.concat = kl.SiteConcat()
        self.head = kl.SubMConv3D(2, 1)
        self.to_points = kl.SiteToPoints()

    def call(self, points, training=None):
        sites_dict, point_to_site = self.voxelize(points)
        h = self.relu(self.bn(self.stem(sites_dict), training=training))
        u = self.up(self.down(h))
        return self.to_points([self.head(self.concat([u, h])), point_to_site])


def test_subclassed_model_fits_and_checkpoints_round_trip(rng, tmp_path):
    keras.utils.set_random_seed(2)
    points, _, point_labels = clouds(rng, 16)
    model = compiled(SubclassedSegmenter())
    losses = model.fit(points, point_labels, batch_size=8, epochs=10, verbose=0).history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    expected = model.predict(points, verbose=0)
    assert expected.shape == (16, 64, 2)
    # On a GPU, predict's traced graph and the eager call add float32 sums in another order
    # (the pair tiles add with atomics) over TF32 products: agreement to about 1e-3 there
    # (a lent H200, 2026-11-30: 1.1e-4 apart after ten epochs).
    tolerance = dict(rtol=2e-3, atol=1e-3) if gpu_visible() else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model(points).numpy(), expected, **tolerance)
    path = str(tmp_path / "ckpt.weights.h5")
    model.save_weights(path)
    other = SubclassedSegmenter()
    other(points[:2])
    other.load_weights(path)
    np.testing.assert_allclose(other(points).numpy(), expected, **tolerance)


def test_unet_on_site_inputs_round_trips_through_keras_file_and_export(rng, tmp_path):
    model = site_unet(3, SHAPE, in_channels=3, channels=(4, 8))
    x = kl.as_site_keras_inputs(sites(rng))
    model(x, training=True)  # moves the batch-norm statistics away from their initial values
    expected = model(x).numpy()
    assert expected.shape == (x["coords"].shape[0], 3)  # one logit row per input site
    assert_round_trips(model, x, expected, tmp_path)


def test_outputs_dataflow_with_more_than_32_offsets_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"sub: dataflow='outputs' runs kernels of at most 32 offsets on the GPU's "
                                         r"output-stationary tiles, and kernel_size 5 has 125; use dataflow='auto'"):
        kl.SubMConv3D(4, 5, dataflow="outputs", name="sub")
    with pytest.raises(ValueError, match=r"kernel_size \(3, 3, 4\) has 36"):
        kl.SparseConv3D(4, (3, 3, 4), dataflow="outputs")
    # 32 offsets, or any kernel under 'auto' and 'pairs', are accepted.
    assert kl.SparseConv3D(4, (2, 4, 4), dataflow="outputs").dataflow == "outputs"
    assert kl.SubMConv3D(4, 5, dataflow="auto").dataflow == "auto"
    assert kl.SubMConv3D(4, 5, dataflow="pairs").dataflow == "pairs"


def test_bad_configurations_give_clear_errors(rng):
    with pytest.raises(TypeError, match="strides"):
        kl.SubMConv3D(4, 3, strides=2)  # a submanifold convolution has none
    with pytest.raises(ValueError, match="odd kernel"):
        kl.SubMConv3D(4, 2)
    with pytest.raises(ValueError, match=r"kernel_size needs one entry per spatial dimension \(3\)"):
        kl.SparseConv3D(4, (2, 2))
    for layer in (kl.SubMConv3D, kl.SparseConv3D, kl.SparseConvTranspose2D):  # only an inverse reads it from its map
        with pytest.raises(ValueError, match="kernel_size must be an int or a sequence of ints, got None"):
            layer(4, None)
    with pytest.raises(ValueError, match="padding must be an int, a tuple, 'valid' or 'same'"):
        kl.SparseConv3D(4, 2, padding="full")
    with pytest.raises(ValueError, match="takes its strides from the strided convolution"):
        kl.SparseInverseConv3D(4, indice_key="d0", strides=2)
    with pytest.raises(TypeError, match="needs the indice_key"):
        kl.SparseInverseConv3D(4, 2)
    with pytest.raises(TypeError, match="wraps a keras.layers.Layer"):
        kl.SiteFeatures("relu")
    for layer in (kl.SubMConv3D, kl.SparseConv2D, kl.SparseConvTranspose1D):
        with pytest.raises(ValueError, match="dataflow must be 'auto', 'pairs' or 'outputs', got 'tiles'"):
            layer(4, 3, dataflow="tiles")
    with pytest.raises(ValueError, match="dataflow must be 'auto', 'pairs' or 'outputs', got None"):
        kl.SparseInverseConv3D(4, indice_key="d0", dataflow=None)
    inputs = kl.site_input(SHAPE, 3)
    h = kl.SubMConv3D(4, 3, indice_key="s0")(inputs)
    g = kl.SparseConv3D(4, 2, strides=2, indice_key="d0")(h)
    with pytest.raises(ValueError, match=r"no kernel map under indice_key 'down1'.*maps here: \['d0', 's0'\]"):
        kl.SparseInverseConv3D(4, indice_key="down1")(g)
    with pytest.raises(ValueError, match="inverts a strided convolution; the map under 's0' is 'submanifold'"):
        kl.SparseInverseConv3D(4, indice_key="s0")(g)
    with pytest.raises(ValueError, match="differs from the strided convolution's"):
        kl.SparseInverseConv3D(4, 3, indice_key="d0")(g)
    with pytest.raises(ValueError, match="indice_key 'd0' was built for"):
        kl.SubMConv3D(4, 3, indice_key="d0")(g)
    with pytest.raises(ValueError, match="leave no output site"):
        kl.SparseConv3D(4, 9, strides=1)(inputs)
    with pytest.raises(ValueError, match="a 2-D layer got sites with 3 spatial dimensions"):
        kl.SubMConv2D(4, 3)(inputs)
    with pytest.raises(ValueError, match="a 2-D layer got sites with 3 spatial dimensions"):
        kl.SiteMaxPooling2D(2)(inputs)
    with pytest.raises(TypeError, match="takes the site dict made by as_site_keras_inputs"):
        kl.SparseConv3D(4, 3)(kl.sparse_input((8, 8, 8, 1)))
    with pytest.raises(TypeError, match="site Keras layers take the dict"):
        kl.SiteSelect(3)({"keys": tf.zeros([0], tf.int64)})

    @tf.function(input_signature=[tf.TensorSpec([3], tf.int32)])
    def unknown_extent(spatial_shape):
        x = make_site_sparse(np.zeros((1, 4), np.int32), np.ones((1, 1), np.float32), spatial_shape, 1)
        return kl.as_site_keras_inputs(x)["features"]

    with pytest.raises(ValueError, match="static spatial shape .* must be known to enter a Keras model"):
        unknown_extent.get_concrete_function()


@pytest.mark.parametrize("spatial_shape,channels,kwargs,match", [
    (SHAPE, 0, {}, "site_input: channels must be a whole number >= 1, got 0"),
    (SHAPE, 2.5, {}, "site_input: channels must be a whole number >= 1, got 2.5"),
    (SHAPE, True, {}, "site_input: channels must be a whole number >= 1, got True"),
    ((8, 8.5, 8), 3, {}, r"site_input: spatial_shape entry must be a whole number in \[1, 2147483647\], got 8.5"),
    ((8, None, 8), 3, {}, "site_input: spatial_shape entry must be a whole number .*, got None"),
    (SHAPE, 3, dict(dtype="int32"), "site_input: dtype must be one of .*, got 'int32'"),
    (8, 3, {}, "spatial_shape must be 1 to 4 extents >= 1, got 8"),
])
def test_site_input_refuses_shapes_channels_and_dtypes_no_layer_takes(spatial_shape, channels, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kl.site_input(spatial_shape, channels, **kwargs)
    assert kl.site_input(np.array(SHAPE), np.int64(3))["features"].shape == (None, 3)


@pytest.mark.parametrize("layer", [
    kl.SubMConv3D(4, (3, 1, 3), indice_key="s", activation="relu", kernel_regularizer="l2", use_bias=False),
    kl.SubMConv2D(4, 3, dilation_rate=2),
    kl.SparseConv3D(4, 2, strides=(2, 2, 1), padding="valid", dilation_rate=1, indice_key="d",
                    kernel_initializer="he_normal"),
    kl.SparseConv1D(2, 3, strides=2, padding="same"),
    kl.SparseConvTranspose3D(3, 3, strides=2, padding=1, indice_key="t", bias_regularizer="l1", dataflow="outputs"),
    kl.SparseInverseConv3D(5, 2, indice_key="d", activation="gelu", dataflow="pairs"),
    kl.SiteAveragePooling3D((2, 2, 1), strides=1, padding="valid", indice_key="p"),
    kl.SiteMaxPooling4D(2),
    kl.SiteGlobalPool("sum"), kl.SiteSelect(7), kl.SiteConcat(validate=False), kl.SiteAdd(),
    kl.SiteFeatures(keras.layers.BatchNormalization(momentum=0.5)),
    kl.SiteVoxelize((4, 5, 6), bounds=((0, 0, 0), (1, 2, 3)), reduction="max", clip=False, return_point_map=True),
    kl.SiteToPoints(),
], ids=lambda layer: type(layer).__name__)
def test_layer_configs_round_trip(layer):
    config = keras.saving.serialize_keras_object(layer)
    restored = keras.saving.deserialize_keras_object(json.loads(json.dumps(config)))
    assert type(restored) is type(layer) and restored.get_config() == layer.get_config()
    assert restored.supports_jit is False


def test_conv_layers_keep_their_dataflow_and_old_configs_run_auto(rng):
    x = sites(rng)
    for dataflow in ("auto", "pairs", "outputs"):
        layer = kl.SubMConv3D(4, 3, dataflow=dataflow)
        assert layer.get_config()["dataflow"] == dataflow
        assert keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)).dataflow == dataflow
    config = kl.SparseConv3D(4, 2, strides=2).get_config()
    del config["dataflow"]  # as saved by 0.1
    assert kl.SparseConv3D.from_config(config).dataflow == "auto"
    # On the CPU 'pairs' is the one dataflow, and 'outputs' is refused by the op.
    with tf.device(CPU):
        pairs = kl.SubMConv3D(4, 3, dataflow="pairs")
        y = pairs(kl.as_site_keras_inputs(x))
        auto = kl.SubMConv3D(4, 3)
        auto(kl.as_site_keras_inputs(x))
        auto.set_weights(pairs.get_weights())
        np.testing.assert_array_equal(auto(kl.as_site_keras_inputs(x))["features"].numpy(), y["features"].numpy())
        outputs = kl.SubMConv3D(4, 3, dataflow="outputs")
        with pytest.raises(tf.errors.InvalidArgumentError, match="dataflow='outputs' runs on the GPU only"):
            outputs(kl.as_site_keras_inputs(x))


def test_train_entry_point_trains_site_resnet_on_synthetic(tmp_path, capsys):
    # Adagrad: fewer optimizer slots to build and trace than Adam.
    results = train.main(["--model", "site-resnet", "--dataset", "synthetic", "--resolution", "8",
                          "--synthetic-per-class", "3", "--val-fraction", "0.2", "--epochs", "1",
                          "--batch-size", "16", "--site-channels", "4", "8", "--site-k", "40",
                          "--optimizer", "adagrad", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "validation accuracy" in printed and "memory bound at batch 16: " in printed
    with open(tmp_path / "results.json") as f:
        saved = json.load(f)
    # bounded with the selection's 40 sites per example after the stem (synthetic clouds:
    # at most --points sites per sample before it)
    assert saved["model"] == "site-resnet" and saved["memory_bound_bytes"] > 0
    assert saved["memory_bound_sites_per_sample"] == 1024
    assert {b["name"]: b for b in saved["memory_bound_layers"]}["select"]["output_entries"] == 16 * 40 * 4
    assert saved["site_k"] == 40 and "at most 40 sites per example" in printed
    assert saved["val_accuracy"] == pytest.approx(results["val_accuracy"]) and 0 <= saved["val_accuracy"] <= 1
    assert len(saved["sec_per_epoch"]) == 1 and saved["peak_rss_bytes"] > 0
    model = keras.models.load_model(tmp_path / "model.keras")
    assert model.output_shape == (None, 8)
    with pytest.raises(SystemExit):
        train.main(["--model", "site-resnet", "--rho", "0.5", "--out", str(tmp_path / "again")])
    assert "apply to the channel-sparse octnet3 model" in capsys.readouterr().err
