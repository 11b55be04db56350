"""Conversions of the channel-sparse tensor to and from dense tensors and tf.SparseTensor,
key (de)compression and validation, with gradients."""
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.channel.direct_conv import check_conv_statuses
from tf_sparseconv.channel.tensor import ChannelSparseTensor, make_channel_sparse
from tf_sparseconv.checks import check_every_op, made_by_library
from tf_sparseconv.inputs import finite_checks, integer_tensor, real_tensor, refuse_complex, same_vector


def _check(x):
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"expected a ChannelSparseTensor, got {type(x).__name__}")


def from_dense(dense, non_finite="raise"):
    """Keeps the non-zero entries of a dense [B, R1..Rd, C] float tensor (d = 1..4).
    dense must be real (other types than float32 and float64 become float32; complex is
    TypeError) and finite: NaN or infinite entries are InvalidArgumentError unless
    non_finite="allow" (tf_sparseconv.inputs)."""
    dense = real_tensor(dense, "dense", "from_dense")
    if dense.dtype not in (tf.float32, tf.float64):
        dense = tf.cast(dense, tf.float32)
    with tf.control_dependencies(finite_checks(dense, non_finite, "dense entries", "from_dense")):
        keys, values, dense_shape = _ops.dense_to_channel_sparse(dense)
    return make_channel_sparse(keys, values, dense_shape, dense.shape)


def to_dense(x):
    """The dense [B, R1..Rd, C] tensor, zeros where x has no entry. Keys that one of the
    library's ops made in the same traced graph are not checked again (on the GPU: no wait);
    the data checks of the padded convolutions upstream (direct_conv's padded_output) are
    reported by one op beside the result, which nothing waits for: a traced function that
    holds it ends with its error (check_conv_statuses)."""
    _check(x)
    trusted = not check_every_op() and made_by_library(x.keys, x.dense_shape)
    dense = _ops.channel_sparse_to_dense(x.keys, x.values, x.dense_shape, inputs_checked=trusted,
                                         padded_input=x.padded)
    # The sparse part ends here: the data checks of padded convolutions upstream are read.
    dense = check_conv_statuses(dense, x.keys)
    if x.shape.rank is not None:
        dense = tf.ensure_shape(dense, x.shape)
    return dense


def _assert_dense_shape(x, dense):
    """dense's shape is x's dense_shape: the op reads keys in dense's layout, so another
    shape would gather other positions."""
    return tf.debugging.assert_equal(same_vector(tf.shape(dense, out_type=tf.int64), x.dense_shape), True,
                                     message="gather_dense: dense must have x's dense_shape")


def gather_dense(x, dense):
    """The values of `dense` at x's positions, as a ChannelSparseTensor with x's keys;
    dense must have x's dense_shape."""
    _check(x)
    dense = real_tensor(refuse_complex(dense, "dense", "gather_dense"), "dense", "gather_dense", x.dtype)
    with tf.control_dependencies([_assert_dense_shape(x, dense)]):
        return x.with_values(_ops.channel_sparse_gather_dense(x.keys, dense, padded_input=x.padded))


def encode_keys(indices, dense_shape):
    """[N, d+2] indices (b, x1..xd, c) -> int64 keys in the same row order. indices and
    dense_shape must be integers (a float is TypeError, never truncated)."""
    return _ops.channel_sparse_encode_keys(integer_tensor(indices, tf.int64, "indices", "encode_keys"),
                                           integer_tensor(dense_shape, tf.int64, "dense_shape", "encode_keys"))


def decode_keys(keys, dense_shape):
    """int64 keys -> [N, d+2] indices (b, x1..xd, c)."""
    return _ops.channel_sparse_decode_keys(integer_tensor(keys, tf.int64, "keys", "decode_keys"),
                                           integer_tensor(dense_shape, tf.int64, "dense_shape", "decode_keys"))


def reorder(keys, values, dense_shape):
    """Sorts in-range keys into canonical order (duplicates are an error). values must be
    real (other types than float32 and float64 become float32; complex is TypeError)."""
    keys = integer_tensor(keys, tf.int64, "keys", "reorder")
    dense_shape = integer_tensor(dense_shape, tf.int64, "dense_shape", "reorder")
    values = real_tensor(values, "values", "reorder")
    if values.dtype not in (tf.float32, tf.float64):
        values = tf.cast(values, tf.float32)
    keys, values, _ = _ops.channel_sparse_reorder(keys, values, dense_shape)
    return make_channel_sparse(keys, values, dense_shape)


def from_sparse_tensor(sp, non_finite="raise"):
    """From a tf.SparseTensor of shape [B, R1..Rd, C] in any index order (no duplicates).
    Its values must be real (other types than float32 and float64 become float32; complex
    is TypeError) and finite: NaN or infinite values are InvalidArgumentError unless
    non_finite="allow" (tf_sparseconv.inputs)."""
    if not isinstance(sp, tf.SparseTensor):
        raise TypeError(f"from_sparse_tensor expects a tf.SparseTensor, got {type(sp).__name__}")
    values = real_tensor(sp.values, "values", "from_sparse_tensor")
    values = values if values.dtype in (tf.float32, tf.float64) else tf.cast(values, tf.float32)
    with tf.control_dependencies(finite_checks(values, non_finite, "values", "from_sparse_tensor")):
        keys = encode_keys(sp.indices, sp.dense_shape)
    x = reorder(keys, values, sp.dense_shape)
    return x.with_shape(sp.shape)


def to_sparse_tensor(x):
    """A tf.SparseTensor in TensorFlow's canonical (row-major) order. x is checked first
    (validate: sorted unique keys in range, no NaN values)."""
    x = validate(x).without_padding()
    return tf.sparse.reorder(tf.SparseTensor(decode_keys(x.keys, x.dense_shape), x.values, x.dense_shape))


def validate(x):
    """Checks sorted, unique, in-range keys, matching values and a valid dense_shape.

    Raises tf.errors.InvalidArgumentError naming the problem; returns x unchanged.
    """
    _check(x)
    keys, values = _ops.channel_sparse_validate(x.keys, x.values, x.dense_shape, padded_input=x.padded)
    return ChannelSparseTensor(keys, values, x.dense_shape, x.shape, x.padded)


@tf.RegisterGradient(OP_NAMESPACE + "ChannelSparseToDense")
def _to_dense_grad(op, grad):
    # ToDense checked the keys (or was told the library made them)
    return [None, _ops.channel_sparse_gather_dense(op.inputs[0], grad, inputs_checked=not check_every_op(),
                                                   padded_input=op.get_attr("padded_input")), None]


@tf.RegisterGradient(OP_NAMESPACE + "ChannelSparseGatherDense")
def _gather_dense_grad(op, grad):
    # the forward gather checked the keys (or was told they were checked)
    return [None, _ops.channel_sparse_to_dense(op.inputs[0], grad, tf.shape(op.inputs[1], out_type=tf.int64),
                                               inputs_checked=not check_every_op(),
                                               padded_input=op.get_attr("padded_input"))]


@tf.RegisterGradient(OP_NAMESPACE + "DenseToChannelSparse")
def _from_dense_grad(op, _keys_grad, values_grad, _shape_grad):
    return [_ops.channel_sparse_to_dense(op.outputs[0], values_grad, op.outputs[2],
                                         inputs_checked=not check_every_op())]  # keys the forward made


@tf.RegisterGradient(OP_NAMESPACE + "ChannelSparseReorder")
def _reorder_grad(op, _keys_grad, values_grad, _perm_grad):
    n = tf.shape(op.inputs[1], out_type=tf.int64)
    return [None, tf.scatter_nd(op.outputs[2][:, None], values_grad, n), None]


@tf.RegisterGradient(OP_NAMESPACE + "ChannelSparseValidate")
def _validate_grad(_op, _keys_grad, values_grad):
    return [None, values_grad, None]


tf.no_gradient(OP_NAMESPACE + "ChannelSparseEncodeKeys")
tf.no_gradient(OP_NAMESPACE + "ChannelSparseDecodeKeys")
