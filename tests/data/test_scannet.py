"""The PLY reader (ascii, binary little/big endian, mixed polygon faces, truncation) and
ScanNet object crops from small generated scans in the official layout."""
import json
import struct

import numpy as np
import pytest

from tf_sparseconv.data.scannet import (LABEL_SYNONYMS, SCANNET_CLASSES, class_of, load_scannet_objects, read_ply,
                                        scene_objects)

VERTEX_PROPERTIES = [("x", "float", "f"), ("y", "float", "f"), ("z", "float", "f"), ("nx", "float", "f"),
                     ("ny", "float", "f"), ("nz", "float", "f"), ("red", "uchar", "B"), ("green", "uchar", "B"),
                     ("blue", "uchar", "B"), ("alpha", "uchar", "B")]


def write_ply(path, vertices, faces, fmt="binary_little_endian", with_normals=True):
    """vertices: [V, 10] x y z nx ny nz r g b a; faces: lists of vertex indices."""
    props = [p for p in VERTEX_PROPERTIES if with_normals or p[0] not in ("nx", "ny", "nz")]
    columns = [i for i, p in enumerate(VERTEX_PROPERTIES) if p in props]
    header = ["ply", f"format {fmt} 1.0", "comment written by the test", f"element vertex {len(vertices)}"]
    header += [f"property {kind} {name}" for name, kind, _ in props]
    header += [f"element face {len(faces)}", "property list uchar int vertex_indices", "end_header"]
    body = b""
    if fmt == "ascii":
        lines = [" ".join(str(int(v[i])) if props[k][1] == "uchar" else repr(float(v[i]))
                          for k, i in enumerate(columns)) for v in vertices]
        lines += [f"{len(f)} {' '.join(map(str, f))}" for f in faces]
        body = ("\n".join(lines) + "\n").encode()
    else:
        endian = "<" if fmt == "binary_little_endian" else ">"
        vertex_format = endian + "".join(p[2] for p in props)
        body = b"".join(struct.pack(vertex_format, *[v[i] if props[k][2] == "f" else int(v[i])
                                                     for k, i in enumerate(columns)]) for v in vertices)
        body += b"".join(struct.pack(f"{endian}B{len(f)}i", len(f), *f) for f in faces)
    path.write_bytes(("\n".join(header) + "\n").encode() + body)
    return path


def grid_mesh(offset, n=6, seed=0):
    """An n x n vertex patch (with a colour and a normal per vertex) and its quads split into triangles."""
    rng = np.random.default_rng(seed)
    xs, ys = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    xyz = np.stack([xs.ravel() * 0.1, ys.ravel() * 0.1, rng.uniform(0, 0.05, n * n)], 1) + offset
    vertices = np.concatenate([xyz, np.tile([0, 0, 1], (n * n, 1)), rng.integers(0, 256, (n * n, 3)),
                               np.full((n * n, 1), 255)], 1)
    # Counter-clockwise seen from +z.
    faces = [[i * n + j, (i + 1) * n + j + 1, i * n + j + 1] for i in range(n - 1) for j in range(n - 1)]
    faces += [[i * n + j, (i + 1) * n + j, (i + 1) * n + j + 1] for i in range(n - 1) for j in range(n - 1)]
    return vertices, faces


# (raw label, number of segments): each object is one 6 x 6 patch split over its segments.
SCENE_OBJECTS = [("chair", 2), ("couch", 1), ("wall", 1), ("otherfurniture", 1), ("office chair", 3), ("lamp", 1),
                 ("end table", 1)]


def write_scene(root, name, fmt, with_normals=True):
    folder = root / name
    folder.mkdir(parents=True)
    vertices, faces, seg_indices, groups = [], [], [], []
    segment = 100
    for object_id, (label, num_segments) in enumerate(SCENE_OBJECTS):
        patch, patch_faces = grid_mesh(offset=[object_id * 2.0, 0, 0], n=2 if label == "end table" else 6,
                                       seed=object_id)
        first = len(vertices)
        vertices.extend(patch)
        faces.extend([[first + i for i in f] for f in patch_faces])
        segments = list(range(segment, segment + num_segments))
        seg_indices.extend(segments[i % num_segments] for i in range(len(patch)))
        groups.append({"id": object_id, "objectId": object_id, "segments": segments, "label": label})
        segment += num_segments + 5
    write_ply(folder / f"{name}_vh_clean_2.ply", vertices, faces, fmt, with_normals)
    (folder / f"{name}.aggregation.json").write_text(json.dumps({"sceneId": name, "segGroups": groups}))
    (folder / f"{name}_vh_clean_2.0.010000.segs.json").write_text(json.dumps({"segIndices": seg_indices}))
    return folder


@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian", "binary_big_endian"])
def test_read_ply_triangles_and_polygons(tmp_path, fmt):
    vertices, faces = grid_mesh(offset=[1, 2, 3], n=3)
    mesh = read_ply(write_ply(tmp_path / "m.ply", vertices, faces, fmt))
    np.testing.assert_allclose(np.stack([mesh["vertex"][k] for k in "xyz"], 1), vertices[:, :3], rtol=1e-6)
    np.testing.assert_array_equal(mesh["vertex"]["red"], vertices[:, 6])
    assert mesh["vertex"]["red"].dtype == np.uint8 and mesh["vertex"]["x"].dtype == np.float32
    np.testing.assert_array_equal(mesh["face"]["vertex_indices"], faces)
    # Quads mixed with triangles: lists of varying length.
    mixed = [[0, 1, 2], [0, 1, 4, 3], [2, 5, 8]]
    mesh = read_ply(write_ply(tmp_path / "mixed.ply", vertices, mixed, fmt))
    assert [list(f) for f in mesh["face"]["vertex_indices"]] == mixed


@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian"])
def test_truncated_ply_names_file_and_element(tmp_path, fmt):
    vertices, faces = grid_mesh(offset=[0, 0, 0], n=3)
    data = write_ply(tmp_path / "m.ply", vertices, faces, fmt).read_bytes()
    (tmp_path / "cut.ply").write_bytes(data[:-7])
    with pytest.raises(ValueError, match=r"cut.ply: truncated PLY: element 'face' ends at record 7 of 8"):
        read_ply(tmp_path / "cut.ply")
    (tmp_path / "cut_vertices.ply").write_bytes(data[:data.index(b"end_header") + 40])
    with pytest.raises(ValueError, match=r"cut_vertices.ply: truncated PLY: element 'vertex'"):
        read_ply(tmp_path / "cut_vertices.ply")


def test_bad_ply_headers(tmp_path):
    (tmp_path / "a.ply").write_bytes(b"PLY?\n")
    with pytest.raises(ValueError, match="a.ply: not a PLY file"):
        read_ply(tmp_path / "a.ply")
    (tmp_path / "b.ply").write_bytes(b"ply\nformat ascii 1.0\nelement vertex 1\n")
    with pytest.raises(ValueError, match="b.ply: truncated PLY header"):
        read_ply(tmp_path / "b.ply")
    (tmp_path / "c.ply").write_bytes(b"ply\nformat ascii 1.0\nelement vertex 1\nproperty quad x\nend_header\n1\n")
    with pytest.raises(ValueError, match="c.ply: bad PLY header line 4"):
        read_ply(tmp_path / "c.ply")


def test_label_mapping():
    assert class_of("Couch") == "sofa" and class_of(" office chair ") == "chair"
    assert class_of("otherfurniture") is None and class_of("lamp") is None
    assert class_of("big comfy thing", {"big comfy thing": "sofa"}) == "sofa"
    assert class_of("cold box", {"cold box": "refridgerator"}) == "refrigerator"  # NYU40's spelling
    assert len(SCANNET_CLASSES) == 19 and "otherfurniture" not in SCANNET_CLASSES
    assert set(LABEL_SYNONYMS.values()) <= set(SCANNET_CLASSES)


@pytest.mark.parametrize("fmt", ["ascii", "binary_little_endian"])
def test_scene_crops(tmp_path, fmt):
    scene = write_scene(tmp_path, "scene0007_01", fmt)
    objects = list(scene_objects(scene, num_points=64, min_points=10))
    # lamp and otherfurniture are not among the 19 classes; the 4-vertex end table is below min_points.
    assert [(o.object_id, o.raw_label) for o in objects] == [(0, "chair"), (1, "couch"), (2, "wall"),
                                                            (4, "office chair")]
    assert [SCANNET_CLASSES[o.label] for o in objects] == ["chair", "sofa", "wall", "chair"]
    for o in objects:
        assert o.points.shape == (64, 3) and o.scene == "scene0007_01"
        np.testing.assert_allclose(np.linalg.norm(o.points, axis=1).max(), 1.0, rtol=1e-5)
    # A crop is exactly its object's 36 vertices (over 2 or 3 segments): a flat 0.5 x 0.5 patch.
    for o in scene_objects(scene, num_points=500, min_points=10, seed=1):
        assert len(np.unique(o.points, axis=0)) == 36
        extent = np.ptp(o.points, axis=0)
        assert extent[2] < 0.2 * extent[0]
    tables = list(scene_objects(scene, num_points=8, min_points=1))
    assert (tables[-1].raw_label, SCANNET_CLASSES[tables[-1].label]) == ("end table", "table")


def test_crops_are_seeded_and_normals_come_from_file_or_faces(tmp_path):
    with_normals = write_scene(tmp_path / "a", "scene0000_00", "binary_little_endian")
    without = write_scene(tmp_path / "b", "scene0000_00", "binary_little_endian", with_normals=False)
    first = list(scene_objects(with_normals, num_points=50, min_points=10, normals=True))
    again = list(scene_objects(with_normals, num_points=50, min_points=10, normals=True))
    np.testing.assert_array_equal(first[0].points, again[0].points)
    assert len(first) == 4
    other_seed = list(scene_objects(with_normals, num_points=50, min_points=10, normals=True, seed=1))
    assert not np.array_equal(first[0].points, other_seed[0].points)
    derived = list(scene_objects(without, num_points=50, min_points=10, normals=True))
    for a, b in zip(first, derived):
        np.testing.assert_array_equal(a.points[:, :3], b.points[:, :3])
        np.testing.assert_allclose(a.points[:, 3:], [[0, 0, 1]] * 50)
        # From the faces: the bumpy patches face +z.
        assert np.all(b.points[:, 5] > 0.7)
        np.testing.assert_allclose(np.linalg.norm(b.points[:, 3:], axis=1), 1.0, rtol=1e-5)


def test_load_scannet_objects_over_scenes(tmp_path):
    write_scene(tmp_path, "scene0001_00", "ascii")
    write_scene(tmp_path, "scene0002_00", "binary_little_endian")
    (tmp_path / "README.txt").write_text("not a scene")
    points, labels, classes = load_scannet_objects(tmp_path, num_points=32, min_points=10)
    assert points.shape == (8, 32, 3) and classes == SCANNET_CLASSES
    assert [classes[i] for i in labels] == ["chair", "sofa", "wall", "chair"] * 2
    furniture = ("chair", "sofa")
    points, labels, classes = load_scannet_objects(tmp_path, classes=furniture, num_points=32, min_points=10)
    assert classes == furniture and labels.tolist() == [0, 1, 0, 0, 1, 0]
    tsv = tmp_path / "labels.tsv"
    tsv.write_text("id\traw_category\tcategory\tnyu40class\n1\tlamp\tlamp\tchair\n")
    _, labels, _ = load_scannet_objects(tmp_path, classes=furniture, num_points=32, min_points=10, label_map=tsv)
    assert labels.tolist() == [0, 1, 0, 0, 0, 1, 0, 0]  # lamp -> chair


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_points=0), "num_points must be a whole number >= 1, got 0"),  # was a NumPy error
    (dict(num_points=2.5), "num_points must be a whole number >= 1, got 2.5"),
    (dict(num_points=True), "num_points must be a whole number >= 1, got True"),
    (dict(min_points=-1), "min_points must be a whole number >= 0, got -1"),
    (dict(seed=-1), "seed must be a whole number >= 0, got -1"),  # was NumPy's bare message
    (dict(normals="no"), "normals must be True or False, got 'no'"),  # was taken as True
])
def test_loaders_refuse_counts_seeds_and_flags_they_cannot_take(tmp_path, kwargs, message):
    write_scene(tmp_path, "scene0001_00", "ascii")
    with pytest.raises(ValueError, match=f"load_scannet_objects: {message}"):
        load_scannet_objects(tmp_path, **kwargs)
    with pytest.raises(ValueError, match=f"scene_objects: {message}"):
        scene_objects(tmp_path / "scene0001_00", **kwargs)


def test_layout_and_corruption_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"scene\*/scene\*_vh_clean_2.ply"):
        load_scannet_objects(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no scene"):
        load_scannet_objects(tmp_path)
    scene = write_scene(tmp_path, "scene0003_00", "binary_little_endian")
    segs = scene / "scene0003_00_vh_clean_2.0.010000.segs.json"
    aggregation = scene / "scene0003_00.aggregation.json"

    segs.write_text(json.dumps({"segIndices": [1, 2, 3]}))
    with pytest.raises(ValueError, match="segs.json: segIndices has 3 entries but .* has 220 vertices"):
        list(scene_objects(scene))
    segs.write_text(json.dumps({"segments": []}))
    with pytest.raises(ValueError, match="segs.json: missing key 'segIndices'"):
        list(scene_objects(scene))
    segs.write_text("{not json")
    with pytest.raises(ValueError, match="segs.json: not valid JSON"):
        list(scene_objects(scene))
    segs.write_text(json.dumps({"segIndices": [0] * 220}))
    aggregation.write_text(json.dumps({"segGroups": [{"objectId": 0, "segments": [0]}]}))
    with pytest.raises(ValueError, match=r"aggregation.json: a segGroup lacks keys \['label'\]"):
        list(scene_objects(scene))
    aggregation.write_text(json.dumps({"sceneId": "x"}))
    with pytest.raises(ValueError, match="aggregation.json: missing key 'segGroups'"):
        list(scene_objects(scene))
    aggregation.unlink()
    with pytest.raises(FileNotFoundError, match="scene0003_00.aggregation.json"):
        list(scene_objects(scene))
