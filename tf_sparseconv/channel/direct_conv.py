"""Direct sparse convolution with k-selection attention (Hackel et al. Alg. 1, §3.2)."""
import math
import numbers
import warnings

import numpy as np
import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.channel.keras_io import gpu_visible
from tf_sparseconv.channel.tensor import ChannelSparseTensor
from tf_sparseconv.checks import check_every_op, enters_the_graph, made_by_library, padded_convs_upstream
from tf_sparseconv.inputs import count_arg, float_attr, int_attr, refuse_complex
from tf_sparseconv.layer_config import flag

SELECTION_MODES = ("none", "signed", "abs")
ACTIVATIONS = (None, "relu")
DATAFLOWS = ("auto", "sort", "dense", "bitmap", "atomic")
# tf_sparseconv 0.1's name of the CPU's dataflow choice, kept one release: its 'merge' is 'sort'.
ACCUMULATORS = {"auto": "auto", "dense": "dense", "merge": "sort"}


def check_dataflow(dataflow, accumulator=None):
    """The dataflow to run: `dataflow`, or what the deprecated `accumulator` names (warning)."""
    if dataflow not in DATAFLOWS:
        raise ValueError(f"dataflow must be one of {DATAFLOWS}, got {dataflow!r}")
    if accumulator is None or accumulator == "auto":
        return dataflow
    if accumulator not in ACCUMULATORS:
        raise ValueError(f"accumulator must be one of {tuple(ACCUMULATORS)}, got {accumulator!r}")
    warnings.warn("tf_sparseconv: accumulator= is deprecated and will be removed; use dataflow= "
                  "('merge' is 'sort')", DeprecationWarning, stacklevel=3)
    named = ACCUMULATORS[accumulator]
    if dataflow not in ("auto", named):
        raise ValueError(f"dataflow={dataflow!r} and accumulator={accumulator!r} disagree; give dataflow alone")
    return named


def check_temp_limit(temp_limit_bytes):
    """The op's temp_limit_bytes: a whole number of bytes >= 0, 0 (or None) for no limit."""
    if temp_limit_bytes is None:
        return 0
    if isinstance(temp_limit_bytes, bool) or not isinstance(temp_limit_bytes, numbers.Integral) \
            or temp_limit_bytes < 0:
        raise ValueError(f"temp_limit_bytes must be a whole number of bytes >= 0 (None or 0: no limit), "
                         f"got {temp_limit_bytes!r}")
    return int(temp_limit_bytes)


def k_from_rho_up(rho_up, spatial_shape):
    """k = ceil(rho_up * R1 * ... * Rd): the per-(batch, channel) entry bound.

    rho_up is rounded to float32 first, as the op's attr holds it: ceil(0.1 * 100) is 10
    in double precision but 11 from float32 0.1, and the bound must be the op's.
    spatial_shape: the extents R1..Rd, ints >= 1."""
    rho_up = float_attr(rho_up, "rho_up", "k_from_rho_up")
    if not 0.0 < rho_up <= 1.0:
        raise ValueError(f"k_from_rho_up: rho_up must be in (0, 1], got {rho_up}")
    if isinstance(spatial_shape, (str, bytes)) or not hasattr(spatial_shape, "__iter__"):
        raise TypeError(f"k_from_rho_up: spatial_shape must be a sequence of extents R1..Rd, got {spatial_shape!r}")
    extents = [count_arg(r, "spatial_shape entries", "k_from_rho_up") for r in spatial_shape]
    if not extents:
        raise ValueError("k_from_rho_up: spatial_shape must have at least one extent, got none")
    return int(math.ceil(float(np.float32(rho_up)) * math.prod(extents)))


def direct_conv(x, filters, bias=None, filter_mask=None, *, selection="none", k=None,
                rho_up=None, dataflow="auto", temp_limit_bytes=None, accumulator=None, activation=None,
                return_counts=False, padded_output=False, max_entries=None):
    """Convolves a ChannelSparseTensor [B, R..., Cin] with a [K..., Cin, Cout] filter.

    Stride 1, 'same' zero padding, odd kernel sizes, cross-correlation as in
    tf.nn.convolution, restricted to the touched set: every position that a present
    entry reaches through a present (filter_mask true) weight. `selection` 'signed' or
    'abs' keeps at most k entries per (batch, output channel); give k or rho_up.

    `dataflow` chooses how the touched set is formed, with the same result: 'sort' (the
    contributions in output-key order; memory follows the entries), 'dense' (buffers over
    the grid; memory follows B * R1*...*Rd), 'bitmap' (the GPU only, refused on the CPU: a
    bit per input and output key, the touched keys read from the bits in order without a
    sort; memory follows B * R1*...*Rd / 8 per channel), 'atomic' (the GPU only, refused on
    the CPU and under tf.config.experimental.enable_op_determinism: the touched keys from the
    output bits as 'bitmap', each contribution added with a float atomic, no sort; values
    within rounding of the others', their last bits varying run to run) or 'auto' (each
    device's rule; the GPU takes 'atomic' for large convolutions unless op determinism is on).
    `temp_limit_bytes` caps the GPU sort's contribution buffers by running the batch in
    groups of whole examples (None or 0: no cap; under 'auto' the GPU then takes the bitmaps
    only where they fit the cap); the CPU holds no such buffers.
    `accumulator` is 0.1's name of the choice ('merge' is 'sort'), deprecated.
    `activation` 'relu' is sparse_relu fused into the op: the same output as
    sparse_relu(direct_conv(...)) without a second op (on the GPU, without its wait).
    `padded_output` True: the result's length is known before the op runs (with selection
    B * Cout * min(k, S), capped by the input's length times the present weights of an input
    channel), its live entries followed by padding (ChannelSparseTensor.padded). On the GPU,
    with keys that one of the library's ops made in the same traced graph, or that enter the
    traced graph (checked on the host first, `check_on_host`), the op then does not wait for
    the device; its data checks (NaN in values, filter or bias, or before the
    fused ReLU) are reported by `to_dense` where the sparse part ends, as one InvalidArgument
    naming the convolution, at the latest when the traced function ends. A result that never
    reaches `to_dense` is not checked then.

    `max_entries` caps the output's entries (None: no cap), where k-selection does not
    bound them: more kept entries are refused with InvalidArgument. With padded_output the
    result's length is then the smaller of the bound above and max_entries (the memory of a
    convolution without selection known before it runs); where the GPU did not wait for
    the device, the overflow is reported by the end of the traced function (a status report
    of the convolution's own, beside the one `to_dense` makes), whether or not the result
    reaches `to_dense`.

    Returns a ChannelSparseTensor [B, R..., Cout]; with return_counts also two [B, Cout]
    int64 tensors measured before k-selection: the support size (touched entries) and the
    number of entries > 0 (what a following ReLU keeps; the density of Eq. 4).
    """
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"direct_conv expects a ChannelSparseTensor, got {type(x).__name__}")
    if selection not in SELECTION_MODES:
        raise ValueError(f"selection must be one of {SELECTION_MODES}, got {selection!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or 'relu' (a dense activation would fill empty space), "
                         f"got {activation!r}")
    dataflow = check_dataflow(dataflow, accumulator)
    temp_limit_bytes = check_temp_limit(temp_limit_bytes)
    padded_output = flag(padded_output, "padded_output", "direct_conv")
    max_entries = 0 if max_entries is None else count_arg(max_entries, "max_entries", "direct_conv")
    filters = tf.convert_to_tensor(refuse_complex(filters, "filters", "direct_conv"), dtype=x.dtype)
    cout = tf.shape(filters)[-1]
    if bias is None:
        bias = tf.zeros([cout], dtype=x.dtype)
    refuse_complex(bias, "bias", "direct_conv")
    if filter_mask is None:
        filter_mask = tf.ones_like(filters, dtype=tf.bool)
    trusted = not check_every_op() and made_by_library(x.keys, x.dense_shape)
    if not trusted and not check_every_op() and check_on_host(x.keys):
        x = validate_on_host(x)
        trusted = made_by_library(x.keys, x.dense_shape)
    keys, values, dense_shape, touched, positive, _status = _ops.direct_sparse_conv(
        in_keys=x.keys, in_values=x.values, dense_shape=x.dense_shape, filter=filters,
        filter_mask=tf.cast(filter_mask, tf.bool), bias=tf.convert_to_tensor(bias, dtype=x.dtype),
        selection=selection, k=0 if k is None else int_attr(k, "k", "direct_conv"),
        rho_up=0.0 if rho_up is None else float_attr(rho_up, "rho_up", "direct_conv"), dataflow=dataflow,
        temp_limit_bytes=temp_limit_bytes, activation=activation or "none", padded_input=x.padded,
        padded_output=padded_output, inputs_checked=trusted, max_entries=max_entries)
    if max_entries and padded_output and not tf.executing_eagerly():
        # An overflow of a capped output is reported whether or not the output reaches
        # to_dense: this convolution's own status report, which nothing waits for and the
        # traced function runs before it returns (on the CPU, and on the GPU where the op
        # waited for its count, the op has refused already).
        _ops.direct_sparse_conv_report_status([_status], sources=[keys.op.name])
    out_shape = x.shape if x.shape.rank is None else x.shape[:-1].concatenate([filters.shape[-1]])
    y = ChannelSparseTensor(keys, values, dense_shape, out_shape, padded_output)
    return (y, touched, positive) if return_counts else y


def check_on_host(keys):
    """Whether the user's keys are checked on the host before a GPU convolution: where they
    enter a traced graph (a tf.data batch arrives in host memory). The GPU op's own check
    reads its result back, a wait for the GPU to reach it behind all the work queued before;
    the host's check waits for nothing, and the op then trusts the keys."""
    return enters_the_graph(keys) and gpu_visible()


def validate_on_host(x):
    """x, its keys and values checked by ChannelSparseValidate on the host (InvalidArgument
    naming the problem otherwise)."""
    from tf_sparseconv.channel.conversions import validate
    with tf.device("/cpu:0"):
        return validate(x)


@tf.RegisterGradient(OP_NAMESPACE + "DirectSparseConv")
def _direct_sparse_conv_grad(op, _keys_grad, values_grad, _shape_grad, _touched_grad, _positive_grad,
                             _status_grad):
    in_keys, in_values, dense_shape, filters, filter_mask, _bias = op.inputs
    in_grad, filter_grad, bias_grad = _ops.direct_sparse_conv_backprop(
        in_keys=in_keys, in_values=in_values, dense_shape=dense_shape, filter=filters,
        filter_mask=filter_mask, out_keys=op.outputs[0], out_grad=values_grad,
        dataflow=op.get_attr("dataflow"), inputs_checked=not check_every_op(),  # the forward checked them
        padded_input=op.get_attr("padded_input"), padded_output=op.get_attr("padded_output"))
    return [None, in_grad, None, filter_grad, None, bias_grad]


tf.no_gradient(OP_NAMESPACE + "DirectSparseConvReportStatus")


@tf.RegisterGradient(OP_NAMESPACE + "DirectSparseConvCheckStatus")
def _check_status_grad(op, grad):
    return [grad] + [None] * (len(op.inputs) - 1)


def check_conv_statuses(tensor, keys):
    """tensor, unchanged; in a traced graph, beside it one DirectSparseConvReportStatus op
    that reads the status outputs of the padded convolutions upstream of keys. No op takes
    its output, so nothing after the convolutions waits for the GPU to reach them (on the
    GPU the statuses are read back asynchronously); being stateful, it is kept in the traced
    function, which ends with its error (at the latest at the end of a training step, after
    the step's other ops, its variable updates among them). Nothing where there are none."""
    convs = padded_convs_upstream(keys)
    if convs:
        _ops.direct_sparse_conv_report_status([op.outputs[5] for op in convs], sources=[op.name for op in convs])
    return tensor
