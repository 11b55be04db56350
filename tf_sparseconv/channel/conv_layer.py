"""DirectSparseConv: the direct sparse convolution as a Keras layer, with k-selection, pruning
masks, density metrics and adaptive density regularisation."""
import math
import threading

import keras
import tensorflow as tf

from tf_sparseconv.channel.direct_conv import (SELECTION_MODES, check_dataflow, check_temp_limit, direct_conv,
                                               k_from_rho_up)
from tf_sparseconv.channel.keras_io import SparseLayer, check_padded_output, logical_shape, padded_now
from tf_sparseconv.geometry import per_dim
from tf_sparseconv.layer_config import choice, flag, real, whole, whole_or_wholes

ACTIVATIONS = (None, "linear", "relu")


class KeepPrunedAtZero(keras.constraints.Constraint):
    """Applied after every optimizer step: pruned weights stay exactly 0 whatever the
    optimizer's momentum (the op already gives them no gradient)."""

    def __init__(self, mask):
        self.mask = mask

    def __call__(self, w):
        return w * tf.cast(self.mask, w.dtype)


def _sum_over_replicas(survivors, cells):
    """(survivors, cells) summed over the replicas of a tf.distribute strategy with more
    than one, so Eq. 4's density is the global batch's and every replica pulls its weights
    the same way; unchanged on one replica."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return survivors, cells
    return tuple(context.all_reduce(tf.distribute.ReduceOp.SUM, [survivors, cells]))


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class DirectSparseConv(SparseLayer):
    """Direct sparse convolution over 1-4 spatial dimensions ('same' padding, stride 1).

    Args:
      filters: output channels.
      kernel_size: odd int or tuple of odd ints.
      rho_up / k: density bound per (batch, channel): keep at most k = ceil(rho_up * R1*...*Rd)
        entries (give one, or neither for no bound).
      selection: 'signed' (largest values, the paper's default), 'abs', or 'none'; defaults
        to 'signed' when a bound is given.
      activation: None or 'relu' (sparse ReLU; a dense activation would fill empty space).
      density_regularizer: a DensityRegularizer (Eq. 4), needs rho_up.
      dataflow: 'auto', 'sort', 'dense', 'bitmap' or 'atomic' (both GPU only), how the op forms
        the touched set (direct_conv).
      temp_limit_bytes: a cap on the GPU sort's contribution buffers (None: no cap).
      accumulator: 0.1's name of dataflow ('merge' is 'sort'), deprecated.
      padded_output: False (the output holds its live entries only), True (a length known
        before the op runs, the live entries then padding: on the GPU no wait for the device
        after a library op; the data checks are read where SparseToDense ends the sparse
        part; see direct_conv) or "auto" (padded inside a traced function, as in fit,
        evaluate and predict, where TensorFlow sees a GPU: on the CPU there is no wait to
        spare, and the capacity only costs).
      max_entries: a cap on the output's entries (None: none), for a layer without k-selection
        whose padded output would otherwise take the bound B * filters * R1*...*Rd (capped by
        the input's entries times the present weights): the padded length is then at most
        max_entries, and more entries are refused with InvalidArgument (see direct_conv).
    Metrics: `<name>_density`, the output density (entries / (B * R1*...*Rd * filters)).
    """

    def __init__(self, filters, kernel_size=3, rho_up=None, k=None, selection=None, activation=None,
                 use_bias=True, kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 kernel_regularizer=None, bias_regularizer=None, density_regularizer=None,
                 dataflow="auto", temp_limit_bytes=None, accumulator=None, padded_output=False, max_entries=None,
                 **kwargs):
        super().__init__(**kwargs)
        what = self.name
        if rho_up is not None and k is not None:
            raise ValueError(f"{what}: give rho_up or k, not both")
        if rho_up is not None:
            rho_up = real(rho_up, "rho_up", what, 0.0, 1.0, low_open=True)
        if k is not None:
            k = whole(k, "k", what)
        bounded = rho_up is not None or k is not None
        if selection is None:
            selection = "signed" if bounded else "none"
        choice(selection, "selection", what, SELECTION_MODES)
        if bounded != (selection != "none"):
            raise ValueError(f"{what}: selection={selection!r} needs a bound (rho_up or k) exactly when it is not "
                             "'none'")
        if activation not in ACTIVATIONS:
            raise ValueError(f"{what}: activation must be None or 'relu' (a dense activation would fill empty "
                             f"space), got {activation!r}")
        if density_regularizer is not None and rho_up is None:
            raise ValueError(f"{what}: density_regularizer (Eq. 4) compares the density with rho_up: give rho_up")
        try:
            self.dataflow = check_dataflow(dataflow, accumulator)
            self.temp_limit_bytes = None if temp_limit_bytes is None else check_temp_limit(temp_limit_bytes)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
        self.padded_output = check_padded_output(padded_output, what)
        self.max_entries = None if max_entries is None else whole(max_entries, "max_entries", what)
        self.filters = whole(filters, "filters", what)
        # Odd sizes >= 1 ('same' padding centres the kernel); their count is checked in build.
        sizes = whole_or_wholes(kernel_size, "kernel_size", what)
        if any(s % 2 == 0 for s in ((sizes,) if isinstance(sizes, int) else sizes)):
            raise ValueError(f"{what}: kernel_size entries must be odd (the kernel is centred on each entry), "
                             f"got {kernel_size}")
        self.kernel_size = sizes
        self.rho_up, self.k, self.selection = rho_up, k, selection
        self.activation = None if activation == "linear" else activation
        self.use_bias = flag(use_bias, "use_bias", what)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        if isinstance(density_regularizer, dict):
            try:
                density_regularizer = keras.saving.deserialize_keras_object(density_regularizer)
            except ValueError as e:
                raise ValueError(f"{what}: {e}") from None
        if density_regularizer is not None and not (callable(getattr(density_regularizer, "penalty", None))
                                                    and hasattr(density_regularizer, "density")):
            # A Keras regularizer (e.g. "l2") has neither: it would fail at the first training step.
            raise ValueError(f"{what}: density_regularizer must be a tf_sparseconv DensityRegularizer (Eq. 4; "
                             f"kernel_regularizer takes Keras' regularizers), got {density_regularizer!r}")
        self.density_regularizer = density_regularizer
        # Set False by FineTunePhase: the regulariser stays in the config, its penalty is off.
        self.density_regularization_on = True
        self.density_metric = keras.metrics.Mean(name=f"{self.name}_density")

    def build(self, input_shape):
        shape = logical_shape(input_shape)
        d = shape.rank - 2
        cin = shape[-1]
        if cin is None:
            raise ValueError(f"{self.name}: the input's channel count must be known, got shape {shape}")
        sizes = per_dim(self.kernel_size, d, "kernel_size", what=self.name)
        if any(s % 2 == 0 for s in sizes):  # the op's 'same' padding centres the kernel on each entry
            raise ValueError(f"{self.name}: kernel_size must be {d} odd sizes, got {self.kernel_size}")
        self.spatial_shape = tuple(shape[1:-1].as_list())
        self.kernel_shape = (*sizes, int(cin), self.filters)
        # The pruning mask (1 = present); pruned weights are skipped by the op, which reads the
        # mask in host memory: kept there, a step copies nothing back from the GPU for it.
        with tf.device("/cpu:0"):
            self.mask = self.add_weight(name="mask", shape=self.kernel_shape, initializer="ones", trainable=False)
        # Weights found small at the last epoch end: the warning shot (§3.6).
        self.warned = self.add_weight(name="warned", shape=self.kernel_shape, initializer="zeros", trainable=False)
        self.kernel = self.add_weight(name="kernel", shape=self.kernel_shape, initializer=self.kernel_initializer,
                                      regularizer=self.kernel_regularizer, constraint=KeepPrunedAtZero(self.mask))
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.filters,), initializer=self.bias_initializer,
                                        regularizer=self.bias_regularizer)

    # Keras keeps a layer's add_loss losses in one list, shared by the threads in which a
    # MirroredStrategy runs its replicas; Eq. 4's all-reduce interleaves the replicas within
    # the forward pass, so each replica would read every replica's penalty. A list per
    # thread keeps each replica's own.
    @property
    def _losses(self):
        per_thread = self.__dict__.setdefault("_losses_per_thread", threading.local())
        if not hasattr(per_thread, "losses"):
            per_thread.losses = []
        return per_thread.losses

    @_losses.setter
    def _losses(self, value):
        self.__dict__.setdefault("_losses_per_thread", threading.local()).losses = value

    @property
    def k_bound(self):
        """Entries kept per (batch, channel): k, ceil(rho_up * S), or S without a bound."""
        size = math.prod(self.spatial_shape)
        if self.k is not None:
            return min(self.k, size)
        if self.rho_up is not None:
            return min(k_from_rho_up(self.rho_up, self.spatial_shape), size)
        return size

    def sparse_call(self, x, training=None):
        y, touched, positive = direct_conv(
            x, self.kernel, self.bias, self.bool_mask(), selection=self.selection,
            k=self.k, rho_up=self.rho_up, dataflow=self.dataflow, temp_limit_bytes=self.temp_limit_bytes,
            activation=self.activation, return_counts=True,  # the ReLU fused into the op
            padded_output=padded_now(self.padded_output), max_entries=self.max_entries)
        cells = tf.cast(tf.reduce_prod(y.dense_shape), tf.float32)
        self.density_metric.update_state(tf.cast(y.live_entries, tf.float32) / cells)
        if self.density_regularizer is not None and self.density_regularization_on and training:
            # Eq. 4's rho: what the layer would keep without the bound (the ReLU's survivors
            # before k-selection), so b > 0 exactly when k-selection has to cut.
            survivors = tf.cast(tf.reduce_sum(positive if self.activation == "relu" else touched, axis=0),
                                tf.float32)  # [Cout]
            survivors, all_cells = _sum_over_replicas(survivors, cells)
            if self.density_regularizer.density == "channel":
                rho = survivors / (all_cells / self.filters)
            else:
                rho = tf.reduce_sum(survivors) / all_cells
            self.add_loss(self.density_regularizer.penalty(self.kernel, self.mask, rho, self.rho_up, self.bias))
        return y

    def bool_mask(self):
        """The mask as the op takes it, cast on the host where the mask is."""
        with tf.device("/cpu:0"):
            return tf.cast(self.mask, tf.bool)

    def present_weights(self):
        return int(tf.reduce_sum(self.mask))

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters, kernel_size=self.kernel_size, rho_up=self.rho_up, k=self.k,
            selection=self.selection, activation=self.activation, use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            kernel_regularizer=keras.regularizers.serialize(self.kernel_regularizer),
            bias_regularizer=keras.regularizers.serialize(self.bias_regularizer),
            density_regularizer=None if self.density_regularizer is None
            else keras.saving.serialize_keras_object(self.density_regularizer),
            dataflow=self.dataflow, temp_limit_bytes=self.temp_limit_bytes, padded_output=self.padded_output,
            max_entries=self.max_entries)
        return config
