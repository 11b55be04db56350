"""An embedded 3-D shape classification set that needs no download: surface point clouds of
eight primitive classes under random rotation, anisotropic scaling, partial occlusion, size
and noise.

Anisotropy and occlusion keep it from being trivial (a sphere becomes an ellipsoid, close to
a capsule; a short cylinder approaches a disc, a flat box a plane patch; a cut cone looks
like a cut tetrahedron), while the surfaces stay distinct enough at 16^3-32^3 to be learnable
(docs/channel.md, "Data", gives baselines).
Every shape is a pure function of (seed, class, index), so the set is identical on every machine.
"""
import numpy as np

from tf_sparseconv.data.modelnet import normalize_to_unit_sphere, sample_surface
from tf_sparseconv.inputs import count_arg
from tf_sparseconv.layer_config import flag, real

SHAPE_CLASSES = ("sphere", "cube", "cylinder", "cone", "torus", "tetrahedron", "plane", "capsule")


def _unit_vectors(n, rng):
    v = rng.normal(size=(n, 3))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _outward(points, normals):
    # Convex solids around the origin: the outward normal points away from it.
    flip = np.sum(points * normals, axis=1) < 0
    normals[flip] *= -1
    return points, normals


def _sphere(n, rng):
    d = _unit_vectors(n, rng)
    return d, d.copy()


def _cube(n, rng):
    corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float64)
    quads = [(0, 1, 3, 2), (4, 5, 7, 6), (0, 1, 5, 4), (2, 3, 7, 6), (0, 2, 6, 4), (1, 3, 7, 5)]
    triangles = np.array([t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))])
    return _outward(*sample_surface(corners, triangles, n, rng))


def _disc(n, radius, rng):
    r = radius * np.sqrt(rng.random(n))
    t = 2 * np.pi * rng.random(n)
    return np.stack([r * np.cos(t), r * np.sin(t), np.zeros(n)], 1)


def _cylinder(n, rng):
    radius, height = rng.uniform(0.4, 1.0), rng.uniform(0.6, 2.0)
    side = rng.random(n) < height / (height + radius)  # side 2*pi*r*h vs caps 2*pi*r^2
    t = 2 * np.pi * rng.random(n)
    points = np.stack([radius * np.cos(t), radius * np.sin(t), height * (rng.random(n) - 0.5)], 1)
    normals = np.stack([np.cos(t), np.sin(t), np.zeros(n)], 1)
    caps = ~side
    top = rng.random(n) < 0.5
    points[caps] = _disc(caps.sum(), radius, rng)
    points[caps, 2] = np.where(top[caps], height / 2, -height / 2)
    normals[caps] = 0
    normals[caps, 2] = np.where(top[caps], 1.0, -1.0)
    return points, normals


def _cone(n, rng):
    radius, height = rng.uniform(0.5, 1.0), rng.uniform(0.8, 2.0)
    slant = np.hypot(radius, height)
    lateral = rng.random(n) < slant / (slant + radius)  # lateral pi*r*s vs base pi*r^2
    t = 2 * np.pi * rng.random(n)
    s = np.sqrt(rng.random(n))  # distance from the apex, uniform by area
    points = np.stack([s * radius * np.cos(t), s * radius * np.sin(t), height * (1 - s)], 1)
    normals = np.stack([height * np.cos(t), height * np.sin(t), np.full(n, radius)], 1) / slant
    base = ~lateral
    points[base] = _disc(base.sum(), radius, rng)
    normals[base] = [0, 0, -1]
    return points, normals


def _torus(n, rng):
    major, minor = 1.0, rng.uniform(0.2, 0.5)
    # Area element (R + r cos v): rejection-sample v against its maximum.
    v = np.empty(0)
    while len(v) < n:
        candidates = 2 * np.pi * rng.random(2 * n)
        keep = rng.random(2 * n) * (major + minor) < major + minor * np.cos(candidates)
        v = np.concatenate([v, candidates[keep]])
    v = v[:n]
    u = 2 * np.pi * rng.random(n)
    normals = np.stack([np.cos(v) * np.cos(u), np.cos(v) * np.sin(u), np.sin(v)], 1)
    centre = np.stack([major * np.cos(u), major * np.sin(u), np.zeros(n)], 1)
    return centre + minor * normals, normals


def _tetrahedron(n, rng):
    corners = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], np.float64)
    triangles = np.array([[0, 1, 2], [0, 1, 3], [0, 2, 3], [1, 2, 3]])
    return _outward(*sample_surface(corners, triangles, n, rng))


def _plane(n, rng):
    points = np.stack([rng.uniform(-1, 1, n), rng.uniform(-1, 1, n) * rng.uniform(0.5, 1.0), np.zeros(n)], 1)
    return points, np.tile([0.0, 0.0, 1.0], (n, 1))


def _capsule(n, rng):
    radius, half_length = rng.uniform(0.3, 0.6), rng.uniform(0.4, 1.0)
    side = rng.random(n) < half_length / (half_length + radius)  # side 4*pi*r*L vs caps 4*pi*r^2
    t = 2 * np.pi * rng.random(n)
    normals = np.stack([np.cos(t), np.sin(t), np.zeros(n)], 1)
    points = radius * normals + np.stack([np.zeros(n), np.zeros(n), half_length * rng.uniform(-1, 1, n)], 1)
    caps = ~side
    d = _unit_vectors(caps.sum(), rng)
    normals[caps] = d
    points[caps] = radius * d + np.stack([np.zeros(len(d)), np.zeros(len(d)), np.sign(d[:, 2]) * half_length], 1)
    return points, normals


_SAMPLERS = dict(zip(SHAPE_CLASSES, (_sphere, _cube, _cylinder, _cone, _torus, _tetrahedron, _plane, _capsule)))


def random_rotation(rng):
    """A rotation matrix uniform on SO(3) (from a uniform unit quaternion)."""
    w, x, y, z = _unit_quaternion(rng)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def _unit_quaternion(rng):
    q = rng.normal(size=4)
    return q / np.linalg.norm(q)


def make_shape(name, num_points, rng, anisotropy=0.5, occlusion=0.3, scale_range=(0.6, 1.0), noise=0.01,
               normals=False):
    """[num_points, 3 or 6] float32: one primitive, posed, stretched, partly cut away, sized and noised.

    anisotropy: per-axis stretch factors are drawn from [1 - anisotropy, 1]. occlusion: up to
    this fraction of the surface, beyond a random plane, is missing (as in a partial scan).
    """
    oversampled = int(np.ceil(num_points / (1 - occlusion))) + 1
    points, point_normals = _SAMPLERS[name](oversampled, rng)
    # Samplers emit points in random order, so the first num_points kept ones are a uniform sample.
    depth = points @ _unit_vectors(1, rng)[0]
    kept = depth <= np.quantile(depth, 1 - rng.uniform(0, occlusion))
    points, point_normals = points[kept][:num_points], point_normals[kept][:num_points]
    stretch = rng.uniform(1 - anisotropy, 1.0, 3)
    rotation = random_rotation(rng)
    points = normalize_to_unit_sphere(points * stretch @ rotation.T) * rng.uniform(*scale_range)
    points += rng.normal(scale=noise, size=points.shape)
    if not normals:
        return points.astype(np.float32)
    # Normals transform with the inverse transpose of the stretch.
    point_normals = (point_normals / stretch) @ rotation.T
    point_normals /= np.linalg.norm(point_normals, axis=1, keepdims=True)
    return np.concatenate([points, point_normals], 1).astype(np.float32)


def make_shapes(num_per_class, num_points=1024, seed=0, classes=SHAPE_CLASSES, normals=False, noise=0.01,
                anisotropy=0.5, occlusion=0.3):
    """(points float32 [M, N, 3 or 6], labels int64 [M], classes): num_per_class shapes of each
    class in a seeded random order. Shape j of class c depends only on (seed, c, j)."""
    what = "make_shapes"
    classes = (classes,) if isinstance(classes, str) else tuple(classes)
    unknown = [c for c in classes if not isinstance(c, str) or c not in _SAMPLERS]
    if unknown:
        raise ValueError(f"unknown shape classes {unknown}; choose from {SHAPE_CLASSES}")
    if not classes or len(set(classes)) != len(classes):
        raise ValueError(f"{what}: classes must be distinct names, at least one, got {classes}")
    num_per_class = count_arg(num_per_class, "num_per_class", what, 0)
    num_points = count_arg(num_points, "num_points", what)
    seed = count_arg(seed, "seed", what, 0)  # NumPy's generators take no negative seed
    normals = flag(normals, "normals", what)
    noise = real(noise, "noise", what, 0.0)
    anisotropy = real(anisotropy, "anisotropy", what, 0.0, 1.0, high_open=True)  # 1 or more: stretches of <= 0
    occlusion = real(occlusion, "occlusion", what, 0.0, 1.0, high_open=True)  # 1: nothing left
    clouds, labels = [], []
    for label, name in enumerate(classes):
        for j in range(num_per_class):
            rng = np.random.default_rng([seed, SHAPE_CLASSES.index(name), j])
            clouds.append(make_shape(name, num_points, rng, anisotropy=anisotropy, occlusion=occlusion, noise=noise,
                                     normals=normals))
            labels.append(label)
    order = np.random.default_rng(seed).permutation(len(labels))
    width = 6 if normals else 3
    points = np.stack(clouds)[order] if clouds else np.zeros([0, num_points, width], np.float32)
    return points, np.array(labels, np.int64)[order], classes
