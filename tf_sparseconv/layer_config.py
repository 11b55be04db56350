"""Checks of the Keras layers' config values, shared by both families.

Every layer checks its config when it is made, so a config written by hand or changed
inside a saved .keras file fails on loading with a ValueError naming the layer, the field
and the valid range, instead of loading a model that computes something else.
"""
import math
import numbers

import numpy as np

# Largest extent of one spatial dimension, and the key bound B * R1 * ... * Rd * C < 2^63
# (csrc/channel/channel_sparse.h; site coordinates are int32).
MAX_EXTENT = 2**31 - 1
MAX_KEYS = 2**63
FLOATS = ("float16", "bfloat16", "float32", "float64")
# The channel ops run these; so do the layers that voxelize coordinates, which float16
# would round into other voxels than in training.
FLOAT32_OR_64 = ("float32", "float64")


def whole(value, field, what, minimum=1, maximum=None):
    """value as an int when it is a whole number in [minimum, maximum]; ValueError naming
    `what` (the layer) and `field` otherwise."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok and isinstance(value, numbers.Real) and not isinstance(value, bool):
        ok = math.isfinite(value) and float(value).is_integer()
    if not ok or value < minimum or (maximum is not None and value > maximum):
        valid = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{what}: {field} must be a whole number {valid}, got {value!r}")
    return int(value)


def whole_or_wholes(value, field, what, minimum=1, maximum=None):
    """An int, or a sequence of ints as a tuple, each a whole number in [minimum, maximum]."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (numbers.Number, list, tuple)):
        raise ValueError(f"{what}: {field} must be an int or a sequence of ints, got {value!r}")
    if isinstance(value, numbers.Number):
        return whole(value, field, what, minimum, maximum)
    if not value:
        raise ValueError(f"{what}: {field} must be an int or a non-empty sequence of ints, got {value!r}")
    return tuple(whole(v, f"{field} entry", what, minimum, maximum) for v in value)


def real(value, field, what, low=-math.inf, high=math.inf, low_open=False, high_open=False):
    """value as a float when it is a finite number in the interval; ValueError otherwise."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        if high == math.inf:
            valid = f"{'>' if low_open else '>='} {low:g}"
        else:
            valid = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{what}: {field} must be {valid} (a finite number), got {value!r}")
    return float(value)


def flag(value, field, what):
    """value when it is a bool (a string such as "false" would count as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{what}: {field} must be True or False, got {value!r}")
    return bool(value)


def choice(value, field, what, choices):
    """value when it is one of `choices`."""
    if not isinstance(value, (str, type(None))) or value not in choices:
        raise ValueError(f"{what}: {field} must be one of {choices}, got {value!r}")
    return value


def bounds_pair(bounds, field, what):
    """(lo, hi) of two finite numbers with lo < hi."""
    pair = isinstance(bounds, (list, tuple)) and len(bounds) == 2
    if not (pair and all(isinstance(b, numbers.Real) and not isinstance(b, bool) and math.isfinite(b) for b in bounds)
            and bounds[0] < bounds[1]):
        raise ValueError(f"{what}: {field} must be (low, high), two finite numbers with low < high, got {bounds!r}")
    return float(bounds[0]), float(bounds[1])


def grid(resolution, channels, what, field="resolution"):
    """The extents of a voxel grid (a tuple), refused where one batch element's keys would
    not fit in int64 (extents * channels >= 2^63)."""
    extents = (resolution,) if isinstance(resolution, int) else tuple(resolution)
    if math.prod(extents) * channels >= MAX_KEYS:
        raise ValueError(f"{what}: {field} {resolution} with {channels} channel(s) makes "
                         f"{math.prod(extents) * channels} cells per batch element; keys must stay below 2^63")
    return resolution


def dtype_policy(layer, allowed):
    """Refuses a layer whose dtype policy computes or stores variables in another dtype than
    `allowed`, or quantizes (the library's layers implement no quantized kernels)."""
    policy = layer.dtype_policy
    dtypes = (policy.compute_dtype, policy.variable_dtype)
    if any(d not in allowed for d in dtypes) or getattr(policy, "quantization_mode", None):
        raise ValueError(f"{layer.name}: dtype must be a policy computing and storing variables in one of "
                         f"{allowed}, got {policy.name!r} (compute {dtypes[0]}, variables {dtypes[1]})")


__all__ = ["whole", "whole_or_wholes", "real", "flag", "choice", "bounds_pair", "grid", "dtype_policy",
           "FLOATS", "FLOAT32_OR_64", "MAX_EXTENT"]
