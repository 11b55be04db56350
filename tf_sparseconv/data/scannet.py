"""ScanNet object crops (Hackel et al. §4.5): every annotated furniture instance of every scan,
cut out by its segments, normalised into the unit sphere and resampled to a fixed size.

Official scan layout, one folder per scan:
    <root>/sceneXXXX_YY/sceneXXXX_YY_vh_clean_2.ply               mesh (vertices, faces)
    <root>/sceneXXXX_YY/sceneXXXX_YY.aggregation.json             segGroups: objectId, label, segments
    <root>/sceneXXXX_YY/sceneXXXX_YY_vh_clean_2.0.010000.segs.json  segIndices: one segment per vertex

Classes: the paper uses "19 different classes of furniture (like bathtub, bed, chair,
desk, ...), plus a rejection class 'other furniture', which we discard". That is the
ScanNet benchmark's 20-class NYU40 subset without otherfurniture: SCANNET_CLASSES below,
in NYU40-id order. Raw annotation labels are mapped onto them by LABEL_SYNONYMS (e.g.
'couch' -> 'sofa', 'office chair' -> 'chair') or, complete, by ScanNet's
scannetv2-labels.combined.tsv (raw_category -> nyu40class) when given as `label_map`;
instances of any other label are skipped. The paper trains on a random 70% of the objects
(pipeline.stratified_split(labels, val_fraction=0.3)).
"""
import csv
import json
import os
import zlib
from typing import NamedTuple

import numpy as np

from tf_sparseconv.data.modelnet import normalize_to_unit_sphere
from tf_sparseconv.layer_config import flag, whole

SCANNET_CLASSES = ("wall", "floor", "cabinet", "bed", "chair", "sofa", "table", "door", "window", "bookshelf",
                   "picture", "counter", "desk", "curtain", "refrigerator", "shower curtain", "toilet", "sink",
                   "bathtub")

# Frequent raw ScanNet labels (lower case) -> class; NYU40's own spelling 'refridgerator' too.
LABEL_SYNONYMS = {
    "couch": "sofa", "sofa chair": "chair", "office chair": "chair", "armchair": "chair", "chairs": "chair",
    "kitchen cabinet": "cabinet", "kitchen cabinets": "cabinet", "file cabinet": "cabinet",
    "bathroom cabinet": "cabinet", "cabinets": "cabinet",
    "coffee table": "table", "end table": "table", "dining table": "table", "round table": "table",
    "side table": "table", "bookshelves": "bookshelf", "bookcase": "bookshelf", "book shelf": "bookshelf",
    "kitchen counter": "counter", "bathroom counter": "counter", "fridge": "refrigerator",
    "mini fridge": "refrigerator", "refridgerator": "refrigerator", "bathroom sink": "sink",
    "kitchen sink": "sink", "tub": "bathtub", "bath tub": "bathtub", "curtains": "curtain", "doors": "door",
    "windows": "window", "pictures": "picture", "desks": "desk",
}

SCAN_LAYOUT = ("<root>/scene*/scene*_vh_clean_2.ply, scene*.aggregation.json and "
               "scene*_vh_clean_2.0.010000.segs.json")

_PLY_TYPES = {"char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
              "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
              "float": "f4", "float32": "f4", "double": "f8", "float64": "f8"}


def read_ply(path):
    """{element: {property: array}} of an ascii or binary (little/big endian) PLY file.

    Scalar properties give 1-D arrays; list properties (faces' vertex_indices) a 2-D array
    when every list has the same length, else an object array of 1-D arrays.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(b"ply"):
        raise ValueError(f"{path}: not a PLY file (no 'ply' magic)")
    end = data.find(b"end_header")
    newline = data.find(b"\n", end)
    if end < 0 or newline < 0:
        raise ValueError(f"{path}: truncated PLY header (no 'end_header' line)")
    fmt, elements = _parse_ply_header(data[:end].decode("ascii", errors="replace"), path)
    body = data[newline + 1:]
    if fmt == "ascii":
        return _read_ascii_body(body, elements, path)
    return _read_binary_body(body, elements, "<" if fmt == "binary_little_endian" else ">", path)


def _parse_ply_header(header, path):
    fmt, elements = None, []
    for number, line in enumerate(header.splitlines(), 1):
        words = line.split()
        if not words or words[0] in ("ply", "comment", "obj_info"):
            continue
        try:
            if words[0] == "format":
                fmt = words[1]
                if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
                    raise ValueError
            elif words[0] == "element":
                elements.append((words[1], int(words[2]), []))
            elif words[0] == "property" and words[1] == "list":
                elements[-1][2].append((words[4], (_PLY_TYPES[words[2]], _PLY_TYPES[words[3]])))
            elif words[0] == "property":
                elements[-1][2].append((words[2], _PLY_TYPES[words[1]]))
            else:
                raise ValueError
        except (ValueError, IndexError, KeyError):
            raise ValueError(f"{path}: bad PLY header line {number}: {line[:60]!r}") from None
    if fmt is None:
        raise ValueError(f"{path}: PLY header has no 'format' line")
    return fmt, elements


def _list_columns(rows, props, list_length):
    """Splits uniform records [count, width] into {property: column(s)}."""
    out, col = {}, 0
    for name, kind in props:
        if isinstance(kind, tuple):
            out[name] = rows[:, col + 1:col + 1 + list_length].astype(kind[1])
            col += 1 + list_length
        else:
            out[name] = rows[:, col].astype(kind)
            col += 1
    return out


def _read_ascii_body(body, elements, path):
    try:
        return _read_ascii_tokens(body.split(), elements, path)
    except ValueError as e:
        if str(e).startswith(path):
            raise
        raise ValueError(f"{path}: non-numeric value in the PLY body ({e})") from None


def _read_ascii_tokens(tokens, elements, path):
    pos, result = 0, {}
    for name, count, props in elements:
        list_props = [i for i, (_, kind) in enumerate(props) if isinstance(kind, tuple)]
        # Assume every list has the first record's length (faces of a triangle mesh); check it.
        length = 0
        if list_props and count:
            first_list_at = pos + list_props[0]
            length = int(tokens[first_list_at]) if first_list_at < len(tokens) else 0
        width = len(props) + len(list_props) * length
        chunk = tokens[pos:pos + count * width]
        uniform = len(chunk) == count * width
        if uniform and count:
            rows = np.array(chunk, np.float64).reshape(count, width)
            starts = [i + k * length for k, i in enumerate(list_props)]
            uniform = all((rows[:, s] == length).all() for s in starts)
        if uniform:
            result[name] = _list_columns(rows if count else np.zeros([0, width]), props, length)
            pos += count * width
            continue
        columns = {p: [] for p, _ in props}
        for record in range(count):
            for prop, kind in props:
                try:
                    if isinstance(kind, tuple):
                        n = int(tokens[pos])
                        items = tokens[pos + 1:pos + 1 + n]
                        if len(items) < n:
                            raise IndexError
                        columns[prop].append(np.array(items, np.float64).astype(kind[1]))
                        pos += 1 + n
                    else:
                        columns[prop].append(float(tokens[pos]))
                        pos += 1
                except IndexError:
                    raise ValueError(f"{path}: truncated PLY: element '{name}' ends at record {record} of "
                                     f"{count}") from None
        result[name] = {p: _stack_column(columns[p], kind) for p, kind in props}
    return result


def _stack_column(values, kind):
    if not isinstance(kind, tuple):
        return np.array(values, kind)
    column = np.empty(len(values), object)
    column[:] = values
    return column


def _read_binary_body(body, elements, endian, path):
    offset, result = 0, {}
    for name, count, props in elements:
        fields = []
        # Record layout assuming every list is as long as the first record's list.
        probe = offset
        for prop, kind in props:
            if isinstance(kind, tuple):
                count_type = np.dtype(endian + kind[0])
                length = 0
                if count and probe + count_type.itemsize <= len(body):
                    length = int(np.frombuffer(body, count_type, 1, probe)[0])
                fields += [(prop + "/count", count_type), (prop, endian + kind[1], (length,))]
                probe += count_type.itemsize + length * np.dtype(kind[1]).itemsize
            else:
                fields.append((prop, endian + kind))
                probe += np.dtype(kind).itemsize
        record = np.dtype(fields)
        if offset + count * record.itemsize <= len(body):
            rows = np.frombuffer(body, record, count, offset)
            lists = [f for f in record.names if f.endswith("/count")]
            if all((rows[f] == record[f[:-6]].shape[0]).all() for f in lists):
                result[name] = {p: rows[p].astype(kind[1] if isinstance(kind, tuple) else kind) for p, kind in props}
                offset += count * record.itemsize
                continue
        result[name], offset = _read_binary_records(body, offset, name, count, props, endian, path)
    return result


def _read_binary_records(body, offset, name, count, props, endian, path):
    """Record by record, for lists of varying length (and to locate truncation)."""
    columns = {p: [] for p, _ in props}
    for record in range(count):
        for prop, kind in props:
            types = kind if isinstance(kind, tuple) else (None, kind)
            n = 1
            if types[0] is not None:
                count_type = np.dtype(endian + types[0])
                if offset + count_type.itemsize > len(body):
                    raise ValueError(f"{path}: truncated PLY: element '{name}' ends at record {record} of {count}")
                n = int(np.frombuffer(body, count_type, 1, offset)[0])
                offset += count_type.itemsize
            item_type = np.dtype(endian + types[1])
            if offset + n * item_type.itemsize > len(body):
                raise ValueError(f"{path}: truncated PLY: element '{name}' ends at record {record} of {count}")
            items = np.frombuffer(body, item_type, n, offset).astype(item_type.newbyteorder("="))
            columns[prop].append(items if types[0] is not None else items[0])
            offset += n * item_type.itemsize
    return {p: _stack_column(columns[p], kind) for p, kind in props}, offset


class ScanNetObject(NamedTuple):
    scene: str
    object_id: int
    raw_label: str
    label: int          # index into the requested classes
    points: np.ndarray  # float32 [num_points, 3 or 6], unit sphere; columns 3:6 unit normals


def read_label_map(tsv_path):
    """raw_category -> nyu40class from ScanNet's scannetv2-labels.combined.tsv."""
    tsv_path = os.fspath(tsv_path)
    with open(tsv_path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f, delimiter="\t")
        missing = {"raw_category", "nyu40class"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{tsv_path}: label map lacks columns {sorted(missing)}")
        return {row["raw_category"].strip().lower(): row["nyu40class"].strip().lower() for row in reader}


def class_of(raw_label, label_map=None):
    """The SCANNET_CLASSES name of a raw annotation label, or None for anything else."""
    label = raw_label.strip().lower()
    if label_map is not None:
        label = label_map.get(label, label)
    label = LABEL_SYNONYMS.get(label, label)
    return label if label in SCANNET_CLASSES else None


def _load_json(path, key):
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(content, dict) or key not in content:
        raise ValueError(f"{path}: missing key {key!r}")
    return content[key]


def _scene_files(scene_dir):
    scene = os.path.basename(os.path.normpath(scene_dir))
    mesh = os.path.join(scene_dir, f"{scene}_vh_clean_2.ply")
    segs = os.path.join(scene_dir, f"{scene}_vh_clean_2.0.010000.segs.json")
    # ScanNet v2 ships the aggregation under both names.
    aggregation = next((p for p in (os.path.join(scene_dir, f"{scene}.aggregation.json"),
                                    os.path.join(scene_dir, f"{scene}_vh_clean.aggregation.json"))
                        if os.path.isfile(p)), os.path.join(scene_dir, f"{scene}.aggregation.json"))
    for path in (mesh, aggregation, segs):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"missing {path!r}; expected the scan layout {SCAN_LAYOUT}")
    return scene, mesh, aggregation, segs


def _vertex_normals(vertices, faces, path):
    """Unit normals from the area-weighted normals of the incident triangles."""
    normals = np.zeros_like(vertices)
    if faces.dtype == object:  # polygons: fans
        faces = np.array([(f[0], f[i], f[i + 1]) for f in faces for i in range(1, len(f) - 1)], np.int64)
    faces = faces.reshape(-1, 3)
    if faces.size and (faces.min() < 0 or faces.max() >= len(vertices)):
        raise ValueError(f"{path}: a face indexes a vertex outside 0..{len(vertices) - 1}")
    a, b, c = (vertices[faces[:, k]] for k in range(3))
    cross = np.cross(b - a, c - a)
    for k in range(3):
        np.add.at(normals, faces[:, k], cross)
    length = np.linalg.norm(normals, axis=1, keepdims=True)
    return np.divide(normals, length, out=np.zeros_like(normals), where=length > 0)


def _checked(num_points, min_points, seed, normals, what):
    """The loaders' numbers and flag, checked: whole numbers (never truncated), a bool."""
    return (whole(num_points, "num_points", what), whole(min_points, "min_points", what, minimum=0),
            whole(seed, "seed", what, minimum=0), flag(normals, "normals", what))


def scene_objects(scene_dir, classes=SCANNET_CLASSES, num_points=2048, min_points=50, seed=0, normals=False,
                  label_map=None):
    """The ScanNetObject crops of one scan folder, in the aggregation file's order.

    Instances whose label maps to none of `classes`, or with fewer than `min_points` vertices,
    are skipped. Crops are resampled to `num_points` vertices (with repetition if smaller,
    which leaves the occupancy unchanged), seeded by (seed, scene, objectId).
    """
    # Checked when called (the crops are a generator, which would check only when read).
    num_points, min_points, seed, normals = _checked(num_points, min_points, seed, normals, "scene_objects")
    return _scene_objects(scene_dir, classes, num_points, min_points, seed, normals, label_map)


def _scene_objects(scene_dir, classes, num_points, min_points, seed, normals, label_map):
    scene, mesh_path, aggregation_path, segs_path = _scene_files(os.fspath(scene_dir))
    mesh = read_ply(mesh_path)
    vertex = mesh.get("vertex", {})
    if not {"x", "y", "z"} <= set(vertex):
        raise ValueError(f"{mesh_path}: PLY has no vertex element with x, y, z")
    xyz = np.stack([vertex["x"], vertex["y"], vertex["z"]], 1).astype(np.float64)
    seg_indices = np.asarray(_load_json(segs_path, "segIndices"))
    if seg_indices.shape != (len(xyz),):
        raise ValueError(f"{segs_path}: segIndices has {seg_indices.size} entries but {mesh_path} has "
                         f"{len(xyz)} vertices")
    groups = _load_json(aggregation_path, "segGroups")
    if normals:
        if {"nx", "ny", "nz"} <= set(vertex):
            vertex_normals = np.stack([vertex["nx"], vertex["ny"], vertex["nz"]], 1).astype(np.float64)
        elif "vertex_indices" in mesh.get("face", {}):
            vertex_normals = _vertex_normals(xyz, mesh["face"]["vertex_indices"], mesh_path)
        else:
            raise ValueError(f"{mesh_path}: normals requested, but the PLY has neither nx, ny, nz vertex "
                             "properties nor faces to derive them from")
    classes = tuple(classes)
    for group in groups:
        missing = {"label", "objectId", "segments"} - set(group)
        if missing:
            raise ValueError(f"{aggregation_path}: a segGroup lacks keys {sorted(missing)}")
        name = class_of(group["label"], label_map)
        if name not in classes:
            continue
        inside = np.flatnonzero(np.isin(seg_indices, group["segments"]))
        if len(inside) < max(min_points, 1):
            continue
        rng = np.random.default_rng([seed, zlib.crc32(scene.encode()), int(group["objectId"])])
        chosen = inside[rng.choice(len(inside), num_points, replace=len(inside) < num_points)]
        points = normalize_to_unit_sphere(xyz[chosen])
        if normals:
            points = np.concatenate([points, vertex_normals[chosen]], 1)
        yield ScanNetObject(scene, int(group["objectId"]), group["label"], classes.index(name),
                            points.astype(np.float32))


def load_scannet_objects(root, classes=SCANNET_CLASSES, num_points=2048, min_points=50, seed=0, normals=False,
                         label_map=None):
    """(points float32 [M, num_points, 3 or 6], labels int64 [M], classes) of every scan under root.

    label_map: None, a {raw: nyu40class} dict or the path of scannetv2-labels.combined.tsv.
    """
    root = os.fspath(root)
    _checked(num_points, min_points, seed, normals, "load_scannet_objects")
    if not os.path.isdir(root):
        raise FileNotFoundError(f"ScanNet root {root!r} does not exist; expected {SCAN_LAYOUT}")
    scenes = sorted(d for d in os.listdir(root) if d.startswith("scene") and os.path.isdir(os.path.join(root, d)))
    if not scenes:
        raise FileNotFoundError(f"no scene* folders under {root!r}; expected {SCAN_LAYOUT}")
    if isinstance(label_map, (str, os.PathLike)):
        label_map = read_label_map(label_map)
    unknown = [c for c in classes if c not in SCANNET_CLASSES]
    if unknown:
        raise ValueError(f"unknown ScanNet classes {unknown}; choose from {SCANNET_CLASSES}")
    objects = [obj for scene in scenes
               for obj in scene_objects(os.path.join(root, scene), classes, num_points, min_points, seed, normals,
                                        label_map)]
    width = 6 if normals else 3
    points = np.stack([o.points for o in objects]) if objects else np.zeros([0, num_points, width], np.float32)
    return points, np.array([o.label for o in objects], np.int64), tuple(classes)
