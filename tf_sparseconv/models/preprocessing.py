"""Layers that turn what users have (point clouds, images) into the sparse inputs of a
core network, inside the model, so a saved model takes raw data.

- PointCloudToSparse: points [B, N, 3 or 6] -> the channel-sparse dict [B, r, r, r, C],
  equal to tf_sparseconv.data.voxelize_arrays on the same (normalised) coordinates;
- VoxelizePoints: PointCloudToSparse for occupancy only, without normalisation;
- ImageToSparse: images [B, H, W] (0..255) -> the channel-sparse dict [B, H, W, 1], equal
  to tf_sparseconv.data.image_arrays.

normalize_unit_sphere and voxelize_point_tensor are the TensorFlow functions the layer
runs; tf_sparseconv.models.normalize_point_clouds runs the same normalisation on NumPy
arrays, so training data voxelized by NumPy gets exactly the keys the layer computes.
"""
import keras
import tensorflow as tf

from tf_sparseconv.channel.keras_io import as_keras_inputs
from tf_sparseconv.channel.tensor import ChannelSparseTensor
from tf_sparseconv.data.voxelize import num_channels
from tf_sparseconv.layer_config import FLOAT32_OR_64, MAX_EXTENT, bounds_pair, choice, dtype_policy, grid, real, whole
from tf_sparseconv.models.point_normals import check_neighbours, estimate_normals

NORMALIZATIONS = ("unit_sphere", "none")


def _assert_per_example(ok, template, *values):
    """An Assert op (InvalidArgumentError) whose message names the first example (cloud,
    image) failing `ok` [B]; template is a tf.strings.format template whose first {} is
    that example's index and whose further {} are its entries of `values` ([B] each)."""
    first = tf.argmin(tf.concat([tf.cast(ok, tf.int32), [1]], 0), output_type=tf.int64)  # B when all pass
    picked = [tf.gather(tf.concat([v, tf.zeros([1], v.dtype)], 0), first) for v in values]
    message = tf.strings.format(template, (first, *picked), summarize=-1)
    return tf.debugging.Assert(tf.reduce_all(ok), [message])


def _pairwise_sum(x):
    """Sum over the last axis, adding neighbours pairwise until one element is left.

    Elementwise adds in a fixed order: the same bits for every batch size and thread count,
    unlike a reduction whose order depends on the shape and the thread pool."""
    x = tf.pad(x, [[0, 0]] * (x.shape.rank - 1) + [[0, tf.maximum(1 - tf.shape(x)[-1], 0)]])

    def halve(x):
        x = tf.pad(x, [[0, 0]] * (x.shape.rank - 1) + [[0, tf.shape(x)[-1] % 2]])
        return (x[..., 0::2] + x[..., 1::2],)

    shape = x.shape[:-1].concatenate([None])
    (x,) = tf.while_loop(lambda x: tf.shape(x)[-1] > 1, halve, (x,), shape_invariants=(shape,))
    return x[..., 0]


def normalize_unit_sphere(points):
    """float32 clouds [B, N, K] -> float32 [B, N, K]: each cloud's xyz centred on its
    centroid and divided by the largest distance from it (as
    data.modelnet.normalize_to_unit_sphere; a cloud of one repeated point is only centred);
    columns 3: (normals) unchanged. Computed in float64, per cloud in a fixed order, so a
    cloud gets the same bits in any batch."""
    points = tf.convert_to_tensor(points, tf.float32)
    xyz = tf.cast(points[..., :3], tf.float64)
    n = tf.cast(tf.shape(points)[1], tf.float64)
    centroid = _pairwise_sum(tf.transpose(xyz, [0, 2, 1])) / n  # [B, 3]
    centred = xyz - centroid[:, None, :]
    squared = centred[..., 0] * centred[..., 0] + centred[..., 1] * centred[..., 1] + centred[..., 2] * centred[..., 2]
    radius = tf.sqrt(tf.reduce_max(squared, axis=1))  # max is exact in any order
    radius = tf.where(radius > 0, radius, tf.ones_like(radius))
    normalized = tf.cast(centred / radius[:, None, None], tf.float32)
    return tf.concat([normalized, points[..., 3:]], axis=-1)


def checked_shape(tensor, expected, what, described):
    """tensor, after Assert ops that refuse, when the graph runs, another rank than
    len(expected) and other extents where `expected` gives one (None: any): the signature
    of an exported model does not check the shapes it is fed. described: the shape in
    words for the message ("[B, N, 3] (x, y, z)")."""
    n = len(expected)
    shape = tf.shape(tensor)
    message = tf.strings.format(f"{what}: expected {described}, got shape {{}}", shape, summarize=-1)
    # The rank is read from the extents' values: the graph optimizer folds a Rank op (or the
    # Size of the shape) into the rank the signature declares. Extents are >= 0, so -1 marks
    # the end of the shape.
    padded = tf.concat([shape, tf.fill([n + 1], -1)], 0)[:n + 1]
    ok = tf.reduce_all(padded[:n] >= 0) & tf.equal(padded[n], -1)
    fixed = [(axis, extent) for axis, extent in enumerate(expected) if extent is not None]
    if fixed:
        ok &= tf.reduce_all(tf.equal(tf.gather(padded, [axis for axis, _ in fixed]), [e for _, e in fixed]))
    with tf.control_dependencies([tf.debugging.Assert(ok, [message])]):
        return tf.identity(tensor)


def _assert_batch_not_empty(tensor, what, items):
    # The sparse ops need at least one batch element; say so before they fail.
    return tf.debugging.Assert(tf.shape(tensor)[0] > 0, [f"{what}: empty batch (0 {items}); give at least one"])


def check_point_clouds(points, columns, what="PointCloudToSparse"):
    """Assert ops refusing an empty batch, clouds without points and NaN / infinite values
    in the first `columns` columns (InvalidArgumentError naming the cloud)."""
    used = points[..., :columns]
    has_points = tf.fill(tf.shape(points)[:1], tf.shape(points)[1] > 0)
    finite = tf.reduce_all(tf.math.is_finite(used), axis=[1, 2])
    kind = "coordinates or normals" if columns > 3 else "coordinates"
    return [_assert_batch_not_empty(points, what, "point clouds"),
            _assert_per_example(has_points, f"{what}: point cloud {{}} of the batch has no points"),
            _assert_per_example(finite, f"{what}: point cloud {{}} of the batch contains NaN or infinite {kind}; "
                                "remove those points")]


def voxelize_point_tensor(points, resolution, bounds=(-1.0, 1.0), features=("occupancy",), what="PointCloudToSparse"):
    """float32 clouds [B, N, 3+] -> ChannelSparseTensor [B, r, r, r, C] (float32 values).

    The same grid as data.voxelize_arrays (see there for the features): cells are
    floor((p - lo) * (r / (hi - lo))) in float64, so keys are bit-identical; a point on the
    upper bound goes to the last cell. Points outside [lo, hi] raise InvalidArgumentError
    naming the cloud (nothing is clipped into the border cells); so do NaN / infinite values,
    clouds without points and an empty batch.
    """
    features = tuple(features)
    channels = num_channels(features)
    r = int(resolution)
    lo, hi = float(bounds[0]), float(bounds[1])
    columns = 6 if "normals" in features else 3
    points = tf.convert_to_tensor(points, tf.float32)
    checks = check_point_clouds(points, columns, what)
    with tf.control_dependencies(checks):
        xyz = tf.cast(points[..., :3], tf.float64)
    low, high = tf.reduce_min(xyz, axis=[1, 2]), tf.reduce_max(xyz, axis=[1, 2])
    inside = (low >= lo) & (high <= hi)
    check = _assert_per_example(inside, f"{what}: point cloud {{}} of the batch has coordinates from {{}} to {{}}, "
                                f"outside the bounds [{lo:g}, {hi:g}]; use normalize='unit_sphere' (each cloud "
                                "centred and scaled into the unit sphere, as in training) or scale the points into "
                                "the bounds", low, high)
    with tf.control_dependencies([check]):
        shape = tf.shape(points, out_type=tf.int64)
    batch, n = shape[0], shape[1]
    scaled = tf.reshape((xyz - lo) * (r / (hi - lo)), [-1, 3])
    cells = tf.clip_by_value(tf.cast(tf.floor(scaled), tf.int64), 0, r - 1)
    spatial = r ** 3
    batch_of_point = tf.repeat(tf.range(batch), n)
    site = batch_of_point * spatial + (cells[:, 0] * r + cells[:, 1]) * r + cells[:, 2]
    dense_shape = tf.stack([batch, r, r, r, tf.constant(channels, tf.int64)])
    static = tf.TensorShape([None, r, r, r, channels])
    if features == ("occupancy",):  # one channel: key = b * r^3 + lin is the site itself
        keys = tf.sort(tf.unique(site).y)
        return ChannelSparseTensor(keys, tf.ones_like(keys, tf.float32), dense_shape, static)

    # Sites in order of first occurrence; sums over the points in their order, as np.bincount.
    sites, inverse = tf.unique(site, out_idx=tf.int64)
    num_sites = tf.shape(sites, out_type=tf.int64)[0]
    counts = tf.math.unsorted_segment_sum(tf.ones_like(site, tf.float64), inverse, num_sites)
    columns_out = []
    for feature in features:
        if feature == "occupancy":
            columns_out.append(tf.ones_like(counts))
        elif feature == "count":
            columns_out.append(counts)
        elif feature == "offset":
            local = scaled - (tf.cast(cells, tf.float64) + 0.5)  # voxel units from the centre
            columns_out.append(tf.clip_by_value(
                tf.math.unsorted_segment_sum(local, inverse, num_sites) / counts[:, None], -0.5, 0.5))
        else:
            normals = tf.reshape(tf.cast(points[..., 3:6], tf.float64), [-1, 3])
            columns_out.append(tf.math.unsorted_segment_sum(normals, inverse, num_sites) / counts[:, None])
    values = tf.cast(tf.concat([c if c.shape.rank == 2 else c[:, None] for c in columns_out], axis=1), tf.float32)
    b, lin = sites // spatial, sites % spatial
    keys = (b[:, None] * channels + tf.range(channels, dtype=tf.int64)) * spatial + lin[:, None]  # [sites, C]
    keys, values = tf.reshape(keys, [-1]), tf.reshape(values, [-1])
    nonzero = tf.not_equal(values, 0)  # zero feature values are not stored, as in voxelize_arrays
    keys, values = tf.boolean_mask(keys, nonzero), tf.boolean_mask(values, nonzero)
    order = tf.argsort(keys)  # canonical (b, c, lin) order; keys are unique
    return ChannelSparseTensor(tf.gather(keys, order), tf.gather(values, order), dense_shape, static)


def check_features(features):
    """features as a tuple of distinct names from FEATURE_CHANNELS (ValueError otherwise)."""
    features = (features,) if isinstance(features, str) else tuple(features)
    num_channels(features)
    return features


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class PointCloudToSparse(keras.layers.Layer):
    """Point clouds [B, N, 3] (or [B, N, 6] with unit normals in columns 3:6 when "normals"
    is a feature) -> the channel-sparse dict of as_keras_inputs, logical shape
    [B, r, r, r, C], inside the graph.

    Equal to tf_sparseconv.data.voxelize_arrays(normalize_point_clouds(points), resolution,
    bounds, features) (tf_sparseconv.models.normalize_point_clouds): the same keys, the
    same values to float32 rounding. Coordinates are taken as float32, the dtype of the
    model's input. Works for any batch size and number of points per cloud.

    normalize: "unit_sphere" centres each cloud on its centroid and scales its farthest
    point to radius 1 (bounds must contain [-1, 1]); "none" voxelizes the coordinates as
    given. Points outside `bounds`, NaN / infinite values and clouds without points raise
    InvalidArgumentError naming the cloud, an empty batch raises it too; nothing is clipped.
    So do another rank or number of columns, checked in the graph as well (the signature of
    an exported model does not check the shapes it is fed).
    points_per_cloud: the points per cloud the model was trained with; stored for tools
    that resample clouds before predicting (any N works).
    estimate_normals: None, or with the "normals" feature the neighbours per point k
    (3..256) from which the layer estimates each point's normal itself
    (models.point_normals.estimate_normals, after normalizing): the clouds are then
    [B, N, 3], as for data without normals.
    """

    def __init__(self, resolution, features=("occupancy",), normalize="unit_sphere", bounds=(-1.0, 1.0),
                 points_per_cloud=None, estimate_normals=None, **kwargs):
        super().__init__(**kwargs)
        what = self.name
        dtype_policy(self, FLOAT32_OR_64)  # float16 would round coordinates into other voxels than in training
        self.resolution = whole(resolution, "resolution", what, 1, MAX_EXTENT)
        try:
            self.features = check_features(features)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        grid((self.resolution,) * 3, num_channels(self.features), what)
        self.normalize = choice(normalize, "normalize", what, NORMALIZATIONS)
        lo, hi = bounds_pair(bounds, "bounds", what)
        if normalize == "unit_sphere" and not (lo <= -1.0 and hi >= 1.0):
            raise ValueError(f"{what}: normalize='unit_sphere' puts points anywhere in [-1, 1]; bounds {bounds} "
                             "must contain it")
        self.bounds = (lo, hi)
        self.points_per_cloud = None if points_per_cloud is None else whole(points_per_cloud, "points_per_cloud",
                                                                              what)
        self.estimate_normals = None
        if estimate_normals is not None:
            if "normals" not in self.features:
                raise ValueError(f"{what}: estimate_normals={estimate_normals!r} estimates the normals feature, "
                                 f"which features {list(self.features)} do not contain")
            self.estimate_normals = check_neighbours(estimate_normals, f"{what}: estimate_normals")
        self.supports_jit = False

    @property
    def channels(self):
        return num_channels(self.features)

    @property
    def columns(self):
        """Columns a cloud needs: x, y, z (and nx, ny, nz with the normals feature, unless
        the layer estimates them)."""
        return 6 if "normals" in self.features and self.estimate_normals is None else 3

    def call(self, points):
        points = tf.convert_to_tensor(points)
        described = f"points [B, N, {self.columns}] (x, y, z{', nx, ny, nz' * (self.columns > 3)})"
        if points.shape.rank != 3 or points.shape[-1] not in (None, self.columns):
            raise ValueError(f"{self.name}: expected {described}, got shape {points.shape}")
        points = checked_shape(tf.cast(points, tf.float32), [None, None, self.columns], self.name, described)
        if self.normalize == "unit_sphere" or self.estimate_normals is not None:
            # checked once before what cannot take NaN, empty clouds or an empty batch
            with tf.control_dependencies(check_point_clouds(points, self.columns, self.name)):
                points = tf.identity(points)
        if self.normalize == "unit_sphere":
            points = normalize_unit_sphere(points)
        if self.estimate_normals is not None:
            normals = tf.cast(estimate_normals(points, self.estimate_normals), tf.float32)
            points = tf.concat([points, normals], axis=-1)
        x = voxelize_point_tensor(points, self.resolution, self.bounds, self.features, self.name)
        return as_keras_inputs(x)

    def get_config(self):
        return {**super().get_config(), "resolution": self.resolution, "features": list(self.features),
                "normalize": self.normalize, "bounds": list(self.bounds), "points_per_cloud": self.points_per_cloud,
                "estimate_normals": self.estimate_normals}


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class VoxelizePoints(PointCloudToSparse):
    """A batch of point clouds [B, N, 3] -> occupancy [B, r, r, r, 1], inside the graph:
    PointCloudToSparse(resolution, features=("occupancy",), normalize="none", bounds).

    Coordinates are mapped from `bounds` onto r cells per axis; several points in one voxel
    make one entry of value 1. Points outside `bounds` raise InvalidArgumentError (they are
    not clipped into the border cells); PointCloudToSparse also normalises clouds and
    computes further features.
    """

    def __init__(self, resolution, bounds=(-1.0, 1.0), **kwargs):
        super().__init__(resolution, features=("occupancy",), normalize="none", bounds=bounds, **kwargs)

    def get_config(self):
        config = super().get_config()
        for key in ("features", "normalize", "points_per_cloud", "estimate_normals"):
            config.pop(key)
        return config



@keras.saving.register_keras_serializable(package="tf_sparseconv")
class ImageToSparse(keras.layers.Layer):
    """Images [B, H, W] with values 0..255 (uint8 or float) -> the channel-sparse dict
    [B, H, W, 1]: pixels >= threshold keep v / 255, the rest are dropped (MNIST, §4.2).

    Equal to tf_sparseconv.data.image_arrays(images, threshold). Values outside 0..255 or
    NaN raise InvalidArgumentError, and so do an empty batch and, checked in the graph,
    another rank or image size than the layer was built for. Images scaled to 0..1 are
    not detected: every pixel of them falls below the threshold.
    """

    def __init__(self, threshold=50, **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOAT32_OR_64)
        real(threshold, "threshold", self.name, 0, 255, low_open=True)
        self.threshold = threshold
        self.image_shape = None
        self.supports_jit = False

    def build(self, input_shape):
        if len(input_shape) != 3 or None in tuple(input_shape[1:]):
            raise ValueError(f"{self.name}: images must be [B, H, W] with H and W known, got shape {input_shape}")
        self.image_shape = tuple(int(s) for s in input_shape[1:])

    def call(self, images):
        images = tf.convert_to_tensor(images)
        if images.shape.rank != 3 or not images.shape[1:].is_fully_defined():
            raise ValueError(f"{self.name}: images must be [B, H, W] with H and W known, got shape {images.shape}")
        h, w = images.shape[1], images.shape[2]
        images = checked_shape(tf.cast(images, tf.float32), [None, h, w], self.name, f"images [B, {h}, {w}]")
        valid = tf.reduce_all((images >= 0) & (images <= 255), axis=[1, 2])  # False for NaN too
        checks = [_assert_batch_not_empty(images, self.name, "images"),
                  _assert_per_example(valid, f"{self.name}: image {{}} of the batch has values outside 0..255 (or "
                                      "NaN); give pixel values 0..255 as in training")]
        with tf.control_dependencies(checks):
            flat = tf.reshape(images, [-1])
        keys = tf.where(flat >= tf.cast(self.threshold, tf.float32))[:, 0]
        values = tf.gather(flat, keys) / tf.constant(255, tf.float32)
        dense_shape = tf.stack([tf.shape(images, out_type=tf.int64)[0], h, w, tf.constant(1, tf.int64)])
        return as_keras_inputs(ChannelSparseTensor(keys, values, dense_shape, tf.TensorShape([None, h, w, 1])))

    def get_config(self):
        return {**super().get_config(), "threshold": self.threshold}


__all__ = ["PointCloudToSparse", "VoxelizePoints", "ImageToSparse", "normalize_unit_sphere",
           "voxelize_point_tensor", "check_point_clouds", "checked_shape", "NORMALIZATIONS"]
