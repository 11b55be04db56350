"""The site convolutions as Keras layers, named as in Keras with spconv's kinds:
SubMConv{1,2,3,4}D (submanifold), SparseConv{1,2,3,4}D (strided), SparseConvTranspose
{1,2,3,4}D and SparseInverseConv{1,2,3,4}D.

Arguments follow Keras (filters, kernel_size, strides, padding="valid"|"same" or spconv's
int padding, dilation_rate, activation, initializers, regularizers) plus spconv's
indice_key: layers of one geometry under one key share one kernel map, and an inverse
convolution maps back through the map of the strided convolution whose key it names; and
dataflow="auto"|"pairs"|"outputs", the GPU's dataflow (spconv's algo=; site_conv).
The _SiteConv bases take the rank from their input (rank None); the named classes fix it.
"""
import math
import warnings

import keras
import tensorflow as tf

from tf_sparseconv.geometry import PADDINGS, checked_output_shape, conv_geometry, int_or_ints, per_dim
from tf_sparseconv.layer_config import flag, whole
from tf_sparseconv.site.conv import site_conv, site_conv_transpose, site_inverse_conv
from tf_sparseconv.site.keras_io import SiteLayer, map_geometries, site_shapes
from tf_sparseconv.site.kernel_map import check_dataflow
from tf_sparseconv.site.tensor import SiteSparseTensor

register = keras.saving.register_keras_serializable(package="tf_sparseconv")


def dilation_rate_of(dilation_rate, kwargs, what):
    """dilation_rate, or the value of the deprecated keyword `dilation` (with a warning)."""
    if "dilation" in kwargs:
        dilation = kwargs.pop("dilation")
        if dilation_rate != 1 and dilation != dilation_rate:
            raise ValueError(f"{what}: give dilation_rate, not both dilation_rate and the deprecated dilation")
        warnings.warn(f"{what}: the argument dilation is deprecated, use dilation_rate (as Keras)",
                      DeprecationWarning, stacklevel=3)
        return dilation
    return dilation_rate


class _SiteConv(SiteLayer):
    """Weights, geometry, activation and config shared by the site convolutions."""

    mode = None  # "submanifold", "strided" or "transposed"
    rank = None  # spatial dimensions; None: those of the input
    kernel_size_optional = False  # True: kernel_size None is read from a cached map (SparseInverseConv)

    def __init__(self, filters, kernel_size, strides=1, padding="valid", dilation_rate=1, indice_key=None,
                 activation=None, use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, dataflow="auto", **kwargs):
        dilation_rate = dilation_rate_of(dilation_rate, kwargs, type(self).__name__)
        super().__init__(**kwargs)
        self.dataflow = check_dataflow(dataflow, self.name)
        self.filters = whole(filters, "filters", self.name)
        if kernel_size is None and not self.kernel_size_optional:
            raise ValueError(f"{self.name}: kernel_size must be an int or a sequence of ints, got None")
        self.kernel_size = None if kernel_size is None else int_or_ints(kernel_size, "kernel_size", self.name)
        self.strides = int_or_ints(strides, "strides", self.name)
        if isinstance(padding, str):
            if padding.lower() not in PADDINGS:
                raise ValueError(f"{self.name}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
            padding = padding.lower()
        else:
            padding = int_or_ints(padding, "padding", self.name)
        self.padding = padding
        self.dilation_rate = int_or_ints(dilation_rate, "dilation_rate", self.name)
        for name, minimum in (("kernel_size", 1), ("strides", 1), ("dilation_rate", 1), ("padding", 0)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                per_dim(value, self.rank or (1 if isinstance(value, int) else len(value)), name, minimum, self.name)
        # The kernel's offsets, where known before the input: a fixed rank or a tuple kernel_size.
        known = self.kernel_size is not None and (self.rank or not isinstance(self.kernel_size, int))
        if self.dataflow == "outputs" and known:
            volume = math.prod(per_dim(self.kernel_size, self.rank or len(self.kernel_size), "kernel_size"))
            if volume > 32:  # the neighbour tables' bound (SiteSparseConv's dataflow doc)
                raise ValueError(f"{self.name}: dataflow='outputs' runs kernels of at most 32 offsets on the GPU's "
                                 f"output-stationary tiles, and kernel_size {self.kernel_size} has {volume}; use "
                                 "dataflow='auto' (or 'pairs')")
        if indice_key is not None and not isinstance(indice_key, str):
            raise TypeError(f"{self.name}: indice_key must be a string or None, got {indice_key!r}")
        self.indice_key = indice_key
        self.use_bias = flag(use_bias, "use_bias", self.name)
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)

    def _spatial(self, input_shape):
        """(static spatial shape, input channels), checked against a fixed rank."""
        spatial, cin = site_shapes(input_shape, self.name)
        if self.rank is not None and len(spatial) != self.rank:
            raise ValueError(f"{self.name}: a {self.rank}-D layer got sites with {len(spatial)} spatial dimensions "
                             f"(spatial shape {spatial})")
        return spatial, cin

    def _geometry(self, spatial):
        """This layer's ConvGeometry on the static spatial shape `spatial`, refusing one
        that leaves no output site."""
        geometry = conv_geometry(self.mode, len(spatial), self.kernel_size, self.strides, self.padding,
                                 self.dilation_rate, what=self.name)
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
                             f"(mode, kernel_size, strides, padding, dilation) = {tuple(cached[0])}, but this layer "
                             f"needs {tuple(geometry)}; give layers of another geometry another indice_key")

    def build(self, input_shape):
        spatial, cin = self._spatial(input_shape)
        self.geometry = self._geometry(spatial)
        self._check_cached(input_shape, self.geometry)
        self._add_weights(self.geometry.kernel_size, cin)

    def site_call(self, x, training=None):
        # A ReLU runs inside the convolution op (its epilogue); other activations after it.
        fused = "relu" if self.activation is keras.activations.relu else None
        y = self.convolve(x, bias=self.bias, activation=fused)
        if fused or self.activation is None or self.activation is keras.activations.linear:
            return y
        return y.with_features(self.activation(y.features))

    def convolve(self, x, scale=None, bias=None, activation=None, normalize=None):
        """This layer's convolution of the SiteSparseTensor x with its kernel, and the
        epilogue of each output value (site_conv's scale, bias, activation and normalize),
        nothing else."""
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters, kernel_size=self.kernel_size, strides=self.strides, padding=self.padding,
            dilation_rate=self.dilation_rate, indice_key=self.indice_key, dataflow=self.dataflow,
            use_bias=self.use_bias,
            activation=keras.activations.serialize(self.activation),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
            bias_regularizer=keras.regularizers.serialize(self.bias_regularizer))
        return config


class _SubMConv(_SiteConv):
    """Submanifold convolution (spconv's SubMConv): the output sites are the input sites,
    each the sum over its active neighbours; odd kernel, no strides or padding."""

    mode = "submanifold"

    def __init__(self, filters, kernel_size, dilation_rate=1, indice_key=None, **kwargs):
        super().__init__(filters, kernel_size, 1, "same", dilation_rate, indice_key, **kwargs)
        if any(k % 2 == 0 for k in ((self.kernel_size,) if isinstance(self.kernel_size, int) else self.kernel_size)):
            raise ValueError(f"{self.name}: a submanifold convolution needs an odd kernel size, got "
                             f"{self.kernel_size}")

    def convolve(self, x, scale=None, bias=None, activation=None, normalize=None):
        return site_conv(x, self.kernel, bias, subm=True, indice_key=self.indice_key, dataflow=self.dataflow,
                         scale=scale, activation=activation, normalize=normalize, **self._conv_args)

    def get_config(self):
        config = super().get_config()
        for name in ("strides", "padding"):
            config.pop(name)
        return config


class _SparseConv(_SiteConv):
    """Strided sparse convolution (spconv's SparseConv): every site an input reaches is an
    output site. padding: "valid" (0, the default), "same" (dilation_rate * (k - 1) // 2 on
    each side: ceil(r / strides) output extent for an odd kernel) or ints, as spconv's."""

    mode = "strided"

    def convolve(self, x, scale=None, bias=None, activation=None, normalize=None):
        return site_conv(x, self.kernel, bias, indice_key=self.indice_key, dataflow=self.dataflow, scale=scale,
                         activation=activation, normalize=normalize, **self._conv_args)


class _SparseConvTranspose(_SiteConv):
    """Transposed (generative) sparse convolution (spconv's SparseConvTranspose): every
    site an input reaches through o = x * strides - padding + q * dilation_rate is an
    output site."""

    mode = "transposed"

    def convolve(self, x, scale=None, bias=None, activation=None, normalize=None):
        return site_conv_transpose(x, self.kernel, bias, indice_key=self.indice_key, dataflow=self.dataflow,
                                   scale=scale, activation=activation, normalize=normalize, **self._conv_args)


class _SparseInverseConv(_SiteConv):
    """Inverse of the strided convolution whose indice_key it names (spconv's
    SparseInverseConv): back onto that convolution's input sites, through its cached map.

    kernel_size defaults to the strided layer's (read from the map's geometry); given, it
    must equal it. The input must hold the strided layer's output sites (e.g. after
    submanifold layers at that level), with the map still carried.
    """

    mode = "strided"  # of the map it inverts
    kernel_size_optional = True

    def __init__(self, filters, kernel_size=None, indice_key=None, **kwargs):
        for name in ("strides", "padding", "dilation_rate", "dilation"):
            if name in kwargs:
                raise ValueError(f"{type(self).__name__} takes its {name} from the strided convolution it inverts; "
                                 f"do not pass {name}")
        if not isinstance(indice_key, str):
            raise TypeError(f"{type(self).__name__} needs the indice_key (a string) of the strided convolution it "
                            f"inverts, got {indice_key!r}")
        super().__init__(filters, kernel_size, indice_key=indice_key, **kwargs)

    def build(self, input_shape):
        spatial, cin = self._spatial(input_shape)
        maps = map_geometries(input_shape)
        if self.indice_key not in maps:
            raise ValueError(f"{self.name}: no kernel map under indice_key {self.indice_key!r} reaches this layer "
                             f"(maps here: {sorted(maps)}); give the strided convolution it inverts "
                             f"indice_key={self.indice_key!r} and let its output flow into this layer")
        geometry, in_static = maps[self.indice_key]
        if geometry.mode != "strided":
            raise ValueError(f"{self.name}: {type(self).__name__} inverts a strided convolution; the map under "
                             f"{self.indice_key!r} is {geometry.mode!r}")
        if self.kernel_size is not None and per_dim(self.kernel_size, len(spatial), "kernel_size",
                                                    what=self.name) != geometry.kernel_size:
            raise ValueError(f"{self.name}: kernel_size {self.kernel_size} differs from the strided convolution's "
                             f"{geometry.kernel_size} under {self.indice_key!r}")
        self.geometry = geometry
        self.out_static_shape = tf.TensorShape(list(in_static))
        self._add_weights(geometry.kernel_size, cin)

    def convolve(self, x, scale=None, bias=None, activation=None, normalize=None):
        y = site_inverse_conv(x, self.kernel, self.indice_key, bias, dataflow=self.dataflow, scale=scale,
                              activation=activation, normalize=normalize)
        # The op cannot know the static shape of the finer sites; the map's token did.
        return SiteSparseTensor(y.coords, y.features, y.spatial_shape, y.batch_size, y.kernel_maps,
                                y.static_spatial_shape.merge_with(self.out_static_shape))

    def get_config(self):
        config = super().get_config()
        for name in ("strides", "padding", "dilation_rate"):
            config.pop(name)
        return config


@register
class SubMConv1D(_SubMConv):
    """1-D submanifold convolution (spconv's SubMConv1d)."""
    rank = 1


@register
class SubMConv2D(_SubMConv):
    """2-D submanifold convolution (spconv's SubMConv2d)."""
    rank = 2


@register
class SubMConv3D(_SubMConv):
    """3-D submanifold convolution (spconv's SubMConv3d)."""
    rank = 3


@register
class SubMConv4D(_SubMConv):
    """4-D submanifold convolution (spconv's SubMConv4d)."""
    rank = 4


@register
class SparseConv1D(_SparseConv):
    """1-D strided sparse convolution (spconv's SparseConv1d)."""
    rank = 1


@register
class SparseConv2D(_SparseConv):
    """2-D strided sparse convolution (spconv's SparseConv2d)."""
    rank = 2


@register
class SparseConv3D(_SparseConv):
    """3-D strided sparse convolution (spconv's SparseConv3d)."""
    rank = 3


@register
class SparseConv4D(_SparseConv):
    """4-D strided sparse convolution (spconv's SparseConv4d)."""
    rank = 4


@register
class SparseConvTranspose1D(_SparseConvTranspose):
    """1-D transposed sparse convolution (spconv's SparseConvTranspose1d)."""
    rank = 1


@register
class SparseConvTranspose2D(_SparseConvTranspose):
    """2-D transposed sparse convolution (spconv's SparseConvTranspose2d)."""
    rank = 2


@register
class SparseConvTranspose3D(_SparseConvTranspose):
    """3-D transposed sparse convolution (spconv's SparseConvTranspose3d)."""
    rank = 3


@register
class SparseConvTranspose4D(_SparseConvTranspose):
    """4-D transposed sparse convolution (spconv's SparseConvTranspose4d)."""
    rank = 4


@register
class SparseInverseConv1D(_SparseInverseConv):
    """1-D inverse of a strided sparse convolution (spconv's SparseInverseConv1d)."""
    rank = 1


@register
class SparseInverseConv2D(_SparseInverseConv):
    """2-D inverse of a strided sparse convolution (spconv's SparseInverseConv2d)."""
    rank = 2


@register
class SparseInverseConv3D(_SparseInverseConv):
    """3-D inverse of a strided sparse convolution (spconv's SparseInverseConv3d)."""
    rank = 3


@register
class SparseInverseConv4D(_SparseInverseConv):
    """4-D inverse of a strided sparse convolution (spconv's SparseInverseConv4d)."""
    rank = 4


# The layer of each kind for a number of spatial dimensions (models built for any rank).
SUBM_CONV = {1: SubMConv1D, 2: SubMConv2D, 3: SubMConv3D, 4: SubMConv4D}
SPARSE_CONV = {1: SparseConv1D, 2: SparseConv2D, 3: SparseConv3D, 4: SparseConv4D}
SPARSE_CONV_TRANSPOSE = {1: SparseConvTranspose1D, 2: SparseConvTranspose2D, 3: SparseConvTranspose3D,
                         4: SparseConvTranspose4D}
SPARSE_INVERSE_CONV = {1: SparseInverseConv1D, 2: SparseInverseConv2D, 3: SparseInverseConv3D,
                       4: SparseInverseConv4D}
