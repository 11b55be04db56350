"""What the public functions of both families accept, checked where values enter.

- Integer inputs (coordinates, batch indices, shapes, keys) must be integers: a float or
  complex tensor is refused (TypeError), never truncated, and an integer outside the
  target type's range is refused (ValueError where the value is known while tracing,
  InvalidArgumentError otherwise), never wrapped.
- Feature values must be real: integers are converted to float32, complex is refused.
- Non-finite values follow one policy: where features enter a sparse tensor
  (make_site_sparse, site_from_dense, voxelize_sites; from_dense, from_sparse_tensor)
  NaN and infinite values are InvalidArgumentError unless non_finite="allow". Further
  in, the ops refuse NaN in what they read (the site convolution on the CPU and with an
  untrusted map on the GPU, every channel op), select_sites refuses NaN scores (their
  rank would be arbitrary), and the site pooling gives NaN wherever a NaN is pooled (in
  'max' mode too, where TensorFlow's segment max would keep or drop it by position).
"""
import numbers
import operator

import numpy as np
import tensorflow as tf

NON_FINITE = ("raise", "allow")


def integer_tensor(value, dtype, name, what):
    """value as a tensor of the integer dtype, refusing what the cast would change."""
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {name} must be integers in the {dtype.name} range, got {value!r}") from None
    if tensor.dtype == dtype:
        return tensor
    if tensor.dtype == tf.bool or not tensor.dtype.is_integer:
        hint = "; round or cast them yourself if that is what you mean" if tensor.dtype.is_floating else ""
        raise TypeError(f"{what}: {name} must be integers ({dtype.name}), got {tensor.dtype.name}{hint}")
    source = tensor.dtype
    if source.min >= dtype.min and source.max <= dtype.max:
        return tf.cast(tensor, dtype)
    lo, hi = max(source.min, dtype.min), min(source.max, dtype.max)
    message = f"{what}: {name} must lie in the {dtype.name} range [{dtype.min}, {dtype.max}]"
    known = tf.get_static_value(tensor)
    if known is not None:
        known = np.asarray(known)
        if known.size and (known.min() < lo or known.max() > hi):
            bad = known.min() if known.min() < lo else known.max()
            raise ValueError(f"{message}, got {bad}")
        return tf.cast(tensor, dtype)
    check = tf.debugging.assert_equal(tf.reduce_all((tensor >= lo) & (tensor <= hi)), True, message=message)
    with tf.control_dependencies([check]):
        return tf.cast(tensor, dtype)


def real_tensor(value, name, what, dtype=None):
    """value as a floating tensor (of dtype if given; integers become float32), refusing
    complex numbers, whose imaginary part a cast would drop."""
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype.is_complex or not (tensor.dtype.is_floating or tensor.dtype.is_integer
                                       or tensor.dtype == tf.bool):
        raise TypeError(f"{what}: {name} must be real numbers, got {tensor.dtype.name}")
    target = dtype or (tensor.dtype if tensor.dtype.is_floating else tf.float32)
    return tensor if tensor.dtype == target else tf.cast(tensor, target)


def refuse_complex(value, name, what):
    """value, unless it holds complex numbers (TypeError): for inputs converted to a
    real dtype by TensorFlow, which would drop the imaginary part of a NumPy array."""
    try:
        dtype = tf.as_dtype(value.dtype)  # tensors, variables (Keras' name theirs by a string) and arrays
    except (AttributeError, TypeError):
        dtype = None
    if (dtype is not None and dtype.is_complex) or (dtype is None and np.iscomplexobj(value)):
        raise TypeError(f"{what}: {name} must be real numbers, got complex values")
    return value


def int_attr(value, name, what):
    """value as a Python int for an op attribute: TypeError for a bool, float or other
    non-integer (never truncated)."""
    if isinstance(value, bool):
        raise TypeError(f"{what}: {name} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: {name} must be an int, got {value!r}") from None


def count_arg(value, name, what, minimum=1):
    """value as a Python int >= minimum (a size or a count): TypeError for a bool, float or
    other non-integer (never truncated), ValueError below minimum."""
    value = int_attr(value, name, what)
    if value < minimum:
        raise ValueError(f"{what}: {name} must be >= {minimum}, got {value}")
    return value


def float_attr(value, name, what):
    """value as a Python float for an op attribute: TypeError for a bool or anything but a
    real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what}: {name} must be a number, got {value!r}")
    return float(value)


def same_vector(a, b):
    """Whether the vectors a and b (of one integer dtype, e.g. two tensors' shapes) are
    equal, as a scalar bool tensor, whatever their lengths: tf.equal refuses two lengths,
    while both orders concatenated always have one and are equal only for equal vectors."""
    a_size, b_size = tf.size(a, out_type=a.dtype)[None], tf.size(b, out_type=b.dtype)[None]
    return tf.reduce_all(tf.equal(tf.concat([a_size, a, b], 0), tf.concat([b_size, b, a], 0)))


def check_non_finite(non_finite, what):
    if not isinstance(non_finite, str) or non_finite not in NON_FINITE:
        raise ValueError(f"{what}: non_finite must be 'raise' or 'allow', got {non_finite!r}")
    return non_finite


def finite_checks(values, non_finite, name, what):
    """The assert ops refusing NaN or infinite entries of values (none for
    non_finite='allow')."""
    if check_non_finite(non_finite, what) == "allow" or not values.dtype.is_floating:
        return []
    return [tf.debugging.assert_equal(
        tf.reduce_all(tf.math.is_finite(values)), True,
        message=f"{what}: {name} hold NaN or infinite values (non_finite='allow' lets them in)")]


def nan_checks(values, name, what):
    """The assert ops refusing NaN entries of values, for results that would depend on
    where a NaN sits (orderings, maxima)."""
    if not values.dtype.is_floating:
        return []
    return [tf.debugging.assert_equal(tf.reduce_any(tf.math.is_nan(values)), False,
                                      message=f"{what}: {name} hold NaN")]
