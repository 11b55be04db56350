"""tf.data pipelines yielding (ts.ChannelSparseTensor, labels) batches for Keras `fit`, plus
the fixed train/validation splits (stratified, or balanced across the classes).

Index batches are shuffled by tf.data, then one tf.numpy_function per batch gathers the
clouds (or images), augments them and builds keys/values/dense_shape with the vectorised
NumPy code; a ChannelSparseTensor (an ExtensionType, so a valid tf.data element) is
assembled from them. The data stays in a NumPy closure, never in the graph. Augmentation
draws from a per-batch seed out of tf.data.Dataset.random, so runs are reproducible and
parallel map calls cannot reorder the random stream, yet every epoch differs.

Under tf.distribute, split=ReplicaSplit(...) makes the batches of some replicas instead:
each global batch of indices (the same on every host: same seed, same order) is cut into
one contiguous part per replica, in replica order, and this input pipeline yields the parts
of its replicas (strategy.distribute_datasets_from_function hands them out in that order).
"""
import dataclasses
import math
import numbers

import numpy as np
import tensorflow as tf

from tf_sparseconv.channel.tensor import ChannelSparseTensor
from tf_sparseconv.inputs import count_arg, int_attr
from tf_sparseconv.layer_config import bounds_pair, flag, real, whole
from tf_sparseconv.data.mnist import THRESHOLD, image_arrays
from tf_sparseconv.data.voxelize import num_channels, voxelize_arrays

# The up axis of the point clouds: z in ModelNet's OFF meshes (and so in
# modelnet40_train.npz, whose persons, bottles and doors are tallest along z) and in ScanNet.
UP_AXIS = 2
# Seeds go to NumPy's generators (non-negative) and tf.data (int64).
MAX_SEED = 2 ** 63 - 1


def _seed(seed, what):
    seed = int_attr(seed, "seed", what)
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{what}: seed must be in [0, 2^63 - 1], got {seed}")
    return seed


def _labels(labels, what, examples=None):
    """labels as int64 [M]: TypeError for non-integers (never truncated), ValueError for a
    negative label (no class) or another shape."""
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu" and not (labels.size == 0 and labels.dtype.kind == "f"):
        raise TypeError(f"{what}: labels must be integers (class indices), got dtype {labels.dtype}")
    if labels.ndim != 1:
        raise ValueError(f"{what}: labels must be one class index per example [M], got shape {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{what}: labels must be class indices >= 0, got {labels.min()}")
    return labels.astype(np.int64)


def stratified_split(labels, val_fraction=0.1, seed=0):
    """(train_idx, val_idx), both sorted: round(val_fraction * n_c) of each class c go to
    validation, chosen by a generator seeded from (seed, c), so the split is fixed."""
    labels = _labels(labels, "stratified_split")
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real) or not 0 <= val_fraction < 1:
        raise ValueError(f"stratified_split: val_fraction must be in [0, 1), got {val_fraction!r}")
    seed = _seed(seed, "stratified_split")
    classes = np.unique(labels)
    return _held_out_split(labels, {c: int(round(val_fraction * np.sum(labels == c))) for c in classes}, seed)


def balanced_split(labels, per_class, max_fraction=0.25, seed=0):
    """(train_idx, val_idx), both sorted: min(per_class[c], floor(max_fraction * n_c)) of each
    class c go to validation, so the large classes do not outweigh the others as they do in
    a stratified split, and a small class keeps most of its examples for training.

    per_class: one count for every class, or a sequence indexed by the label (e.g. the
    official test split's counts, data.modelnet40_test_counts). Examples are drawn as
    stratified_split draws them (the same per-class order), so the split is fixed by seed."""
    labels = _labels(labels, "balanced_split")
    if isinstance(max_fraction, bool) or not isinstance(max_fraction, numbers.Real) or not 0 < max_fraction < 1:
        raise ValueError(f"balanced_split: max_fraction must be in (0, 1), got {max_fraction!r}")
    seed = _seed(seed, "balanced_split")
    classes = np.unique(labels)
    counts = np.asarray(per_class)
    if counts.dtype.kind not in "iu":  # 1.7 would hold out 1, text fail in int()
        raise TypeError(f"balanced_split: per_class must be whole counts (integers), got {per_class!r}")
    if counts.ndim == 0:
        counts = np.full(int(classes.max()) + 1 if len(classes) else 0, int(counts))
    if len(classes) and (counts.ndim != 1 or len(counts) <= classes.max()):
        raise ValueError(f"per_class must be one count or one per class label (labels go up to {classes.max()}), "
                         f"got shape {counts.shape}")
    if (counts < 0).any():
        raise ValueError(f"per_class counts must be >= 0, got {counts.tolist()}")
    return _held_out_split(labels, {c: min(int(counts[c]), int(max_fraction * np.sum(labels == c)))
                                    for c in classes}, seed)


def _held_out_split(labels, val_counts, seed):
    """(train_idx, val_idx), sorted int64: the first val_counts[c] examples of class c in an
    order drawn from a generator seeded from (seed, c) go to validation."""
    val = [np.random.default_rng([seed, int(c)]).permutation(np.flatnonzero(labels == c))[:n]
           for c, n in val_counts.items()]
    val = np.sort(np.concatenate(val)) if val else np.zeros([0], np.int64)
    train = np.setdiff1d(np.arange(len(labels)), val)
    return train.astype(np.int64), val.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class ReplicaSplit:
    """Which parts of every global batch one input pipeline makes: replicas in all, and
    the `count` replicas from `first` on (one host's; count None: all from first). Of a global batch of n, replica r of
    R gets the next n // R examples, one more while r < n % R, so B / R each when R divides
    B, and the parts in replica order are the batch in order. A part that would be empty (a
    last batch smaller than R, without drop_remainder) gets the batch's first example with
    sample weight 0 instead, after all the batch's own: the ops take no empty batch, and
    every replica must run every step."""
    replicas: int
    first: int = 0
    count: int = None

    def __post_init__(self):
        for field in ("replicas", "first") + (() if self.count is None else ("count",)):
            object.__setattr__(self, field, int_attr(getattr(self, field), field, "ReplicaSplit"))
        if self.count is None:
            object.__setattr__(self, "count", self.replicas - self.first)
        if not (self.replicas >= 1 and self.count >= 1 and 0 <= self.first and self.first + self.count <= self.replicas):
            raise ValueError(f"ReplicaSplit needs 0 <= first < first + count <= replicas, got {self}")


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """Per-cloud random rotation about the up axis, mirroring, scale (one factor per cloud,
    or with anisotropic one per axis, which changes the shape's proportions as CAD models of
    one class differ) and Gaussian jitter. rotation_steps 0 draws any angle (within
    +-max_angle degrees where that is > 0: small turns of aligned data); N > 0 one of the N
    multiples of 360/N degrees (the views that voting over rotations-N averages)."""
    rotate_up: bool = True
    up_axis: int = UP_AXIS
    rotation_steps: int = 0
    mirror_axes: tuple = ()   # each axis here is negated in half of the clouds (for aligned data)
    scale_range: tuple = (0.85, 1.0)  # > 1 would push surfaces into the clipped border voxels
    anisotropic: bool = False  # a scale factor per axis instead of one per cloud
    jitter: float = 0.01      # std in unit-sphere units, clipped at 3 std
    max_angle: float = 0.0    # degrees; > 0: the turn about the up axis is uniform in [-max_angle, max_angle]

    def __post_init__(self):
        what = "Augmentation"
        flag(self.rotate_up, "rotate_up", what)
        flag(self.anisotropic, "anisotropic", what)
        whole(self.up_axis, "up_axis", what, 0, 2)
        whole(self.rotation_steps, "rotation_steps", what, 0)
        axes = self.mirror_axes
        if not isinstance(axes, (tuple, list)) or len(set(axes)) != len(axes):
            raise ValueError(f"{what}: mirror_axes must be a tuple of distinct axes in 0..2, got {axes!r}")
        for axis in axes:
            whole(axis, "mirror_axes entry", what, 0, 2)
        low, high = self.scale_range if isinstance(self.scale_range, (tuple, list)) and len(self.scale_range) == 2 \
            else (None, None)
        if not all(isinstance(b, numbers.Real) and not isinstance(b, bool) and math.isfinite(b) for b in (low, high)) \
                or not 0 < low <= high:
            raise ValueError(f"{what}: scale_range must be (low, high), two finite numbers with 0 < low <= high, "
                             f"got {self.scale_range!r}")
        real(self.jitter, "jitter", what, 0.0)
        real(self.max_angle, "max_angle", what, 0.0, 180.0)

    @classmethod
    def named(cls, mode):
        """One of NAMED_AUGMENTATIONS, the augmentations the training entry point offers."""
        if not isinstance(mode, str) or mode not in NAMED_AUGMENTATIONS:
            raise ValueError(f"augmentation must be one of {sorted(NAMED_AUGMENTATIONS)}, got {mode!r}")
        return NAMED_AUGMENTATIONS[mode]


# By name: 'rotate' (about z by any angle, for data in arbitrary orientations), 'rotate12'
# (about z by a multiple of 30 degrees, the views of --vote rotations-12), 'mirror' (x negated
# at random, for aligned data), 'scale' (scale and jitter only) or 'aniso' (each axis scaled
# by its own factor in [0.8, 1], PointNet++'s practice within the unit sphere) or 'turn10'
# (about z by at most 10 degrees either way: aligned data whose models tilt a little, against
# a network that learns the voxel grid's exact alignment); all of them scale and jitter.
NAMED_AUGMENTATIONS = {"rotate": Augmentation(), "rotate12": Augmentation(rotation_steps=12),
                       "mirror": Augmentation(rotate_up=False, mirror_axes=(0,)),
                       "scale": Augmentation(rotate_up=False),
                       "aniso": Augmentation(rotate_up=False, anisotropic=True, scale_range=(0.8, 1.0)),
                       "turn10": Augmentation(max_angle=10.0)}


def rotate_about_up(points, angles, up_axis=UP_AXIS):
    """Copy of clouds [B, N, 3 or 6] (float64) rotated by angles [B] (radians,
    counter-clockwise seen from above) about the up axis through the origin; normals
    (columns 3:6) turn with the points."""
    up_axis = whole(up_axis, "up_axis", "rotate_about_up", 0, 2)
    points = np.array(points, np.float64)
    angles = np.broadcast_to(np.asarray(angles, np.float64), [len(points)])
    cos, sin = np.cos(angles), np.sin(angles)
    a, b = [axis for axis in range(3) if axis != up_axis]
    rotation = np.tile(np.eye(3), (len(points), 1, 1))
    rotation[:, a, a], rotation[:, a, b], rotation[:, b, a], rotation[:, b, b] = cos, -sin, sin, cos
    points[..., :3] = np.einsum("bij,bnj->bni", rotation, points[..., :3])
    if points.shape[-1] >= 6:
        points[..., 3:6] = np.einsum("bij,bnj->bni", rotation, points[..., 3:6])
    return points


def augment_point_clouds(points, rng, augmentation=Augmentation()):
    """Augmented copy of clouds [B, N, 3 or 6]; normals (columns 3:6) are rotated and mirrored,
    not jittered, and turned as the surface turns under anisotropic scaling."""
    if not isinstance(augmentation, Augmentation):
        raise TypeError(f"augment_point_clouds: augmentation must be an Augmentation, got {augmentation!r}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"augment_point_clouds: rng must be a numpy.random.Generator, got {rng!r}")
    points = np.array(points, np.float64)
    if points.ndim != 3 or points.shape[-1] < 3:
        raise ValueError(f"augment_point_clouds: points must be clouds [B, N, 3 or 6], got shape {points.shape}")
    batch = len(points)
    if augmentation.rotate_up:
        steps = augmentation.rotation_steps
        if steps:
            angle = rng.integers(0, steps, batch) * (2 * np.pi / steps)
        elif augmentation.max_angle > 0:
            angle = np.radians(rng.uniform(-augmentation.max_angle, augmentation.max_angle, batch))
        else:
            angle = rng.uniform(0, 2 * np.pi, batch)
        points = rotate_about_up(points, angle, augmentation.up_axis)
    for axis in augmentation.mirror_axes:
        sign = np.where(rng.random(batch) < 0.5, -1.0, 1.0)[:, None]
        points[..., axis] *= sign
        if points.shape[-1] >= 6:
            points[..., 3 + axis] *= sign
    scale = rng.uniform(*augmentation.scale_range, (batch, 1, 3 if augmentation.anisotropic else 1))
    points[..., :3] *= scale
    if augmentation.anisotropic and points.shape[-1] >= 6:
        # normals turn by the inverse transpose of the scaling, then have unit length again
        normals = points[..., 3:6] / scale
        points[..., 3:6] = normals / np.maximum(np.linalg.norm(normals, axis=-1, keepdims=True), 1e-12)
    if augmentation.jitter > 0:
        sigma = augmentation.jitter
        points[..., :3] += np.clip(rng.normal(scale=sigma, size=points[..., :3].shape), -3 * sigma, 3 * sigma)
    return points.astype(np.float32)


def _replica_parts(batch_indices, batch_seed, split):
    """The parts of one global batch of indices that split's replicas train on, as a
    dataset of (indices, seed, sample weights); each part's seed is the batch's plus its
    replica index, so one replica (R = 1) draws what the unsplit pipeline draws."""
    n = tf.shape(batch_indices, out_type=tf.int64)[0]

    def part(i):
        r = split.first + i
        size, extra = n // split.replicas, n % split.replicas
        start = r * size + tf.minimum(r, extra)
        end = start + size + tf.cast(r < extra, tf.int64)
        empty = end <= start
        indices = tf.cond(empty, lambda: batch_indices[:1], lambda: batch_indices[start:end])
        weights = tf.fill(tf.shape(indices), tf.where(empty, 0.0, 1.0))
        return indices, batch_seed + r, weights

    return tf.data.Dataset.range(split.count).map(part)


def _sparse_batches(num_examples, batch_size, shuffle, seed, drop_remainder, make_batch, sample_shape, split=None,
                    what="the dataset"):
    """Dataset of (ChannelSparseTensor, labels) from make_batch(indices, batch_seed) ->
    (keys, values, dense_shape, labels) in NumPy; sample_shape is the static (R..., C).
    With split (a ReplicaSplit), the parts of each global batch of batch_size for its
    replicas; without drop_remainder they come with sample weights (0 on a filler)."""
    rank = len(sample_shape) + 1
    if num_examples == 0:
        raise ValueError("cannot build a dataset from 0 examples")
    batch_size = count_arg(batch_size, "batch_size", what)
    shuffle = flag(shuffle, "shuffle", what)
    drop_remainder = flag(drop_remainder, "drop_remainder", what)
    seed = _seed(seed, what)
    if split is not None and not isinstance(split, ReplicaSplit):
        raise TypeError(f"{what}: split must be a ReplicaSplit or None, got {split!r}")
    if split is not None and drop_remainder and batch_size % split.replicas:
        raise ValueError(f"the global batch size {batch_size} is not divisible by the {split.replicas} replicas")
    indices = tf.data.Dataset.range(num_examples)
    if shuffle:
        indices = indices.shuffle(num_examples, seed=seed, reshuffle_each_iteration=True)
    indices = indices.batch(batch_size, drop_remainder=drop_remainder)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    batches = tf.data.Dataset.zip(indices, seeds)
    batch_dim = batch_size if drop_remainder else None
    weighted = split is not None and not drop_remainder
    if split is not None:
        batches = batches.flat_map(lambda batch_indices, batch_seed: _replica_parts(batch_indices, batch_seed, split))
        batch_dim = batch_size // split.replicas if drop_remainder else None

    def assemble(batch_indices, batch_seed, weights=None):
        keys, values, dense_shape, labels = tf.numpy_function(
            make_batch, [batch_indices, batch_seed], [tf.int64, tf.float32, tf.int64, tf.int64], stateful=False)
        x = ChannelSparseTensor(tf.ensure_shape(keys, [None]), tf.ensure_shape(values, [None]),
                                tf.ensure_shape(dense_shape, [rank]), tf.TensorShape([batch_dim, *sample_shape]))
        if weighted:
            return x, tf.ensure_shape(labels, [batch_dim]), weights
        return x, tf.ensure_shape(labels, [batch_dim])

    return batches.map(assemble, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)


def point_cloud_dataset(points, labels, resolution, batch_size, *, features=("occupancy",), bounds=(-1.0, 1.0),
                        shuffle=True, augmentation=None, seed=0, drop_remainder=False, split=None):
    """Batches (ChannelSparseTensor [B, r, r, r, C], labels int64 [B]) of voxelized clouds.

    points: [M, N, 3 or 6] (columns 3:6 normals, for features containing "normals");
    augmentation: None or an Augmentation, applied before voxelizing; split: a
    ReplicaSplit (batch_size is then the global batch; see the module docstring).
    """
    what = "point_cloud_dataset"
    points = np.asarray(points)
    labels = _labels(labels, what)
    if points.ndim != 3 or len(points) != len(labels):
        raise ValueError(f"expected points [M, N, 3+] and labels [M], got {points.shape} and {labels.shape}")
    num_channels(features)  # fail on bad feature names now, not inside tf.data
    columns = 6 if "normals" in features else 3
    if points.dtype.kind not in "iuf" or points.shape[-1] < columns:
        raise ValueError(f"{what}: points must be numbers [M, N, {columns}+] (x, y, z{', nx, ny, nz' * (columns > 3)}"
                         f"{' for the normals feature' * (columns > 3)}), got {points.dtype} {points.shape}")
    resolution = whole(resolution, "resolution", what)
    bounds = bounds_pair(bounds, "bounds", what)
    if augmentation is not None and not isinstance(augmentation, Augmentation):
        raise TypeError(f"{what}: augmentation must be an Augmentation or None (Augmentation.named(name) for a named "
                        f"one), got {augmentation!r}")
    used = points[..., :columns]
    if not np.isfinite(used).all():
        raise ValueError(f"example {int(np.argmin(np.isfinite(used).all(axis=(1, 2))))} contains NaN or infinite "
                         "values")

    def make_batch(batch_indices, batch_seed):
        clouds = points[batch_indices]
        if augmentation is not None:
            clouds = augment_point_clouds(clouds, np.random.default_rng(int(batch_seed) % 2 ** 63), augmentation)
        keys, values, dense_shape = voxelize_arrays(clouds, resolution, bounds, features, np.float32)
        return keys, values, dense_shape, labels[batch_indices]

    sample_shape = (resolution, resolution, resolution, num_channels(features))
    return _sparse_batches(len(points), batch_size, shuffle, seed, drop_remainder, make_batch, sample_shape, split,
                           what)


def image_dataset(images, labels, batch_size, *, threshold=THRESHOLD, shuffle=True, seed=0, drop_remainder=False,
                  split=None):
    """Batches (ChannelSparseTensor [B, H, W, 1], labels int64 [B]) of thresholded uint8 images
    (split: as point_cloud_dataset's)."""
    what = "image_dataset"
    images = np.asarray(images)
    labels = _labels(labels, what)
    if images.ndim != 3 or len(images) != len(labels):
        raise ValueError(f"expected images [M, H, W] and labels [M], got {images.shape} and {labels.shape}")
    if images.dtype.kind not in "iuf" or 0 in images.shape[1:]:
        raise ValueError(f"{what}: images must be numbers [M, H, W] with H, W >= 1, got {images.dtype} {images.shape}")
    threshold = real(threshold, "threshold", what, 0.0)  # NaN dropped every pixel

    def make_batch(batch_indices, _batch_seed):
        keys, values, dense_shape = image_arrays(images[batch_indices], threshold, np.float32)
        return keys, values, dense_shape, labels[batch_indices]

    return _sparse_batches(len(images), batch_size, shuffle, seed, drop_remainder, make_batch,
                           (*images.shape[1:], 1), split, what)
