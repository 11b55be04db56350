"""Keras layers against the raw ops; functional and subclassed models with fit, checkpoints,
.keras and SavedModel round trips; jit_compile; density metrics."""
import numpy as np
import pytest
import tensorflow as tf
import keras

import tf_sparseconv as ts
from tf_sparseconv import keras_layers as kl
from tf_sparseconv.data.voxelize import voxelize_points


def random_clouds(rng, batch, points=200):
    """Three learnable classes: flat, elongated and round blobs."""
    labels = np.arange(batch) % 3
    clouds = rng.normal(0, 0.35, (batch, points, 3))
    clouds[labels == 0, :, 2] *= 0.05
    clouds[labels == 1, :, :2] *= 0.1
    return np.clip(clouds, -1, 1).astype(np.float32), labels


def point_classifier(resolution=8, classes=3, density_regularizer=None):
    inputs = keras.Input((None, 3))
    h = kl.VoxelizePoints(resolution)(inputs)
    h = kl.DirectSparseConv(6, 3, rho_up=0.5, activation="relu", density_regularizer=density_regularizer,
                            name="conv_a")(h)
    h = kl.SparseMaxPool(2)(h)
    h = kl.DirectSparseConv(8, 3, rho_up=0.6, activation="relu", name="conv_b")(h)
    h = keras.layers.Flatten()(kl.SparseToDense()(h))
    return keras.Model(inputs, keras.layers.Dense(classes)(h))


class SubclassedClassifier(keras.Model):
    def __init__(self, classes=3, **kwargs):
        super().__init__(**kwargs)
        self.voxelize = kl.VoxelizePoints(8)
        self.conv = kl.DirectSparseConv(6, 3, rho_up=0.5, activation="relu")
        self.pool = kl.SparseMaxPool(2)
        self.to_dense = kl.SparseToDense()
        self.flatten = keras.layers.Flatten()
        self.head = keras.layers.Dense(classes)

    def call(self, points):
        return self.head(self.flatten(self.to_dense(self.pool(self.conv(self.voxelize(points))))))


def compile_for_test(model, jit_compile="auto"):
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=jit_compile)
    return model


def test_sparse_conv_layer_equals_the_raw_op(rng):
    dense = (rng.random((2, 7, 6, 5, 2)) < 0.2) * rng.standard_normal((2, 7, 6, 5, 2))
    x = ts.from_dense(dense.astype(np.float32))
    layer = kl.DirectSparseConv(4, 3, rho_up=0.1, activation="relu")
    out = kl.from_keras_inputs(layer(kl.as_keras_inputs(x)))
    expected = ts.sparse_relu(ts.direct_conv(x, layer.kernel, layer.bias, selection="signed", rho_up=0.1))
    np.testing.assert_array_equal(out.keys.numpy(), expected.keys.numpy())
    np.testing.assert_allclose(out.values.numpy(), expected.values.numpy(), rtol=1e-6)
    assert out.shape.as_list() == [None, 7, 6, 5, 4]


def test_the_pruning_mask_lives_and_is_cast_on_the_host(rng):
    """The op reads filter_mask in host memory: kept there, a step copies nothing back from
    the GPU for it; pruned weights still drop out of the layer's output."""
    dense = (rng.random((2, 5, 5, 5, 2)) < 0.3) * rng.standard_normal((2, 5, 5, 5, 2))
    x = kl.as_keras_inputs(ts.from_dense(dense.astype(np.float32)))
    layer = kl.DirectSparseConv(3, 3)
    layer(x)
    assert "CPU" in layer.mask.value.device
    graph = tf.function(lambda inputs: layer(inputs)).get_concrete_function(x).graph
    casts = [op for op in graph.get_operations() if op.type == "Cast" and op.outputs[0].dtype == tf.bool]
    assert casts and all("CPU" in op.device for op in casts)
    mask = np.ones(layer.mask.shape, np.float32)
    mask[..., 0] = 0  # prune every weight of output channel 0
    layer.mask.assign(mask)
    dense_out = ts.to_dense(kl.from_keras_inputs(layer(x))).numpy()
    assert not dense_out[..., 0].any() and dense_out[..., 1:].any()  # no present weight, no entry


def test_pool_relu_to_dense_layers_equal_the_raw_ops(rng):
    dense = rng.standard_normal((2, 6, 4, 3)).astype(np.float32) * (rng.random((2, 6, 4, 3)) < 0.5)
    x = ts.from_dense(dense)
    h = kl.SparseMaxPool((2, 2))(kl.SparseReLU()(kl.as_keras_inputs(x)))
    expected = ts.sparse_max_pool(ts.sparse_relu(x), 2)
    np.testing.assert_array_equal(kl.SparseToDense()(h).numpy(), ts.to_dense(expected).numpy())
    roundtrip = kl.from_keras_inputs(kl.DenseToSparse()(dense))
    np.testing.assert_array_equal(roundtrip.keys.numpy(), x.keys.numpy())


def test_voxelize_points_layer_matches_numpy_voxelizer(rng):
    clouds, _ = random_clouds(rng, 4)
    got = kl.from_keras_inputs(kl.VoxelizePoints(16)(clouds))
    expected = voxelize_points(list(clouds), 16)
    np.testing.assert_array_equal(got.keys.numpy(), expected.keys.numpy())


@pytest.mark.parametrize("build", [point_classifier, SubclassedClassifier], ids=["functional", "subclassed"])
def test_fit_lowers_the_loss_and_shows_density_metrics(rng, build):
    clouds, labels = random_clouds(rng, 48)
    model = compile_for_test(build())
    history = model.fit(clouds, labels, batch_size=12, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0]
    density_keys = [key for key in history.history if key.endswith("_density")]
    assert density_keys, "each sparse conv must report its density as a metric"
    for key in density_keys:
        assert all(0.0 < v <= 1.0 for v in history.history[key])


def test_jit_compile_auto_is_refused_by_sparse_layers_and_fit_still_runs(rng, monkeypatch):
    model = point_classifier()
    gpus = [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
    with monkeypatch.context() as m:  # Keras resolves 'auto' to False on any CPU-only machine: show it a GPU
        m.setattr(tf.config, "list_physical_devices", lambda *_: gpus)
        compile_for_test(model)
    assert model.jit_compile is False
    clouds, labels = random_clouds(rng, 12)
    model.fit(clouds, labels, batch_size=6, epochs=1, verbose=0)


def test_predict_evaluate_and_keras_file_round_trip(rng, tmp_path):
    clouds, labels = random_clouds(rng, 12)
    model = compile_for_test(point_classifier())
    model.fit(clouds, labels, batch_size=6, epochs=1, verbose=0)
    model.get_layer("conv_a").mask.assign(tf.cast(rng.random(model.get_layer("conv_a").mask.shape) < 0.7, tf.float32))
    expected = model.predict(clouds, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_allclose(restored.predict(clouds, verbose=0), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(restored.get_layer("conv_a").mask.numpy(), model.get_layer("conv_a").mask.numpy())
    assert "loss" in model.evaluate(clouds, labels, verbose=0, return_dict=True)


def test_export_savedmodel_round_trip(rng, tmp_path):
    clouds, _ = random_clouds(rng, 6)
    model = point_classifier()
    expected = model(clouds).numpy()
    model.export(str(tmp_path / "exported"), verbose=False)
    restored = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_allclose(restored.serve(clouds).numpy(), expected, rtol=1e-5, atol=1e-6)


def test_checkpoint_round_trip_restores_weights_and_masks(rng, tmp_path):
    clouds, _ = random_clouds(rng, 6)
    model = point_classifier()
    model(clouds)
    # Half pruned (not all: an all-zero mask gives zeros whatever the restored weights)
    model.get_layer("conv_b").mask.assign(tf.cast(rng.random(model.get_layer("conv_b").mask.shape) < 0.5, tf.float32))
    expected = model(clouds).numpy()
    path = str(tmp_path / "ckpt.weights.h5")
    model.save_weights(path)
    other = point_classifier()
    other(clouds)
    other.load_weights(path)
    np.testing.assert_allclose(other(clouds).numpy(), expected, rtol=1e-6)


def test_sparse_model_inside_tf_function_with_dataset(rng):
    clouds, labels = random_clouds(rng, 8)
    model = point_classifier()
    dataset = tf.data.Dataset.from_tensor_slices((clouds, labels)).batch(4)

    @tf.function
    def predict(points):
        return model(points)

    outputs = [predict(points) for points, _ in dataset]
    np.testing.assert_allclose(np.concatenate(outputs), model(clouds).numpy(), rtol=1e-5, atol=1e-6)


def test_sparse_input_feeds_channel_sparse_batches_from_tf_data(rng):
    inputs = kl.sparse_input((8, 8, 8, 1))
    h = kl.DirectSparseConv(4, 3, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(kl.SparseToDense()(h))))
    compile_for_test(model)
    grids = (rng.random((8, 8, 8, 8, 1)) < 0.1).astype(np.float32)
    labels = (grids.sum(axis=(1, 2, 3, 4)) > np.median(grids.sum(axis=(1, 2, 3, 4)))).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((grids, labels)).batch(4).map(
        lambda g, y: (kl.as_keras_inputs(ts.from_dense(g).with_shape([None, 8, 8, 8, 1])), y))
    model.fit(dataset, epochs=1, verbose=0)
    assert model.predict(dataset, verbose=0).shape == (8, 2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(rho_up=1.5), r"rho_up must be in \(0, 1\]"),
    (dict(rho_up=0.1, k=3), "not both"),
    (dict(selection="abs"), "needs a bound"),
    (dict(activation="sigmoid"), "fill empty space"),
    (dict(density_regularizer=kl.DensityRegularizer()), "give rho_up"),
    (dict(density_regularizer="l2", rho_up=0.5), "density_regularizer must be a tf_sparseconv DensityRegularizer"),
    (dict(density_regularizer=keras.regularizers.L2(), rho_up=0.5), "density_regularizer must be a tf_sparseconv"),
    (dict(selection="top", k=3), "selection must be one of"),
    (dict(selection="", k=3), "selection must be one of"),  # was taken as the default
    (dict(dataflow="merge"), r"dataflow must be one of \('auto', 'sort', 'dense', 'bitmap', 'atomic'\)"),
    (dict(temp_limit_bytes=-1), "temp_limit_bytes must be a whole number of bytes >= 0"),
    (dict(padded_output=1), "padded_output must be 'auto', True or False, got 1"),
    (dict(padded_output=0.0), "padded_output must be 'auto', True or False, got 0.0"),
])
def test_sparse_conv_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kl.DirectSparseConv(4, 3, **kwargs)


def test_dataflow_and_temp_limit_reach_the_ops_and_the_config(rng):
    dense = (rng.random((2, 6, 5, 2)) < 0.3) * rng.standard_normal((2, 6, 5, 2))
    x = kl.as_keras_inputs(ts.from_dense(dense.astype(np.float32)))
    layer = kl.DirectSparseConv(3, 3, k=4, dataflow="sort", temp_limit_bytes=np.int64(1 << 20))
    layer(x)
    config = layer.get_config()
    assert (config["dataflow"], config["temp_limit_bytes"]) == ("sort", 1 << 20) and "accumulator" not in config
    restored = kl.DirectSparseConv.from_config(config)
    assert (restored.dataflow, restored.temp_limit_bytes) == ("sort", 1 << 20)

    @tf.function
    def kernel_gradient():
        with tf.GradientTape() as tape:
            y = layer(x)
        return tape.gradient(y["values"], layer.kernel)

    ops = {op.type: op for op in kernel_gradient.get_concrete_function().graph.get_operations()}
    forward, backprop = ops["TfSparseconv>DirectSparseConv"], ops["TfSparseconv>DirectSparseConvBackprop"]
    assert (forward.get_attr("dataflow"), forward.get_attr("temp_limit_bytes")) == (b"sort", 1 << 20)
    assert backprop.get_attr("dataflow") == b"sort"


def test_a_0_1_config_with_accumulator_loads_as_dataflow():
    config = kl.DirectSparseConv(3, 3).get_config()
    del config["dataflow"], config["temp_limit_bytes"]
    assert kl.DirectSparseConv.from_config({**config, "accumulator": "auto"}).dataflow == "auto"
    with pytest.warns(DeprecationWarning, match="use dataflow="):
        assert kl.DirectSparseConv.from_config({**config, "accumulator": "merge"}).dataflow == "sort"


def test_sparse_conv_rejects_even_kernels_when_made_and_other_ranks_at_build():
    with pytest.raises(ValueError, match=r"conv: kernel_size entries must be odd .*, got \(3, 2\)"):
        kl.DirectSparseConv(4, (3, 2), name="conv")
    with pytest.raises(ValueError, match="kernel_size needs one entry per spatial dimension"):
        kl.DirectSparseConv(4, (3, 3, 3))(kl.sparse_input((5, 5, 1)))


def test_layers_reject_inputs_that_are_not_channel_sparse_dicts():
    with pytest.raises(TypeError, match="as_keras_inputs"):
        kl.SparseReLU()(tf.zeros([2, 3]))


@pytest.mark.parametrize("shape,kwargs,match", [
    ((8, 8, 0), {}, r"shape entry must be a whole number in \[1, 2147483647\], got 0"),
    ((8.5, 8, 1), {}, "shape entry must be a whole number .*, got 8.5"),
    ((8, True, 1), {}, "shape entry must be a whole number .*, got True"),
    ((8, None, 1), {}, "shape entry must be a whole number .*, got None"),
    ((8,), {}, r"shape must be \(R1, ..., Rd, C\) with 1 to 4 extents, got \(8,\)"),
    ((2, 2, 2, 2, 2, 1), {}, "shape must be .* with 1 to 4 extents, got"),
    ((8, 8, 1), dict(dtype="int32"), "dtype must be one of .*, got 'int32'"),
])
def test_sparse_input_refuses_shapes_and_dtypes_no_layer_takes(shape, kwargs, match):
    with pytest.raises(ValueError, match="sparse_input: " + match):
        kl.sparse_input(shape, **kwargs)
    # Numpy entries and float64 values are fine.
    assert kl.sparse_input(np.array([4, 4, 1]), dtype="float64")["shape_token"].shape == (0, 4, 4, 1)
