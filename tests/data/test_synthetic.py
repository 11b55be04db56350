"""The embedded procedural shape set: deterministic, balanced, correct normals, sparse, and
learnable but not solved by global shape statistics."""
import numpy as np
import pytest

import tf_sparseconv as ts
from tf_sparseconv.data.synthetic import SHAPE_CLASSES, make_shape, make_shapes
from tf_sparseconv.data.voxelize import voxelize_points


def test_deterministic_and_balanced():
    points, labels, classes = make_shapes(5, 128, seed=7)
    again, again_labels, _ = make_shapes(5, 128, seed=7)
    np.testing.assert_array_equal(points, again)
    np.testing.assert_array_equal(labels, again_labels)
    assert classes == SHAPE_CLASSES and len(classes) >= 6
    assert points.shape == (40, 128, 3) and points.dtype == np.float32
    np.testing.assert_array_equal(np.bincount(labels), [5] * len(classes))
    assert not np.array_equal(labels, np.sort(labels))  # shuffled
    other, _, _ = make_shapes(5, 128, seed=8)
    assert not np.allclose(points, other)


def test_shape_depends_only_on_seed_class_and_index():
    few, few_labels, _ = make_shapes(2, 64, seed=1, classes=("torus", "cone"))
    many, many_labels, _ = make_shapes(3, 64, seed=1)
    for label, name in enumerate(("torus", "cone")):
        in_many = many[many_labels == SHAPE_CLASSES.index(name)]
        assert all(any(np.array_equal(f, m) for m in in_many) for f in few[few_labels == label])


def test_within_unit_sphere_with_unit_normals():
    points, _, _ = make_shapes(4, 256, seed=0, normals=True)
    assert points.shape[-1] == 6
    radius = np.linalg.norm(points[..., :3], axis=2).max(axis=1)
    assert np.all(radius < 1.06) and np.all(radius > 0.55)
    np.testing.assert_allclose(np.linalg.norm(points[..., 3:], axis=2), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", SHAPE_CLASSES)
def test_normals_are_perpendicular_to_the_surface(name):
    # Noise-free: neighbouring points' offsets are (nearly) perpendicular to the normal.
    cloud = make_shape(name, 1500, np.random.default_rng(0), noise=0.0, normals=True, occlusion=0.0)
    p, n = cloud[:, :3].astype(np.float64), cloud[:, 3:].astype(np.float64)
    d = np.linalg.norm(p[:, None] - p[None], axis=2)
    np.fill_diagonal(d, np.inf)
    nearest = np.argsort(d, axis=1)[:, :3]
    offsets = p[nearest] - p[:, None]
    cosines = np.abs(np.einsum("nkc,nc->nk", offsets, n)) / np.linalg.norm(offsets, axis=2)
    assert np.median(cosines) < 0.1


def rotation_invariant_descriptor(points):
    """Normalised covariance eigenvalues and a histogram of distances to the centroid."""
    centred = points - points.mean(axis=1, keepdims=True)
    eigenvalues = np.sort(np.linalg.eigvalsh(np.einsum("mni,mnj->mij", centred, centred)), axis=1)
    radius = np.linalg.norm(centred, axis=2)
    radius /= radius.max(axis=1, keepdims=True)
    histogram = np.stack([np.histogram(r, bins=8, range=(0, 1))[0] for r in radius]) / points.shape[1]
    return np.concatenate([eigenvalues / eigenvalues.sum(axis=1, keepdims=True), histogram], axis=1)


def test_learnable_but_not_solved_by_global_statistics():
    train, train_labels, classes = make_shapes(30, 512, seed=0)
    test, test_labels, _ = make_shapes(30, 512, seed=1)
    f_train, f_test = rotation_invariant_descriptor(train), rotation_invariant_descriptor(test)
    mean, std = f_train.mean(axis=0), f_train.std(axis=0)
    f_train, f_test = (f_train - mean) / std, (f_test - mean) / std
    centroids = np.stack([f_train[train_labels == c].mean(axis=0) for c in range(len(classes))])
    predicted = np.argmin(((f_test[:, None] - centroids[None]) ** 2).sum(axis=2), axis=1)
    accuracy = np.mean(predicted == test_labels)
    # Chance is 1/8; a nearest-centroid on global shape statistics gets about 0.66 here.
    assert 0.35 < accuracy < 0.9, accuracy


def test_surfaces_are_sparse_at_16_cubed():
    points, _, _ = make_shapes(3, 1024, seed=0)
    x = voxelize_points(points, 16)
    assert 0.01 < float(x.density()) < 0.2
    ts.validate(x)


def test_unknown_class():
    with pytest.raises(ValueError, match="unknown shape classes"):
        make_shapes(1, 8, classes=("sphere", "teapot"))


@pytest.mark.parametrize("options,error,message", [
    # ZeroDivisionError, IndexError, NumPy errors, or shapes taken: occlusion 1 divided by 0,
    # num_points 0 failed in a reduction, anisotropy 2 drew negative stretches (mirrored,
    # collapsed shapes), NaN noise gave NaN clouds, num_per_class True one shape per class,
    # duplicate classes two labels of one shape, no class an empty data set
    (dict(occlusion=1.0), ValueError, r"occlusion must be in \[0, 1\)"),
    (dict(anisotropy=2.0), ValueError, r"anisotropy must be in \[0, 1\)"),
    (dict(noise=float("nan")), ValueError, "noise must be >= 0"),
    (dict(num_points=0), ValueError, "num_points must be >= 1"),
    (dict(num_points=2.5), TypeError, "num_points must be an int"),
    (dict(num_per_class=True), TypeError, "num_per_class must be an int"),
    (dict(seed=-1), ValueError, "seed must be >= 0"),
    (dict(normals="no"), ValueError, "normals must be True or False"),
    (dict(classes=("sphere", "sphere")), ValueError, "classes must be distinct names, at least one"),
    (dict(classes=()), ValueError, "classes must be distinct names, at least one"),
])
def test_make_shapes_refuses_options_it_cannot_honour(options, error, message):
    arguments = dict(num_per_class=1, num_points=16)
    arguments.update(options)
    with pytest.raises(error, match="make_shapes: " + message):
        make_shapes(**arguments)
