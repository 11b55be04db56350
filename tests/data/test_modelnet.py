"""OFF parsing (standard and malformed headers, polygons, comments), area-weighted surface
sampling, the ModelNet mesh layout and .npz loaders, their errors, the official test split's
class counts, and the real .npz (its up axis among them)."""
import warnings
from pathlib import Path

import numpy as np
import pytest

from tf_sparseconv.data.modelnet import (MODELNET10_CLASSES, MODELNET40_TEST_COUNTS, load_modelnet_meshes,
                                         load_modelnet_npz, mesh_point_cloud, modelnet40_test_counts,
                                         normalize_to_unit_sphere, read_off, sample_surface)
from tf_sparseconv.data.pipeline import UP_AXIS

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"

CUBE_VERTICES = [(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]
CUBE_QUADS = [(0, 1, 3, 2), (4, 6, 7, 5), (0, 4, 5, 1), (2, 3, 7, 6), (0, 2, 6, 4), (1, 5, 7, 3)]


def off_text(vertices, faces, header="OFF\n"):
    """header 'OFF\n' is the standard form; 'OFF' glues the counts on as some ModelNet files do."""
    lines = [f"{' '.join(map(str, v))}" for v in vertices] + [f"{len(f)} {' '.join(map(str, f))}" for f in faces]
    counts = f"{len(vertices)} {len(faces)} 0\n"
    return header + counts + "\n".join(lines) + "\n"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_standard_off_with_quads_is_fan_triangulated(tmp_path):
    vertices, triangles = read_off(write(tmp_path / "cube.off", off_text(CUBE_VERTICES, CUBE_QUADS)))
    np.testing.assert_array_equal(vertices, CUBE_VERTICES)
    assert triangles.shape == (12, 3)
    np.testing.assert_array_equal(triangles[:2], [[0, 1, 3], [0, 3, 2]])


def test_malformed_header_comments_and_extra_columns(tmp_path):
    text = ("OFF8 7 0\n"  # the ModelNet variant: counts glued onto the header
            "# a comment line\n\n"
            + "\n".join(f"{x} {y} {z}  # vertex" for x, y, z in CUBE_VERTICES) + "\n"
            + "\n".join(f"{len(q)} {' '.join(map(str, q))} 255 0 0" for q in CUBE_QUADS) + "\n"
            + "5 0 1 3 7 5\n")  # a pentagon: three triangles
    vertices, triangles = read_off(write(tmp_path / "glued.off", text))
    assert vertices.shape == (8, 3)
    assert triangles.shape == (12 + 3, 3)
    np.testing.assert_array_equal(triangles[-3:], [[0, 1, 3], [0, 3, 7], [0, 7, 5]])
    # Counts on the header line after a space, too.
    vertices, triangles = read_off(write(tmp_path / "spaced.off",
                                         off_text(CUBE_VERTICES, CUBE_QUADS, header="OFF ")))
    assert triangles.shape == (12, 3)


@pytest.mark.parametrize("text, message", [
    ("COFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 2\n", "bad OFF header"),
    ("", "empty OFF file"),
    ("OFF\nthree 1 0\n", "bad OFF counts"),
    ("OFF\n3 1 0\n0 0 0\n1 0 0\n3 0 1 2\n", "truncated"),
    ("OFF\n3 1 0\n0 0 0\n1 0 0\n0 1\n3 0 1 2\n", "bad vertex on line 5"),
    ("OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 9\n", "indexes vertex 9"),
    ("OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n2 0 1\n", "bad face on line 6"),
    ("OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 99999999999999999999\n",
     "the face on line 6 indexes vertex 99999999999999999999, outside 0..2"),
    ("OFF\n4 1 0\n0 0 0\n1 0 0\n0 1 0\n1 1 0\n4 0 1 3 -99999999999999999999\n",
     "the face on line 7 indexes vertex -99999999999999999999, outside 0..3"),
])
def test_corrupt_off_files_name_file_and_problem(tmp_path, text, message):
    path = write(tmp_path / "bad.off", text)
    with pytest.raises(ValueError, match=message) as info:
        read_off(path)
    assert str(path) in str(info.value)


def test_samples_lie_on_the_cube_surface_with_face_normals(rng):
    vertices = np.array(CUBE_VERTICES, np.float64)
    triangles = np.array([t for a, b, c, d in CUBE_QUADS for t in ((a, b, c), (a, c, d))])
    points, normals = sample_surface(vertices, triangles, 4000, rng)
    np.testing.assert_allclose(np.abs(points).max(axis=1), 1.0, atol=1e-12)
    assert np.all(np.abs(points) <= 1 + 1e-12)
    # The normal is the axis of the face the point lies on (up to the winding's sign).
    face_axis = np.argmax(np.abs(points), axis=1)
    np.testing.assert_allclose(np.abs(normals[np.arange(len(points)), face_axis]), 1.0)
    # Uniform by area: each of the six faces gets about a sixth.
    counts = np.bincount(face_axis * 2 + (points[np.arange(len(points)), face_axis] > 0), minlength=6)
    assert np.all(np.abs(counts / len(points) - 1 / 6) < 0.03)


def test_sampling_is_area_weighted_and_seeded():
    # Two triangles with areas 1 : 3.
    vertices = np.array([[0, 0, 0], [1, 0, 0], [0, 2, 0], [5, 0, 0], [8, 0, 0], [5, 2, 0]], np.float64)
    triangles = np.array([[0, 1, 2], [3, 4, 5]])
    points, _ = sample_surface(vertices, triangles, 20000, np.random.default_rng(0))
    assert abs(np.mean(points[:, 0] >= 5) - 0.75) < 0.015
    again, _ = sample_surface(vertices, triangles, 20000, np.random.default_rng(0))
    np.testing.assert_array_equal(points, again)
    with pytest.raises(ValueError, match="no surface"):
        sample_surface(vertices, np.array([[0, 0, 0]]), 10, np.random.default_rng(0))


@pytest.mark.parametrize("name, vertices", [("inf", "0 0 0\ninf 0 0\n0 1 0"), ("nan", "0 0 0\nnan 0 0\n0 1 0"),
                                             ("overflow", "0 0 0\n1e300 0 0\n0 1e300 0")])
def test_meshes_without_a_finite_surface_are_refused_without_numpy_warnings(tmp_path, name, vertices):
    path = write(tmp_path / f"{name}.off", f"OFF\n3 1 0\n{vertices}\n3 0 1 2\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the error alone reaches the user, no RuntimeWarning of the arithmetic
        with pytest.raises(ValueError, match=f"{name}.off: mesh has no surface to sample"):
            mesh_point_cloud(path, 16, np.random.default_rng(0))


def test_normalize_to_unit_sphere(rng):
    points = normalize_to_unit_sphere(rng.normal(size=(100, 3)) * 7 + 3)
    np.testing.assert_allclose(points.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(points, axis=1).max(), 1.0)


def make_layout(root, classes, per_split=2):
    for c, name in enumerate(classes):
        for split in ("train", "test"):
            for i in range(per_split):
                scale = 1 + c + i  # different sizes: normalization must remove them
                write(root / name / split / f"{name}_{i:04d}.off",
                      off_text([(x * scale, y, z) for x, y, z in CUBE_VERTICES], CUBE_QUADS,
                               header="OFF" if i else "OFF\n"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_points=0), "num_points must be a whole number >= 1, got 0"),  # was a NumPy reduction error
    (dict(num_points=-3), "num_points must be a whole number >= 1, got -3"),
    (dict(num_points=2.5), "num_points must be a whole number >= 1, got 2.5"),
    (dict(num_points=True), "num_points must be a whole number >= 1, got True"),
    (dict(seed=-1), "seed must be a whole number >= 0, got -1"),
    (dict(normals="no"), "normals must be True or False, got 'no'"),  # was taken as True
    (dict(split="val"), "split must be 'train' or 'test', got 'val'"),
])
def test_mesh_loader_refuses_counts_seeds_and_flags_it_cannot_take(tmp_path, kwargs, message):
    make_layout(tmp_path, ["chair"])
    with pytest.raises(ValueError, match=f"load_modelnet_meshes: {message}"):
        load_modelnet_meshes(tmp_path, **kwargs)


def test_mesh_layout_loader(tmp_path):
    make_layout(tmp_path, ["chair", "airplane", "sofa"])
    points, labels, classes = load_modelnet_meshes(tmp_path, "test", num_points=256, seed=3)
    assert classes == ("airplane", "chair", "sofa")
    assert points.shape == (6, 256, 3) and points.dtype == np.float32
    np.testing.assert_array_equal(labels, [0, 0, 1, 1, 2, 2])
    np.testing.assert_allclose(np.linalg.norm(points, axis=2).max(axis=1), 1.0, rtol=1e-6)
    again, _, _ = load_modelnet_meshes(tmp_path, "test", num_points=256, seed=3)
    np.testing.assert_array_equal(points, again)
    # A class subset: relabelled in the given order, same shapes as when loading all classes.
    sub, sub_labels, sub_classes = load_modelnet_meshes(tmp_path, "test", classes=("sofa", "chair"),
                                                        num_points=256, seed=3, normals=True)
    assert sub_classes == ("sofa", "chair") and sub.shape == (4, 256, 6)
    np.testing.assert_array_equal(sub_labels, [0, 0, 1, 1])
    np.testing.assert_array_equal(sub[2:, :, :3], points[2:4])
    np.testing.assert_allclose(np.linalg.norm(sub[..., 3:], axis=2), 1.0, rtol=1e-6)


def test_mesh_layout_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"<root>/<class>/\{train,test\}/\*\.off"):
        load_modelnet_meshes(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no class directories"):
        load_modelnet_meshes(tmp_path)
    make_layout(tmp_path, ["chair"])
    with pytest.raises(FileNotFoundError, match="missing .*bathtub"):
        load_modelnet_meshes(tmp_path, classes=MODELNET10_CLASSES)
    write(tmp_path / "chair" / "train" / "chair_9999.off", "OFF\n8 12\n")
    with pytest.raises(ValueError, match="chair_9999.off: truncated"):
        load_modelnet_meshes(tmp_path, num_points=16)


def test_npz_loader_dequantizes_and_selects_modelnet10(tmp_path, rng):
    names = np.array(sorted(set(MODELNET10_CLASSES) | {"airplane", "xbox"}))
    raw = rng.integers(0, 256, (30, 16, 3), dtype=np.uint8)
    raw_labels = rng.integers(0, len(names), 30).astype(np.uint8)
    np.savez(tmp_path / "m.npz", points=raw, labels=raw_labels, classes=names)
    points, labels, classes = load_modelnet_npz(tmp_path / "m.npz")
    np.testing.assert_allclose(points, raw / 255 * 2 - 1, atol=1e-6)
    assert points.dtype == np.float32 and classes == tuple(names)
    np.testing.assert_array_equal(labels, raw_labels)
    points10, labels10, classes10 = load_modelnet_npz(tmp_path / "m.npz", classes=MODELNET10_CLASSES)
    keep = np.isin(names[raw_labels], MODELNET10_CLASSES)
    assert classes10 == MODELNET10_CLASSES and len(points10) == keep.sum()
    np.testing.assert_array_equal(np.array(MODELNET10_CLASSES)[labels10], names[raw_labels][keep])


def test_npz_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_modelnet_npz(tmp_path / "absent.npz")
    np.savez(tmp_path / "partial.npz", points=np.zeros((1, 2, 3), np.uint8))
    with pytest.raises(ValueError, match=r"partial.npz: missing arrays \['classes', 'labels'\]"):
        load_modelnet_npz(tmp_path / "partial.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="junk.npz: not a readable"):
        load_modelnet_npz(tmp_path / "junk.npz")
    np.savez(tmp_path / "float.npz", points=np.zeros((1, 2, 3)), labels=[0], classes=["a"])
    with pytest.raises(ValueError, match="float.npz: expected points uint8"):
        load_modelnet_npz(tmp_path / "float.npz")
    np.savez(tmp_path / "twice.npz", points=np.zeros((3, 2, 3), np.uint8), labels=[0, 1, 2], classes=["a", "b", "a"])
    with pytest.raises(ValueError, match="twice.npz: classes names 'a' more than once; each label value needs its own"):
        load_modelnet_npz(tmp_path / "twice.npz")
    flat = np.random.default_rng(0).integers(0, 256, (3, 4, 3), dtype=np.uint8)
    flat[2] = flat[2, :1]
    np.savez(tmp_path / "flat.npz", points=flat, labels=[0, 1, 0], classes=["a", "b"])
    with pytest.raises(ValueError, match=r"flat.npz\[2\]: 4 points all at one position, a cloud without a shape"):
        load_modelnet_npz(tmp_path / "flat.npz")
    for n, message in ((0, "clouds of 0 points, without a shape"), (1, "clouds of 1 point, without a shape")):
        np.savez(tmp_path / "few.npz", points=np.zeros((2, n, 3), np.uint8), labels=[0, 1], classes=["a", "b"])
        with pytest.raises(ValueError, match=f"few.npz: {message}"):
            load_modelnet_npz(tmp_path / "few.npz")


@pytest.mark.skipif(not (DATA / "modelnet40_train.npz").exists(), reason="../shared/data not available")
def test_real_modelnet40_and_modelnet10():
    points, labels, classes = load_modelnet_npz(DATA / "modelnet40_train.npz")
    assert points.shape == (9843, 1024, 3) and len(classes) == 40
    assert labels.min() == 0 and labels.max() == 39 and classes[0] == "airplane" and classes[-1] == "xbox"
    assert np.abs(points).max() <= 1.0
    points10, labels10, classes10 = load_modelnet_npz(DATA / "modelnet40_train.npz", classes=MODELNET10_CLASSES)
    assert points10.shape == (3991, 1024, 3)  # the official ModelNet10 training split size
    assert set(np.unique(labels10)) == set(range(10))
    chair = classes.index("chair")
    np.testing.assert_array_equal(points10[labels10 == MODELNET10_CLASSES.index("chair")], points[labels == chair])


def test_modelnet40_test_counts_sum_to_the_official_test_split():
    counts = MODELNET40_TEST_COUNTS
    assert len(counts) == 40 and sum(counts.values()) == 2468
    assert sum(counts[c] for c in MODELNET10_CLASSES) == 908  # ModelNet10's test split
    np.testing.assert_array_equal(modelnet40_test_counts(["chair", "bathtub", "desk", "xbox"]), [100, 50, 86, 20])
    np.testing.assert_array_equal(modelnet40_test_counts(["chair", "bathtub", "desk", "xbox"], full=50),
                                  [50, 25, 43, 10])
    with pytest.raises(ValueError, match="no classes"):
        modelnet40_test_counts(["chair", "sphere"])


@pytest.mark.skipif(not (DATA / "modelnet40_train.npz").exists(), reason="../shared/data not available")
def test_real_modelnet40_classes_are_the_test_counts_and_z_is_up():
    points, labels, classes = load_modelnet_npz(DATA / "modelnet40_train.npz")
    assert sorted(classes) == sorted(MODELNET40_TEST_COUNTS)
    # people, bottles and doors are tallest along z; aeroplanes are flattest along it
    extent = {c: (points[labels == classes.index(c)].max(1) - points[labels == classes.index(c)].min(1)).mean(0)
              for c in ("person", "bottle", "door", "airplane")}
    for c in ("person", "bottle", "door"):
        assert np.argmax(extent[c]) == UP_AXIS, (c, extent[c])
    assert np.argmin(extent["airplane"]) == UP_AXIS


@pytest.mark.parametrize("full", [float("nan"), 0.5, True])
def test_modelnet40_test_counts_full_is_a_whole_number(full):
    # NaN failed in int(), True was 1
    with pytest.raises(ValueError, match="modelnet40_test_counts: full must be a whole number >= 1"):
        modelnet40_test_counts(["bed"], full)
