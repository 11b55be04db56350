"""Convolution and pooling geometry, computed in one place for both families.

A site convolution's geometry is (mode, kernel_size, strides, padding, dilation), one
entry per spatial dimension, as spconv 2.x defines it; the SiteKernelMap op checks the
same rules in csrc/site/kernel_map/site_geometry.h. Output extent per dimension, from
the input extent r:

    submanifold  r                                  (odd kernel, stride 1: the input's sites)
    strided      (r + 2p - d (k - 1) - 1) // s + 1
    transposed   (r - 1) s - 2p + d (k - 1) + 1

padding "valid" is 0 and "same" is d (k - 1) // 2 on each side: with an odd kernel a
strided convolution then gives ceil(r / s), as Keras' "same" does. The channel family's
direct convolution is "same" with stride 1, and its max-pooling (window = stride, partial
windows kept) gives ceil(r / s).
"""
import math
import numbers
import typing

MODES = ("submanifold", "strided", "transposed")
PADDINGS = ("valid", "same")


class ConvGeometry(typing.NamedTuple):
    """A convolution's geometry; equal to the plain tuple KernelMap.geometry() gives."""

    mode: str
    kernel_size: typing.Tuple[int, ...]
    strides: typing.Tuple[int, ...]
    padding: typing.Tuple[int, ...]
    dilation: typing.Tuple[int, ...]


def _whole(value):
    """value as an int when it is a whole number (not a bool, not 2.5: no silent rounding)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or int(value) != value:
        raise ValueError(value)
    return int(value)


def per_dim(value, rank, name, minimum=1, what=None):
    """An int (for every dimension) or a sequence of rank ints, as a tuple of rank ints >=
    minimum; ValueError (prefixed by `what: `) otherwise."""
    prefix = f"{what}: " if what else ""
    try:
        values = (_whole(value),) * rank if isinstance(value, numbers.Number) else tuple(_whole(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{prefix}{name} must be an int or a sequence of ints, got {value!r}") from None
    if len(values) != rank:
        raise ValueError(f"{prefix}{name} needs one entry per spatial dimension ({rank}), got {value}")
    if any(v < minimum for v in values):
        raise ValueError(f"{prefix}{name} entries must be >= {minimum}, got {value}")
    return values


def int_or_ints(value, name, what):
    """An int or a tuple of ints, as a layer stores an option before it knows its rank
    (ValueError otherwise)."""
    try:
        return _whole(value) if isinstance(value, numbers.Number) else tuple(_whole(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {name} must be an int or a sequence of ints, got {value!r}") from None


def same_padding(kernel_size, dilation):
    """d (k - 1) // 2 per dimension: what keeps an odd kernel centred on its site."""
    return tuple(dl * (k - 1) // 2 for k, dl in zip(kernel_size, dilation))


def conv_geometry(mode, rank, kernel_size, strides=1, padding=0, dilation=1, what=None):
    """The ConvGeometry of a convolution over rank spatial dimensions. padding is "valid",
    "same", an int or one int per dimension. A submanifold convolution needs an odd kernel
    and stride 1, and accepts padding 0 or "same" (spconv accepts and ignores it); its
    geometry records padding 0."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    prefix = f"{what}: " if what else ""
    kernel_size = per_dim(kernel_size, rank, "kernel_size", 1, what)
    strides = per_dim(strides, rank, "strides", 1, what)
    dilation = per_dim(dilation, rank, "dilation", 1, what)
    if isinstance(padding, str):
        if padding.lower() not in PADDINGS:
            raise ValueError(f"{prefix}padding must be an int, a tuple, 'valid' or 'same', got {padding!r}")
        padding = (0,) * rank if padding.lower() == "valid" else same_padding(kernel_size, dilation)
    else:
        padding = per_dim(padding, rank, "padding", 0, what)
    if mode == "submanifold":
        if strides != (1,) * rank:
            raise ValueError(f"{prefix}a submanifold convolution keeps its sites: strides must be 1, got {strides}")
        if any(k % 2 == 0 for k in kernel_size):
            raise ValueError(f"{prefix}a submanifold convolution needs an odd kernel size, got {kernel_size}")
        same = same_padding(kernel_size, dilation)
        if padding not in ((0,) * rank, same):
            raise ValueError(f"{prefix}a submanifold convolution keeps its sites: padding must be 0 or {same}, "
                             f"got {padding}")
        padding = (0,) * rank
    return ConvGeometry(mode, kernel_size, strides, padding, dilation)


def output_extent(extent, mode, kernel_size, stride, padding, dilation):
    """The output extent along one dimension (None for an unknown input extent)."""
    if extent is None or mode == "submanifold":
        return extent
    if mode == "strided":
        return (extent + 2 * padding - dilation * (kernel_size - 1) - 1) // stride + 1
    return (extent - 1) * stride - 2 * padding + dilation * (kernel_size - 1) + 1


def output_shape(spatial_shape, geometry):
    """The output spatial shape (a tuple; None where the input extent is unknown)."""
    mode, kernel_size, strides, padding, dilation = geometry
    return tuple(output_extent(r, mode, k, s, p, dl)
                 for r, k, s, p, dl in zip(spatial_shape, kernel_size, strides, padding, dilation))


def checked_output_shape(spatial_shape, geometry, what=None):
    """output_shape, refusing a geometry that leaves no output site (ValueError)."""
    out = output_shape(spatial_shape, geometry)
    if any(o is not None and o < 1 for o in out):
        mode, k, s, p, dl = geometry
        prefix = f"{what}: " if what else ""
        raise ValueError(f"{prefix}kernel {k}, strides {s}, padding {p}, dilation {dl} leave no output site on "
                         f"the spatial shape {tuple(spatial_shape)} (output extents {out})")
    return out


def pooled_shape(spatial_shape, strides):
    """The channel family's max-pooling: ceil(r / s) per dimension (None stays None)."""
    return tuple(None if r is None else -(-r // s) for r, s in zip(spatial_shape, strides))
