"""Point clouds and images from the files users have, for the predict and evaluate commands.

read_point_file: .off meshes (sampled by area), .ply (vertices, with normals when the file
has nx, ny, nz), .npy [N, 3+] or [M, N, 3+], .npz with `points` (uint8 arrays are the
quantised ModelNet form). read_image_file: .png, .npy [H, W] or [M, H, W], .npz with
`images`. Clouds come back as float32 [N, 3 or 6] (one cloud) or [M, N, 3 or 6] (several),
columns 3:6 being unit normals; images as uint8 or float32 [H, W] or [M, H, W].

.npy and .npz files are read without pickles: a file holding Python objects is refused,
since unpickling runs code from the file.
"""
import collections
import os
import zipfile
import zlib

import numpy as np

from tf_sparseconv.data.npz import NOT_UNPICKLED

POINT_SUFFIXES = (".off", ".ply", ".npy", ".npz")
IMAGE_SUFFIXES = (".png", ".npy", ".npz")
# Points sampled from a mesh when the caller does not say how many.
DEFAULT_MESH_POINTS = 1024

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def suffix(path):
    return os.path.splitext(os.fspath(path))[1].lower()


def check_readable(path, suffixes, what="file"):
    """FileNotFoundError / ValueError naming the path unless it is a readable file with one of suffixes."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such {what}")
    if os.path.isdir(path):
        raise ValueError(f"{path}: is a folder, expected a {what} ({', '.join(suffixes)})")
    if suffix(path) not in suffixes:
        raise ValueError(f"{path}: unsupported file type {suffix(path) or '(no extension)'!r}; "
                         f"expected one of {', '.join(suffixes)}")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None


def _array_header(stream, path, member=None):
    """(shape, dtype) from an .npy header, without reading the data."""
    where = f"{path}[{member}]" if member else path
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{where}: not a valid NumPy array ({e})") from None
    if dtype.hasobject:
        raise ValueError(f"{where}: holds Python objects (dtype {dtype}); {NOT_UNPICKLED}. Save plain arrays "
                         "(np.save / np.savez; text as np.array(names, dtype=str))")
    return tuple(shape), dtype


def npy_header(path):
    """(shape, dtype) of an .npy file; ValueError for anything else or an object array."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            raise ValueError(f"{path}: not a NumPy .npy file (no .npy header)")
        f.seek(0)
        return _array_header(f, path)


def npz_headers(path):
    """{name: (shape, dtype)} of an .npz archive's arrays, read from their headers only."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        if f.read(4) != _ZIP_MAGIC:
            raise ValueError(f"{path}: not a NumPy .npz archive (not a zip file); expected an archive written by "
                             "numpy.savez")
    try:
        with zipfile.ZipFile(path) as archive:
            headers = {}
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                with archive.open(member) as stream:
                    headers[member[:-4]] = _array_header(stream, path, member[:-4])
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable .npz archive ({e})") from None
    if not headers:
        raise ValueError(f"{path}: an archive without NumPy arrays, not an .npz file")
    return headers


def load_npy(path):
    npy_header(path)  # refuses object arrays and foreign files with a clear message
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{os.fspath(path)}: not a readable .npy file ({e})") from None


def load_npz(path, names):
    """{name: array} of the named arrays of an .npz; ValueError naming what is missing."""
    path = os.fspath(path)
    headers = npz_headers(path)
    missing = [n for n in names if n not in headers]
    if missing:
        raise ValueError(f"{path}: no array named {' or '.join(map(repr, missing))}; it holds {sorted(headers)}")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {n: data[n] for n in names}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable .npz archive ({e})") from None


def resample_points(cloud, num_points, rng):
    """num_points rows of cloud [N, C], without repetition when N >= num_points."""
    chosen = rng.choice(len(cloud), num_points, replace=len(cloud) < num_points)
    return cloud[chosen]


def as_clouds(array, path, centre=False):
    """float32 [N, 3 or 6] or [M, N, 3 or 6] from a numeric array; uint8 is the quantised ModelNet form.

    ValueError for a cloud the models cannot classify: values NaN, infinite or beyond
    float32's range, every point at one position, or coordinates so large (or so small) for
    the cloud's size that float32, which the models compute in, moves its points by more than
    1/32 of it (about a voxel of a 64^3 grid over the unit sphere).
    centre: move each cloud's centroid to the origin, in float64 before the cast to float32,
    for models that centre every cloud on its centroid themselves (normalize='unit_sphere'):
    a cloud far from the origin for its size, e.g. an object cut out of a georeferenced scan,
    then keeps its shape instead of being refused."""
    if array.ndim not in (2, 3) or array.shape[-1] < 3 or 0 in array.shape:
        raise ValueError(f"{path}: expected points [N, 3+] (one cloud) or [M, N, 3+] (several), x y z first, "
                         f"got shape {list(array.shape)}")
    if array.dtype == np.uint8:  # xyz = q / 255 * 2 - 1, as data.modelnet.load_modelnet_npz
        check_extent(array[..., :3], path)
        return array[..., :3].astype(np.float32) * np.float32(2 / 255) - np.float32(1)
    if array.dtype.kind not in "iuf":  # not bool, complex, text, dates or time spans (numpy's integers)
        raise ValueError(f"{path}: points must be numbers, got dtype {array.dtype}")
    columns = 6 if array.shape[-1] >= 6 else 3
    values = array[..., :columns]
    low, high = values.min(axis=-2).astype(np.float64), values.max(axis=-2).astype(np.float64)  # NaN propagates
    if not (np.abs(low) <= np.finfo(np.float32).max).all() or not (np.abs(high) <= np.finfo(np.float32).max).all():
        representable = np.isfinite(values) & (np.abs(values.astype(np.float64)) <= np.finfo(np.float32).max)
        bad = np.flatnonzero(~representable.reshape(-1, columns).all(axis=1))[0]
        raise ValueError(f"{path}: point {bad} contains NaN or infinite values, or values beyond float32's range")
    if centre:  # float64 keeps the shape of a cloud far from the origin; the model re-centres anyway
        xyz = values[..., :3].astype(np.float64)
        values = np.concatenate([xyz - xyz.mean(axis=-2, keepdims=True), values[..., 3:].astype(np.float64)], axis=-1)
    clouds = values.astype(np.float32)
    check_extent(values[..., :3], path, clouds)
    return clouds


def check_extent(xyz, path, clouds=None):
    """ValueError naming the first cloud of xyz [..., N, 3] whose points coincide, or, given
    clouds (xyz as float32), which float32 does not hold to 1/32 of its size: it rounds by up
    to 2^-24 of a value, and TensorFlow flushes values below its smallest normal to zero."""
    low, high = xyz.min(axis=-2).astype(np.float64), xyz.max(axis=-2).astype(np.float64)
    extent = np.atleast_1d((high - low).max(axis=-1))
    largest = np.atleast_1d(np.maximum(np.abs(low), np.abs(high)).max(axis=-1))
    tiny = np.finfo(np.float32).tiny
    for i in np.flatnonzero((extent == 0) | (largest * 2.0 ** -24 + tiny > extent / 32)):  # the bound settles most
        cloud = xyz[i] if xyz.ndim == 3 else xyz
        where = f"{path}[{i}]" if xyz.ndim == 3 else path
        if extent[i] == 0:
            points = "a single point" if len(cloud) == 1 else f"{len(cloud)} points all at one position"
            raise ValueError(f"{where}: {points}, a cloud without a shape to classify")
        if clouds is None:
            continue
        rounded = (clouds[i] if xyz.ndim == 3 else clouds)[..., :3].astype(np.float64)
        rounded[np.abs(rounded) < tiny] = 0
        moved = np.abs(rounded - cloud).max()
        if moved > extent[i] / 32:
            raise ValueError(f"{where}: coordinates up to {largest[i]:.3g} for a cloud {extent[i]:.3g} across: "
                             f"float32, which the model computes in, moves its points by up to {moved:.3g}, more "
                             "than 1/32 of its size; centre the cloud (subtract its mean) or scale it")


def npz_class_names(classes, path):
    """The names of an .npz's classes array [C], as strings; ValueError unless it is one
    distinct name per label value."""
    if classes.ndim != 1:
        raise ValueError(f"{path}: classes must be the class names [C], one per label value, got an array of shape "
                         f"{list(classes.shape)}")
    names = tuple(str(c) for c in classes)
    twice = sorted(c for c, n in collections.Counter(names).items() if n > 1)
    if twice:
        raise ValueError(f"{path}: classes names {', '.join(map(repr, twice))} more than once; each label value "
                         "needs its own name")
    return names


def _ply_cloud(path):
    from tf_sparseconv.data.scannet import read_ply

    vertex = read_ply(path).get("vertex", {})
    if not {"x", "y", "z"} <= set(vertex):
        raise ValueError(f"{path}: PLY has no vertex element with x, y, z properties")
    names = ["x", "y", "z"] + (["nx", "ny", "nz"] if {"nx", "ny", "nz"} <= set(vertex) else [])
    return np.stack([vertex[n] for n in names], 1)


def read_point_file(path, num_points=None, seed=0, centre=False):
    """The point cloud(s) of one file: float32 [N, 3 or 6] for one cloud, [M, N, 3 or 6] for several.

    num_points: resample every cloud to this many points (seeded by seed, the file name and
    the cloud's index; without repetition when a cloud has enough), or for .off meshes the
    points to sample (default DEFAULT_MESH_POINTS). Meshes are sampled with their face
    normals and scaled into the unit sphere, as data.modelnet.load_modelnet_meshes does;
    the other formats keep their coordinates, or with centre (as_clouds) their shapes about
    each cloud's centroid.
    """
    from tf_sparseconv.data.modelnet import mesh_point_cloud

    path = os.fspath(path)
    check_readable(path, POINT_SUFFIXES, "point file")
    kind = suffix(path)
    file_seed = zlib.crc32(os.path.basename(path).encode())
    if kind == ".off":
        rng = np.random.default_rng([seed, file_seed])
        return mesh_point_cloud(path, num_points or DEFAULT_MESH_POINTS, rng, normals=True)
    if kind == ".ply":
        clouds = as_clouds(_ply_cloud(path), path, centre)
    elif kind == ".npy":
        clouds = as_clouds(load_npy(path), path, centre)
    else:
        clouds = as_clouds(load_npz(path, ["points"])["points"], path, centre)
    if num_points is None or clouds.shape[-2] == num_points:
        return clouds
    if clouds.ndim == 2:
        return resample_points(clouds, num_points, np.random.default_rng([seed, file_seed, 0]))
    return np.stack([resample_points(c, num_points, np.random.default_rng([seed, file_seed, i]))
                     for i, c in enumerate(clouds)])


def read_image_file(path):
    """The image(s) of one file: [H, W] for one image, [M, H, W] for several (values 0..255).

    PNG files are converted to 8-bit grey; .npy holds [H, W] or [M, H, W]; .npz an `images` array.
    """
    path = os.fspath(path)
    check_readable(path, IMAGE_SUFFIXES, "image file")
    kind = suffix(path)
    if kind == ".png":
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(path) as image:
                images = np.asarray(image.convert("L"), np.uint8)
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise ValueError(f"{path}: not a readable PNG image ({e})") from None
    elif kind == ".npy":
        images = load_npy(path)
    else:
        images = load_npz(path, ["images"])["images"]
    if images.ndim not in (2, 3) or 0 in images.shape:
        raise ValueError(f"{path}: expected an image [H, W] or images [M, H, W], got shape {list(images.shape)}")
    if images.dtype != np.uint8:
        if images.dtype.kind not in "iuf":  # not bool, complex, text, dates or time spans (numpy's integers)
            raise ValueError(f"{path}: images must be numbers 0..255, got dtype {images.dtype}")
        if not np.isfinite(images).all() or images.min() < 0 or images.max() > 255:  # before float32 rounds them
            raise ValueError(f"{path}: image values must lie in 0..255 (as MNIST's), got "
                             f"{np.nanmin(images):g}..{np.nanmax(images):g}")
        images = images.astype(np.float32)
    return images
