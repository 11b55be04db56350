"""Labelled examples to score a trained model on: the data sets' test splits, found by their layout.

Kinds (detect_kind tells them apart from the path alone, reading no data):
    modelnet-meshes  <root>/<class>/{train,test}/*.off (the official ModelNet layout)
    points-npz       an .npz with points [M, N, 3+] (uint8: quantised as the ModelNet40 file), labels, classes
    mnist            an .npz with images [M, H, W] and labels, or a folder of MNIST idx files
    scannet          <root>/scene*/ scans with their aggregation and segment files
Layouts with splits (meshes, idx files) give "test", "train" or "all" (both); a single .npz
and ScanNet scans have no split and give "all".
"""
import os
from typing import NamedTuple

import numpy as np

from tf_sparseconv.data import point_files
from tf_sparseconv.host_memory import check_fits

KINDS = ("modelnet-meshes", "points-npz", "mnist", "scannet")
SPLITS = ("test", "train", "all")
MNIST_CLASSES = tuple(str(d) for d in range(10))
_IDX_IMAGES = {"train": "train-images-idx3-ubyte", "test": "t10k-images-idx3-ubyte"}


class LabelledSet(NamedTuple):
    examples: np.ndarray  # float32 clouds [M, N, 3 or 6] or images [M, H, W]
    labels: np.ndarray    # int64 [M], indices into classes
    classes: tuple
    kind: str
    source: str           # what was read, for reports


def _has_idx(root, split):
    return any(os.path.isfile(os.path.join(root, _IDX_IMAGES[split] + ext)) for ext in ("", ".gz"))


def _mesh_classes(root, split):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, split)))


def detect_kind(path):
    """(kind, splits the data has): from the file's arrays or the folder's layout; ValueError otherwise."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    if os.path.isfile(path):
        point_files.check_readable(path, (".npz",), "data file")
        headers = point_files.npz_headers(path)
        if "points" in headers:
            missing = {"labels", "classes"} - set(headers)
            if missing:
                raise ValueError(f"{path}: has points but no {' or '.join(sorted(missing))}; an evaluation .npz "
                                 "holds points [M, N, 3], labels [M] and classes (the names)")
            return "points-npz", ()
        if "images" in headers:
            if "labels" not in headers:
                raise ValueError(f"{path}: has images but no labels; an MNIST .npz holds images [M, H, W] and labels")
            return "mnist", ()
        raise ValueError(f"{path}: holds {sorted(headers)}; expected points, labels and classes (point clouds) "
                         "or images and labels (MNIST)")
    entries = os.listdir(path)
    if any(e.startswith("scene") and os.path.isdir(os.path.join(path, e)) for e in entries):
        return "scannet", ()
    idx_splits = tuple(s for s in ("test", "train") if _has_idx(path, s))
    if idx_splits:
        return "mnist", idx_splits
    mesh_splits = tuple(s for s in ("test", "train") if _mesh_classes(path, s))
    if mesh_splits:
        return "modelnet-meshes", mesh_splits
    raise ValueError(f"{path}: a folder in none of the known layouts: <class>/test/*.off (ModelNet meshes), "
                     "t10k-images-idx3-ubyte (MNIST idx files) or scene*/ (ScanNet scans); for an .npz give "
                     "the file itself")


def resolve_split(kind, splits, split):
    """The split to read: 'test' by default where the data has splits, 'all' where it has none."""
    if split is None:
        return "test" if "test" in splits else ("all" if not splits else splits[0])
    if split == "all" or split in splits:
        return split
    if not splits:
        raise ValueError(f"this {kind} data has no {split!r} split; use --split all to score every example")
    raise ValueError(f"this {kind} data has no {split!r} split (it has {', '.join(splits)})")


def data_classes(path, kind, split):
    """The class names the data holds, read without loading it."""
    if kind == "points-npz":
        return point_files.npz_class_names(point_files.load_npz(path, ["classes"])["classes"], path)
    if kind == "mnist":
        return MNIST_CLASSES
    if kind == "scannet":
        from tf_sparseconv.data.scannet import SCANNET_CLASSES
        return SCANNET_CLASSES
    splits = ("train", "test") if split == "all" else (split,)
    return tuple(sorted({c for s in splits for c in _mesh_classes(path, s)}))


def _relabel(labels, from_classes, to_classes):
    index = np.array([to_classes.index(c) if c in to_classes else -1 for c in from_classes], np.int64)
    return index[labels]


def _load_meshes(root, split, classes, num_points, normals, seed, progress):
    from tf_sparseconv.data.modelnet import load_modelnet_meshes, mesh_files

    clouds, labels, count = [], [], 0
    splits = ("train", "test") if split == "all" else (split,)
    jobs = [(s, c) for s in splits for c in classes if os.path.isdir(os.path.join(root, c, s))]
    # The clouds as float32 [meshes, num_points, columns], twice (per class, then joined).
    meshes = sum(len(mesh_files(os.path.join(root, c, s))) for s, c in jobs)
    check_fits(2 * meshes * num_points * (6 if normals else 3) * 4, f"{meshes} clouds of {num_points} points")
    for done, (s, name) in enumerate(jobs, 1):
        # One class per call gives progress; sampling is seeded per (seed, class, file), so
        # the clouds equal those of a single call over every class.
        points, _, _ = load_modelnet_meshes(root, s, classes=[name], num_points=num_points, seed=seed,
                                            normals=normals)
        clouds.append(points)
        labels.append(np.full(len(points), classes.index(name), np.int64))
        count += len(points)
        progress(done, len(jobs), f"class folders, {count} shapes ({s}/{name})")
    return np.concatenate(clouds), np.concatenate(labels)


def _load_scannet(root, classes, num_points, min_points, normals, seed, progress):
    from tf_sparseconv.data.scannet import scene_objects

    scenes = sorted(d for d in os.listdir(root) if d.startswith("scene") and os.path.isdir(os.path.join(root, d)))
    objects = []
    for done, scene in enumerate(scenes, 1):
        objects.extend(scene_objects(os.path.join(root, scene), classes, num_points, min_points, seed, normals))
        progress(done, len(scenes), f"scans, {len(objects)} objects")
    if not objects:
        raise ValueError(f"{root}: no objects of the classes {list(classes)} in {len(scenes)} scans")
    return np.stack([o.points for o in objects]), np.array([o.label for o in objects], np.int64)


def load_test_split(path, kind, split, classes, num_points=1024, normals=False, seed=0, min_points=50,
                    progress=None, centre=False):
    """LabelledSet of the examples of `classes` (names the data holds) in the split; labels index classes.

    num_points and seed: points sampled per mesh or kept per ScanNet object; normals: columns
    3:6 as well (meshes' face normals, scans' vertex normals); min_points: ScanNet objects
    with fewer vertices are skipped, as in training. progress(done, total, what) hears of
    long loads: class folders of meshes or scans read so far. centre: each point cloud of an
    .npz centred on its centroid as it is read (point_files.as_clouds).
    """
    path = os.fspath(path)
    progress = progress or (lambda done, total, what: None)
    classes = tuple(classes)
    if kind == "modelnet-meshes":
        clouds, labels = _load_meshes(path, split, classes, num_points, normals, seed, progress)
        return LabelledSet(clouds, labels, classes, kind, f"{path} ({split})")
    if kind == "scannet":
        clouds, labels = _load_scannet(path, classes, num_points, min_points, normals, seed, progress)
        return LabelledSet(clouds, labels, classes, kind, path)
    if kind == "points-npz":
        arrays = point_files.load_npz(path, ["points", "labels", "classes"])
        names = point_files.npz_class_names(arrays["classes"], path)
        raw_labels = arrays["labels"]
        points = arrays["points"]
        if points.ndim != 3 or points.shape[2] < 3 or raw_labels.shape != (len(points),):
            raise ValueError(f"{path}: expected points [M, N, 3+] and labels [M], got points {list(points.shape)} "
                             f"and labels {list(raw_labels.shape)}")
        if not np.issubdtype(raw_labels.dtype, np.integer) or (
                len(raw_labels) and (raw_labels.min() < 0 or raw_labels.max() >= len(names))):
            raise ValueError(f"{path}: labels must be integers in 0..{len(names) - 1} (indices into classes)")
        keep = np.isin(raw_labels, [names.index(c) for c in classes])
        # every example checked, named by its index in the file
        clouds = point_files.as_clouds(points, path, centre)[keep]
        return LabelledSet(clouds, _relabel(raw_labels[keep].astype(np.int64), names, classes), classes, kind, path)
    if kind == "mnist":
        from tf_sparseconv.data.mnist import load_mnist

        splits = ("train", "test") if split == "all" and os.path.isdir(path) else (split,)
        loaded = [load_mnist(path, s) for s in splits]
        images = np.concatenate([i for i, _ in loaded])
        labels = np.concatenate([l for _, l in loaded])
        if len(labels) and (labels.min() < 0 or labels.max() > 9):
            raise ValueError(f"{path}: MNIST labels must be digits 0..9")
        keep = np.isin(labels, [int(c) for c in classes])
        return LabelledSet(images[keep], _relabel(labels[keep], MNIST_CLASSES, classes), classes, kind,
                           f"{path} ({split})" if os.path.isdir(path) else path)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
