"""Keras 3 layers over the site-sparse ops (TensorFlow backend).

Between layers a SiteSparseTensor is the dict of keras_io.py; models start from
site_input, SiteVoxelize (point clouds) or SparseToSite (a channel-sparse batch) and
leave through SiteGlobalPool (dense [B, C]), SiteToPoints (per-point rows) or the
"features" entry of a site dict (per-site rows). Submanifold, strided, transposed and inverse convolutions follow spconv 2.x
(SubMConv, SparseConv, SparseConvTranspose, SparseInverseConv), with kernel maps cached
under indice_key exactly as the ops cache them. Batch norm, activations, dropout and
dense layers are ordinary Keras layers on the feature rows, through SiteFeatures.
"""
import numbers

import keras
import tensorflow as tf

from tf_sparseconv.channel.keras_io import from_keras_inputs, logical_shape
from tf_sparseconv.geometry import checked_output_shape, conv_geometry, per_dim
from tf_sparseconv.site.conv import site_conv, site_conv_transpose, site_inverse_conv
from tf_sparseconv.site.conversions import REDUCTIONS, from_channel_sparse, voxelize_sites
from tf_sparseconv.site.keras_io import (SiteLayer, as_site_keras_inputs, from_site_keras_inputs, map_geometries,
                                         site_dict_from, site_shapes)
from tf_sparseconv.site.pool import global_pool, site_pool
from tf_sparseconv.site.select import select_sites
from tf_sparseconv.site.tensor import SiteSparseTensor

POOL_MODES = ("max", "avg")
GLOBAL_POOL_MODES = ("max", "mean", "sum")


def _check_option(value, name, layer_name):
    """Constructor-time check of an int-or-sequence option (the dimension is known later)."""
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        return tuple(int(v) for v in value)
    except TypeError:
        raise ValueError(f"{layer_name}: {name} must be an int or a sequence of ints, got {value!r}") from None


def _entries(value):
    return (value,) if isinstance(value, int) else tuple(value)


class _SiteConvBase(SiteLayer):
    """Weights, activation and config shared by the site convolutions."""

    def __init__(self, filters, kernel_size=3, strides=1, padding=0, dilation=1, indice_key=None, use_bias=True,
                 activation=None, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, **kwargs):
        super().__init__(**kwargs)
        if int(filters) < 1:
            raise ValueError(f"{self.name}: filters must be >= 1, got {filters}")
        self.filters = int(filters)
        self.kernel_size = _check_option(kernel_size, "kernel_size", self.name) if kernel_size is not None else None
        self.strides = _check_option(strides, "strides", self.name)
        if isinstance(padding, str):
            if padding.lower() not in ("valid", "same"):
                raise ValueError(f"{self.name}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
            padding = padding.lower()
        else:
            padding = _check_option(padding, "padding", self.name)
        self.padding = padding
        self.dilation = _check_option(dilation, "dilation", self.name)
        for name in ("kernel_size", "strides", "dilation"):
            value = getattr(self, name)
            if value is not None and any(v < 1 for v in _entries(value)):
                raise ValueError(f"{self.name}: {name} entries must be >= 1, got {value}")
        if not isinstance(padding, str) and any(v < 0 for v in _entries(padding)):
            raise ValueError(f"{self.name}: padding entries must be >= 0, got {padding}")
        if indice_key is not None and not isinstance(indice_key, str):
            raise TypeError(f"{self.name}: indice_key must be a string or None, got {indice_key!r}")
        self.indice_key = indice_key
        self.use_bias = bool(use_bias)
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def _geometry(self, mode, spatial):
        """This layer's ConvGeometry on the static spatial shape `spatial`, refusing one
        that leaves no output site."""
        geometry = conv_geometry(mode, len(spatial), self.kernel_size, self.strides, self.padding, self.dilation,
                                 what=self.name)
        checked_output_shape(spatial, geometry, self.name)
        self._conv_args = dict(strides=geometry.strides, padding=geometry.padding, dilation=geometry.dilation)
        return geometry

    def _add_weights(self, kernel_size, cin):
        if cin is None:
            raise ValueError(f"{self.name}: the input's channel count must be known")
        self.kernel = self.add_weight(name="kernel", shape=(*kernel_size, int(cin), self.filters),
                                      initializer=self.kernel_initializer, regularizer=self.kernel_regularizer)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.filters,), initializer=self.bias_initializer,
                                        regularizer=self.bias_regularizer)

    def _check_cached(self, input_shape, geometry):
        """A map under this layer's key must have this layer's geometry (checked when the
        layer builds, so a functional model fails as it is assembled)."""
        cached = map_geometries(input_shape).get(self.indice_key) if self.indice_key is not None else None
        if cached is not None and cached[0] != geometry:
            raise ValueError(f"{self.name}: the kernel map under indice_key {self.indice_key!r} was built for "
                             f"(mode, kernel_size, strides, padding, dilation) = {cached[0]}, but this layer needs "
                             f"{geometry}; give layers of another geometry another indice_key")

    def _activate(self, y):
        if self.activation is None or self.activation is keras.activations.linear:
            return y
        return y.with_features(self.activation(y.features))

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters, kernel_size=self.kernel_size, strides=self.strides, padding=self.padding,
            dilation=self.dilation, indice_key=self.indice_key, use_bias=self.use_bias,
            activation=keras.activations.serialize(self.activation),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
            bias_regularizer=keras.regularizers.serialize(self.bias_regularizer))
        return config


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteConv(_SiteConvBase):
    """Sparse convolution over the active sites (1-4 spatial dimensions).

    subm=True: submanifold convolution (spconv's SubMConv): the output sites are the
    input sites; odd kernel, strides 1, padding 0 / 'same' (both mean the same).
    subm=False: strided sparse convolution (spconv's SparseConv): every site an input
    reaches becomes an output site; a SiteInverseConv with the same indice_key maps back.
    indice_key: layers of one geometry with the same key share one kernel map.
    """

    def __init__(self, filters, kernel_size=3, strides=1, padding=0, dilation=1, subm=False, indice_key=None,
                 **kwargs):
        super().__init__(filters, kernel_size, strides, padding, dilation, indice_key, **kwargs)
        self.subm = bool(subm)
        if self.subm:
            if any(s != 1 for s in _entries(self.strides)):
                raise ValueError(f"{self.name}: a submanifold convolution (subm=True) keeps its sites, so strides "
                                 f"must be 1, got {self.strides}; use subm=False for a strided convolution")
            if any(k % 2 == 0 for k in _entries(self.kernel_size)):
                raise ValueError(f"{self.name}: a submanifold convolution needs an odd kernel size, got "
                                 f"{self.kernel_size}")

    def build(self, input_shape):
        spatial, cin = site_shapes(input_shape, self.name)
        self.geometry = self._geometry("submanifold" if self.subm else "strided", spatial)
        self._check_cached(input_shape, self.geometry)
        self._add_weights(self.geometry.kernel_size, cin)

    def site_call(self, x, training=None):
        y = site_conv(x, self.kernel, self.bias, subm=self.subm, indice_key=self.indice_key, **self._conv_args)
        return self._activate(y)

    def get_config(self):
        return {**super().get_config(), "subm": self.subm}


def SubMConv(filters, kernel_size=3, indice_key=None, **kwargs):
    """spconv's SubMConv{1,2,3,4}d: SiteConv(..., subm=True)."""
    return SiteConv(filters, kernel_size, subm=True, indice_key=indice_key, **kwargs)


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteConvTranspose(_SiteConvBase):
    """Transposed (generative) sparse convolution (spconv's SparseConvTranspose): every
    site an input reaches through o = x * stride - padding + q * dilation is an output."""

    def build(self, input_shape):
        spatial, cin = site_shapes(input_shape, self.name)
        self.geometry = self._geometry("transposed", spatial)
        self._check_cached(input_shape, self.geometry)
        self._add_weights(self.geometry.kernel_size, cin)

    def site_call(self, x, training=None):
        return self._activate(site_conv_transpose(x, self.kernel, self.bias, indice_key=self.indice_key,
                                                  **self._conv_args))


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteInverseConv(_SiteConvBase):
    """Inverse of the strided SiteConv whose indice_key it names (spconv's
    SparseInverseConv): back onto that convolution's input sites, through its cached map.

    kernel_size defaults to the strided layer's (read from the map's geometry); given, it
    must equal it. The input must hold the strided layer's output sites (e.g. after
    submanifold layers at that level), with the map still carried.
    """

    def __init__(self, filters, indice_key, kernel_size=None, **kwargs):
        for name in ("strides", "padding", "dilation"):
            if name in kwargs:
                raise ValueError(f"SiteInverseConv takes its {name} from the strided convolution it inverts; "
                                 f"do not pass {name}")
        if not isinstance(indice_key, str):
            raise TypeError(f"SiteInverseConv needs the indice_key (a string) of the strided convolution it inverts, "
                            f"got {indice_key!r}")
        super().__init__(filters, kernel_size, indice_key=indice_key, **kwargs)

    def build(self, input_shape):
        spatial, cin = site_shapes(input_shape, self.name)
        maps = map_geometries(input_shape)
        if self.indice_key not in maps:
            raise ValueError(f"{self.name}: no kernel map under indice_key {self.indice_key!r} reaches this layer "
                             f"(maps here: {sorted(maps)}); give the strided SiteConv it inverts "
                             f"indice_key={self.indice_key!r} and let its output flow into this layer")
        geometry, in_static = maps[self.indice_key]
        mode, kernel_size = geometry[0], geometry[1]
        if mode != "strided":
            raise ValueError(f"{self.name}: SiteInverseConv inverts a strided convolution; the map under "
                             f"{self.indice_key!r} is {mode!r}")
        if self.kernel_size is not None and per_dim(self.kernel_size, len(spatial), "kernel_size",
                                                    what=self.name) != kernel_size:
            raise ValueError(f"{self.name}: kernel_size {self.kernel_size} differs from the strided convolution's "
                             f"{kernel_size} under {self.indice_key!r}")
        self.geometry = geometry
        self.out_static_shape = tf.TensorShape(list(in_static))
        self._add_weights(kernel_size, cin)

    def site_call(self, x, training=None):
        y = site_inverse_conv(x, self.kernel, self.indice_key, self.bias)
        # The op cannot know the static shape of the finer sites; the map's token did.
        y = SiteSparseTensor(y.coords, y.features, y.spatial_shape, y.batch_size, y.kernel_maps,
                             y.static_spatial_shape.merge_with(self.out_static_shape))
        return self._activate(y)

    def get_config(self):
        config = super().get_config()
        for name in ("strides", "padding", "dilation"):
            config.pop(name)
        return config


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SitePool(SiteLayer):
    """Max or average pooling over the active sites of each window; strides default to
    pool_size; 'avg' divides by the number of active sites in the window."""

    def __init__(self, pool_size=2, strides=None, padding=0, mode="max", indice_key=None, **kwargs):
        super().__init__(**kwargs)
        if mode not in POOL_MODES:
            raise ValueError(f"{self.name}: mode must be one of {POOL_MODES}, got {mode!r}")
        self.pool_size = _check_option(pool_size, "pool_size", self.name)
        self.strides = None if strides is None else _check_option(strides, "strides", self.name)
        self.padding = _check_option(padding, "padding", self.name)
        self.mode = mode
        self.indice_key = indice_key

    def build(self, input_shape):
        spatial, _ = site_shapes(input_shape, self.name)
        size = per_dim(self.pool_size, len(spatial), "pool_size", what=self.name)
        geometry = conv_geometry("strided", len(spatial), size, size if self.strides is None else self.strides,
                                 self.padding, what=self.name)
        checked_output_shape(spatial, geometry, self.name)
        self._pool_args = dict(pool_size=size, strides=geometry.strides, padding=geometry.padding)
        cached = map_geometries(input_shape).get(self.indice_key) if self.indice_key is not None else None
        if cached is not None and cached[0] != geometry:
            raise ValueError(f"{self.name}: the kernel map under indice_key {self.indice_key!r} was built for "
                             f"{cached[0]}, but this pooling needs {geometry}")

    def site_call(self, x, training=None):
        return site_pool(x, mode=self.mode, indice_key=self.indice_key, **self._pool_args)

    def get_config(self):
        return {**super().get_config(), "pool_size": self.pool_size, "strides": self.strides,
                "padding": self.padding, "mode": self.mode, "indice_key": self.indice_key}


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteGlobalPool(keras.layers.Layer):
    """Per batch element: the max, mean or sum over its sites -> dense [B, C] (zeros for a
    batch element without sites)."""

    def __init__(self, mode="mean", **kwargs):
        super().__init__(**kwargs)
        if mode not in GLOBAL_POOL_MODES:
            raise ValueError(f"{self.name}: mode must be one of {GLOBAL_POOL_MODES}, got {mode!r}")
        self.mode = mode
        self.supports_jit = False

    def call(self, inputs):
        return global_pool(from_site_keras_inputs(inputs), self.mode)

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SiteSelect(SiteLayer):
    """Density-bounded sites: per batch element keep the k sites with the largest feature
    norm (ties to the lower row, order kept), so at most batch_size * k sites go on
    whatever the input. Cached maps are dropped (they index the sites before selection):
    the levels after a SiteSelect use new indice_keys."""

    def __init__(self, k, **kwargs):
        super().__init__(**kwargs)
        if int(k) < 1:
            raise ValueError(f"{self.name}: k must be >= 1, got {k}")
        self.k = int(k)

    def site_call(self, x, training=None):
        return select_sites(x, self.k)

    def get_config(self):
        return {**super().get_config(), "k": self.k}


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
        if features.shape.rank != 2 or (features.shape[0] is not None and x.features.shape[0] is not None
                                        and features.shape[0] != x.features.shape[0]):
            raise ValueError(f"{self.name}: the wrapped layer {self.layer.name} must map [N, C] rows to [N, C'] "
                             f"rows, got shape {features.shape} from {x.features.shape}")
        return x.with_features(features)

    def get_config(self):
        return {**super().get_config(), "layer": keras.saving.serialize_keras_object(self.layer)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        layer = keras.saving.deserialize_keras_object(config.pop("layer"))
        return cls(layer, **config)


class _SiteMerge(SiteLayer):
    """Merges site tensors with the same sites (the same coordinates in the same order,
    e.g. a skip connection and the inverse convolution back onto its sites); their maps
    are united."""

    def __init__(self, validate=True, **kwargs):
        super().__init__(**kwargs)
        self.validate = bool(validate)

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
        resolution = _check_option(resolution, "resolution", self.name)
        self.resolution = (resolution,) * 3 if isinstance(resolution, int) else tuple(resolution)
        if not 1 <= len(self.resolution) <= 4 or any(r < 1 for r in self.resolution):
            raise ValueError(f"{self.name}: resolution must be 1 to 4 entries >= 1, got {resolution}")
        d = len(self.resolution)
        lo, hi = bounds
        self.bounds = tuple(tuple(float(v) for v in _as_tuple_float(b, d, self.name)) for b in (lo, hi))
        if any(h <= l for l, h in zip(*self.bounds)):
            raise ValueError(f"{self.name}: bounds need lo < hi on every axis, got {bounds}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"{self.name}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.clip = bool(clip)
        self.return_point_map = bool(return_point_map)
        self.supports_jit = False

    def call(self, points):
        points = tf.convert_to_tensor(points)
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
        finite = tf.reduce_all(tf.math.is_finite(xyz), axis=1)
        xyz = tf.where(finite[:, None], xyz, lo)
        if self.clip:
            xyz = tf.clip_by_value(xyz, lo, hi - voxel / 2)
        batch_index = tf.where(finite, tf.repeat(tf.range(batch), n), -1)
        features = tf.concat([tf.ones_like(flat[:, :1]), flat[:, d:]], axis=1)
        sites, point_to_site = voxelize_sites(xyz, voxel, self.resolution, batch_index, batch, features, origin=lo,
                                              reduction=self.reduction)
        out = as_site_keras_inputs(sites)
        if self.return_point_map:
            return out, tf.reshape(point_to_site, [batch, n])
        return out

    def get_config(self):
        return {**super().get_config(), "resolution": self.resolution, "bounds": self.bounds,
                "reduction": self.reduction, "clip": self.clip, "return_point_map": self.return_point_map}


def _as_tuple_float(value, d, name):
    values = (float(value),) * d if isinstance(value, numbers.Real) else tuple(float(v) for v in value)
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
        self.supports_jit = False

    def call(self, inputs):
        sites, point_to_site = inputs
        x = from_site_keras_inputs(sites)
        padded = tf.concat([tf.zeros_like(x.features[:1]), x.features], axis=0)
        return tf.gather(padded, tf.maximum(tf.cast(point_to_site, tf.int32), -1) + 1)


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseToSite(keras.layers.Layer):
    """The channel-sparse dict -> the site dict of as_site_keras_inputs: one site per
    position with a stored entry, its C values as the feature row (what training feeds a
    site-sparse core, tf_sparseconv.training.train.site_keras_batches)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False

    def call(self, inputs):
        x = from_keras_inputs(inputs)
        sites = from_channel_sparse(x)
        return as_site_keras_inputs(sites.with_features(tf.ensure_shape(sites.features, [None, x.shape[-1]])))

    def build(self, input_shape):
        logical_shape(input_shape)  # refuses anything but the channel-sparse dict
