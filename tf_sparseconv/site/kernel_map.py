"""Kernel maps: which input site feeds which output site through which kernel offset.

kernel_map wraps the SiteKernelMap op (submanifold, strided and transposed geometry, as
spconv 2.x defines it); neighbour_table wraps SiteNeighbourTable, the output-major view
the GPU's output-stationary dataflow reads; table_map builds a submanifold map as that
table directly (SiteSubmanifoldNeighbours), whose size is known before it runs, with its
pairs made from the table only where an op reads them. along_map is what every layer that moves
between sites does: take the map cached under its indice_key (or build it), run a
computation along it, and hand the map on with the output so later layers reuse it.
"""
import functools
import math
import os

import tensorflow as tf

from tf_sparseconv._op_library import OP_NAMESPACE, ops as _ops
from tf_sparseconv.geometry import MODES, output_shape, per_dim
from tf_sparseconv.inputs import same_vector
from tf_sparseconv.layer_config import flag
from tf_sparseconv.site.tensor import KernelMap, SiteSparseTensor, check_site_tensor


BUILDERS = ("hash", "sort")  # SiteKernelMap's builder attr


def kernel_map(x, kernel_size, strides=1, padding=0, dilation=1, mode="strided", builder="hash"):
    """The KernelMap of x's sites for one convolution geometry (see SiteKernelMap).

    builder: "hash" or "sort", how the GPU kernel builds the map (identical results;
    the CPU kernel has one builder and accepts either)."""
    check_site_tensor(x, "kernel_map")
    if mode not in MODES:
        raise ValueError(f"kernel_map: mode must be one of {MODES}, got {mode!r}")
    if builder not in BUILDERS:
        raise ValueError(f"kernel_map: builder must be one of {BUILDERS}, got {builder!r}")
    d = x.spatial_rank
    kernel_size = per_dim(kernel_size, d, "kernel_size", 1)
    strides = per_dim(strides, d, "strides", 1)
    padding = per_dim(padding, d, "padding", 0)
    dilation = per_dim(dilation, d, "dilation", 1)
    out_coords, out_shape, in_rows, out_rows, splits = _ops.site_kernel_map(
        x.coords, x.spatial_shape, x.batch_size, mode=mode, kernel_size=list(kernel_size), strides=list(strides),
        padding=list(padding), dilation=list(dilation), builder=builder)
    if mode == "submanifold":
        # The op's out_coords and out_shape are copies of x's: keeping x's own tensors lets
        # the layers after this one see that their sites are the map's (same_sites_checks).
        out_coords, out_shape = x.coords, x.spatial_shape
    return KernelMap(in_rows, out_rows, splits, x.coords, out_coords, x.spatial_shape, out_shape, mode, kernel_size,
                     strides, padding, dilation, trusted=True)


def sites_proven(x):
    """Whether x carries a trusted map whose input or output sites are x's own coords and
    spatial shape (tensors, not values): SiteKernelMap or SiteSubmanifoldNeighbours
    checked or built those sites, as along the layers of a model."""
    return any(m.trusted and ((m.in_coords is x.coords and m.in_spatial_shape is x.spatial_shape) or
                              (m.out_coords is x.coords and m.out_spatial_shape is x.spatial_shape))
               for m in x.kernel_maps.values())


def site_checks(x, what):
    """The ops that raise InvalidArgumentError unless x's sites are valid: batch indices in
    [0, batch_size), coordinates inside spatial_shape, each site once (SiteKernelMap's
    checks, run for a 1 x ... x 1 submanifold map), for the helpers that index by sites
    without a kernel map of their own. None where x's sites are proven (sites_proven)."""
    check_site_tensor(x, what)
    if sites_proven(x):
        return []
    d = x.spatial_rank
    return [_ops.site_kernel_map(x.coords, x.spatial_shape, x.batch_size, mode="submanifold", kernel_size=[1] * d,
                                 strides=[1] * d, padding=[0] * d, dilation=[1] * d)[4]]


def table_map(x, kernel_size, dilation):
    """The submanifold KernelMap of x's sites (kernels of at most 32 offsets) built as its
    neighbour table by SiteSubmanifoldNeighbours, without a read-back on the GPU where x's
    sites are proven (sites_proven; otherwise they are checked as SiteKernelMap checks
    them). Its pairs, equal to SiteKernelMap's, come from SiteTablePairs of the table: in a
    traced function that op runs only where something reads them (a layer the table does
    not serve, or a filter gradient)."""
    d = x.spatial_rank
    table = _ops.site_submanifold_neighbours(x.coords, x.spatial_shape, x.batch_size, kernel_size=list(kernel_size),
                                             dilation=list(dilation), sites_checked=sites_proven(x))
    in_rows, out_rows, splits = _ops.site_table_pairs(table)
    return KernelMap(in_rows, out_rows, splits, x.coords, x.coords, x.spatial_shape, x.spatial_shape, "submanifold",
                     tuple(kernel_size), (1,) * d, (0,) * d, tuple(dilation), trusted=True, neighbours=table)


def reads_table(dtype, cin, cout, dataflow="auto"):
    """Whether a submanifold convolution of dtype features, cin -> cout channels, with this
    dataflow runs from a neighbour table alone (SiteSparseConv's map_is_table) where
    TensorFlow sees a GPU: the output-stationary tiles, for half and bfloat16 under 'auto'
    or 'outputs' (and float32 under 'outputs' with TF32 on), on rows of whole 16-byte
    vectors; its input gradient then does too (the same channels swapped).
    TF_SPARSECONV_TABLE_MAPS=0 turns this off (maps are SiteKernelMap's pairs again).
    GPUs before sm_80 have no such tiles: their convolutions read the pairs."""
    if dataflow == "pairs" or not gpu_visible() or not gpu_tensor_tiles() or cin is None or cout is None:
        return False
    if os.environ.get("TF_SPARSECONV_TABLE_MAPS", "1") == "0":
        return False
    if dtype in (tf.float16, tf.bfloat16):
        vector = 8
    elif dtype == tf.float32 and dataflow == "outputs" and \
            tf.config.experimental.tensor_float_32_execution_enabled():
        vector = 4
    else:
        return False
    return cin % vector == 0 and cout % vector == 0 and cin > 0


def pairs_from_table(kmap):
    """Whether kmap's pairs are SiteTablePairs' of its table (a table map), so that a
    convolution reading the table alone spares them; in a traced function, from the op that
    made them. Eagerly every op has run already: True, which costs a gradient one
    SiteTablePairs at most."""
    try:
        return kmap.in_rows.op.type == OP_NAMESPACE + "SiteTablePairs"
    except AttributeError:  # an eager tensor has no op
        return True


def cached_kernel_map(x, indice_key, geometry, table_ok=False):
    """x's map under indice_key (checked to have this geometry), or a new one, and the
    ops checking that a cached map belongs to x (map_checks). table_ok: a new submanifold
    map of at most 32 offsets is built as its table (table_map), which the caller's
    convolution reads alone (reads_table)."""
    mode, kernel_size, strides, padding, dilation = geometry
    if indice_key is not None and indice_key in x.kernel_maps:
        cached = x.kernel_maps[indice_key]
        if cached.geometry() != geometry:
            raise ValueError(f"the kernel map under indice_key {indice_key!r} was built for (mode, kernel_size, "
                             f"strides, padding, dilation) = {cached.geometry()}, but this layer needs {geometry}; "
                             "give layers of another geometry another indice_key")
        return cached, map_checks(cached, x, indice_key)
    if table_ok and mode == "submanifold" and math.prod(kernel_size) <= 32:
        return table_map(x, kernel_size, dilation), []
    return kernel_map(x, kernel_size, strides, padding, dilation, mode), []


def same_sites_checks(map_coords, map_shape, x, indice_key, side):
    """The ops checking that the sites of a cached map's side ('input' or 'output') are
    x's: none where they are x's own tensors, as along the layers of one model (a map is
    built from x.coords and hands its out_coords on as the output's coords); otherwise the
    coordinates and spatial shapes are compared, as after a tf.function or tf.data
    boundary, and a map built for other sites is InvalidArgumentError, not features read
    along another site set's pairs."""
    where = f"the kernel map under indice_key {indice_key!r} belongs to other sites"
    checks = []
    if map_coords is not x.coords:
        count = tf.debugging.assert_equal(same_vector(tf.shape(map_coords), tf.shape(x.coords)), True,
                                          message=f"{where} (its {side} site count differs from these sites')")
        with tf.control_dependencies([count]):
            checks.append(tf.debugging.assert_equal(
                map_coords, x.coords, message=f"{where} (its {side} sites' coordinates differ from these sites')"))
    if map_shape is not x.spatial_shape:
        checks.append(tf.debugging.assert_equal(
            map_shape, x.spatial_shape, message=f"{where} (its {side} spatial shape differs from these sites')"))
    return checks


def map_checks(kmap, x, indice_key, inverse=False):
    """The ops checking a cached map before x's features are read along it: its input
    sites (its output sites for the inverse convolution) are x's (same_sites_checks), and
    a hand-built map (trusted=False) is the map SiteKernelMap builds for its stated
    geometry over its input sites. A trusted map's pairs are taken as they are."""
    if inverse:
        checks = same_sites_checks(kmap.out_coords, kmap.out_spatial_shape, x, indice_key, "output")
    else:
        checks = same_sites_checks(kmap.in_coords, kmap.in_spatial_shape, x, indice_key, "input")
    if kmap.trusted:
        return checks
    with tf.control_dependencies(checks):
        built = _ops.site_kernel_map(kmap.in_coords, kmap.in_spatial_shape, x.batch_size, mode=kmap.mode,
                                     kernel_size=list(kmap.kernel_size), strides=list(kmap.strides),
                                     padding=list(kmap.padding), dilation=list(kmap.dilation))
    stated = (kmap.out_coords, kmap.out_spatial_shape, kmap.in_rows, kmap.out_rows, kmap.offset_splits)
    names = ("out_coords", "out_spatial_shape", "in_rows", "out_rows", "offset_splits")
    for name, given, want in zip(names, stated, built):
        message = (f"the hand-built kernel map under indice_key {indice_key!r} (trusted=False) is not the map of its "
                   f"stated (mode, kernel_size, strides, padding, dilation) = {tuple(kmap.geometry())} over its input "
                   f"sites ({name} differ): build maps with "
                   "tf_sparseconv.kernel_map, or apply another map with the SiteSparseConv op")
        count = tf.debugging.assert_equal(same_vector(tf.shape(given), tf.shape(want)), True, message=message)
        with tf.control_dependencies([count]):
            checks.append(tf.debugging.assert_equal(given, want, message=message))
    return checks


def neighbour_table(kmap, inverse=False):
    """SiteNeighbourTable of kmap (inverse=True: of the reversed map, output rows = its
    input sites), for maps of at most 32 kernel offsets: [num_out, volume + 2] int32, the
    input row per output row and offset (-1: none), then the output rows sorted by their
    neighbour masks, each beside its mask. SiteSparseConv's output-stationary dataflow
    reads it on the GPU."""
    if not isinstance(kmap, KernelMap):
        raise TypeError(f"neighbour_table takes a KernelMap (tf_sparseconv.kernel_map), got {type(kmap).__name__}")
    inverse = flag(inverse, "inverse", "neighbour_table")
    # The op takes the table's width from the splits: they must be those of kmap's kernel.
    fits = tf.debugging.assert_equal(
        tf.size(kmap.offset_splits), kmap.volume + 1,
        message=f"neighbour_table: the map's offset_splits must have one entry per offset of its kernel "
                f"{kmap.kernel_size} plus one ({kmap.volume + 1})")
    with tf.control_dependencies([fits]):
        num_in, num_out = tf.shape(kmap.in_coords)[0], tf.shape(kmap.out_coords)[0]
    if inverse:
        return _ops.site_neighbour_table(kmap.out_rows, kmap.in_rows, kmap.offset_splits, num_out, num_in,
                                         map_is_trusted=kmap.trusted)
    return _ops.site_neighbour_table(kmap.in_rows, kmap.out_rows, kmap.offset_splits, num_in, num_out,
                                     map_is_trusted=kmap.trusted)


DATAFLOWS = ("auto", "pairs", "outputs")


def check_dataflow(dataflow, what):
    """dataflow, if it is one of SiteSparseConv's (DATAFLOWS); ValueError otherwise."""
    if not isinstance(dataflow, str) or dataflow not in DATAFLOWS:
        raise ValueError(f"{what}: dataflow must be 'auto', 'pairs' or 'outputs', got {dataflow!r}")
    return dataflow


def gpu_visible():
    """Whether TensorFlow sees a GPU, where the convolutions run by default."""
    return bool(tf.config.list_logical_devices("GPU"))


@functools.lru_cache(maxsize=None)
def gpu_tensor_tiles():
    """Whether every GPU TensorFlow sees has the pipelined tensor-core tiles that read a
    neighbour table (compute capability 8.0 or later; SiteSparseConv's 'outputs'). Read
    once: a process's GPUs do not change."""
    gpus = tf.config.list_physical_devices("GPU")
    capabilities = [tf.config.experimental.get_device_details(g).get("compute_capability") for g in gpus]
    return bool(gpus) and all(c is not None and tuple(c) >= (8, 0) for c in capabilities)


def wants_tables(dtype, kmap, dataflow="auto"):
    """Whether a convolution of dtype features over kmap (stored under an indice_key, so
    reused) with this dataflow should build the map's neighbour table once, for the GPU's
    output-stationary dataflow to read instead of building one per call: on a GPU, for
    'outputs' with any dtype and for 'auto' with half and bfloat16 (the types 'auto' runs
    output-stationary from a table; docs/gpu-kernels.md); never for 'pairs', nor on the
    CPU, whose kernel would only check the table. The table is only read with a trusted
    map of at most 32 offsets."""
    if dataflow == "pairs" or not kmap.trusted or kmap.volume > 32 or not gpu_visible():
        return False
    return dataflow == "outputs" or dtype in (tf.float16, tf.bfloat16)


def assert_rows_match(kmap_rows, features, indice_key):
    return tf.debugging.assert_equal(
        tf.shape(kmap_rows)[0], tf.shape(features)[0],
        message=f"the kernel map under indice_key {indice_key!r} belongs to other sites (site counts differ)")


def along_map(x, indice_key, geometry, compute, dataflow="auto", table_ok=False):
    """The output sites of geometry's map over x (cached under indice_key) with features
    compute(kmap, num_out); the map is stored on the output under indice_key, with its
    neighbour table where the dataflow wants one (wants_tables). table_ok: as for
    cached_kernel_map."""
    kmap, checks = cached_kernel_map(x, indice_key, geometry, table_ok)
    if indice_key is not None and kmap.neighbours is None and wants_tables(x.dtype, kmap, dataflow):
        kmap = kmap.with_tables(neighbours=neighbour_table(kmap))
    with tf.control_dependencies([assert_rows_match(kmap.in_coords, x.features, indice_key), *checks]):
        num_out = tf.shape(kmap.out_coords)[0]
    out = compute(kmap, num_out)
    maps = dict(x.kernel_maps)
    if indice_key is not None:
        maps[indice_key] = kmap
    static = x.static_spatial_shape
    if static.rank is not None:
        static = tf.TensorShape(output_shape(static.as_list(), geometry))
    return SiteSparseTensor(kmap.out_coords, out, kmap.out_spatial_shape, x.batch_size, maps, static)


def with_inverse_table(kmap, dtype, dataflow="auto"):
    """kmap with the neighbour table of its reversed pairs, where the inverse convolution's
    dataflow wants one (wants_tables) and it has none yet."""
    if kmap.inverse_neighbours is None and wants_tables(dtype, kmap, dataflow):
        return kmap.with_tables(inverse_neighbours=neighbour_table(kmap, inverse=True))
    return kmap
