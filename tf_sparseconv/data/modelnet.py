"""ModelNet40 / ModelNet10: OFF meshes in the official layout, or the point-cloud .npz form.

Both loaders return (points float32 [M, N, 3 or 6], labels int64 [M], class names); columns
3:6, when asked for, are unit surface normals. Shapes are centred and scaled into the unit
sphere, ready for voxelizing over bounds (-1, 1).
"""
import os
import re
import zlib

import numpy as np

from tf_sparseconv.data.npz import read_npz_arrays
from tf_sparseconv.data.point_files import check_extent, npz_class_names
from tf_sparseconv.layer_config import flag, whole

MODELNET10_CLASSES = ("bathtub", "bed", "chair", "desk", "dresser", "monitor", "night_stand", "sofa", "table",
                      "toilet")

MESH_LAYOUT = "<root>/<class>/{train,test}/*.off"

# Shapes per class in the official ModelNet40 test split (2,468 in all), counted from the
# <class>/test/*.off folders of Princeton's ModelNet40 archive (the same counts as its
# modelnet40_test.txt file list); ModelNet10's test split (908) has the same counts for its
# ten classes. Most classes have 100 test shapes, many 20, whatever their training size, so
# a validation split that follows the training set's balance weights the classes
# differently from the test (train --val-split modelnet40-test mirrors these counts).
MODELNET40_TEST_COUNTS = {
    "airplane": 100, "bathtub": 50, "bed": 100, "bench": 20, "bookshelf": 100, "bottle": 100, "bowl": 20,
    "car": 100, "chair": 100, "cone": 20, "cup": 20, "curtain": 20, "desk": 86, "door": 20, "dresser": 86,
    "flower_pot": 20, "glass_box": 100, "guitar": 100, "keyboard": 20, "lamp": 20, "laptop": 20, "mantel": 100,
    "monitor": 100, "night_stand": 86, "person": 20, "piano": 100, "plant": 100, "radio": 20, "range_hood": 100,
    "sink": 20, "sofa": 100, "stairs": 20, "stool": 20, "table": 100, "tent": 20, "toilet": 100, "tv_stand": 100,
    "vase": 100, "wardrobe": 20, "xbox": 20,
}

def modelnet40_test_counts(classes, full=100):
    """Validation examples per class (in the order of classes) in the proportions of the
    official ModelNet40 test split: full for a class with 100 test shapes, round(full *
    count / 100) for the others (full=50: 50, 43, 25 or 10)."""
    unknown = [c for c in classes if c not in MODELNET40_TEST_COUNTS]
    if unknown:
        raise ValueError(f"the official ModelNet40 test split has no classes {unknown}; its test counts apply to "
                         "ModelNet40 and ModelNet10 only")
    whole(full, "full", "modelnet40_test_counts")  # NaN failed in int()
    return np.array([int(round(full * MODELNET40_TEST_COUNTS[c] / 100)) for c in classes], np.int64)


# 'OFF' alone, or with the counts glued on as in some ModelNet files: "OFF490 518 0".
_HEADER = re.compile(r"^OFF(?:\s*(\d.*))?$")


def _content_lines(path):
    """(line number, text) of the non-empty lines with '#' comments stripped."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if line:
                yield number, line


def read_off(path):
    """(vertices float64 [V, 3], triangles int64 [T, 3]) of an OFF mesh; polygons become fans.

    Accepts 'OFF' alone on the first line or the malformed 'OFF<V> <F> <E>' variant, comments
    and blank lines, and extra per-vertex/per-face columns (colours), which are ignored.
    """
    path = os.fspath(path)
    lines = _content_lines(path)
    first = next(lines, None)
    if first is None:
        raise ValueError(f"{path}: empty OFF file")
    header = _HEADER.match(first[1])
    if header is None:
        raise ValueError(f"{path}: bad OFF header {first[1][:40]!r} on line {first[0]}, expected 'OFF'")
    counts_line = (first[0], header.group(1)) if header.group(1) else next(lines, (first[0] + 1, ""))
    counts = counts_line[1].split()
    if len(counts) < 2 or not all(c.isdigit() for c in counts[:2]):
        raise ValueError(f"{path}: bad OFF counts {counts_line[1][:40]!r} on line {counts_line[0]}, "
                         "expected '<vertices> <faces> <edges>'")
    num_vertices, num_faces = int(counts[0]), int(counts[1])
    body = list(lines)
    if len(body) < num_vertices + num_faces:
        raise ValueError(f"{path}: truncated: header announces {num_vertices} vertices and {num_faces} faces, "
                         f"file has {len(body)} data lines")
    vertices = _parse_vertices(body[:num_vertices], path)
    triangles = _triangulate(body[num_vertices:num_vertices + num_faces], num_vertices, path)
    return vertices, triangles


def _parse_vertices(lines, path):
    tokens = " ".join(text for _, text in lines).split()
    if len(tokens) == 3 * len(lines):  # fast path: exactly x y z per line
        try:
            return np.array(tokens, np.float64).reshape(-1, 3)
        except ValueError:
            pass
    rows = []
    for number, text in lines:
        try:
            row = [float(t) for t in text.split()[:3]]
        except ValueError:
            row = []
        if len(row) != 3:
            raise ValueError(f"{path}: bad vertex on line {number}: {text[:60]!r}, expected 'x y z'")
        rows.append(row)
    return np.array(rows, np.float64).reshape(-1, 3)


def _triangulate(lines, num_vertices, path):
    tokens = " ".join(text for _, text in lines).split()
    triangles = None
    if len(tokens) == 4 * len(lines):  # fast path: a pure triangle mesh
        try:
            rows = np.array(tokens, np.int64).reshape(-1, 4)
            triangles = rows[:, 1:] if (rows[:, 0] == 3).all() else None
        except (ValueError, OverflowError):  # a token not an int64: the slow path names its line
            pass
    if triangles is None:
        fans = []
        for number, text in lines:
            parts = text.split()
            try:
                n = int(parts[0])
                polygon = [int(t) for t in parts[1:1 + n]]
            except (ValueError, IndexError):
                n, polygon = 0, []
            if n < 3 or len(polygon) != n:
                raise ValueError(f"{path}: bad face on line {number}: {text[:60]!r}, expected '<n >= 3> i1 ... in'")
            outside = [i for i in polygon if not 0 <= i < num_vertices]
            if outside:
                raise ValueError(f"{path}: the face on line {number} indexes vertex {outside[0]}, outside "
                                 f"0..{num_vertices - 1}")
            fans.extend((polygon[0], polygon[i], polygon[i + 1]) for i in range(1, n - 1))
        triangles = np.array(fans, np.int64).reshape(-1, 3)
    out_of_range = (triangles < 0) | (triangles >= num_vertices)
    if out_of_range.any():
        bad = int(triangles[out_of_range][0])
        raise ValueError(f"{path}: a face indexes vertex {bad}, outside 0..{num_vertices - 1}")
    return triangles


def sample_surface(vertices, triangles, num_points, rng):
    """(points [N, 3], unit face normals [N, 3]) sampled uniformly by area on the mesh surface."""
    a, b, c = (vertices[triangles[:, k]] for k in range(3))
    with np.errstate(over="ignore", invalid="ignore"):  # non-finite areas are refused below, not warned of
        cross = np.cross(b - a, c - a)
        doubled_area = np.linalg.norm(cross, axis=1)
        total = doubled_area.sum()
    if not total > 0 or not np.isfinite(total):
        raise ValueError("mesh has no surface to sample (no triangles, zero area or non-finite vertices)")
    chosen = np.searchsorted(np.cumsum(doubled_area), rng.random(num_points) * total, side="right")
    chosen = np.minimum(chosen, len(triangles) - 1)
    # sqrt(u) folds the unit square onto the triangle with uniform density.
    su = np.sqrt(rng.random((num_points, 1)))
    v = rng.random((num_points, 1))
    points = (1 - su) * a[chosen] + su * (1 - v) * b[chosen] + su * v * c[chosen]
    normals = cross[chosen] / doubled_area[chosen, None]
    return points, normals


def normalize_to_unit_sphere(points):
    """Centres on the centroid and scales the farthest point to radius 1."""
    points = points - points.mean(axis=0)
    radius = np.linalg.norm(points, axis=1).max()
    return points / radius if radius > 0 else points


def mesh_point_cloud(path, num_points, rng, normals=False):
    """[num_points, 3 or 6] float32: one OFF mesh sampled by area and normalised into the unit sphere."""
    vertices, triangles = read_off(path)
    try:
        points, face_normals = sample_surface(vertices, triangles, num_points, rng)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    points = normalize_to_unit_sphere(points)
    return np.concatenate([points, face_normals], 1).astype(np.float32) if normals else points.astype(np.float32)


def mesh_files(folder):
    """The .off files of a class folder, sorted (their order seeds the sampling)."""
    return sorted(f for f in os.listdir(folder) if f.lower().endswith(".off"))


def load_modelnet_meshes(root, split="train", classes=None, num_points=1024, seed=0, normals=False):
    """Samples every mesh of `<root>/<class>/<split>/*.off` (the official ModelNet layout).

    classes: None for every class directory (alphabetical, as in ModelNet40), or a sequence
    such as MODELNET10_CLASSES; labels index it. Sampling is seeded per shape from (seed,
    class, file), so results do not depend on which other classes are loaded.
    """
    root = os.fspath(root)
    if split not in ("train", "test"):
        raise ValueError(f"load_modelnet_meshes: split must be 'train' or 'test', got {split!r}")
    num_points = whole(num_points, "num_points", "load_modelnet_meshes")
    seed = whole(seed, "seed", "load_modelnet_meshes", minimum=0)
    normals = flag(normals, "normals", "load_modelnet_meshes")
    if not os.path.isdir(root):
        raise FileNotFoundError(f"ModelNet root {root!r} does not exist; expected the layout {MESH_LAYOUT}")
    if classes is None:
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, split)))
        if not classes:
            raise FileNotFoundError(f"no class directories with a {split!r} folder under {root!r}; "
                                    f"expected the layout {MESH_LAYOUT}")
    classes = tuple(classes)
    clouds, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name, split)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"missing {folder!r}; expected the layout {MESH_LAYOUT}")
        files = mesh_files(folder)
        if not files:
            raise FileNotFoundError(f"no .off files in {folder!r}; expected the layout {MESH_LAYOUT}")
        for file_index, file in enumerate(files):
            # crc32, not hash(): Python salts str hashes per process.
            rng = np.random.default_rng([seed, zlib.crc32(name.encode()), file_index])
            clouds.append(mesh_point_cloud(os.path.join(folder, file), num_points, rng, normals))
            labels.append(label)
    return np.stack(clouds), np.array(labels, np.int64), classes


def load_modelnet_npz(path, classes=None):
    """(points float32 [M, N, 3], labels int64 [M], classes) from the quantised point-cloud .npz.

    The file holds `points` uint8 [M, N, 3] (xyz = points / 255 * 2 - 1), `labels` and
    `classes`. classes: None for all, or a subset such as MODELNET10_CLASSES, which keeps
    only those shapes and relabels them 0..len-1 in the given order.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"ModelNet point-cloud file {path!r} does not exist; expected an .npz with "
                                "points uint8 [M, N, 3], labels [M] and classes")
    arrays = read_npz_arrays(path, ("points", "labels", "classes"))
    raw, raw_labels, names = arrays["points"], arrays["labels"].astype(np.int64), arrays["classes"]
    names = list(npz_class_names(names, path))
    if raw.ndim != 3 or raw.shape[2] != 3 or raw.dtype != np.uint8 or len(raw_labels) != len(raw):
        raise ValueError(f"{path}: expected points uint8 [M, N, 3] and labels [M], got points {raw.dtype} "
                         f"{raw.shape} and labels {raw_labels.shape}")
    if len(raw_labels) and (raw_labels.min() < 0 or raw_labels.max() >= len(names)):
        raise ValueError(f"{path}: labels outside 0..{len(names) - 1}")
    if raw.shape[0] and raw.shape[1] < 2:
        raise ValueError(f"{path}: clouds of {raw.shape[1]} point{'s' * (raw.shape[1] != 1)}, without a shape to "
                         "classify")
    if raw.shape[0]:
        check_extent(raw, path)
    if classes is None:
        keep, labels, classes = slice(None), raw_labels, tuple(names)
    else:
        classes = tuple(classes)
        unknown = [c for c in classes if c not in names]
        if unknown:
            raise ValueError(f"{path}: classes {unknown} not in the file's classes")
        relabel = np.full(len(names), -1, np.int64)
        relabel[[names.index(c) for c in classes]] = np.arange(len(classes))
        labels = relabel[raw_labels]
        keep = labels >= 0
        labels = labels[keep]
    points = raw[keep].astype(np.float32) * np.float32(2 / 255) - np.float32(1)
    return points, labels, classes

