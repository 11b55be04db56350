"""Normals estimated from the points (models.point_normals) and the serving layer that
estimates them itself (PointCloudToSparse(estimate_normals=k)): values on surfaces whose
normals are known, equivariance, chunking, the layer against the training pipeline, and
what is refused."""
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv import keras_layers as kl
from tf_sparseconv import models
from tf_sparseconv.data import voxelize_arrays
from tf_sparseconv.models import point_normals
from tf_sparseconv.models.point_normals import check_neighbours, estimate_normals, with_estimated_normals


def sphere(rng, batch, points, radius=1.0):
    v = rng.normal(size=(batch, points, 3))
    return radius * v / np.linalg.norm(v, axis=-1, keepdims=True)


def ellipsoid(rng, batch, points):
    return sphere(rng, batch, points) * np.array([1.0, 0.6, 0.3])


def test_sphere_normals_point_outwards_along_the_radius(rng):
    clouds = sphere(rng, 2, 600)
    normals = estimate_normals(clouds).numpy()
    assert normals.shape == (2, 600, 3) and normals.dtype == np.float64
    np.testing.assert_allclose(np.linalg.norm(normals, axis=-1), 1.0, atol=1e-12)
    assert np.min(np.sum(normals * clouds, axis=-1)) > 0.98


def test_two_parallel_planes_get_opposite_normals_away_from_the_centroid(rng):
    xy = rng.uniform(-1, 1, (1, 400, 2))
    z = np.where(np.arange(400) < 200, 0.5, -0.5)[None, :, None]
    normals = estimate_normals(np.concatenate([xy, z], -1), neighbours=8).numpy()[0]
    np.testing.assert_allclose(normals[:200], np.tile([0.0, 0.0, 1.0], (200, 1)), atol=1e-9)
    np.testing.assert_allclose(normals[200:], np.tile([0.0, 0.0, -1.0], (200, 1)), atol=1e-9)


def test_rotating_and_permuting_the_cloud_rotates_and_permutes_the_normals(rng):
    clouds = ellipsoid(rng, 1, 500) + rng.normal(0, 0.05, (1, 1, 3))
    q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    order = rng.permutation(500)
    normals = estimate_normals(clouds).numpy()[0]
    turned = estimate_normals((clouds[0] @ q.T)[None]).numpy()[0]
    np.testing.assert_allclose(turned, normals @ q.T, atol=1e-6)
    shuffled = estimate_normals(clouds[:, order]).numpy()[0]
    np.testing.assert_allclose(shuffled, normals[order], atol=1e-9)


def test_clouds_in_chunks_give_the_normals_of_one_chunk(rng, monkeypatch):
    clouds = ellipsoid(rng, 3, 300)
    whole = estimate_normals(clouds).numpy()
    assert point_normals.chunk_rows(300) == 300
    monkeypatch.setattr(point_normals, "CHUNK_ELEMENTS", 7 * 300)  # 7 queries a chunk, the last one shorter
    assert point_normals.chunk_rows(300) == 7
    np.testing.assert_array_equal(estimate_normals(clouds).numpy(), whole)
    np.testing.assert_array_equal(tf.function(estimate_normals)(tf.constant(clouds)).numpy(), whole)


def test_clouds_of_fewer_points_than_neighbours_and_of_one_repeated_point_give_unit_normals():
    tiny = np.array([[[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0], [0.5, 0.5, 0]]], np.float32)
    normals = estimate_normals(tiny, neighbours=16).numpy()
    np.testing.assert_allclose(np.abs(normals[..., 2]), 1.0, atol=1e-9)
    same = estimate_normals(np.ones((2, 20, 3), np.float32)).numpy()
    assert np.all(np.isfinite(same))
    np.testing.assert_allclose(np.linalg.norm(same, axis=-1), 1.0, atol=1e-12)


@pytest.mark.parametrize("bad", [2, 257, 0, -4, 3.5, True, "16"])
def test_neighbours_outside_3_to_256_are_refused(bad):
    with pytest.raises(ValueError, match="from 3 to 256"):
        check_neighbours(bad)
    with pytest.raises(ValueError, match="from 3 to 256"):
        kl.PointCloudToSparse(8, ("occupancy", "normals"), estimate_normals=bad)
    with pytest.raises(ValueError, match="from 3 to 256"):
        estimate_normals(np.zeros((1, 8, 3)), bad)


def test_with_estimated_normals_adds_the_columns_in_float32_and_reports_progress(rng):
    clouds = ellipsoid(rng, 5, 100).astype(np.float32)
    seen = []
    out = with_estimated_normals(clouds, 8, clouds_per_call=2, progress=lambda done, total: seen.append((done, total)))
    assert out.shape == (5, 100, 6) and out.dtype == np.float32
    np.testing.assert_array_equal(out[..., :3], clouds)
    np.testing.assert_allclose(out[..., 3:], estimate_normals(clouds, 8).numpy(), atol=1e-7)
    assert seen == [(2, 5), (4, 5), (5, 5)]
    with pytest.raises(ValueError, match=r"expected point clouds \[M, N, 3\]"):
        with_estimated_normals(np.zeros((2, 10, 6)))
    with pytest.raises(ValueError, match="cannot estimate normals of 0 clouds"):
        with_estimated_normals(np.zeros((0, 10, 3)))


@pytest.mark.parametrize("features", [("occupancy", "normals"), ("occupancy", "normals", "offset")], ids="+".join)
def test_the_layer_estimating_normals_equals_the_training_pipeline(rng, features):
    # Training: the clouds normalised, their normals estimated once, then voxelized in NumPy.
    # Serving: the layer takes x, y, z and does all of it in the graph.
    clouds = (ellipsoid(rng, 4, 256) * rng.uniform(2, 9) + rng.uniform(-30, 30, (4, 1, 3))).astype(np.float32)
    layer = kl.PointCloudToSparse(16, features, estimate_normals=12)
    assert layer.columns == 3
    expected = voxelize_arrays(with_estimated_normals(models.normalize_point_clouds(clouds), 12), 16,
                               features=features)
    for fn in (layer, tf.function(lambda p: layer(p), input_signature=[tf.TensorSpec([None, None, 3])])):
        x = kl.from_keras_inputs(fn(clouds))
        np.testing.assert_array_equal(x.keys.numpy(), expected[0])
        np.testing.assert_allclose(x.values.numpy(), expected[1], rtol=1e-5, atol=1e-6)


def test_estimating_layer_round_trips_its_config_and_refuses_what_it_cannot_do(rng):
    layer = kl.PointCloudToSparse(8, ("occupancy", "normals"), estimate_normals=10)
    again = kl.PointCloudToSparse.from_config(layer.get_config())
    assert again.estimate_normals == 10 and again.columns == 3
    with pytest.raises(ValueError, match="estimates the normals feature, which features"):
        kl.PointCloudToSparse(8, ("occupancy", "offset"), estimate_normals=10)
    with pytest.raises(ValueError, match=r"expected points \[B, N, 3\]"):
        layer(np.zeros((1, 10, 6), np.float32))
    # NaN is refused before any normal is estimated
    bad = ellipsoid(rng, 1, 50).astype(np.float32)
    bad[0, 3, 1] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or infinite"):
        layer(bad)
    unnormalized = kl.PointCloudToSparse(8, ("occupancy", "normals"), normalize="none", estimate_normals=10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or infinite"):
        unnormalized(bad)


def test_a_saved_classifier_estimates_the_normals_it_was_trained_with(rng, tmp_path):
    core = models.octnet3(16, 3, in_channels=4)
    model = models.point_cloud_classifier(core, 16, features=("occupancy", "normals"), class_names=("a", "b", "c"),
                                          points_per_cloud=128, estimate_normals=8)
    assert models.input_spec(model)["columns"] == 3 and models.input_spec(model)["estimate_normals"] == 8
    clouds = ellipsoid(rng, 2, 128).astype(np.float32)
    path = tmp_path / "model.keras"
    models.save_model(model, path)
    loaded = models.load_model(path)
    expected = model.predict(clouds, verbose=0)
    np.testing.assert_allclose(loaded.predict(clouds, verbose=0), expected, rtol=1e-5, atol=1e-6)
    # exported as a SavedModel, the estimation runs in the served graph
    model.export(str(tmp_path / "exported"), verbose=False)
    restored = tf.saved_model.load(str(tmp_path / "exported"))  # kept: serve needs its variables alive
    np.testing.assert_allclose(restored.serve(tf.constant(clouds)).numpy(), expected, rtol=1e-5, atol=1e-6)
