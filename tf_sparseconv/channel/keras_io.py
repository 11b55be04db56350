"""How a channel-sparse tensor travels through Keras.

Keras layers take tensors or nested structures of tensors, not extension types, so
between Keras layers a ChannelSparseTensor is the dict {keys, values, dense_shape,
shape_token}. shape_token is a zero-element tensor whose static shape is
[0, R1, ..., Rd, C]: it carries the logical shape through Keras' symbolic tracing (so
layers can build their weights) and costs nothing at run time.
"""
import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv.channel.tensor import ChannelSparseTensor
from tf_sparseconv.checks import padded_by_library
from tf_sparseconv.layer_config import FLOAT32_OR_64, FLOATS, MAX_EXTENT, dtype_policy, whole

FIELDS = ("keys", "values", "dense_shape", "shape_token")


def as_keras_inputs(x):
    """ChannelSparseTensor -> the dict Keras layers and models take (use in tf.data .map)."""
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"expected a ChannelSparseTensor, got {type(x).__name__}")
    per_sample = x.shape[1:]
    if not per_sample.is_fully_defined():
        raise ValueError(f"the logical shape {x.shape} must be known apart from the batch size to enter a "
                         "Keras model; build the tensor with a static shape (e.g. .with_shape([None, 32, 32, 32, 1]))")
    return {"keys": x.keys, "values": x.values, "dense_shape": x.dense_shape,
            "shape_token": tf.zeros([0, *per_sample.as_list()], x.dtype)}


def from_keras_inputs(inputs):
    """The dict of as_keras_inputs (or a ChannelSparseTensor) -> ChannelSparseTensor."""
    if isinstance(inputs, ChannelSparseTensor):
        return inputs
    if not isinstance(inputs, dict) or set(inputs) != set(FIELDS):
        raise TypeError("sparse Keras layers take the dict {keys, values, dense_shape, shape_token} made by "
                        f"tf_sparseconv.keras_layers.as_keras_inputs, got {type(inputs).__name__}")
    shape = tf.TensorShape([None]).concatenate(inputs["shape_token"].shape[1:])
    # Padded keys (made inside a traced model by a layer with padded output) are known by
    # the op that made them; eager layers make no padding.
    return ChannelSparseTensor(inputs["keys"], inputs["values"], inputs["dense_shape"], shape,
                               padded_by_library(inputs["keys"]))


def sparse_input(shape, dtype="float32", name=None):
    """keras.Input for a channel-sparse batch of per-sample logical shape (R1, ..., Rd, C)."""
    entries = () if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") else tuple(shape)
    if not 2 <= len(entries) <= 5:
        raise ValueError(f"sparse_input: shape must be (R1, ..., Rd, C) with 1 to 4 extents, got {shape!r}")
    shape = tuple(whole(s, "shape entry", "sparse_input", 1, MAX_EXTENT) for s in entries)
    if keras.backend.standardize_dtype(dtype) not in FLOATS:
        raise ValueError(f"sparse_input: dtype must be one of {FLOATS}, got {dtype!r}")
    prefix = f"{name}_" if name else ""
    return {"keys": keras.Input(batch_shape=(None,), dtype="int64", name=prefix + "keys"),
            "values": keras.Input(batch_shape=(None,), dtype=dtype, name=prefix + "values"),
            "dense_shape": keras.Input(batch_shape=(len(shape) + 1,), dtype="int64", name=prefix + "dense_shape"),
            "shape_token": keras.Input(batch_shape=(0, *shape), dtype=dtype, name=prefix + "shape_token")}


def logical_shape(input_shape):
    """The logical shape [None, R..., C] from what Keras passes to build()."""
    if isinstance(input_shape, dict) and "shape_token" in input_shape:
        return tf.TensorShape([None, *input_shape["shape_token"][1:]])
    raise TypeError(f"sparse Keras layers take the dict made by as_keras_inputs / sparse_input; got shapes {input_shape}")


def check_padded_output(padded_output, what):
    """A sparse layer's padded_output option: 'auto', True or False (ValueError otherwise)."""
    if isinstance(padded_output, str) and padded_output == "auto":
        return padded_output
    if not isinstance(padded_output, (bool, np.bool_)):  # 1 or 0.0 would pass an `in (True, False)` test
        raise ValueError(f"{what}: padded_output must be 'auto', True or False, got {padded_output!r}")
    return bool(padded_output)


def gpu_visible():
    """Whether TensorFlow sees a GPU in this process."""
    return bool(tf.config.list_logical_devices("GPU"))


def padded_now(padded_output):
    """Whether a layer with this padded_output option pads the call being made: 'auto' pads
    inside traced functions (fit, evaluate, predict), where padded dicts can pass between
    layers (SparseLayer.call), where TensorFlow sees a GPU. Padding spares the GPU's ops a
    wait for the device; on the CPU there is none to spare, and the capacity only costs (an
    OctNet3 32^3 training step on 2 cores: 694 / 698 ms padded against 653 / 639 exact)."""
    if padded_output == "auto":
        return tf.inside_function() and gpu_visible()
    return bool(padded_output)


class CustomOpLayer(keras.layers.Layer):
    """A layer running the library's ops, TensorFlow custom ops that XLA cannot compile: Keras
    is told not to jit_compile models using it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOAT32_OR_64)  # the channel ops' dtypes
        self.supports_jit = False


class SparseLayer(CustomOpLayer):
    """Base of the sparse layers: dict in, dict out."""

    def call(self, inputs, training=None):
        # Subclasses define sparse_call(ChannelSparseTensor, training) -> ChannelSparseTensor.
        y = self.sparse_call(from_keras_inputs(inputs), training=training)
        if y.padded and not tf.inside_function():
            # An eager dict cannot say that it is padded (padded_by_library reads a traced
            # graph), so the next layer would take the padding for a user's keys: dropped.
            y = y.without_padding()
        return as_keras_inputs(y)

