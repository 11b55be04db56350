"""The channel-sparse tensor type: sorted int64 keys, a values vector and a dense shape.

Keys compress {batch, x1..xd, channel} as key = (b * C + c) * (R1*...*Rd) + lin(x), so
sorted keys order entries by batch, then channel, then spatial position (Hackel et al.
§3). As a tf.experimental.ExtensionType it passes through tf.function, tf.data and
SavedModel signatures like any tensor.

A tensor that one of the library's ops allocated at a bound known before it ran (on the
GPU: without waiting for the device to learn the size) is *padded*: after its live
entries come padding entries, key PADDING_KEY (the largest int64, above every valid key)
and value 0, which every op of the family treats as absent. Only the library makes such
tensors (`padded` is True on them); a user's key equal to PADDING_KEY is out of range.
"""
import tensorflow as tf

# The key of a padding entry (common/key_layout.h's kPaddingKey).
PADDING_KEY = 2 ** 63 - 1


class ChannelSparseTensor(tf.experimental.ExtensionType):
    """A logical dense tensor [B, R1, ..., Rd, C] stored as sorted unique keys + values."""

    # The registered name lets SavedModels store and restore signatures of this type.
    __name__ = "tf_sparseconv.ChannelSparseTensor"

    keys: tf.Tensor
    values: tf.Tensor
    dense_shape: tf.Tensor
    # The static part of the logical dense shape, as tf.SparseTensor has one: what is
    # known while tracing (typically all but the batch size). Keras layers build from it.
    shape: tf.TensorShape = tf.TensorShape(None)
    # Whether the entries may end in padding (made by a library op with padded output).
    padded: bool = False

    @classmethod
    def spec(cls, shape, dtype=tf.float32, padded=False):
        """The TypeSpec for tf.function signatures: `shape` is the static logical shape,
        e.g. [None, 32, 32, 32, 1]; padded: tensors made with padding by a library op."""
        shape = tf.TensorShape(shape)
        return cls.Spec(keys=tf.TensorSpec([None], tf.int64), values=tf.TensorSpec([None], dtype),
                        dense_shape=tf.TensorSpec([shape.rank], tf.int64), shape=shape, padded=bool(padded))

    def __validate__(self):
        if self.keys.dtype != tf.int64 or self.dense_shape.dtype != tf.int64:
            raise TypeError("ChannelSparseTensor keys and dense_shape must be int64, got "
                            f"{self.keys.dtype.name} and {self.dense_shape.dtype.name}")
        if self.values.dtype not in (tf.float32, tf.float64):
            raise TypeError(f"ChannelSparseTensor values must be float32 or float64, got {self.values.dtype.name}")
        for name in ("keys", "values", "dense_shape"):
            shape = getattr(self, name).shape
            if shape.rank is not None and shape.rank != 1:
                raise ValueError(f"ChannelSparseTensor {name} must be a vector (rank 1), got shape {shape}")
        if self.keys.shape[0] is not None and self.values.shape[0] is not None and \
                self.keys.shape[0] != self.values.shape[0]:
            raise ValueError(f"ChannelSparseTensor has {self.keys.shape[0]} keys but {self.values.shape[0]} values")
        if self.shape.rank is not None and self.dense_shape.shape[0] is not None and \
                self.shape.rank != self.dense_shape.shape[0]:
            raise ValueError(f"ChannelSparseTensor static shape {self.shape} does not match a dense_shape "
                             f"of {self.dense_shape.shape[0]} entries")

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def rank(self):
        """Rank of the logical dense tensor (spatial dims + 2), known statically."""
        return self.shape.rank if self.shape.rank is not None else self.dense_shape.shape[0]

    @property
    def spatial_rank(self):
        return self.rank - 2

    @property
    def num_entries(self):
        """The stored entries, padding included (the capacity of a padded tensor)."""
        return tf.shape(self.keys, out_type=tf.int64)[0]

    @property
    def live_entries(self):
        """The entries that are not padding (a scalar tensor; on the device where keys are,
        found by a binary search without waiting for it)."""
        if not self.padded:
            return self.num_entries
        return tf.searchsorted(self.keys, tf.constant([PADDING_KEY], tf.int64), side="left", out_type=tf.int64)[0]

    def without_padding(self):
        """The same tensor with its live entries only (unchanged where it is not padded)."""
        if not self.padded:
            return self
        live = self.live_entries
        return ChannelSparseTensor(self.keys[:live], self.values[:live], self.dense_shape, self.shape)

    def with_values(self, values):
        return ChannelSparseTensor(self.keys, values, self.dense_shape, self.shape, self.padded)

    def with_shape(self, shape):
        """The same tensor with its static shape refined by `shape` (must be compatible)."""
        return ChannelSparseTensor(self.keys, self.values, self.dense_shape, self.shape.merge_with(shape),
                                   self.padded)

    def density(self):
        """Fraction of the logical dense tensor that is stored: live entries / (B*R1*...*Rd*C)."""
        total = tf.reduce_prod(self.dense_shape)
        return tf.cast(self.live_entries, tf.float64) / tf.cast(total, tf.float64)

    def memory_bytes(self):
        """Bytes held by keys and values (64-bit keys + the value width), padding included."""
        return self.num_entries * (8 + self.values.dtype.size)


def make_channel_sparse(keys, values, dense_shape, shape=None):
    """Builds a ChannelSparseTensor whose static shape merges `shape` with whatever is
    statically known of dense_shape (everything, in eager mode)."""
    static = tf.TensorShape(shape) if shape is not None else tf.TensorShape(None)
    known = tf.get_static_value(dense_shape)
    if known is not None:
        static = static.merge_with(tf.TensorShape([int(v) for v in known]))
    elif dense_shape.shape[0] is not None:
        static = static.merge_with(tf.TensorShape([None] * dense_shape.shape[0]))
    return ChannelSparseTensor(keys, values, dense_shape, static)
