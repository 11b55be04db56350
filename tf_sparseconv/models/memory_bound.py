"""Memory bounds known before a model runs, and inference that keeps within a budget.

Every DirectSparseConv keeps at most k entries per (batch, channel) (§3.2), so its output is
bounded by B * Cout * k entries whatever the input; ReLU and max-pooling never add
entries. From these caps this module computes, per layer, a guaranteed upper bound on
the bytes of the layer's outputs and of the temporaries its CPU kernel allocates, and
for the whole forward pass the sum of all outputs plus the largest temporary (every
activation kept alive at once: an upper bound for inference).

The temporary terms follow the CPU kernels in csrc/channel/ (see direct_conv_kernels.cc):
decoded coordinates (4 bytes per entry and dimension), segment offsets, the present-
weight lists, the kept entries of every output segment until the output is assembled,
and per worker block either the dense path's position-major [R1*...*Rd, Cout] scratch
or the touched set of one segment plus its merge heap.

A serving model (tf_sparseconv.models.point_cloud_classifier / image_classifier) is
bounded through its core: the voxelized grid its PointCloudToSparse / ImageToSparse layer
makes is the first activation. The voxelization's own temporaries grow with the points
per cloud: they are in the bound only when points_per_sample is given. For comparison,
ModelBound.dense_bytes is what the same layers' outputs take as dense tensors.

Bounds are per device: under a tf.distribute strategy each replica holds its own batch, so
give memory_bound the batch of one replica (the global batch / replicas).
"""
import dataclasses
import math
import os

import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv.channel.conv_layer import DirectSparseConv
from tf_sparseconv.channel.keras_io import FIELDS, as_keras_inputs, from_keras_inputs
from tf_sparseconv.channel.layers import DenseToSparse, SparseMaxPool, SparseReLU, SparseToDense
from tf_sparseconv.channel.tensor import ChannelSparseTensor
from tf_sparseconv.geometry import pooled_shape
from tf_sparseconv.models.preprocessing import ImageToSparse, PointCloudToSparse
from tf_sparseconv.models.serving import ClassNames

# LayerBound.kind of the layers whose outputs are channel-sparse.
SPARSE_KINDS = ("voxelize", "image", "sparse_conv", "sparse_relu", "sparse_max_pool")
KEY_BYTES = 8
INDEX_BYTES = 8
# What one allocation may cost beyond its bytes: a large buffer is mapped in whole pages,
# plus the allocator's header and TensorFlow's 64-byte alignment.
ALLOCATION_OVERHEAD = 4096 + 16 + 64
# What one layer call costs beyond its tensors: Python objects, TensorFlow's eager op
# contexts and kernels' small bookkeeping. They come from the heap, which grows by whole
# pages (a to_dense call was measured one page over its buffers on a fresh CI machine).
CALL_OVERHEAD = 64 << 10
# Largest per-block scratch for which the conv kernel may pick its dense path
# (kMaxDenseScratchBytes in csrc/channel/direct_conv/direct_conv.h).
MAX_DENSE_SCRATCH_BYTES = 64 << 20


@dataclasses.dataclass
class LayerBound:
    name: str
    kind: str
    output_shape: tuple        # logical per-batch shape, batch included
    output_entries: int        # stored entries (sparse) or elements (dense)
    output_bytes: int
    temporary_bytes: int
    dense_bytes: int = 0       # the same output as one dense tensor of the value dtype


@dataclasses.dataclass
class ModelBound:
    batch_size: int
    layers: list
    activation_bytes: int      # all layer outputs, alive together
    temporary_bytes: int       # the largest single layer's temporaries
    total_bytes: int
    dense_bytes: int = 0       # all layer outputs as dense tensors: the dense grid's activations,
                               # to compare with activation_bytes
    notes: tuple = ()          # what the bound leaves out

    def table(self):
        lines = [f"{'layer':<28}{'kind':<16}{'entries':>14}{'output MB':>12}{'temp MB':>10}{'dense MB':>10}"]
        for b in self.layers:
            lines.append(f"{b.name:<28}{b.kind:<16}{b.output_entries:>14,}{b.output_bytes / 2**20:>12.2f}"
                         f"{b.temporary_bytes / 2**20:>10.2f}{b.dense_bytes / 2**20:>10.2f}")
        lines.append(f"forward pass at batch {self.batch_size}: activations {self.activation_bytes / 2**20:.2f} MB"
                     f" + largest temporary {self.temporary_bytes / 2**20:.2f} MB"
                     f" = {self.total_bytes / 2**20:.2f} MB")
        if self.dense_bytes:
            lines.append(f"activations: bound {self.activation_bytes / 2**20:.2f} MB vs dense grid "
                         f"{self.dense_bytes / 2**20:.2f} MB (the same layers' outputs as dense tensors; "
                         f"{self.activation_bytes / self.dense_bytes:.2f}x)")
        sparse = [b for b in self.layers if b.kind in SPARSE_KINDS]
        if sparse:
            entries = sum(b.output_entries for b in sparse)
            cells = sum(math.prod(b.output_shape) for b in sparse)
            lines.append(f"sparse layers: at most {entries:,} stored entries vs {cells:,} dense grid elements "
                         f"({entries / cells:.0%}; each entry also holds an 8-byte key)")
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def _worker_threads():
    configured = tf.config.threading.get_intra_op_parallelism_threads()
    return configured if configured > 0 else (os.cpu_count() or 1)


def _sparse_bytes(entries, value_bytes):
    return entries * (KEY_BYTES + value_bytes)


def _conv_bound(layer, shape, in_entries, batch, value_bytes, threads):
    """Output and temporary bytes of one DirectSparseConv (+ its ReLU) on an input bounded by
    in_entries entries."""
    d = len(shape) - 2
    cin, cout = shape[-1], layer.filters
    cells = math.prod(shape[1:-1])
    offsets = math.prod(layer.kernel_shape[:d])
    out_entries = batch * cout * min(layer.k_bound, cells)
    out_bytes = _sparse_bytes(out_entries, value_bytes) + 2 * batch * cout * INDEX_BYTES
    # Entries of one input segment are bounded by the input bound and the grid.
    in_per_segment = min(cells, in_entries)
    contributions = min(in_entries, cin * in_per_segment) * offsets
    touched = min(cells, contributions)
    streams = cin * offsets
    # The dense path: per block a position-major [S, Cout] scratch, plus the masked filter,
    # mask bytes and offset lists shared by all blocks.
    dense_scratch = cells * cout * (value_bytes + 1) + cells + 8
    dense = dense_scratch <= MAX_DENSE_SCRATCH_BYTES
    filter_size = offsets * cin * cout
    # masked filter and mask bytes, offset lists, per-row present-channel lists, row flags
    dense_tables = (filter_size * (value_bytes + 1) + offsets * cin * (48 + 24 + 4 * cout) + filter_size // cout
                    if dense else 0)
    # The merge path: one segment in flight per block: its touched set (vector growth may
    # double the capacity), k-selection's index order, the contribution streams and heap.
    # The dense path holds Cout segments' touched sets at once.
    segments_in_flight = cout if dense else 1
    per_block = (segments_in_flight * (2 * touched * (KEY_BYTES + value_bytes) + touched * INDEX_BYTES)
                 + streams * (48 + 4) + (dense_scratch if dense else 0))
    # With k-selection each segment's kept entries go straight into the staged output;
    # without it they are held until the output's exact size is known, then copied.
    kept_until_assembly = _sparse_bytes(out_entries, value_bytes) if layer.selection == "none" else 0
    temporary = (in_entries * d * 4                              # decoded coordinates
                 + (batch * cin + 1) * INDEX_BYTES               # segment offsets
                 + offsets * cin * cout * 48                     # present-weight lists
                 + 2 * (cout * cin + 1) * INDEX_BYTES
                 + dense_tables
                 + kept_until_assembly
                 + batch * cout * 72                             # per-segment results and offsets
                 + (threads + 1) * per_block)                    # the calling thread runs a block too
    # Allocations: 5 outputs; coordinates, offsets, weight lists (3), result table, offsets;
    # the dense tables (4, 2 per input channel, 1 per row); 2 vectors per output segment;
    # per block the scratch (3), order, streams, heap, and up to Cout touched sets.
    allocations = 5 + 7 + 4 + 2 * cin + offsets * cin + 2 * batch * cout + (threads + 1) * (7 + 2 * cout)
    if layer.activation == "relu":
        # The ReLU's output and its kept-index vector exist beside the conv output.
        out_bytes += _sparse_bytes(out_entries, value_bytes) + out_entries * INDEX_BYTES
        allocations += 3
    return out_entries, out_bytes, temporary + allocations * ALLOCATION_OVERHEAD


def _bound_layer(layer, shape, in_entries, batch, value_bytes, threads):
    """(kind, output shape, output entries, output bytes, temporary bytes) of one layer."""
    if isinstance(layer, DirectSparseConv):
        out_shape = (*shape[:-1], layer.filters)
        entries, out_bytes, temp = _conv_bound(layer, shape, in_entries, batch, value_bytes, threads)
        return "sparse_conv", out_shape, entries, out_bytes, temp
    if isinstance(layer, SparseReLU):
        return ("sparse_relu", shape, in_entries, _sparse_bytes(in_entries, value_bytes) + in_entries * INDEX_BYTES,
                3 * ALLOCATION_OVERHEAD)
    if isinstance(layer, SparseMaxPool):
        strides = layer.strides
        out_shape = (shape[0], *pooled_shape(shape[1:-1], strides), shape[-1])
        entries = min(in_entries, math.prod(out_shape))
        out_bytes = _sparse_bytes(entries, value_bytes) + entries * INDEX_BYTES
        temp = in_entries * (2 * INDEX_BYTES + 4 * (len(shape) - 2)) + (batch * shape[-1] + 1) * 2 * INDEX_BYTES
        return "sparse_max_pool", out_shape, entries, out_bytes, temp + 8 * ALLOCATION_OVERHEAD
    if isinstance(layer, SparseToDense):
        elements = math.prod(shape)
        return "to_dense", shape, elements, elements * value_bytes, ALLOCATION_OVERHEAD
    raise TypeError(f"no bound for layer {layer.name} ({type(layer).__name__})")


def _voxelize_temporary_bytes(layer, batch, points_per_sample):
    """Bytes PointCloudToSparse allocates besides its output for batch clouds of
    points_per_sample points: the sum of every allocation of its TensorFlow code (as if all
    were alive at once, more than eager mode keeps). Per point: float32 / float64 copies of
    the coordinates and the checks, the normalisation's copies and pairwise sums, cells and
    site indices, tf.unique's hash table, the sort; per site and per stored entry: feature
    sums, keys, masks, the argsort and the gathers."""
    points = batch * points_per_sample
    sites = batch * min(points_per_sample, layer.resolution ** 3)
    entries = sites * layer.channels
    per_point = 4 * layer.columns + 2 * 5 * layer.columns + 360 + 96
    per_site = per_entry = 0
    if layer.normalize == "unit_sphere":
        per_point += 340 + 8 * layer.columns
    if layer.features != ("occupancy",):
        per_point += 128
        per_site, per_entry = 168, 112
    return points * per_point + sites * per_site + entries * per_entry + 64 * ALLOCATION_OVERHEAD


def _input_bound(layer, batch, points_per_sample, value_bytes):
    """(shape, entries, output bytes, temporary bytes, dense bytes, note) of a model-entry
    layer: PointCloudToSparse (VoxelizePoints) or ImageToSparse."""
    if isinstance(layer, PointCloudToSparse):
        r, channels = layer.resolution, layer.channels
        cells = r ** 3
        per_sample = cells if points_per_sample is None else min(cells, points_per_sample)
        entries = batch * channels * per_sample
        shape = (batch, r, r, r, channels)
        note = None
        if points_per_sample is None:
            temp = 0
            note = (f"{layer.name}'s voxelization temporaries grow with the points per cloud and are not in the bound; "
                    "give points_per_sample to include them")
        else:
            temp = _voxelize_temporary_bytes(layer, batch, points_per_sample)
        return shape, entries, _sparse_bytes(entries, value_bytes), temp, math.prod(shape) * value_bytes, note
    if isinstance(layer, ImageToSparse):
        shape = (batch, *layer.image_shape, 1)
        entries = math.prod(shape)
        # the float32 copy, the threshold mask, the kept pixel indices and values, per pixel
        temp = entries * (4 + 1 + 8 + 4) + 16 * ALLOCATION_OVERHEAD
        return shape, entries, _sparse_bytes(entries, value_bytes), temp, entries * value_bytes, None
    raise TypeError(f"no bound for entry layer {layer.name}")


def _dense_layer_bound(layer, shape, batch, value_bytes):
    out_shape = layer.compute_output_shape(shape)
    elements = math.prod(int(s) for s in out_shape)
    return tuple(int(s) for s in out_shape), elements, elements * value_bytes


SITE_MODEL_NOTE = ("no memory bound for site-sparse models: the bound covers the channel-sparse layers "
                   "(DirectSparseConv, SparseMaxPool), and a site model's memory follows its active sites")


def _is_site_layer(layer):
    return type(layer).__module__.startswith("tf_sparseconv.site.")


def _flat_layers(model):
    """The model's layers in order, those of nested models (a serving model's core) inlined."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, keras.Model):
            yield from _flat_layers(layer)
        else:
            yield layer


def memory_bound(model, batch_size, points_per_sample=None, dtype=tf.float32):
    """Upper bounds for model at batch_size, per layer and for the forward pass.

    The model is a chain of layers starting at PointCloudToSparse (VoxelizePoints),
    ImageToSparse or a sparse_input dict (functional or Sequential-like), or a serving
    model around such a core (models.point_cloud_classifier / image_classifier).
    points_per_sample caps the entries a point-cloud model's voxelization can make
    (default: the whole grid) and adds the voxelization's temporaries, which are left out
    without it. Site-sparse models are refused (TypeError).
    """
    value_bytes = tf.as_dtype(dtype).size
    threads = _worker_threads()
    layers = list(_flat_layers(model))
    if any(_is_site_layer(layer) for layer in layers):
        raise TypeError(f"{model.name}: {SITE_MODEL_NOTE}")
    shape, entries, bounds, notes = None, None, [], []
    sparse_inputs = [t for t in model.inputs if t.name.endswith("shape_token")] if hasattr(model, "inputs") else []
    if sparse_inputs:
        shape = (batch_size, *sparse_inputs[0].shape[1:])
        entries = math.prod(shape)  # an arbitrary channel-sparse input can be dense
    for layer in layers:
        if isinstance(layer, ClassNames):
            continue  # the identity on the logits
        if isinstance(layer, (PointCloudToSparse, ImageToSparse)):
            shape, entries, out_bytes, temp, dense, note = _input_bound(layer, batch_size, points_per_sample,
                                                                        value_bytes)
            notes += [note] if note else []
            bounds.append(LayerBound(layer.name, "voxelize" if isinstance(layer, PointCloudToSparse) else "image",
                                     shape, entries, out_bytes, temp + CALL_OVERHEAD, dense))
        elif isinstance(layer, DenseToSparse):
            raise TypeError("DenseToSparse takes arbitrary dense input: bound the model from sparse_input instead")
        elif isinstance(layer, (DirectSparseConv, SparseReLU, SparseMaxPool, SparseToDense)):
            if shape is None:
                raise TypeError(f"layer {layer.name} has no bounded input before it")
            kind, shape, entries, out_bytes, temp = _bound_layer(layer, shape, entries, batch_size, value_bytes,
                                                                 threads)
            # A dense convolution with an activation holds its pre-activation output too, as the sparse one does.
            dense_tensors = 2 if isinstance(layer, DirectSparseConv) and layer.activation == "relu" else 1
            bounds.append(LayerBound(layer.name, kind, tuple(shape), entries, out_bytes, temp + CALL_OVERHEAD,
                                     dense_tensors * math.prod(shape) * value_bytes))
        else:
            shape, entries, out_bytes = _dense_layer_bound(layer, shape, batch_size, value_bytes)
            bounds.append(LayerBound(layer.name, type(layer).__name__, shape, entries, out_bytes,
                                     2 * ALLOCATION_OVERHEAD + CALL_OVERHEAD, out_bytes))
    activation = sum(b.output_bytes for b in bounds)
    temporary = max((b.temporary_bytes for b in bounds), default=0)
    return ModelBound(batch_size, bounds, activation, temporary, activation + temporary,
                      sum(b.dense_bytes for b in bounds), tuple(notes))


class MemoryBudgetExceeded(ValueError):
    pass


def largest_batch_within(model, budget_bytes, points_per_sample=None):
    """The largest batch size whose bound fits the budget (0 if even 1 does not)."""
    lo, hi = 0, 1
    while memory_bound(model, hi, points_per_sample).total_bytes <= budget_bytes:
        lo, hi = hi, hi * 2
        if hi > 1 << 20:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memory_bound(model, mid, points_per_sample).total_bytes <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def _batch_slices(inputs, start, stop):
    """Samples start..stop-1 of a batch: point clouds / dense arrays, or a channel-sparse dict."""
    if isinstance(inputs, dict) and set(inputs) == set(FIELDS):
        x = from_keras_inputs(inputs)
        per_sample = int(np.prod(x.dense_shape.numpy()[1:]))
        keys = x.keys.numpy()
        lo, hi = np.searchsorted(keys, [start * per_sample, stop * per_sample])
        dense_shape = x.dense_shape.numpy().copy()
        dense_shape[0] = stop - start
        part = ChannelSparseTensor(tf.constant(keys[lo:hi] - start * per_sample), x.values[lo:hi],
                                   tf.constant(dense_shape), x.shape)
        return as_keras_inputs(part)
    return inputs[start:stop]


def _batch_size_of(inputs):
    if isinstance(inputs, dict) and set(inputs) == set(FIELDS):
        return int(inputs["dense_shape"][0])
    return int(inputs.shape[0])


class BoundedInference:
    """Runs a model only on batches whose memory bound fits `budget_bytes`.

    on_exceed='refuse' raises MemoryBudgetExceeded for a batch over budget; 'split' runs
    it in the largest chunks that fit and concatenates the outputs.
    """

    def __init__(self, model, budget_bytes, on_exceed="split", points_per_sample=None):
        if on_exceed not in ("split", "refuse"):
            raise ValueError(f"on_exceed must be 'split' or 'refuse', got {on_exceed!r}")
        self.model, self.budget_bytes, self.on_exceed = model, int(budget_bytes), on_exceed
        self.points_per_sample = points_per_sample
        self.chunk_size = largest_batch_within(model, self.budget_bytes, points_per_sample)

    def __call__(self, inputs):
        batch = _batch_size_of(inputs)
        bound = memory_bound(self.model, batch, self.points_per_sample).total_bytes
        if bound <= self.budget_bytes:
            return self.model(inputs, training=False)
        if self.on_exceed == "refuse" or self.chunk_size == 0:
            raise MemoryBudgetExceeded(
                f"batch of {batch} is bounded by {bound / 2**20:.1f} MB, over the budget of "
                f"{self.budget_bytes / 2**20:.1f} MB; the largest batch within it is {self.chunk_size}"
                + (" (use on_exceed='split')" if self.chunk_size else ""))
        outputs = [self.model(_batch_slices(inputs, start, min(batch, start + self.chunk_size)), training=False)
                   for start in range(0, batch, self.chunk_size)]
        return tf.concat(outputs, axis=0)
