"""Serving models: the in-graph preprocessing layers against the NumPy reference (keys
bit-identical, points on voxel boundaries included), clear refusals of bad input, and saved
point-cloud / image classifiers that load in a fresh process after `import tf_sparseconv`
and predict what the core computes on the batches of training."""
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv import keras_layers as kl
from tf_sparseconv import models
from tf_sparseconv.data import (image_arrays, images_to_channel_sparse, normalize_to_unit_sphere, voxelize_arrays,
                                voxelize_points)
from tf_sparseconv.site.conversions import from_channel_sparse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FEATURE_SETS = [("occupancy",), ("count",), ("occupancy", "normals"), ("offset", "count", "normals")]


def with_normals(rng, clouds):
    normals = rng.normal(size=clouds.shape)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    normals[:, ::7] = (0.0, 0.0, 1.0)  # axis-aligned faces: zero components are not stored
    return np.concatenate([clouds, normals], -1).astype(np.float32)


def raw_clouds(rng, batch, points):
    """Clouds far from the unit cube, of random scale and offset, with repeated points."""
    clouds = rng.normal(size=(batch, points, 3)) * rng.uniform(0.5, 20, (batch, 1, 3)) + rng.uniform(-50, 50,
                                                                                                    (batch, 1, 3))
    clouds[:, 1::5] = clouds[:, :1]  # several points in one voxel
    return clouds.astype(np.float32)


def boundary_clouds(rng, batch, points, resolution):
    """Clouds already centred and of radius exactly 1 whose coordinates all lie on voxel
    boundaries (multiples of 2 / resolution, -1 and 1 included): the unit-sphere
    normalisation leaves them exactly as they are."""
    step = 2.0 / resolution
    half = points // 2
    # About a third of the lattice points lie in the unit sphere: draw enough for any seed.
    grid = rng.integers(-resolution // 2, resolution // 2 + 1, (batch, 16 * half, 3)) * step
    inside = [g[np.sum(g * g, axis=1) <= 1.0][:half - 1] for g in grid]
    clouds = []
    for b, kept in enumerate(inside):
        axis = b % 3
        far = np.zeros((1, 3))
        far[0, axis] = 1.0
        half_cloud = np.concatenate([far, kept])
        clouds.append(np.concatenate([half_cloud, -half_cloud]))  # symmetric: the centroid sums to exactly 0
    return np.stack(clouds).astype(np.float32)


def layer_sparse(layer, points):
    return kl.from_keras_inputs(layer(points))


def assert_matches_reference(x, keys, values, dense_shape):
    np.testing.assert_array_equal(x.keys.numpy(), keys)
    np.testing.assert_allclose(x.values.numpy(), values, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(x.dense_shape.numpy(), dense_shape)


@pytest.mark.parametrize("features", FEATURE_SETS, ids="+".join)
@pytest.mark.parametrize("normalize", ["unit_sphere", "none"])
def test_point_cloud_layer_equals_numpy_voxelizer(rng, features, normalize):
    resolution = 8
    clouds = np.concatenate([boundary_clouds(rng, 3, 64, resolution),
                             normalize_to_unit_sphere_each(raw_clouds(rng, 3, 64))])
    if "normals" in features:
        clouds = with_normals(rng, clouds)
    layer = kl.PointCloudToSparse(resolution, features, normalize)
    reference = models.normalize_point_clouds(clouds) if normalize == "unit_sphere" else clouds
    expected = voxelize_arrays(reference, resolution, features=features)
    assert len(expected[0]) > 0
    assert_matches_reference(layer_sparse(layer, clouds), *expected)
    # in a graph with a dynamic batch and number of points
    traced = tf.function(lambda p: layer(p), input_signature=[tf.TensorSpec([None, None, clouds.shape[-1]])])
    assert_matches_reference(kl.from_keras_inputs(traced(clouds)), *expected)
    assert_matches_reference(kl.from_keras_inputs(traced(clouds[2:5, 5:])),
                             *voxelize_arrays(reference[2:5, 5:] if normalize == "none" else
                                              models.normalize_point_clouds(clouds[2:5, 5:]), resolution,
                                              features=features))


def normalize_to_unit_sphere_each(clouds):
    return np.stack([normalize_to_unit_sphere(c.astype(np.float64)) for c in clouds]).astype(np.float32)


def test_boundary_clouds_really_lie_on_voxel_boundaries(rng):
    clouds = boundary_clouds(rng, 4, 64, 8)
    np.testing.assert_array_equal(models.normalize_point_clouds(clouds), clouds)  # normalisation leaves them
    cells = (clouds.astype(np.float64) + 1) * 4
    np.testing.assert_array_equal(cells, np.round(cells))
    assert (clouds == 1.0).any() and (clouds == -1.0).any()


@pytest.mark.parametrize("resolution,bounds", [(12, (-1.0, 1.0)), (16, (-1.3, 1.7))])
def test_points_a_rounding_away_from_voxel_boundaries_get_numpys_cells(rng, resolution, bounds):
    """Float32 boundaries lo + k (hi - lo) / r and their neighbours one ulp away: float32
    arithmetic, or another order of the float64 operations, puts some in the next cell."""
    lo, hi = bounds
    edges = (lo + np.arange(resolution + 1) * (hi - lo) / resolution).astype(np.float32)
    near = np.concatenate([edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf))])
    near = near[(near.astype(np.float64) >= lo) & (near.astype(np.float64) <= hi)]
    clouds = rng.choice(near, (4, 200, 3)).astype(np.float32)
    for features in (("occupancy",), ("offset",)):
        layer = kl.PointCloudToSparse(resolution, features, "none", bounds)
        assert_matches_reference(layer_sparse(layer, clouds), *voxelize_arrays(clouds, resolution, bounds, features))
    float32_cells = np.floor((near - np.float32(lo)) / np.float32(hi - lo) * np.float32(resolution))
    assert (float32_cells != np.floor((near.astype(np.float64) - lo) * (resolution / (hi - lo)))).any(), \
        "the points must tell float32 from float64 arithmetic"


def test_normalized_training_data_gets_the_layers_keys(rng):
    """Training normalises with normalize_point_clouds and voxelizes with NumPy; the saved
    model's layer gets raw clouds. Both must give the same keys: any batch, any chunk."""
    resolution = 16
    clouds = np.concatenate([raw_clouds(rng, 6, 300), boundary_clouds(rng, 2, 300, resolution)])
    normalized = models.normalize_point_clouds(clouds)
    assert normalized.dtype == np.float32 and normalized.shape == clouds.shape
    # the same bits whichever clouds share the call
    one_by_one = np.stack([models.normalize_point_clouds(cloud) for cloud in clouds])
    np.testing.assert_array_equal(one_by_one, normalized)
    np.testing.assert_array_equal(models.normalize_point_clouds(clouds[3:5]), normalized[3:5])
    # and what data.modelnet's NumPy normalisation computes, to float32 rounding
    np.testing.assert_allclose(normalized, normalize_to_unit_sphere_each(clouds), atol=2e-7)
    assert np.isclose(np.linalg.norm(normalized, axis=-1).max(axis=1), 1, atol=1e-6).all()
    for features in FEATURE_SETS[:2]:
        layer = kl.PointCloudToSparse(resolution, features)
        expected = voxelize_arrays(normalized, resolution, features=features)
        assert_matches_reference(layer_sparse(layer, clouds), *expected)
        for start, stop in ((0, 1), (1, 4), (4, 8)):  # any batch
            part = voxelize_arrays(normalized[start:stop], resolution, features=features)
            assert_matches_reference(layer_sparse(layer, clouds[start:stop]), *part)
    # float64 input goes through float32, as the model's input does
    np.testing.assert_array_equal(models.normalize_point_clouds(clouds.astype(np.float64)), normalized)


def test_normals_are_kept_and_bad_arrays_refused(rng):
    clouds = with_normals(rng, raw_clouds(rng, 2, 50))
    normalized = models.normalize_point_clouds(clouds)
    np.testing.assert_array_equal(normalized[..., 3:], clouds[..., 3:])
    bad = clouds.copy()
    bad[1, 7, 2] = np.inf
    with pytest.raises(ValueError, match="point cloud 1 contains NaN or infinite"):
        models.normalize_point_clouds(bad)
    with pytest.raises(ValueError, match=r"\[M, N, 3\+\]"):
        models.normalize_point_clouds(np.zeros((2, 5, 2)))
    with pytest.raises(ValueError, match="no points"):
        models.normalize_point_clouds(np.zeros((2, 0, 3)))


def invalid_argument(fn, match):
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        fn()
    assert match in str(info.value), str(info.value)[:2000]


def test_bad_clouds_are_refused_not_clipped(rng):
    layer = kl.PointCloudToSparse(8, normalize="none")
    clouds = np.clip(raw_clouds(rng, 3, 40) / 100, -1, 1)
    clouds[2, 4, 0] = 1.01
    invalid_argument(lambda: layer(clouds), "point cloud 2 of the batch has coordinates from")
    invalid_argument(lambda: layer(clouds), "outside the bounds [-1, 1]")
    nan = raw_clouds(rng, 3, 40)
    nan[1, 0, 1] = np.nan
    invalid_argument(lambda: kl.PointCloudToSparse(8)(nan), "point cloud 1 of the batch contains NaN or infinite")
    invalid_argument(lambda: kl.PointCloudToSparse(8)(np.zeros((2, 0, 3), np.float32)), "has no points")
    invalid_argument(lambda: kl.PointCloudToSparse(8)(np.zeros((0, 5, 3), np.float32)), "empty batch")
    # VoxelizePoints refuses them too (it used to clip them into the border cells)
    invalid_argument(lambda: kl.VoxelizePoints(8)(clouds), "outside the bounds")
    with pytest.raises(ValueError, match="must contain it"):
        kl.PointCloudToSparse(8, bounds=(-0.5, 0.5))
    with pytest.raises(ValueError, match="features must be distinct names"):
        kl.PointCloudToSparse(8, features=("occupancy", "colour"))
    with pytest.raises(ValueError, match="normalize must be one of"):
        kl.PointCloudToSparse(8, normalize="cube")


def test_image_layer_equals_image_arrays(rng):
    images = (rng.random((3, 12, 10)) ** 3 * 256).astype(np.uint8)
    images[0, 0, :4] = (49, 50, 51, 255)
    expected = image_arrays(images, 50)
    assert 0 < len(expected[0]) < images.size
    assert_matches_reference(layer_sparse(kl.ImageToSparse(50), images), *expected)
    assert_matches_reference(layer_sparse(kl.ImageToSparse(50), images.astype(np.float32)), *expected)
    traced = tf.function(lambda x: kl.ImageToSparse(50)(x), input_signature=[tf.TensorSpec([None, 12, 10])])
    assert_matches_reference(kl.from_keras_inputs(traced(images[1:].astype(np.float32))), *image_arrays(images[1:]))
    invalid_argument(lambda: kl.ImageToSparse()(np.full((2, 4, 4), 300.0, np.float32)), "image 0 of the batch has "
                     "values outside 0..255")


def test_sparse_to_site_is_the_training_conversion(rng):
    clouds = with_normals(rng, models.normalize_point_clouds(raw_clouds(rng, 3, 80)))
    x = voxelize_points(clouds, 8, features=("occupancy", "normals")).with_shape([None, 8, 8, 8, 4])
    sites = kl.from_site_keras_inputs(kl.SparseToSite()(kl.as_keras_inputs(x)))
    expected = from_channel_sparse(x)
    np.testing.assert_array_equal(sites.coords.numpy(), expected.coords.numpy())
    np.testing.assert_array_equal(sites.features.numpy(), expected.features.numpy())
    assert sites.features.shape[-1] == 4 and sites.static_spatial_shape.as_list() == [8, 8, 8]


def test_class_names_and_specs_and_mismatched_cores_refused():
    core = models.octnet3(8, 3, rhos=(0.5, 0.5), fc_units=8)
    model = models.point_cloud_classifier(core, 8, class_names=["a", "b", "c"], points_per_cloud=64)
    assert models.class_names(model) == ("a", "b", "c")
    assert models.core_model(model) is core and models.core_model(core) is core
    assert models.input_spec(model) == {"kind": "points", "resolution": 8, "features": ("occupancy",),
                                        "normalize": "unit_sphere", "points_per_cloud": 64, "columns": 3,
                                        "bounds": (-1.0, 1.0), "estimate_normals": None}
    assert models.class_names(models.point_cloud_classifier(core, 8)) is None
    with pytest.raises(ValueError, match="2 class names for a core with 3 outputs"):
        models.point_cloud_classifier(core, 8, class_names=["a", "b"])
    with pytest.raises(ValueError, match="takes a grid"):
        models.point_cloud_classifier(core, 16)
    with pytest.raises(ValueError, match="takes a grid"):
        models.point_cloud_classifier(core, 8, features=("occupancy", "normals"))
    with pytest.raises(ValueError, match="takes sparse inputs"):
        models.input_spec(core)
    with pytest.raises(TypeError, match="must take the channel-sparse dict"):
        models.point_cloud_classifier(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]), 8)
    inputs = keras.Input((None, 3))
    with pytest.raises(TypeError, match="must take the channel-sparse dict"):
        models.point_cloud_classifier(keras.Model(inputs, keras.layers.Dense(3)(inputs)), 8)


def random_images(rng, count):
    """MNIST-like: a few bright strokes on black."""
    images = np.zeros((count, 28, 28), np.uint8)
    for image in images:
        for _ in range(3):
            row, col = rng.integers(4, 24, 2)
            image[row:row + rng.integers(2, 8), col:col + 3] = rng.integers(60, 256)
    return images


# Loads the saved models after nothing but `import tf_sparseconv` and writes what they compute.
LOAD_AND_PREDICT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import keras
    import tensorflow as tf
    import tf_sparseconv

    folder = sys.argv[1]
    data = np.load(folder + "/inputs.npz")
    results = {}
    for kind, x in (("octnet", data["clouds6"]), ("site", data["clouds3"]), ("image", data["images"])):
        model = keras.models.load_model(f"{folder}/{kind}.keras")
        labels = data["labels"]
        np.save(f"{folder}/{kind}_predict.npy", model.predict(x, batch_size=4, verbose=0))
        dataset = tf.data.Dataset.from_tensor_slices((x, labels)).batch(3)
        np.save(f"{folder}/{kind}_predict_dataset.npy", model.predict(dataset, verbose=0))
        results[kind] = {"evaluate": model.evaluate(x, labels, batch_size=4, verbose=0, return_dict=True),
                         "evaluate_dataset": model.evaluate(dataset, verbose=0, return_dict=True)}
        from tf_sparseconv import models
        results[kind]["class_names"] = models.class_names(model)
        results[kind]["input_spec"] = models.input_spec(model)
    print(json.dumps(results))
""")


def test_saved_models_load_in_a_fresh_process_and_predict_as_in_training(rng, tmp_path):
    num_classes, count = 3, 10
    labels = np.arange(count) % num_classes
    clouds6 = with_normals(rng, raw_clouds(rng, count, 300))
    clouds3 = raw_clouds(rng, count, 200)
    images = random_images(rng, count)
    np.savez(tmp_path / "inputs.npz", clouds6=clouds6, clouds3=clouds3, images=images, labels=labels)
    names = ("cone", "cube", "sphere")

    # OctNet3 with k-selection at 16^3 on occupancy + normals
    features = ("occupancy", "normals")
    octnet = models.octnet3(16, num_classes, rhos=(0.3, 0.5), in_channels=4, fc_units=32)
    models.point_cloud_classifier(octnet, 16, features, class_names=names, points_per_cloud=300).save(
        tmp_path / "octnet.keras")
    x = voxelize_points(models.normalize_point_clouds(clouds6), 16, features=features)
    expected = {"octnet": octnet(kl.as_keras_inputs(x.with_shape([None, 16, 16, 16, 4]))).numpy()}

    # the site-sparse ResNet on occupancy, fed as train.site_keras_batches feeds it
    site = models.site_resnet(num_classes, 16, in_channels=1, channels=(8, 16))
    models.point_cloud_classifier(site, 16, class_names=names).save(tmp_path / "site.keras")
    sites = from_channel_sparse(voxelize_points(models.normalize_point_clouds(clouds3), 16))
    sites = sites.with_features(tf.ensure_shape(sites.features, [None, 1]))
    expected["site"] = site(kl.as_site_keras_inputs(sites)).numpy()

    # an MNIST-like image classifier
    digits = models.octnet3(28, num_classes, rhos=(0.05, 0.10), spatial_dims=2, fc_units=32)
    models.image_classifier(digits, class_names=names).save(tmp_path / "image.keras")
    x = images_to_channel_sparse(images).with_shape([None, 28, 28, 1])
    expected["image"] = digits(kl.as_keras_inputs(x)).numpy()

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", LOAD_AND_PREDICT, str(tmp_path)], env=env, capture_output=True,
                            text=True, timeout=600, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-4000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    # The fresh process runs on the CPU; where a GPU is visible here, the expected logits come
    # from its TF32 matmuls and convolutions, which agree with float32 to about 1e-3.
    tolerance = dict(rtol=2e-3, atol=1e-3) if tf.config.list_physical_devices("GPU") else dict(rtol=1e-5, atol=1e-5)
    for kind, logits in expected.items():
        assert logits.std() > 1e-3, f"{kind}: vacuous comparison, the core's logits are constant"
        for suffix in ("predict", "predict_dataset"):
            np.testing.assert_allclose(np.load(tmp_path / f"{kind}_{suffix}.npy"), logits, **tolerance,
                                       err_msg=f"{kind} {suffix}")
        accuracy = np.mean(np.argmax(logits, -1) == labels)
        loss = np.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
        for how in ("evaluate", "evaluate_dataset"):
            assert results[kind][how]["accuracy"] == pytest.approx(accuracy), (kind, how)
            assert results[kind][how]["loss"] == pytest.approx(float(loss), rel=1e-4), (kind, how)
        assert tuple(results[kind]["class_names"]) == names
    assert results["octnet"]["input_spec"]["features"] == list(features)
    spec = results["octnet"]["input_spec"]
    assert spec["columns"] == 6 and spec["points_per_cloud"] == 300 and spec["resolution"] == 16
    assert results["site"]["input_spec"]["columns"] == 3
    assert results["image"]["input_spec"] == {"kind": "images", "threshold": 50, "image_shape": [28, 28]}


def test_octnet3_without_table4_bounds_for_the_resolution_asks_for_rhos():
    with pytest.raises(ValueError, match=r"default density bounds \(Table 4\) for resolutions \[16, 28, 32, 64, "
                                         r"128\], got 8: give rhos"):
        models.octnet3(8, 3)
    assert models.octnet3(8, 3, rhos=(1.0, 1.0)).output_shape == (None, 3)
