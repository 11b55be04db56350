"""Memory bounds known before a model runs, and inference that keeps within a budget.

Every DirectSparseConv keeps at most k entries per (batch, channel) (§3.2), so its output is
bounded by B * Cout * k entries whatever the input; ReLU and max-pooling never add
entries. From these caps this module computes, per layer, an upper bound on the bytes of
the layer's outputs and of the temporaries its kernel allocates, and for the whole
forward pass the sum of all outputs plus the largest temporary (every activation kept
alive at once: an upper bound for inference).

The temporary terms follow the kernels: on the CPU (csrc/channel/direct_conv/
direct_conv_kernels.cc) decoded coordinates (4 bytes per entry and dimension), segment
offsets, the present-weight lists, the kept entries of every output segment until the
output is assembled, and per worker block the dense path's position-major
[R1*...*Rd, Cout] scratch or the touched set of one segment plus its merge heap; on the
GPU (direct_conv.cu) the sort's contribution buffers or the dense grid's buffers and
k-selection's.

Site-sparse models (models.site_resnet, site_unet with site inputs) are bounded per grid
of sites: every tensor on one spatial shape holds at most B * min(cells, points per
sample) sites (a strided level at most what its input reaches), a submanifold map at most
volume pairs per site; each site layer adds its feature rows and, where it builds a kernel
map, the map's rows and the builder's hash tables (_SiteWalk).

A serving model (tf_sparseconv.models.point_cloud_classifier / image_classifier) is
bounded through its core, after its preprocessing: the float32 copy of the clouds or
images, and the voxelized grid its PointCloudToSparse / ImageToSparse layer makes. The
voxelization's temporaries grow with the points per cloud: they are in the bound when
points_per_sample is given (BoundedInference takes it from each input); _voxelize_bytes
lists them. For comparison, ModelBound.dense_bytes is what the same layers' outputs take
as dense tensors.

Bounds are per device: under a tf.distribute strategy each replica holds its own batch, so
give memory_bound the batch of one replica (the global batch / replicas).
"""
import dataclasses
import math
import numbers
import os

import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv.channel.conv_layer import DirectSparseConv
from tf_sparseconv.channel.keras_io import FIELDS, as_keras_inputs, from_keras_inputs
from tf_sparseconv.channel.layers import DenseToSparse, SparseMaxPool, SparseReLU, SparseToDense
from tf_sparseconv.channel.tensor import ChannelSparseTensor
from tf_sparseconv.geometry import pooled_shape
from tf_sparseconv.layer_config import whole
from tf_sparseconv.models.ensemble import MeanSoftmax
from tf_sparseconv.models.point_normals import chunk_rows
from tf_sparseconv.models.preprocessing import ImageToSparse, PointCloudToSparse
from tf_sparseconv.models.serving import ClassNames
from tf_sparseconv.site.conv_layers import _SiteConv, _SparseInverseConv
from tf_sparseconv.site.layers import SiteFeatures, SiteSelect, SparseToSite, _SiteMerge
from tf_sparseconv.site.pool_layers import SiteGlobalPool

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
# What one layer call may add per CPU worker thread: each of TensorFlow's intra-op threads
# allocates from its own glibc malloc arena, whose heap a call can grow by glibc's top pad
# (128 KiB) and a page before the memory is trimmed again. Measured on a lent 32-core host
# (2026-11-30): the small layers after the convolutions grew peak RSS by 1.2-3.8 MB beyond
# their tensors, and by nothing with MALLOC_ARENA_MAX=1 or 2-8 threads.
THREAD_ARENA_BYTES = (128 << 10) + 4096
DEVICES = ("cpu", "gpu")


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


def _gpu_conv_temporary_bytes(layer, shape, in_entries, batch, value_bytes):
    """Scratch of DirectConvForwardGpu::Run (csrc/channel/direct_conv/direct_conv.cu) on at
    most in_entries input entries: the sort dataflow's two contribution buffers of keys and
    values (one slot per entry and present weight of its input channel) and per-entry data;
    the dense dataflow's grid buffers (input values, output sums, their bit masks, the
    neighbour masks) and touched keys and values; k-selection's two index buffers and keep
    flags (and, for the dense grid, its two score buffers); 8 bytes per sorted item for the
    radix sorts' and compactions' temporary storage. 'auto' picks by the input's real
    entries (DenseForwardBytes < SortForwardBytes in direct_conv_gpu.h), so the bound is
    the larger of the dense grid and the sort at the most entries it would still sort, and of
    the bitmaps (a bit per input and output key, a 4-byte first entry per input word) and,
    from 2^20 contribution slots, the atomic sums (a bit and a 4-byte rank per 32 output
    keys), where 'auto' may take them: each with the touched keys and values, per-entry data,
    and k-selection's ties, segments, tie ranks and keep flags in buffers of their own."""
    d = len(shape) - 2
    cin, cout = shape[-1], layer.filters
    cells = math.prod(shape[1:-1])
    grid, no_output = batch * cells, batch * cout * cells
    max_row = math.prod(layer.kernel_shape[:d]) * cout
    select = layer.selection != "none"

    def sort_bytes(n):
        slots = n * max_row
        touched = min(slots, no_output)
        return slots * (16 + 2 * value_bytes + 8) + n * (12 + 4 * d) + (touched * 9 if select else 0)

    def touched_set_bytes(n):  # the bitmaps' and the atomic sums' touched set, entries' data, k-selection
        touched = min(n * max_row, no_output)
        return touched * (8 + value_bytes + 8) + n * (12 + 4 * d) + (touched * 21 if select else 0)

    def atomic_bytes(n):  # a bit and a 4-byte rank per output key's word
        return (no_output + 31) // 32 * 8 + touched_set_bytes(n)

    def bitmap_bytes(n):  # a bit and a 4-byte first entry per input word, a bit per output key
        return (grid * cin + 31) // 32 * 8 + (no_output + 31) // 32 * 4 + touched_set_bytes(n)

    touched = min(in_entries * max_row, no_output)
    dense = (grid * cin * (value_bytes + 1) + grid * 5 + no_output * (value_bytes + 1)
             + touched * (8 + value_bytes + 8) + (touched * 25 if select else 0))
    if layer.dataflow == "dense":
        return dense
    if layer.dataflow == "sort":
        return sort_bytes(in_entries)
    if layer.dataflow == "atomic":
        return atomic_bytes(in_entries)
    if layer.dataflow == "bitmap":
        return bitmap_bytes(in_entries)
    # 'auto' may take the atomic sums from kMinAtomicSlots, the bitmaps where they take at most
    # twice the sort's memory or 256 MiB (BitmapsFit; the present weights are not known here)
    atomic = atomic_bytes(in_entries) if in_entries * max_row >= 2**20 else 0
    bitmap = bitmap_bytes(in_entries)
    if bitmap > max(2 * sort_bytes(in_entries), 256 << 20):
        bitmap = 0
    # the op's estimates, which decide
    dense_estimate = grid * cin * (value_bytes + 0.125) + grid * 4.125 + no_output * (2 * value_bytes + 24.125)
    switch = int(dense_estimate // (max_row * (16 + 2 * value_bytes)))
    if in_entries <= switch:
        return max(sort_bytes(in_entries), atomic, bitmap)
    return max(dense, sort_bytes(switch), atomic, bitmap)


def _conv_bound(layer, shape, in_entries, batch, value_bytes, threads, device="cpu"):
    """Output and temporary bytes of one DirectSparseConv on an input bounded by in_entries
    entries, on the CPU or the GPU. Its ReLU runs inside the op (activation 'relu'), which
    outputs only the entries > 0: no second output beside the convolution's."""
    d = len(shape) - 2
    cin, cout = shape[-1], layer.filters
    cells = math.prod(shape[1:-1])
    offsets = math.prod(layer.kernel_shape[:d])
    # The op refuses more kept entries than max_entries, once it has counted them: the output
    # is capped, the CPU's kept entries held before the output's size is known are not.
    kept_entries = batch * cout * min(layer.k_bound, cells)
    out_entries = kept_entries if layer.max_entries is None else min(kept_entries, layer.max_entries)
    out_bytes = _sparse_bytes(out_entries, value_bytes) + 2 * batch * cout * INDEX_BYTES
    # Entries of one input segment are bounded by the input bound and the grid.
    in_per_segment = min(cells, in_entries)
    contributions = min(in_entries, cin * in_per_segment) * offsets
    touched = min(cells, contributions)
    streams = cin * offsets
    # The dense path: per block a position-major [S, Cout] scratch (a slab of the grid where
    # the grid's is large; the whole grid bounds it), plus the masked filter, mask bytes and
    # offset lists shared by all blocks. The CPU's 'auto' picks a path from the entries'
    # costs, which the bound does not know: it counts the larger of the two.
    dense_scratch = cells * cout * (value_bytes + 1) + cells + 8
    dense = layer.dataflow != "sort"
    filter_size = offsets * cin * cout
    # masked filter and mask bytes, offset lists, per-row present-channel lists, row flags
    dense_tables = (filter_size * (value_bytes + 1) + offsets * cin * (48 + 24 + 4 * cout) + filter_size // cout
                    if dense else 0)
    # The merge path: one segment in flight per block: its touched set (vector growth may
    # double the capacity), k-selection's index order, the contribution streams and heap.
    # The dense path holds Cout segments' touched sets at once.
    touched_set = 2 * touched * (KEY_BYTES + value_bytes) + touched * INDEX_BYTES
    merge_block = touched_set + streams * (48 + 4)
    dense_block = cout * touched_set + streams * (48 + 4) + dense_scratch
    per_block = max(dense_block if dense else 0, merge_block if layer.dataflow != "dense" else 0)
    # With k-selection each segment's kept entries go straight into the staged output;
    # without it they are held until the output's exact size is known, then copied.
    kept_until_assembly = _sparse_bytes(kept_entries, value_bytes) if layer.selection == "none" else 0
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
    if device == "gpu":
        temporary = _gpu_conv_temporary_bytes(layer, shape, in_entries, batch, value_bytes) + offsets * cin * cout * 48
    return out_entries, out_bytes, temporary + allocations * ALLOCATION_OVERHEAD


def _bound_layer(layer, shape, in_entries, batch, value_bytes, threads, device="cpu"):
    """(kind, output shape, output entries, output bytes, temporary bytes) of one layer."""
    if isinstance(layer, DirectSparseConv):
        out_shape = (*shape[:-1], layer.filters)
        entries, out_bytes, temp = _conv_bound(layer, shape, in_entries, batch, value_bytes, threads, device)
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


# The CPU allocator that TensorFlow uses by default on x86 (oneDNN's pool, a best-fit
# allocator with coalescing) keeps freed chunks and hands a free chunk out unsplit when it
# is less than twice the request, as TensorFlow's GPU allocator does: a live tensor may
# hold up to twice its bytes, and memory freed by one step is not always where the next
# step's tensors fit. The preprocessing's many point-sized tensors are bounded at twice
# their live bytes (docs/memory-bounds.md has the measured peaks).
POOL_FACTOR = 2


def _unique_table_bytes(n):
    """Bytes of tf.unique's hash table for n values: TensorFlow's CPU kernel reserves an
    absl::flat_hash_map for 2n entries (capacity 2^k - 1 slots for 7/8 load, each a 16-byte
    (int64 value, index) slot and one control byte), allocated with malloc, outside the
    tensor allocator."""
    growth = 2 * n
    capacity = 1 << max(4, (growth + (growth - 1) // 7).bit_length())
    return 17 * capacity + 64


def _voxelize_bytes(layer, batch, points_per_sample, columns):
    """(temporary bytes, {phase: bytes}) of PointCloudToSparse on batch clouds of
    points_per_sample points with `columns` float32 columns, beyond its input and its output.

    Each phase is a statement of preprocessing.py at its largest, with the tensors alive
    then as eager mode keeps them (every local until its function returns; graph mode
    frees them earlier): per point p, per site s (at most min(points, r^3) per cloud) and
    per stored entry e = s * channels. Widths: float64 and int64 8 bytes, a float32 point
    4 * columns. No op is assumed to reuse its input's buffer.

    normalize="unit_sphere" (normalize_unit_sphere), before voxelizing:
      pairwise   xyz (24p) + its transpose (24p) + the first halving: a padded copy where N
                 is odd (24p), both halves (24p) and their sum (12p)
      radius     xyz + centred (48p) + squared's column products and slices (32p)
      scale      xyz + centred + squared (56p) + centred / radius (24p) + its float32 cast (12p)
      concat     xyz + centred + squared + the cast (68p) + the normals slice and the
                 normalised clouds (4p per column beyond 3, 4p per column)
    estimate_normals (PointCloudToSparse(estimate_normals=k), models.point_normals), after
    normalising, beside the clouds: their float64 copy (24p), the normals written so far
    and their concatenation (48p) and, for the one chunk of c = chunk_rows(N) queries
    being computed, at most five float64 [c, N] arrays alive at once (the squared
    distance, the coordinate difference, its square, the new sum, the negated distances
    for top_k: 40cN, bounded by 48cN), top_k's values and indices, the gathered and
    centred neighbours (at most 200ck) and the per-query 3x3 covariances, eigenvectors and
    normals (at most 400c); then the normals' float32 cast (12p) and the clouds with them
    (24p) stay alive through the voxelization (72p carried, with slack).
    voxelize_point_tensor, the normalised clouds (4p per column) alive throughout:
      scaled     xyz (24p) + xyz - lo (24p) + its product with r / (hi - lo) (24p)
      cells      xyz + scaled (48p) + floor's int64 cast (24p), clip_by_value's minimum and
                 maximum (48p)
      site       xyz + scaled + cells (72p) + batch_of_point (8p) + the linearisation's
                 products and sums (32p)
      occupancy: unique: the above (88p) + its index (4p) and values (8s); its hash table
                 (_unique_table_bytes) comes from malloc, beside the tensor pool.
                 sort: the above (88p) + the sites, negated twice, top_k's values and
                 indices and its index vector (at most 64s)
      features:  unique with int64 index (88p + 8p + 8s, + the hash table); then, beside
                 xyz, scaled, cells, batch_of_point, site and the index (96p), the offset's
                 cast, shifted and local copies (72p, then local 24p kept), the normals'
                 slice and float64 copy (12p + 24p); per site the counts, feature sums and
                 their quotients and clips (at most 8 + 24 * channels s), per entry the
                 float64 and float32 values, the key products and sums, the mask, the
                 masked keys and values with their indices, argsort and the gathers (112e).
    The bound is POOL_FACTOR times the largest phase's tensors, plus the hash table.
    """
    n, r = int(points_per_sample), layer.resolution
    p = batch * n
    s = batch * min(n, r ** 3)
    e = s * layer.channels
    phases = {}
    carried = 0
    if layer.normalize == "unit_sphere":
        phases["normalize_pairwise"] = (84 + 24 * (n % 2)) * p
        phases["normalize_radius"] = 80 * p
        phases["normalize_scale"] = 92 * p
        phases["normalize_concat"] = (68 + 4 * (columns - 3) + 4 * columns) * p
        carried = 4 * columns * p
    if layer.estimate_normals is not None:
        rows, k = chunk_rows(n), min(layer.estimate_normals, n)
        phases["estimate_normals"] = carried + 72 * p + 48 * rows * n + 200 * rows * k + 400 * rows
        carried += 72 * p
    phases["voxelize_checks"] = carried + layer.columns * p
    phases["voxelize_scaled"] = carried + 72 * p
    phases["voxelize_cells"] = carried + 120 * p
    phases["voxelize_site"] = carried + 112 * p
    table = _unique_table_bytes(p)
    if layer.features == ("occupancy",):
        phases["unique"] = carried + 92 * p + 8 * s
        phases["sort"] = carried + 88 * p + 64 * s
    else:
        offset = "offset" in layer.features
        normals = "normals" in layer.features
        phases["unique"] = carried + 96 * p + 8 * s
        per_point = 96 + (72 if offset else 0)
        if normals:
            per_point = max(per_point, 96 + 24 * offset + 36)
        phases["features"] = carried + per_point * p + (8 + 24 * layer.channels) * s + 112 * e
    largest = max(phases.values())
    return POOL_FACTOR * largest + table + 64 * ALLOCATION_OVERHEAD, phases


def _input_bound(layer, batch, points_per_sample, value_bytes, columns=None):
    """(shape, entries, output bytes, temporary bytes, dense bytes, note, input bytes) of a
    model-entry layer: PointCloudToSparse (VoxelizePoints) or ImageToSparse. input bytes:
    the float32 copy of the clouds or images that the model's call makes of what it is
    given, alive through the pass."""
    if isinstance(layer, PointCloudToSparse):
        r, channels = layer.resolution, layer.channels
        columns = layer.columns if columns is None else max(int(columns), layer.columns)
        cells = r ** 3
        per_sample = cells if points_per_sample is None else min(cells, points_per_sample)
        entries = batch * channels * per_sample
        shape = (batch, r, r, r, channels)
        note, temp, points_bytes = None, 0, 0
        if points_per_sample is None:
            note = (f"{layer.name}'s voxelization grows with the points per cloud and is not in the bound; "
                    "give points_per_sample (BoundedInference takes it from each input)")
        else:
            temp, _ = _voxelize_bytes(layer, batch, points_per_sample, columns)
            points_bytes = 4 * columns * batch * int(points_per_sample)
        return (shape, entries, _sparse_bytes(entries, value_bytes), temp, math.prod(shape) * value_bytes, note,
                points_bytes)
    if isinstance(layer, ImageToSparse):
        shape = (batch, *layer.image_shape, 1)
        entries = math.prod(shape)
        # the float32 copy, the threshold mask, the kept pixel indices and values, per pixel
        temp = entries * (4 + 1 + 8 + 4) + 16 * ALLOCATION_OVERHEAD
        return shape, entries, _sparse_bytes(entries, value_bytes), temp, entries * value_bytes, None, 4 * entries
    raise TypeError(f"no bound for entry layer {layer.name}")


def _dense_layer_bound(layer, shape, batch, value_bytes):
    out_shape = layer.compute_output_shape(shape)
    elements = math.prod(int(s) for s in out_shape)
    return tuple(int(s) for s in out_shape), elements, elements * value_bytes


def _site_fields(structure):
    """(static spatial shape, channels) of a site dict of KerasTensors, of the first of a
    list of them, or of the flat list Keras keeps as a layer's output (the dict's values
    by sorted key: batch_size, coords, features, maps..., shape_token, spatial_shape)."""
    if isinstance(structure, (list, tuple)) and isinstance(structure[0], dict):
        structure = structure[0]
    if isinstance(structure, dict):
        token, features = structure["shape_token"], structure["features"]
    else:
        token, features = structure[-2], structure[2]
    return tuple(int(r) for r in token.shape[1:]), int(features.shape[-1])


def _site_input(layer):
    return layer._inbound_nodes[0].arguments.args[0]


def _hash_table_bytes(n):
    """SiteKernelMap's CPU hash table over n sites: 2^k >= 2n slots of an int64 key and an
    int32 row (site_kernel_map_kernels.cc)."""
    return 12 * (1 << max(4, (2 * n - 1).bit_length()))


class _SiteWalk:
    """The site bounds of a site-sparse model's layers, in model order: sites per static
    spatial shape (every tensor on one grid is bounded alike), kernel maps by indice_key."""

    def __init__(self, batch, sites_per_sample, value_bytes, threads, device):
        self.batch, self.per_sample = batch, sites_per_sample
        self.value_bytes, self.threads, self.device = value_bytes, threads, device
        self.sites, self.maps = {}, {}

    def grid_sites(self, spatial):
        cells = math.prod(spatial)
        return self.batch * (cells if self.per_sample is None else min(cells, self.per_sample))

    def to_site(self, layer, entries):
        """SparseToSite: from_channel_sparse on `entries` stored entries (site_conversions.py):
        per entry the decoded indices (8 (d + 2)), their site columns and key arithmetic
        (8 (d + 1) + 24), the unique index (4), the gathered rows (4), the scatter indices (8);
        per site the unique values and argsort (8 + 36), the inverted permutation (4), the
        decoded coordinates and their casts (8 (2 d + 3) + 4 (d + 1)); tf.unique's table."""
        spatial, channels = _site_fields(layer.output)
        d = len(spatial)
        sites = self.sites[spatial] = self.grid_sites(spatial)
        out = sites * (4 * (d + 1) + channels * self.value_bytes)
        temp = (entries * (8 * (d + 2) + 8 * (d + 1) + 24 + 16) + sites * (48 + 8 * (2 * d + 3) + 4 * (d + 1))
                + _unique_table_bytes(entries) + out + 24 * ALLOCATION_OVERHEAD)
        return "to_site", (self.batch, *spatial, channels), sites * channels, out, temp

    def conv(self, layer):
        """A site convolution: the kernel map where this layer builds it (the map's outputs
        stay alive with the sites), the SiteSparseConv output and its CPU temporaries."""
        in_spatial, cin = _site_fields(_site_input(layer))
        out_spatial, cout = _site_fields(layer.output)
        g = layer.geometry
        d, volume = len(in_spatial), math.prod(g.kernel_size)
        s_in = self.sites[in_spatial]
        if isinstance(layer, _SparseInverseConv):
            s_out = self.sites[out_spatial]
            pairs = self.maps[layer.indice_key]
        elif g.mode == "submanifold":
            s_out, pairs = s_in, s_in * volume
        else:
            # An input site reaches ceil(k / s) outputs per dimension through a strided map
            # (without dilation), every kernel offset through a transposed one.
            reach = (math.prod(-(-k // st) for k, st in zip(g.kernel_size, g.strides))
                     if g.mode == "strided" and all(l == 1 for l in g.dilation) else volume)
            pairs = s_in * reach
            s_out = min(self.grid_sites(out_spatial), pairs)
        self.sites.setdefault(out_spatial, s_out)
        out, temp = 0, 0
        if not isinstance(layer, _SparseInverseConv) and (layer.indice_key is None or layer.indice_key not in self.maps):
            if layer.indice_key is not None:
                self.maps[layer.indice_key] = pairs
            # in/out rows, offset splits, the output coordinates; the hash table over the
            # input sites, each offset's pair vector (16-byte pairs, up to twice reserved),
            # for new output sites their sorted keys and a second table.
            out += 8 * pairs + 4 * (volume + 1) + (4 * (d + 1) * s_out if g.mode != "submanifold" else 0)
            temp = _hash_table_bytes(s_in) + 32 * pairs + 24 * volume
            if g.mode != "submanifold":
                temp += 8 * pairs + _hash_table_bytes(s_out)
            if self.device == "gpu":
                # site_kernel_map*.cu: per (site, offset) candidate a found row (4) and, for
                # the sort builder, two key (8) and index (4) buffers; per site sorted keys,
                # rows and slots; hash tables of 2^k >= 2n slots over the input and output sites.
                temp = max(temp, s_in * volume * 28 + 40 * s_in + 2 * _hash_table_bytes(s_in)
                           + 2 * _hash_table_bytes(s_out) + 24 * s_out)
        vb = self.value_bytes
        features = s_out * cout * vb
        # the output (and the bias sum and activation beside it); the filters' copy, the
        # repeat check's table, per worker block a gathered slab and its products.
        out += features * (1 + layer.use_bias + (layer.activation not in (None, keras.activations.linear)))
        conv_temp = 4 * volume * cin * cout + 4 * (s_out + pairs) + (self.threads + 1) * 128 * (cin + cout) * 8
        if self.device == "gpu":
            # site_conv.cu: the map check's sorted keys and rows (24 per pair) and its bit per
            # (output, offset); a neighbour table (4 (volume + 2) per output); float32
            # accumulators for half types.
            conv_temp = max(conv_temp, 24 * pairs + s_out * volume // 8 + 4 * (volume + 2) * s_out
                            + 4 * s_out * cout + 4 * volume * cin * cout)
        return "site_conv", (self.batch, *out_spatial, cout), s_out * cout, out, max(temp, conv_temp)

    def features(self, layer):
        """SiteFeatures: the wrapped layer's output rows; batch normalisation's two
        intermediate [N, C] products beside them (the most any wrapped Keras layer holds)."""
        spatial, cout = _site_fields(layer.output)
        _, cin = _site_fields(_site_input(layer))
        sites = self.sites[spatial]
        out = sites * cout * self.value_bytes
        return "site_features", (self.batch, *spatial, cout), sites * cout, out, 2 * sites * max(cin, cout) * self.value_bytes

    def merge(self, layer):
        """SiteAdd / SiteConcat: the merged rows; the coordinate comparison's mask."""
        spatial, cout = _site_fields(layer.output)
        sites = self.sites[spatial]
        return ("site_merge", (self.batch, *spatial, cout), sites * cout, sites * cout * self.value_bytes,
                sites * (len(spatial) + 1) * 4)

    def select(self, layer):
        """SiteSelect: at most k sites per batch element. The grid's later tensors hold the
        kept sites (a merge with an earlier one would not match), so the walk counts the
        smaller number on this grid from here on; the tensors before it are counted already.
        Its output carries no kernel maps, so the next convolution of any indice_key builds
        (and the walk counts) a new one. Temporaries (select.py): per input site the score
        and its sorts, gathers, ranks and mask (int32 and int64 vectors, sort scratch; 192
        bytes, generous), the kept rows' coordinates and features gathered once more."""
        spatial, channels = _site_fields(layer.output)
        before = self.sites[spatial]
        kept = self.sites[spatial] = min(before, self.batch * layer.k)
        self.maps.clear()
        out = kept * (4 * (len(spatial) + 1) + channels * self.value_bytes)
        return "site_select", (self.batch, *spatial, channels), kept * channels, out, 192 * before + 8 * kept + out

    def global_pool(self, layer):
        """SiteGlobalPool: [B, C]; the batch column, the segment counts' ones."""
        spatial, channels = _site_fields(_site_input(layer))
        sites = self.sites[spatial]
        out = self.batch * channels * self.value_bytes
        return "global_pool", (self.batch, channels), self.batch * channels, out, 12 * sites + 2 * out


def _site_layer_bound(walk, layer, entries):
    if isinstance(layer, SparseToSite):
        if entries is None:
            raise TypeError(f"layer {layer.name} has no bounded input before it")
        return walk.to_site(layer, entries)
    if isinstance(layer, _SiteConv):
        return walk.conv(layer)
    if isinstance(layer, SiteFeatures):
        return walk.features(layer)
    if isinstance(layer, _SiteMerge):
        return walk.merge(layer)
    if isinstance(layer, SiteGlobalPool):
        return walk.global_pool(layer)
    if isinstance(layer, SiteSelect):
        return walk.select(layer)
    raise TypeError(f"no memory bound for the site layer {layer.name} ({type(layer).__name__}); the bound covers "
                    "SparseToSite, the site convolutions, SiteFeatures, SiteAdd, SiteConcat, SiteSelect and "
                    "SiteGlobalPool")


def _is_site_layer(layer):
    return type(layer).__module__.startswith("tf_sparseconv.site.")


# In _flat_layers' sequence: an ensemble member's layers follow; its input is the shared
# preprocessing's output, not the layer before.
BRANCH = "ensemble member"


def _flat_layers(model):
    """The model's layers in order, those of nested models (a serving model's core, an
    ensemble's members, each after BRANCH) inlined."""
    ensemble = any(isinstance(layer, MeanSoftmax) for layer in model.layers)
    if ensemble and any(isinstance(layer, SparseToSite) for layer in model.layers):
        raise TypeError("an ensemble of site-sparse models (each member's SparseToSite) is not bounded yet")
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, keras.Model):
            if ensemble:
                yield BRANCH
            yield from _flat_layers(layer)
        else:
            yield layer


def _input_shape(model):
    """The model's per-example input shape, points per cloud as given there (None where any)."""
    inputs = getattr(model, "inputs", None)
    shape = getattr(inputs[0], "shape", None) if inputs else None
    return tuple(shape[1:]) if shape is not None and len(shape) else ()


def _input_columns(model):
    """The columns of a point-cloud model's input [B, N, K] (None where not known)."""
    shape = _input_shape(model)
    return shape[-1] if len(shape) == 2 and shape[-1] is not None else None


def _default_device():
    """Where TensorFlow runs a model by default: 'gpu' where it sees one."""
    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def memory_bound(model, batch_size, points_per_sample=None, dtype=tf.float32, device=None, threads=None):
    """Upper bounds for model at batch_size, per layer and for the forward pass.

    The model is a chain of layers starting at PointCloudToSparse (VoxelizePoints),
    ImageToSparse, a sparse_input dict or a site_input dict (functional), or a serving
    model around such a core (models.point_cloud_classifier / image_classifier), or an
    ensemble of channel-sparse serving models (models.ensemble_classifier), whose members
    are bounded as all alive at once (one graph may run them side by side). Site
    layers other than SparseToSite, the site convolutions, SiteFeatures, SiteAdd,
    SiteConcat, SiteSelect and SiteGlobalPool are refused (TypeError naming the layer).

    points_per_sample caps the entries (sites) a point-cloud model's voxelization can make
    (default: the whole grid) and adds the voxelization's temporaries and the clouds'
    float32 copy, which grow with it and are left out without it (ModelBound.notes says so).
    device: 'cpu' or 'gpu', whose kernels' temporaries are counted (default: where
    TensorFlow runs the model, the GPU where it sees one). threads: the worker threads whose
    per-thread scratch the CPU kernels take (default: TensorFlow's intra-op threads, the
    host's cores unless configured), for a bound of another host than this one.

    What the bound covers: the bytes a forward call allocates beyond what exists before it
    (the model's weights, the caller's input), on the device given: the model's copy of
    its input, every layer's outputs alive together, and the largest single layer's
    temporaries, those the kernels take from malloc included (tf.unique's hash table, the
    CPU convolutions' vectors), and on the CPU what a call may grow each worker thread's
    malloc arena by (THREAD_ARENA_BYTES per thread and layer call). Not covered:
    TensorFlow's fixed costs, paid once per process or per new shape and not growing with
    the batch (thread pools, the eager kernel cache, oneDNN's primitive cache, cuBLAS/cuDNN
    workspaces), and host memory while the model runs on the GPU. The allocator's pool
    (oneDNN's on x86 CPUs, TensorFlow's BFC on GPUs) can hold up to twice a request's bytes in a reused chunk; the
    preprocessing's tensors, many and point-sized, are bounded at twice their live bytes
    (POOL_FACTOR), the network's by their generous per-layer caps.

    How it is checked (tests/models/test_memory_bound.py, benchmarks/memory_cap.py): in a
    fresh process, after one call on a 64-point cloud, the growth of peak RSS over one call
    (VmHWM, reset before, minus VmRSS just before it) on the CPU, and the allocator's
    get_memory_info peak minus its current bytes before the call on the GPU, stay at or
    under the bound for clouds of 1,000 and 400,000 points. docs/memory-bounds.md gives
    the figures.
    """
    device = _default_device() if device is None else device
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES} (or None: where TensorFlow runs the model), got {device!r}")
    batch_size = whole(batch_size, "batch_size", "memory_bound")
    if points_per_sample is not None:
        points_per_sample = whole(points_per_sample, "points_per_sample", "memory_bound")
    try:
        value_dtype = tf.as_dtype(dtype)
    except TypeError:
        value_dtype = None
    if value_dtype is None or not value_dtype.is_floating:
        raise ValueError(f"memory_bound: dtype must be the models' floating-point type (float32, float16, ...), "
                         f"got {dtype!r}")
    value_bytes = value_dtype.size
    threads = _worker_threads() if threads is None else threads
    if isinstance(threads, bool) or not isinstance(threads, numbers.Real) or not math.isfinite(threads) \
            or int(threads) != threads or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    call_overhead = CALL_OVERHEAD + (threads * THREAD_ARENA_BYTES if device == "cpu" else 0)
    layers = list(_flat_layers(model))
    walk = _SiteWalk(batch_size, points_per_sample, value_bytes, threads, device)
    shape, entries, bounds, notes = None, None, [], []
    structure = getattr(model, "input", None) if getattr(model, "inputs", None) else None
    if isinstance(structure, dict) and set(FIELDS) == set(structure):
        shape = (batch_size, *structure["shape_token"].shape[1:])
        entries = math.prod(shape)  # an arbitrary channel-sparse input can be dense
    elif isinstance(structure, dict) and "coords" in structure:
        spatial, _ = _site_fields(structure)
        walk.sites[spatial] = walk.grid_sites(spatial)
    members, preprocessed = 0, None
    for layer in layers:
        if layer is BRANCH:  # an ensemble member: it starts from the shared preprocessing's output
            shape, entries = preprocessed
            members += 1
            continue
        if isinstance(layer, ClassNames):
            continue  # the identity on the logits
        if isinstance(layer, MeanSoftmax):  # every member's softmax and their sum, beside its output
            out_bytes = math.prod(shape) * value_bytes
            bounds.append(LayerBound(layer.name, "MeanSoftmax", tuple(shape), math.prod(shape), out_bytes,
                                     (members + 1) * (out_bytes + ALLOCATION_OVERHEAD) + call_overhead, out_bytes))
            continue
        if _is_site_layer(layer):
            kind, out_shape, out_entries, out_bytes, temp = _site_layer_bound(walk, layer, entries)
            dense = batch_size * math.prod(out_shape[1:]) * value_bytes if kind != "global_pool" else out_bytes
            bounds.append(LayerBound(layer.name, kind, out_shape, out_entries, out_bytes, temp + call_overhead,
                                     dense))
            shape, entries = (batch_size, out_shape[-1]) if kind == "global_pool" else None, None
            continue
        if isinstance(layer, (PointCloudToSparse, ImageToSparse)):
            shape, entries, out_bytes, temp, dense, note, input_bytes = _input_bound(
                layer, batch_size, points_per_sample, value_bytes, _input_columns(model))
            notes += [note] if note else []
            if input_bytes:
                bounds.append(LayerBound("inputs", "input", (batch_size, *_input_shape(model)), input_bytes // 4,
                                         input_bytes, 0, input_bytes))
            bounds.append(LayerBound(layer.name, "voxelize" if isinstance(layer, PointCloudToSparse) else "image",
                                     shape, entries, out_bytes, temp + call_overhead, dense))
            preprocessed = (shape, entries)
        elif isinstance(layer, DenseToSparse):
            raise TypeError("DenseToSparse takes arbitrary dense input: bound the model from sparse_input instead")
        elif isinstance(layer, (DirectSparseConv, SparseReLU, SparseMaxPool, SparseToDense)):
            if shape is None:
                raise TypeError(f"layer {layer.name} has no bounded input before it")
            kind, shape, entries, out_bytes, temp = _bound_layer(layer, shape, entries, batch_size, value_bytes,
                                                                 threads, device)
            # A dense convolution with an activation holds its pre-activation output too (the sparse
            # one fuses its ReLU into the op and holds one output).
            dense_tensors = 2 if isinstance(layer, DirectSparseConv) and layer.activation == "relu" else 1
            bounds.append(LayerBound(layer.name, kind, tuple(shape), entries, out_bytes, temp + call_overhead,
                                     dense_tensors * math.prod(shape) * value_bytes))
        else:
            shape, entries, out_bytes = _dense_layer_bound(layer, shape, batch_size, value_bytes)
            bounds.append(LayerBound(layer.name, type(layer).__name__, shape, entries, out_bytes,
                                     2 * ALLOCATION_OVERHEAD + call_overhead, out_bytes))
    activation = sum(b.output_bytes for b in bounds)
    temporary = max((b.temporary_bytes for b in bounds), default=0)
    return ModelBound(batch_size, bounds, activation, temporary, activation + temporary,
                      sum(b.dense_bytes for b in bounds), tuple(notes))


def _megabytes(n):
    return f"{n / 2**20:,.1f} MB"


class MemoryBudgetExceeded(ValueError):
    """A batch whose bound is over a budget. bound_bytes (of the batch, or of one example
    where even one does not fit), budget_bytes, batch_size, points_per_sample (None for
    other inputs) and largest_batch (examples per call within the budget) give the numbers."""

    def __init__(self, message, bound_bytes, budget_bytes, batch_size, points_per_sample, largest_batch):
        super().__init__(message)
        self.bound_bytes, self.budget_bytes = bound_bytes, budget_bytes
        self.batch_size, self.points_per_sample, self.largest_batch = batch_size, points_per_sample, largest_batch


def _takes_point_clouds(model):
    return any(isinstance(layer, PointCloudToSparse) for layer in _flat_layers(model))


def _check_budget(budget_bytes, what, minimum=1):
    """budget_bytes as an int: a whole number of bytes >= minimum (1e9 is 10**9), not NaN,
    infinity, a bool or a string (ValueError)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real) \
            or not math.isfinite(budget_bytes) or int(budget_bytes) != budget_bytes or budget_bytes < minimum:
        kind = "a positive whole number of bytes" if minimum == 1 else f"a whole number of bytes >= {minimum}"
        raise ValueError(f"{what}: budget_bytes must be {kind}, got {budget_bytes!r}")
    return int(budget_bytes)


def largest_batch_within(model, budget_bytes, points_per_sample=None, device=None):
    """The largest batch size whose bound (on device, memory_bound's) fits the budget (0 if
    even 1 does not). A point-cloud model needs points_per_sample: its voxelization grows
    with it."""
    budget_bytes = _check_budget(budget_bytes, "largest_batch_within", minimum=0)
    if points_per_sample is None and _takes_point_clouds(model):
        raise ValueError(f"{model.name} voxelizes point clouds, whose memory grows with the points per cloud: "
                         "give points_per_sample")
    lo, hi = 0, 1
    while memory_bound(model, hi, points_per_sample, device=device).total_bytes <= budget_bytes:
        lo, hi = hi, hi * 2
        if hi > 1 << 20:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memory_bound(model, mid, points_per_sample, device=device).total_bytes <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo


@dataclasses.dataclass
class BatchPlan:
    """How BoundedInference runs one batch: chunks calls of at most chunk_size examples,
    each bounded by chunk_bytes (batch_bytes: the whole batch in one call)."""
    batch_size: int
    points_per_sample: object  # points per cloud of the batch; None for other inputs
    chunk_size: int
    chunks: int
    chunk_bytes: int
    batch_bytes: int


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
    it in the largest chunks that fit and concatenates the outputs. Either way a batch of
    which even one example is over budget raises MemoryBudgetExceeded, with the bound of
    one example beside the budget.

    A point-cloud model is bounded for the clouds of each call: points per cloud are read
    from the input [B, N, K] (N), so larger clouds get smaller chunks. points_per_sample,
    where given, plans chunk_size before any batch is seen (None until then otherwise).
    device: whose memory the budget is, 'cpu' or 'gpu' (default: where TensorFlow runs the
    model, the GPU where it sees one).
    """

    def __init__(self, model, budget_bytes, on_exceed="split", points_per_sample=None, device=None):
        if on_exceed not in ("split", "refuse"):
            raise ValueError(f"on_exceed must be 'split' or 'refuse', got {on_exceed!r}")
        self.model, self.on_exceed = model, on_exceed
        self.budget_bytes = _check_budget(budget_bytes, "BoundedInference")
        self.device = _default_device() if device is None else device
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES} (or None), got {device!r}")
        self.point_clouds = _takes_point_clouds(model)
        self.points_per_sample = None if points_per_sample is None else whole(
            points_per_sample, "points_per_sample", "BoundedInference")
        self.chunk_size = (largest_batch_within(model, self.budget_bytes, self.points_per_sample, self.device)
                           if self.points_per_sample is not None or not self.point_clouds else None)

    def _bound(self, batch, points):
        # clouds of no points are bounded as of one: the model itself refuses them, by name
        return memory_bound(self.model, batch, None if points is None else max(points, 1), device=self.device)

    def _points_of(self, inputs):
        if not self.point_clouds:
            return None
        shape = tuple(np.shape(inputs)) if not isinstance(inputs, tf.Tensor) else tuple(inputs.shape)
        if len(shape) != 3 or shape[1] is None:
            raise ValueError(f"{self.model.name} takes point clouds [B, N, K] with N known, got shape {shape}")
        return int(shape[1])

    def plan(self, inputs):
        """The BatchPlan of inputs (MemoryBudgetExceeded where they cannot run within the budget)."""
        batch, points = _batch_size_of(inputs), self._points_of(inputs)
        batch_bytes = self._bound(max(batch, 1), points).total_bytes
        if batch_bytes <= self.budget_bytes:
            return BatchPlan(batch, points, batch, 1, batch_bytes, batch_bytes)
        largest = (self.chunk_size if self.chunk_size is not None and points == self.points_per_sample
                   else largest_batch_within(self.model, self.budget_bytes, max(points, 1) if points is not None
                                             else None, self.device))
        what = f"point clouds of {points:,} points" if points is not None else "examples"
        budget = _megabytes(self.budget_bytes)
        if largest == 0:
            one = self._bound(1, points)
            largest_temp = max(one.layers, key=lambda b: b.temporary_bytes)
            raise MemoryBudgetExceeded(
                f"even one of these {what} is bounded by {_megabytes(one.total_bytes)} (activations "
                f"{_megabytes(one.activation_bytes)} + the largest temporaries, {largest_temp.name}'s, "
                f"{_megabytes(one.temporary_bytes)}), over the budget of {budget}: raise budget_bytes"
                + (" or give clouds of fewer points" if points is not None else ""),
                one.total_bytes, self.budget_bytes, batch, points, 0)
        if self.on_exceed == "refuse":
            raise MemoryBudgetExceeded(
                f"a batch of {batch} {what} is bounded by {_megabytes(batch_bytes)}, over the budget of {budget}; "
                f"the largest batch within it is {largest} (use on_exceed='split')",
                batch_bytes, self.budget_bytes, batch, points, largest)
        return BatchPlan(batch, points, largest, -(-batch // largest),
                         self._bound(largest, points).total_bytes, batch_bytes)

    def __call__(self, inputs):
        plan = self.plan(inputs)
        if plan.chunks == 1:
            return self.model(inputs, training=False)
        outputs = [self.model(_batch_slices(inputs, start, min(plan.batch_size, start + plan.chunk_size)),
                              training=False)
                   for start in range(0, plan.batch_size, plan.chunk_size)]
        return tf.concat(outputs, axis=0)
