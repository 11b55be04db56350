"""The site layers' names before the Keras conventions (tf_sparseconv 0.1), kept for one
release: they warn (DeprecationWarning) when built, and models saved with them load.

    SiteConv(subm=True)      -> SubMConv{1,2,3,4}D
    SubMConv(...)            -> SubMConv{1,2,3,4}D
    SiteConv(subm=False)     -> SparseConv{1,2,3,4}D
    SiteConvTranspose        -> SparseConvTranspose{1,2,3,4}D
    SiteInverseConv          -> SparseInverseConv{1,2,3,4}D (kernel_size before indice_key)
    SitePool(mode="max")     -> SiteMaxPooling{1,2,3,4}D
    SitePool(mode="avg")     -> SiteAveragePooling{1,2,3,4}D
    dilation=                -> dilation_rate=

They take any number of spatial dimensions, as before.
"""
import warnings

import keras

from tf_sparseconv.site.conv_layers import (_SiteConv, _SparseConv, _SparseConvTranspose, _SparseInverseConv,
                                            _SubMConv, dilation_rate_of)
from tf_sparseconv.layer_config import flag
from tf_sparseconv.site.pool_layers import POOL_MODES, _SitePooling

register = keras.saving.register_keras_serializable(package="tf_sparseconv")


def _entries(value):
    return (value,) if isinstance(value, int) else tuple(value)


def _warn(old, new):
    warnings.warn(f"tf_sparseconv: {old} is deprecated and will be removed; use {new}", DeprecationWarning,
                  stacklevel=3)


@register
class SiteConv(_SiteConv):
    """Deprecated: SubMConv{1,2,3,4}D (subm=True) or SparseConv{1,2,3,4}D."""

    def __init__(self, filters, kernel_size=3, strides=1, padding=0, dilation_rate=1, subm=False, indice_key=None,
                 **kwargs):
        _warn("SiteConv", "SubMConv3D (subm=True) or SparseConv3D, or their 1-D, 2-D and 4-D forms")
        dilation_rate = dilation_rate_of(dilation_rate, kwargs, "SiteConv")
        super().__init__(filters, kernel_size, strides, padding, dilation_rate, indice_key, **kwargs)
        self.subm = flag(subm, "subm", self.name)
        self.mode = "submanifold" if self.subm else "strided"
        if self.subm:
            if any(s != 1 for s in _entries(self.strides)):
                raise ValueError(f"{self.name}: a submanifold convolution (subm=True) keeps its sites, so strides "
                                 f"must be 1, got {self.strides}; use subm=False for a strided convolution")
            if any(k % 2 == 0 for k in _entries(self.kernel_size)):
                raise ValueError(f"{self.name}: a submanifold convolution needs an odd kernel size, got "
                                 f"{self.kernel_size}")

    def convolve(self, x, scale=None, bias=None, activation=None, normalize=None):
        convolve = _SubMConv.convolve if self.subm else _SparseConv.convolve
        return convolve(self, x, scale, bias, activation, normalize)

    def get_config(self):
        return {**super().get_config(), "subm": self.subm}


def SubMConv(filters, kernel_size=3, indice_key=None, **kwargs):
    """Deprecated: SubMConv{1,2,3,4}D. SiteConv(..., subm=True)."""
    _warn("SubMConv", "SubMConv3D or its 1-D, 2-D and 4-D forms")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return SiteConv(filters, kernel_size, subm=True, indice_key=indice_key, **kwargs)


@register
class SiteConvTranspose(_SparseConvTranspose):
    """Deprecated: SparseConvTranspose{1,2,3,4}D."""

    def __init__(self, filters, kernel_size=3, strides=1, padding=0, dilation_rate=1, indice_key=None, **kwargs):
        _warn("SiteConvTranspose", "SparseConvTranspose3D or its 1-D, 2-D and 4-D forms")
        super().__init__(filters, kernel_size, strides, padding, dilation_rate, indice_key, **kwargs)


@register
class SiteInverseConv(_SparseInverseConv):
    """Deprecated: SparseInverseConv{1,2,3,4}D, which takes kernel_size before indice_key."""

    def __init__(self, filters, indice_key=None, kernel_size=None, **kwargs):
        _warn("SiteInverseConv", "SparseInverseConv3D or its 1-D, 2-D and 4-D forms")
        super().__init__(filters, kernel_size, indice_key, **kwargs)


@register
class SitePool(_SitePooling):
    """Deprecated: SiteMaxPooling{1,2,3,4}D (mode="max") or SiteAveragePooling{1,2,3,4}D
    (mode="avg")."""

    def __init__(self, pool_size=2, strides=None, padding=0, mode="max", indice_key=None, **kwargs):
        _warn("SitePool", "SiteMaxPooling3D or SiteAveragePooling3D, or their 1-D, 2-D and 4-D forms")
        super().__init__(pool_size, strides, padding, indice_key, **kwargs)
        if mode not in POOL_MODES:
            raise ValueError(f"{self.name}: mode must be one of {POOL_MODES}, got {mode!r}")
        self.mode = mode

    def get_config(self):
        return {**super().get_config(), "mode": self.mode}
