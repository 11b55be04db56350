"""Site pooling as Keras layers: SiteMaxPooling{1,2,3,4}D and SiteAveragePooling{1,2,3,4}D
over the active sites of each window (Keras' MaxPooling3D / AveragePooling3D arguments:
pool_size, strides defaulting to pool_size, padding "valid"|"same" or ints), and
SiteGlobalPool per batch element. Average pooling divides by the window's active sites,
as MinkowskiEngine's does. Given an indice_key, a window pooling caches its map there, as
the convolutions do.
"""
import keras

from tf_sparseconv.geometry import PADDINGS, checked_output_shape, conv_geometry, int_or_ints, per_dim
from tf_sparseconv.layer_config import FLOATS, choice, dtype_policy
from tf_sparseconv.site.keras_io import SiteLayer, from_site_keras_inputs, map_geometries, site_shapes
from tf_sparseconv.site.pool import global_pool, site_pool

POOL_MODES = ("max", "avg")
GLOBAL_POOL_MODES = ("max", "mean", "sum")

register = keras.saving.register_keras_serializable(package="tf_sparseconv")


class _SitePooling(SiteLayer):
    """Window pooling over the active sites; `mode` is "max" or "avg"."""

    mode = None
    rank = None  # spatial dimensions; None: those of the input

    def __init__(self, pool_size=2, strides=None, padding="valid", indice_key=None, **kwargs):
        super().__init__(**kwargs)
        self.pool_size = int_or_ints(pool_size, "pool_size", self.name)
        self.strides = None if strides is None else int_or_ints(strides, "strides", self.name)
        if isinstance(padding, str):
            if padding.lower() not in PADDINGS:
                raise ValueError(f"{self.name}: padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
            padding = padding.lower()
        else:
            padding = int_or_ints(padding, "padding", self.name)
        self.padding = padding
        for name, minimum in (("pool_size", 1), ("strides", 1), ("padding", 0)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                per_dim(value, self.rank or (1 if isinstance(value, int) else len(value)), name, minimum, self.name)
        if indice_key is not None and not isinstance(indice_key, str):
            raise TypeError(f"{self.name}: indice_key must be a string or None, got {indice_key!r}")
        self.indice_key = indice_key

    def build(self, input_shape):
        spatial, _ = site_shapes(input_shape, self.name)
        if self.rank is not None and len(spatial) != self.rank:
            raise ValueError(f"{self.name}: a {self.rank}-D layer got sites with {len(spatial)} spatial dimensions "
                             f"(spatial shape {spatial})")
        size = per_dim(self.pool_size, len(spatial), "pool_size", what=self.name)
        geometry = conv_geometry("strided", len(spatial), size, size if self.strides is None else self.strides,
                                 self.padding, what=self.name)
        checked_output_shape(spatial, geometry, self.name)
        self._pool_args = dict(pool_size=size, strides=geometry.strides, padding=geometry.padding)
        cached = map_geometries(input_shape).get(self.indice_key) if self.indice_key is not None else None
        if cached is not None and cached[0] != geometry:
            raise ValueError(f"{self.name}: the kernel map under indice_key {self.indice_key!r} was built for "
                             f"{tuple(cached[0])}, but this pooling needs {tuple(geometry)}")

    def site_call(self, x, training=None):
        return site_pool(x, mode=self.mode, indice_key=self.indice_key, **self._pool_args)

    def get_config(self):
        return {**super().get_config(), "pool_size": self.pool_size, "strides": self.strides,
                "padding": self.padding, "indice_key": self.indice_key}


class _SiteMaxPooling(_SitePooling):
    mode = "max"


class _SiteAveragePooling(_SitePooling):
    mode = "avg"


@register
class SiteMaxPooling1D(_SiteMaxPooling):
    """1-D max pooling over the active sites of each window."""
    rank = 1


@register
class SiteMaxPooling2D(_SiteMaxPooling):
    """2-D max pooling over the active sites of each window."""
    rank = 2


@register
class SiteMaxPooling3D(_SiteMaxPooling):
    """3-D max pooling over the active sites of each window."""
    rank = 3


@register
class SiteMaxPooling4D(_SiteMaxPooling):
    """4-D max pooling over the active sites of each window."""
    rank = 4


@register
class SiteAveragePooling1D(_SiteAveragePooling):
    """1-D average pooling over the active sites of each window."""
    rank = 1


@register
class SiteAveragePooling2D(_SiteAveragePooling):
    """2-D average pooling over the active sites of each window."""
    rank = 2


@register
class SiteAveragePooling3D(_SiteAveragePooling):
    """3-D average pooling over the active sites of each window."""
    rank = 3


@register
class SiteAveragePooling4D(_SiteAveragePooling):
    """4-D average pooling over the active sites of each window."""
    rank = 4


SITE_MAX_POOLING = {1: SiteMaxPooling1D, 2: SiteMaxPooling2D, 3: SiteMaxPooling3D, 4: SiteMaxPooling4D}
SITE_AVERAGE_POOLING = {1: SiteAveragePooling1D, 2: SiteAveragePooling2D, 3: SiteAveragePooling3D,
                        4: SiteAveragePooling4D}


@register
class SiteGlobalPool(keras.layers.Layer):
    """Per batch element: the max, mean or sum over its sites -> dense [B, C] (zeros for a
    batch element without sites)."""

    def __init__(self, mode="mean", **kwargs):
        super().__init__(**kwargs)
        self.mode = choice(mode, "mode", self.name, GLOBAL_POOL_MODES)
        dtype_policy(self, FLOATS)
        self.supports_jit = False

    def call(self, inputs):
        return global_pool(from_site_keras_inputs(inputs), self.mode)

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}
