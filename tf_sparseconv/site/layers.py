"""The site layers around the convolutions and pooling: the ways in (SiteVoxelize from
point clouds, SparseToSite from a channel-sparse batch) and out (SiteToPoints), density-
bounded selection (SiteSelect), any Keras layer on the feature rows (SiteFeatures: batch
norm, activations, dropout, dense) and merges at equal sites (SiteConcat, SiteAdd).
"""
import numbers

import keras
import tensorflow as tf

from tf_sparseconv.channel.keras_io import from_keras_inputs, logical_shape
from tf_sparseconv.geometry import int_or_ints
from tf_sparseconv.layer_config import (FLOAT32_OR_64, FLOATS, MAX_EXTENT, bounds_pair, choice, dtype_policy,
                                         flag, whole)
from tf_sparseconv.site.conversions import REDUCTIONS, from_channel_sparse, voxelize_sites
from tf_sparseconv.site.keras_io import (SiteLayer, as_site_keras_inputs, from_site_keras_inputs, site_dict_from,
                                         site_shapes)
from tf_sparseconv.site.select import select_sites
from tf_sparseconv.site.tensor import SiteSparseTensor


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteSelect(SiteLayer):
    """Density-bounded sites: per batch element keep the k sites with the largest feature
    norm (ties to the lower row, order kept), so at most batch_size * k sites go on
    whatever the input. Cached maps are dropped (they index the sites before selection):
    the levels after a SiteSelect use new indice_keys."""

    def __init__(self, k, **kwargs):
        super().__init__(**kwargs)
        self.k = whole(k, "k", self.name)

    def site_call(self, x, training=None):
        return select_sites(x, self.k)

    def get_config(self):
        return {**super().get_config(), "k": self.k}


# Keras layers that map each row on its own, so keep the row count whatever it is: SiteFeatures
# adds no run-time row check around them (a traced site network wraps dozens; the check is
# half a dozen host ops each).
ROW_WISE_LAYERS = (keras.layers.BatchNormalization, keras.layers.ReLU, keras.layers.LeakyReLU, keras.layers.ELU,
                   keras.layers.PReLU, keras.layers.Activation, keras.layers.Dense, keras.layers.Dropout,
                   keras.layers.LayerNormalization, keras.layers.Softmax, keras.layers.Identity)


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteFeatures(SiteLayer):
    """Applies a Keras layer to the feature rows [N, C] of the sites (batch norm, ReLU,
    dropout, Dense, ...); the sites and their maps stay. The layer must keep the row
    count."""

    def __init__(self, layer, **kwargs):
        super().__init__(**kwargs)
        if isinstance(layer, dict):
            layer = keras.saving.deserialize_keras_object(layer)
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(f"{self.name}: SiteFeatures wraps a keras.layers.Layer, got {type(layer).__name__}")
        self.layer = layer

    def build(self, input_shape):
        _, channels = site_shapes(input_shape, self.name)
        if not self.layer.built:
            self.layer.build((None, channels))

    def site_call(self, x, training=None):
        features = self.layer(x.features, training=training)
        message = f"{self.name}: the wrapped layer {self.layer.name} must map [N, C] rows to [N, C'] rows"
        if features.shape.rank != 2 or (features.shape[0] is not None and x.features.shape[0] is not None
                                        and features.shape[0] != x.features.shape[0]):
            raise ValueError(f"{message}, got shape {features.shape} from {x.features.shape}")
        if (features.shape[0] is None or x.features.shape[0] is None) and not isinstance(self.layer, ROW_WISE_LAYERS):
            # traced: the row counts are known when run
            check = tf.debugging.assert_equal(tf.shape(features)[0], tf.shape(x.features)[0],
                                              message=f"{message} (row counts differ)")
            with tf.control_dependencies([check]):
                features = tf.identity(features)
        return x.with_features(features)

    def get_config(self):
        return {**super().get_config(), "layer": keras.saving.serialize_keras_object(self.layer)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        layer = keras.saving.deserialize_keras_object(config.pop("layer"))
        return cls(layer, **config)


def _batch_token(site):
    """What carries the batch size of a site dict (its token) or SiteSparseTensor."""
    return site.batch_size if isinstance(site, SiteSparseTensor) else site["batch_size"]


class _SiteMerge(SiteLayer):
    """Merges site tensors with the same sites (the same coordinates in the same order,
    e.g. a skip connection and the inverse convolution back onto its sites); their maps
    are united."""

    def __init__(self, validate=True, **kwargs):
        super().__init__(**kwargs)
        self.validate = flag(validate, "validate", self.name)

    def build(self, input_shape):
        if not isinstance(input_shape, (list, tuple)) or len(input_shape) < 2:
            raise ValueError(f"{self.name} takes a list of at least two site dicts")
        shapes = [site_shapes(s, self.name)[0] for s in input_shape]
        if any(s != shapes[0] for s in shapes):
            raise ValueError(f"{self.name}: the inputs have different spatial shapes {shapes}")

    def call(self, inputs, training=None):
        xs = [from_site_keras_inputs(i) for i in inputs]
        first = xs[0]
        checks = []
        if self.validate:
            for i, other in enumerate(xs[1:], 1):
                # The merged tensor keeps input 0's batch size. Along a model the inputs share one
                # batch-size token (the layers pass it on), which needs no check.
                if _batch_token(inputs[i]) is not _batch_token(inputs[0]):
                    checks.append(tf.debugging.assert_equal(
                        other.batch_size, first.batch_size,
                        message=f"{self.name}: input {i} has another batch size than input 0"))
                if other.coords is first.coords:
                    continue
                count = tf.debugging.assert_equal(
                    tf.shape(other.coords), tf.shape(first.coords),
                    message=f"{self.name}: input {i} has other sites than input 0 (site counts differ)")
                with tf.control_dependencies([count]):
                    checks.append(tf.debugging.assert_equal(
                        other.coords, first.coords,
                        message=f"{self.name}: input {i} has other sites than input 0 (coordinates differ)"))
        with tf.control_dependencies(checks):
            features = self.merge([tf.identity(x.features) if checks else x.features for x in xs])
        maps = {}
        for x in reversed(xs):
            maps.update(x.kernel_maps)
        y = SiteSparseTensor(first.coords, features, first.spatial_shape, first.batch_size, maps,
                             first.static_spatial_shape)
        return site_dict_from(y, list(zip(inputs, xs)))

    def get_config(self):
        return {**super().get_config(), "validate": self.validate}


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteConcat(_SiteMerge):
    """Concatenates the feature rows of site tensors at equal sites (U-Net skips)."""

    def merge(self, features):
        return tf.concat(features, axis=1)


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteAdd(_SiteMerge):
    """Adds the feature rows of site tensors at equal sites (residual connections)."""

    def build(self, input_shape):
        super().build(input_shape)
        channels = {site_shapes(s, self.name)[1] for s in input_shape}
        if len(channels) > 1:
            raise ValueError(f"{self.name}: the inputs have different channel counts {sorted(channels)}")

    def merge(self, features):
        return tf.add_n(features)


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteVoxelize(keras.layers.Layer):
    """A batch of point clouds [B, N, d + F] -> sites, inside the graph.

    The first d columns (d = len(resolution), 3 for an int) are coordinates, mapped from
    `bounds` (lo, hi) — two floats or two per-axis sequences — onto resolution cells per
    axis; with clip=True points outside land in the border cells (as VoxelizePoints
    does), otherwise they are dropped. Points with a non-finite coordinate are dropped
    (use NaN to pad clouds of fewer points). Site features: a 1 (occupancy) followed by
    the F further columns reduced over the voxel's points ('mean', 'max' or 'first').
    return_point_map=True also returns point_to_site [B, N] int32 (the site row of each
    point, -1 for dropped points), for SiteToPoints.
    """

    def __init__(self, resolution, bounds=(-1.0, 1.0), reduction="mean", clip=True, return_point_map=False,
                 **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOAT32_OR_64)  # float16 would round coordinates into other voxels
        resolution = int_or_ints(resolution, "resolution", self.name)
        self.resolution = (resolution,) * 3 if isinstance(resolution, int) else tuple(resolution)
        if not 1 <= len(self.resolution) <= 4 or any(not 1 <= r <= MAX_EXTENT for r in self.resolution):
            raise ValueError(f"{self.name}: resolution must be 1 to 4 entries in [1, {MAX_EXTENT}], got {resolution}")
        d = len(self.resolution)
        try:
            lo, hi = bounds
        except (TypeError, ValueError):
            raise ValueError(f"{self.name}: bounds must be (lo, hi), each a number or one per axis, "
                             f"got {bounds!r}") from None
        per_axis = [_as_tuple_float(b, d, self.name) for b in (lo, hi)]
        self.bounds = tuple(zip(*(bounds_pair(pair, "bounds", self.name) for pair in zip(*per_axis))))
        self.reduction = choice(reduction, "reduction", self.name, REDUCTIONS)
        self.clip = flag(clip, "clip", self.name)
        self.return_point_map = flag(return_point_map, "return_point_map", self.name)
        self.supports_jit = False

    def call(self, points):
        points = tf.convert_to_tensor(points)
        if not (points.dtype.is_floating or points.dtype.is_integer):  # a complex cast would drop the imaginary part
            raise TypeError(f"{self.name}: points must be real numbers, got {points.dtype.name}")
        if not points.dtype.is_floating:
            points = tf.cast(points, tf.float32)
        d = len(self.resolution)
        if points.shape.rank != 3 or points.shape[-1] is None or points.shape[-1] < d:
            raise ValueError(f"{self.name}: points must be [B, N, {d} + F] with a known last dimension, got "
                             f"shape {points.shape}")
        shape = tf.shape(points)
        batch, n = shape[0], shape[1]
        flat = tf.reshape(points, [-1, points.shape[-1]])
        xyz = flat[:, :d]
        lo = tf.constant(self.bounds[0], points.dtype)
        hi = tf.constant(self.bounds[1], points.dtype)
        voxel = (hi - lo) / tf.constant(self.resolution, points.dtype)
        if self.clip:
            xyz = tf.clip_by_value(xyz, lo, hi - voxel / 2)  # NaN rows (padding) stay NaN
        features = tf.concat([tf.ones_like(flat[:, :1]), flat[:, d:]], axis=1)
        sites, point_to_site = voxelize_sites(xyz, voxel, self.resolution, tf.repeat(tf.range(batch), n), batch,
                                              features, origin=lo, reduction=self.reduction, non_finite="drop")
        out = as_site_keras_inputs(sites)
        if self.return_point_map:
            return out, tf.reshape(point_to_site, [batch, n])
        return out

    def get_config(self):
        return {**super().get_config(), "resolution": self.resolution, "bounds": self.bounds,
                "reduction": self.reduction, "clip": self.clip, "return_point_map": self.return_point_map}


def _as_tuple_float(value, d, name):
    if isinstance(value, numbers.Real):
        return (value,) * d
    try:
        values = tuple(value)
    except TypeError:
        raise ValueError(f"{name}: bounds need a number or one number per axis ({d}), got {value!r}") from None
    if len(values) != d:
        raise ValueError(f"{name}: bounds need one value per axis ({d}), got {value}")
    return values


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteToPoints(keras.layers.Layer):
    """[sites, point_to_site [B, N]] -> per-point rows [B, N, C] (the feature row of each
    point's site; zeros for points that were dropped), e.g. per-point logits of a
    segmentation network on SiteVoxelize(return_point_map=True) sites."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOATS)
        self.supports_jit = False

    def call(self, inputs):
        if not isinstance(inputs, (list, tuple)) or len(inputs) != 2:
            raise TypeError(f"{self.name}: SiteToPoints takes [sites, point_to_site] (the site dict and the [B, N] "
                            f"site rows SiteVoxelize(return_point_map=True) returns), got {type(inputs).__name__}")
        sites, point_to_site = inputs
        x = from_site_keras_inputs(sites)
        point_to_site = tf.convert_to_tensor(point_to_site)
        if not point_to_site.dtype.is_integer:
            raise TypeError(f"{self.name}: point_to_site must hold integer site rows (-1 for dropped points), got "
                            f"{point_to_site.dtype.name}")
        # A row outside [-1, sites) would be an error of tf.gather on the CPU and a zero row on the GPU.
        wide = tf.cast(point_to_site, tf.int64)
        check = tf.debugging.assert_equal(
            tf.reduce_all((wide >= -1) & (wide < tf.shape(x.features, out_type=tf.int64)[0])), True,
            message=f"{self.name}: point_to_site holds rows outside [-1, number of sites)")
        with tf.control_dependencies([check]):
            index = tf.cast(wide, tf.int32) + 1
        padded = tf.pad(x.features, [[1, 0], [0, 0]])  # row 0: the dropped points' zeros, also without sites
        return tf.gather(padded, index)


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseToSite(keras.layers.Layer):
    """The channel-sparse dict -> the site dict of as_site_keras_inputs: one site per
    position with a stored entry, its C values as the feature row (what training feeds a
    site-sparse core, tf_sparseconv.training.train.site_keras_batches)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOAT32_OR_64)  # the channel ops' dtypes
        self.supports_jit = False

    def call(self, inputs):
        x = from_keras_inputs(inputs)
        sites = from_channel_sparse(x)
        return as_site_keras_inputs(sites.with_features(tf.ensure_shape(sites.features, [None, x.shape[-1]])))

    def build(self, input_shape):
        logical_shape(input_shape)  # refuses anything but the channel-sparse dict
