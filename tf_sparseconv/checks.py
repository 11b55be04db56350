"""The debug switch of the library's input checks.

Tensors that enter from the user are checked by the op that first takes them; what a
library op computes from checked inputs (a forward call's output keys, the inputs its
gradient receives back) is not checked again, so that on the GPU those calls queue their
work without waiting for the device. TF_SPARSECONV_CHECK_EVERY_OP=1 in the environment,
set before a model is built or traced, makes every op check its inputs again (on the
GPU at the cost of one wait per call), for tests and for users chasing a bug. It also
turns off the deferral of a padded convolution's data checks (direct_conv's padded_output,
reported once beside to_dense): each convolution then raises its own error at once.
"""
import os

CHECK_EVERY_OP_ENV = "TF_SPARSECONV_CHECK_EVERY_OP"


def check_every_op():
    """True where TF_SPARSECONV_CHECK_EVERY_OP is 1 (read when an op is added to a graph)."""
    value = os.environ.get(CHECK_EVERY_OP_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{CHECK_EVERY_OP_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


# Ops of the library whose keys output (output 0) holds keys they made or checked, and where
# the layout those keys are valid in lies: their output or input dense_shape, by index.
_KEY_SOURCES = {"DirectSparseConv": ("output", 2), "SparseRelu": ("input", 2), "SparseMaxPool": ("output", 2),
                "DenseToChannelSparse": ("output", 2), "ChannelSparseValidate": ("input", 2),
                "ChannelSparseReorder": ("input", 2)}
# Ops that hand their first input on unchanged (Keras and tf.function insert them).
_PASS_THROUGH = ("Identity", "EnsureShape")


def _origin(tensor):
    """tensor, or what the pass-through ops above it hand on; None for an eager tensor."""
    while True:
        op = getattr(tensor, "op", None)  # eager tensors have no op
        if op is None:
            return None
        if op.type not in _PASS_THROUGH:
            return tensor
        tensor = op.inputs[0]


# Ops by which a tensor enters a traced graph: the function's arguments, the batches of its
# tf.data iterator.
_GRAPH_INPUTS = ("Placeholder", "IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue")


def enters_the_graph(tensor):
    """True where, in a traced graph, tensor is one of the graph's inputs (an argument of the
    traced function, or a batch of its iterator), through the pass-through ops; False for an
    eager tensor."""
    tensor = _origin(tensor)
    return tensor is not None and tensor.op.type in _GRAPH_INPUTS


def made_by_library(keys, dense_shape):
    """True where, in a traced graph, keys are the keys output of one of the library's ops,
    which made or checked them, and dense_shape is the layout they are valid in (that op's).
    An op that takes them can skip its checks (and, on the GPU, its wait); eager tensors, the
    user's tensors and a dense_shape from elsewhere are checked as ever."""
    from tf_sparseconv._op_library import OP_NAMESPACE
    keys, dense_shape = _origin(keys), _origin(dense_shape)
    if keys is None or dense_shape is None or keys.value_index != 0 or not keys.op.type.startswith(OP_NAMESPACE):
        return False
    source = _KEY_SOURCES.get(keys.op.type[len(OP_NAMESPACE):])
    if source is None:
        return False
    side, index = source
    layout = keys.op.outputs[index] if side == "output" else _origin(keys.op.inputs[index])
    return layout is not None and layout.ref() == dense_shape.ref()


# Ops of the library whose keys output may end in padding, and the attribute that says so.
_PADDING_SOURCES = {"SparseMaxPool": "padded_output", "ChannelSparseValidate": "padded_input",
                    "DirectSparseConv": "padded_output", "SparseRelu": "padded_output"}


def padded_by_library(keys):
    """True where, in a traced graph, keys are the keys output of one of the library's ops
    that may end them in padding (tf_sparseconv.channel.tensor): how a channel-sparse tensor
    that travelled as a Keras dict, which has no `padded` field, is known to be padded."""
    from tf_sparseconv._op_library import OP_NAMESPACE
    keys = _origin(keys)
    if keys is None or keys.value_index != 0 or not keys.op.type.startswith(OP_NAMESPACE):
        return False
    attr = _PADDING_SOURCES.get(keys.op.type[len(OP_NAMESPACE):])
    return attr is not None and keys.op.get_attr(attr)


def padded_convs_upstream(keys):
    """The DirectSparseConv ops with padded_output whose outputs reach keys through the
    library's ops (and the pass-through ops) in keys' traced graph, stopping at status checks
    already made: the convolutions whose deferred data checks (their `status` output) a
    consumer of keys reads; none for an eager tensor."""
    from tf_sparseconv._op_library import OP_NAMESPACE
    op = getattr(keys, "op", None)
    if op is None:
        return []
    found, seen, stack = [], set(), [op]
    while stack:
        op = stack.pop()
        if op.name in seen or not (op.type.startswith(OP_NAMESPACE) or op.type in _PASS_THROUGH):
            continue
        seen.add(op.name)
        if op.type == OP_NAMESPACE + "DirectSparseConvCheckStatus":
            continue
        if op.type == OP_NAMESPACE + "DirectSparseConv" and op.get_attr("padded_output"):
            found.append(op)
        stack.extend(t.op for t in op.inputs)
    return sorted(found, key=lambda o: o.name)
