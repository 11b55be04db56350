"""Reading the files users have (OFF, ascii and binary PLY, .npy, .npz, PNG) into clouds and
images, their errors (never advice to unpickle), and the labelled test splits evaluate scores."""
import pickle
import warnings

import numpy as np
import pytest
from PIL import Image

from tf_sparseconv.data import point_files, test_split
from tf_sparseconv.data.modelnet import load_modelnet_meshes, load_modelnet_npz
from tf_sparseconv.data.scannet import load_scannet_objects

from tests.data.test_mnist import write_idx_folder
from tests.data.test_modelnet import CUBE_QUADS, CUBE_VERTICES, make_layout, off_text, write
from tests.data.test_scannet import grid_mesh, write_ply, write_scene

TETRAHEDRON = ([(0, 0, 0), (2, 0, 0), (0, 2, 0), (0, 0, 2)], [(0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3)])


def test_off_meshes_are_sampled_with_normals_into_the_unit_sphere(tmp_path):
    cube = write(tmp_path / "cube.off", off_text([(5 * x + 9, 5 * y, 5 * z) for x, y, z in CUBE_VERTICES], CUBE_QUADS))
    points = point_files.read_point_file(cube, num_points=500, seed=1)
    assert points.shape == (500, 6) and points.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(points[:, :3], axis=1).max(), 1.0, rtol=1e-5)
    # Centred on the samples' centroid: every point near a face of the cube of half side 1 / sqrt(3),
    # whatever the file's offset and scale; normals axis-aligned.
    np.testing.assert_allclose(points[:, :3].mean(axis=0), 0, atol=1e-6)
    assert np.all(np.abs(np.abs(points[:, :3]).max(axis=1) - 1 / np.sqrt(3)) < 0.05)
    np.testing.assert_allclose(np.abs(points[:, 3:]).sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(points, point_files.read_point_file(cube, num_points=500, seed=1))
    assert not np.array_equal(points, point_files.read_point_file(cube, num_points=500, seed=2))
    tetra = write(tmp_path / "tetra.off", off_text(*TETRAHEDRON))
    assert point_files.read_point_file(tetra).shape == (point_files.DEFAULT_MESH_POINTS, 6)


@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian"])
def test_ply_vertices_with_and_without_normals(tmp_path, fmt):
    vertices, faces = grid_mesh(offset=[3, 4, 5], n=4)
    with_normals = point_files.read_point_file(write_ply(tmp_path / "n.ply", vertices, faces, fmt))
    np.testing.assert_allclose(with_normals, vertices[:, :6], rtol=1e-6)
    xyz = point_files.read_point_file(write_ply(tmp_path / "p.ply", vertices, faces, fmt, with_normals=False))
    assert xyz.shape == (16, 3)
    np.testing.assert_allclose(xyz, vertices[:, :3], rtol=1e-6)
    # Resampled: distinct rows of the file when it has enough, repeated ones when it has too few.
    fewer = point_files.read_point_file(tmp_path / "p.ply", num_points=10, seed=4)
    rows = [tuple(r) for r in xyz]
    assert fewer.shape == (10, 3) and len({tuple(r) for r in fewer}) == 10 and all(tuple(r) in rows for r in fewer)
    more = point_files.read_point_file(tmp_path / "p.ply", num_points=40, seed=4)
    assert more.shape == (40, 3) and {tuple(r) for r in more} <= set(rows)


def test_npy_and_npz_clouds(tmp_path, rng):
    one = rng.normal(size=(50, 4)) * 30
    np.save(tmp_path / "one.npy", one)
    np.testing.assert_allclose(point_files.read_point_file(tmp_path / "one.npy"), one[:, :3].astype(np.float32))
    several = rng.normal(size=(3, 20, 6)).astype(np.float32)
    np.save(tmp_path / "several.npy", several)
    np.testing.assert_array_equal(point_files.read_point_file(tmp_path / "several.npy"), several)
    resampled = point_files.read_point_file(tmp_path / "several.npy", num_points=8, seed=0)
    assert resampled.shape == (3, 8, 6)
    for cloud, source in zip(resampled, several):
        assert all(any(np.array_equal(p, q) for q in source) for p in cloud)
    quantised = rng.integers(0, 256, (2, 16, 3), dtype=np.uint8)
    np.savez(tmp_path / "q.npz", points=quantised, labels=np.array([0, 1]), classes=np.array(["a", "b"]))
    expected, _, _ = load_modelnet_npz(tmp_path / "q.npz")
    np.testing.assert_array_equal(point_files.read_point_file(tmp_path / "q.npz"), expected)


def _pickled(path):
    with open(path, "wb") as f:
        pickle.dump({"points": [1, 2, 3]}, f)
    return path


@pytest.mark.parametrize("name, make, message", [
    ("objects.npy", lambda p: np.save(p, np.array([{"a": 1}], dtype=object)), r"holds Python objects"),
    ("pickle.npy", _pickled, r"not a NumPy \.npy file"),
    ("pickle.npz", _pickled, r"not a NumPy \.npz archive"),
    ("objects.npz", lambda p: np.savez(p, points=np.array([None, 1], dtype=object)), r"holds Python objects"),
    ("text.npz", lambda p: p.write_text("points"), r"not a NumPy \.npz archive"),
    ("other.npz", lambda p: np.savez(p, xyz=np.zeros((4, 3))), r"no array named 'points'; it holds \['xyz'\]"),
    ("flat.npy", lambda p: np.save(p, np.zeros((5, 2))), r"expected points \[N, 3\+\].*got shape \[5, 2\]"),
    ("nan.npy", lambda p: np.save(p, np.array([[0, 0, 0], [np.nan, 0, 0]])), r"point 1 contains NaN"),
    ("words.npy", lambda p: np.save(p, np.array([["a", "b", "c"]])), r"points must be numbers"),
    ("cloud.xyz", lambda p: p.write_text("0 0 0"), r"unsupported file type '\.xyz'; expected one of \.off, \.ply"),
    ("bad.off", lambda p: p.write_text("OFF\n3 1 0\n0 0 0\n"), r"bad.off: truncated"),
    ("bad.ply", lambda p: p.write_text("plx"), r"not a PLY file"),
    ("none.npy", lambda p: np.save(p, np.zeros((0, 16, 3))), r"expected points \[N, 3\+\].*got shape \[0, 16, 3\]"),
    ("spans.npy", lambda p: np.save(p, np.ones((4, 3), "timedelta64[s]")), r"points must be numbers, got dtype timed"),
    ("beyond.npy", lambda p: np.save(p, np.array([[0, 0, 0], [1e39, 0, 0]])), r"point 1 .*beyond float32's range"),
    ("one.npy", lambda p: np.save(p, np.array([[0.1, 0.2, 0.3]])), r"one.npy: a single point, a cloud without a sha"),
    ("same.npz", lambda p: np.savez(p, points=np.full((2, 8, 3), 7, np.uint8)),
     r"same.npz\[0\]: 8 points all at one position, a cloud without a shape to classify"),
    ("far.npy", lambda p: np.save(p, np.random.default_rng(0).random((64, 3)) + 1e8),
     r"coordinates up to 1e\+08 for a cloud 0.994 across: float32.*moves its points by up to 0.997, more than 1/32"),
    ("tiny.npy", lambda p: np.save(p, np.random.default_rng(0).random((64, 3)) * 1e-40),
     r"coordinates up to 9.97e-41 for a cloud 9.94e-41 across: float32.*moves its points by up to 9.97e-41"),
])
def test_unreadable_point_files_name_the_file_and_never_suggest_pickles(tmp_path, name, make, message):
    path = tmp_path / name
    make(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the error alone: no numpy warning of overflow on the way
        with pytest.raises(ValueError, match=message) as error:
            point_files.read_point_file(path)
    assert str(path) in str(error.value) and "allow_pickle" not in str(error.value)


def test_clouds_far_from_the_origin_are_read_while_float32_holds_their_shape(tmp_path):
    cloud = np.random.default_rng(0).random((64, 3)) * 2
    for offset in (0.0, 1e5, 1e6):  # float32 moves the points by up to 0.016 at 1e6, under 1/32 of 2
        np.save(tmp_path / "c.npy", cloud + offset)
        np.testing.assert_allclose(point_files.read_point_file(tmp_path / "c.npy"), cloud + offset, atol=0.04)


def test_centred_reading_keeps_the_shape_of_clouds_far_from_the_origin(tmp_path):
    cloud = np.random.default_rng(1).random((64, 3)) * 2
    offset = np.array([4.5e8, -5.4e8, 1e8])
    np.save(tmp_path / "far.npy", cloud + offset)
    with pytest.raises(ValueError, match="centre the cloud"):
        point_files.read_point_file(tmp_path / "far.npy")
    centred = point_files.read_point_file(tmp_path / "far.npy", centre=True)
    assert centred.dtype == np.float32
    # float64 holds 5e8 to 1e-7: the shape about its centroid survives, rounded to float32
    np.testing.assert_allclose(centred, cloud - cloud.mean(axis=0), atol=1e-6)
    clouds = np.stack([cloud, cloud[::-1] * 3]) + offset
    normals = np.random.default_rng(2).normal(size=(2, 64, 3))
    np.savez(tmp_path / "two.npz", points=np.concatenate([clouds, normals], axis=-1))
    read = point_files.read_point_file(tmp_path / "two.npz", centre=True)
    np.testing.assert_allclose(read[..., :3], clouds - clouds.mean(axis=1, keepdims=True), atol=1e-5)
    np.testing.assert_allclose(read[..., 3:], normals, rtol=1e-6)  # normals are directions: not moved
    np.save(tmp_path / "tiny.npy", np.random.default_rng(0).random((64, 3)) * 1e-40)
    with pytest.raises(ValueError, match="moves its points by up to"):  # centring does not help a cloud float32
        point_files.read_point_file(tmp_path / "tiny.npy", centre=True)  # flushes to zero


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such point file"):
        point_files.read_point_file(tmp_path / "none.npy")
    (tmp_path / "d.npy").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        point_files.read_point_file(tmp_path / "d.npy")


def test_images_from_png_npy_and_npz(tmp_path, rng):
    grey = rng.integers(0, 256, (28, 28), dtype=np.uint8)
    Image.fromarray(grey).save(tmp_path / "g.png")
    np.testing.assert_array_equal(point_files.read_image_file(tmp_path / "g.png"), grey)
    Image.fromarray(np.stack([grey] * 3, axis=-1)).save(tmp_path / "rgb.png")
    np.testing.assert_array_equal(point_files.read_image_file(tmp_path / "rgb.png"), grey)
    np.save(tmp_path / "i.npy", grey[None].astype(np.float64))
    assert point_files.read_image_file(tmp_path / "i.npy").shape == (1, 28, 28)
    np.savez(tmp_path / "i.npz", images=np.stack([grey, grey]))
    np.testing.assert_array_equal(point_files.read_image_file(tmp_path / "i.npz"), [grey, grey])
    np.save(tmp_path / "unit.npy", grey / 255.0 - 0.5)
    with pytest.raises(ValueError, match=r"must lie in 0\.\.255"):
        point_files.read_image_file(tmp_path / "unit.npy")
    np.save(tmp_path / "spans.npy", np.ones((28, 28), "timedelta64[s]"))
    with pytest.raises(ValueError, match=r"spans.npy: images must be numbers 0\.\.255, got dtype timedelta64"):
        point_files.read_image_file(tmp_path / "spans.npy")
    (tmp_path / "fake.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"fake.png: not a readable PNG"):
        point_files.read_image_file(tmp_path / "fake.png")


def test_detect_kind_from_arrays_and_layouts(tmp_path, rng):
    make_layout(tmp_path / "meshes", ["chair", "airplane"], per_split=1)
    assert test_split.detect_kind(tmp_path / "meshes") == ("modelnet-meshes", ("test", "train"))
    np.savez(tmp_path / "p.npz", points=np.zeros((2, 4, 3), np.uint8), labels=[0, 1], classes=["a", "b"])
    assert test_split.detect_kind(tmp_path / "p.npz") == ("points-npz", ())
    np.savez(tmp_path / "m.npz", images=np.zeros((2, 28, 28), np.uint8), labels=[0, 1])
    assert test_split.detect_kind(tmp_path / "m.npz") == ("mnist", ())
    write_idx_folder(tmp_path / "idx", rng.integers(0, 256, (3, 28, 28), dtype=np.uint8), np.arange(3, dtype=np.uint8),
                     prefix="t10k")
    assert test_split.detect_kind(tmp_path / "idx") == ("mnist", ("test",))
    write_scene(tmp_path / "scans", "scene0000_00", "ascii")
    assert test_split.detect_kind(tmp_path / "scans") == ("scannet", ())
    np.savez(tmp_path / "unlabelled.npz", points=np.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match=r"has points but no classes or labels"):
        test_split.detect_kind(tmp_path / "unlabelled.npz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"none of the known layouts"):
        test_split.detect_kind(tmp_path / "empty")
    assert test_split.resolve_split("points-npz", (), None) == "all"
    assert test_split.resolve_split("modelnet-meshes", ("test", "train"), None) == "test"
    with pytest.raises(ValueError, match=r"no 'test' split; use --split all"):
        test_split.resolve_split("points-npz", (), "test")


def test_mesh_split_per_class_equals_one_load(tmp_path):
    make_layout(tmp_path, ["chair", "airplane", "sofa"])
    messages = []
    loaded = test_split.load_test_split(tmp_path, "modelnet-meshes", "test", ("sofa", "chair"), num_points=64,
                                        seed=5, progress=lambda *m: messages.append(m))
    points, labels, _ = load_modelnet_meshes(tmp_path, "test", classes=("sofa", "chair"), num_points=64, seed=5)
    np.testing.assert_array_equal(loaded.examples, points)
    np.testing.assert_array_equal(loaded.labels, labels)
    assert messages == [(1, 2, "class folders, 2 shapes (test/sofa)"), (2, 2, "class folders, 4 shapes (test/chair)")]
    both = test_split.load_test_split(tmp_path, "modelnet-meshes", "all", ("airplane",), num_points=64)
    np.testing.assert_array_equal(both.labels, [0] * 4)


def test_mesh_split_beyond_the_memory_available_is_refused_before_sampling(tmp_path, monkeypatch):
    """On a host that overcommits memory, sampling clouds that cannot fit does not fail but
    gets the process killed later: the meshes are counted and their clouds' bytes checked first."""
    from tf_sparseconv import host_memory

    make_layout(tmp_path, ["chair", "airplane", "sofa"])
    sampled = []
    monkeypatch.setattr(host_memory, "available_memory_bytes", lambda: 10 << 20)
    import tf_sparseconv.data.modelnet as modelnet
    real = modelnet.load_modelnet_meshes
    monkeypatch.setattr(modelnet, "load_modelnet_meshes", lambda *a, **k: sampled.append(k) or real(*a, **k))
    # 4 test meshes of 2 classes: 2 copies x 4 x 200,000 points x 3 x 4 bytes = 18.3 MiB > 10 MiB
    with pytest.raises(MemoryError, match=r"^4 clouds of 200000 points take 18\.3 MiB, 10\.0 MiB are available$"):
        test_split.load_test_split(tmp_path, "modelnet-meshes", "test", ("sofa", "chair"), num_points=200_000)
    assert sampled == []
    # with normals twice the columns; the train split too under "all"
    with pytest.raises(MemoryError, match=r"^8 clouds of 50000 points take 18\.3 MiB"):
        test_split.load_test_split(tmp_path, "modelnet-meshes", "all", ("sofa", "chair"), num_points=50_000,
                                   normals=True)
    loaded = test_split.load_test_split(tmp_path, "modelnet-meshes", "test", ("sofa", "chair"), num_points=64)
    assert loaded.examples.shape == (4, 64, 3) and len(sampled) == 2


def test_npz_and_mnist_splits_keep_the_asked_classes_by_name(tmp_path, rng):
    quantised = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "p.npz", points=quantised, labels=np.array([0, 1, 2, 2, 1, 0], np.uint8),
             classes=np.array(["bed", "chair", "sofa"]))
    loaded = test_split.load_test_split(tmp_path / "p.npz", "points-npz", "all", ("sofa", "bed"))
    np.testing.assert_array_equal(loaded.labels, [1, 0, 0, 1])
    np.testing.assert_array_equal(loaded.examples, load_modelnet_npz(tmp_path / "p.npz")[0][[0, 2, 3, 5]])
    images = rng.integers(0, 256, (5, 28, 28), dtype=np.uint8)
    write_idx_folder(tmp_path / "idx", images, np.array([3, 1, 4, 1, 5], np.uint8), prefix="t10k")
    digits = test_split.load_test_split(tmp_path / "idx", "mnist", "test", ("1", "5"))
    np.testing.assert_array_equal(digits.examples, images[[1, 3, 4]])
    np.testing.assert_array_equal(digits.labels, [0, 0, 1])


@pytest.mark.parametrize("classes, message", [
    (np.array("a"), r"classes must be the class names \[C\], one per label value, got an array of shape \[\]"),
    (np.array([["a", "b"]]), r"classes must be the class names \[C\].*shape \[1, 2\]"),
    (np.array(["a", "b", "a"]), r"classes names 'a' more than once; each label value needs its own name"),
])
def test_npz_split_refuses_classes_that_are_not_one_name_per_label(tmp_path, rng, classes, message):
    path = tmp_path / "p.npz"
    np.savez(path, points=rng.integers(0, 256, (3, 8, 3), dtype=np.uint8), labels=[0, 1, 2], classes=classes)
    with pytest.raises(ValueError, match=message):
        test_split.data_classes(path, "points-npz", "all")
    with pytest.raises(ValueError, match=message):
        test_split.load_test_split(path, "points-npz", "all", ("a",))


def test_scannet_split_equals_the_loader(tmp_path):
    for name in ("scene0000_00", "scene0001_00"):
        write_scene(tmp_path, name, "binary_little_endian")
    messages = []
    loaded = test_split.load_test_split(tmp_path, "scannet", "all", ("chair", "sofa", "table"), num_points=32,
                                        seed=2, min_points=4, progress=lambda *m: messages.append(m))
    points, labels, _ = load_scannet_objects(tmp_path, ("chair", "sofa", "table"), num_points=32, min_points=4,
                                             seed=2)
    assert len(labels) == 8  # per scan: chair, couch (sofa), office chair, end table
    np.testing.assert_array_equal(loaded.examples, points)
    np.testing.assert_array_equal(loaded.labels, labels)
    assert messages == [(1, 2, "scans, 4 objects"), (2, 2, "scans, 8 objects")]
