"""Fuzzing every op of the site family (tests/fuzz.py): the raw ops SiteKernelMap,
SiteSparseConv, SiteSparseConvFilterGrad, SiteNeighbourTable, SiteSubmanifoldNeighbours,
SiteTablePairs, RowBatchNorm,
RowBatchNormGrad, RowScaleShift and RowNormalize and the public functions,
on each device, from small valid inputs with one mutation each; every case is refused with
a clear error or equals the reference below (numpy, along a brute-force kernel map).

A site tensor's contract: coords [N, 1 + d] int32 inside [0, batch_size) x [0, R), each site
once; features [N, C]. The functions under test get their tensors from make_site_sparse
with non_finite="allow": what each does with NaN and infinite features is the question."""
import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv._op_library import ops
from tf_sparseconv.site import (global_pool, kernel_map, neighbour_table, select_sites, site_conv,
                                site_conv_transpose, site_inverse_conv, site_pool)
from tf_sparseconv.site.conversions import (from_channel_sparse, site_from_dense, site_to_dense, to_channel_sparse,
                                            voxelize_sites)
from tf_sparseconv.site.tensor import KernelMap, make_site_sparse
from tests.fuzz import (Approx, Invalid, MayRefuse, NotRun, Target, assert_equal, cap, constants, numpy_of, require,
                        run_fuzz)
from tests.site.helpers import random_coords

INT32_MAX = 2**31 - 1
MAX_VOLUME = 1 << 20
MAX_TABLE_VOLUME = 32


# --- valid inputs ---------------------------------------------------------------------------------

def random_site_tensor(rng, d=None, dtype=None):
    """coords (shuffled), features, spatial_shape, batch_size of a few random sites in 1 to 4
    spatial dimensions (the mission's 2-D to 4-D data, and 1-D)."""
    d = int(rng.integers(1, 5)) if d is None else d
    batch = int(rng.integers(1, 3))
    shape = tuple(int(r) for r in rng.integers(2, 6, d))
    coords = random_coords(rng, batch, shape, 0.35)
    dtype = rng.choice([np.float32, np.float64]) if dtype is None else dtype
    features = rng.standard_normal((len(coords), int(rng.integers(1, 4)))).astype(dtype)
    return dict(coords=coords, features=features, spatial_shape=np.array(shape, np.int32),
                batch_size=np.array(batch, np.int32))


def random_geometry(rng, d, mode):
    """kernel_size, strides, padding, dilation (int64 arrays) of a geometry valid for mode."""
    if mode == "submanifold":
        kernel = rng.choice([1, 3], d)
        return dict(kernel_size=kernel.astype(np.int64), strides=np.ones(d, np.int64),
                    padding=np.zeros(d, np.int64), dilation=rng.integers(1, 3, d).astype(np.int64))
    return dict(kernel_size=rng.integers(1, 4, d).astype(np.int64), strides=rng.integers(1, 3, d).astype(np.int64),
                padding=rng.integers(0, 2, d).astype(np.int64), dilation=np.ones(d, np.int64))


GEOMETRY = ("kernel_size", "strides", "padding", "dilation")
SITES = ("coords", "features", "spatial_shape", "batch_size")


def make_map_input(rng, max_kernel=None):
    """Sites, a mode and a geometry that leaves output sites (kernel sizes <= max_kernel)."""
    inputs = random_site_tensor(rng)
    while True:
        mode = str(rng.choice(["submanifold", "strided", "transposed"]))
        geometry = random_geometry(rng, len(inputs["spatial_shape"]), mode)
        if max_kernel is not None:
            geometry["kernel_size"] = np.minimum(geometry["kernel_size"], max_kernel)
        candidate = dict(inputs, mode=mode, **geometry)
        try:
            Geometry(candidate)
            return candidate
        except Invalid:
            continue


# --- the reference --------------------------------------------------------------------------------

def check_sites(inputs, what_coords="coords"):
    """d of a valid site tensor; Invalid for bad shapes, out-of-range or repeated sites."""
    coords, spatial_shape, batch_size = inputs[what_coords], inputs["spatial_shape"], inputs["batch_size"]
    require(spatial_shape.ndim == 1, "spatial_shape must be a vector")
    require(batch_size.ndim == 0, "batch_size must be a scalar")
    d = len(spatial_shape)
    require(coords.ndim == 2 and coords.shape[1] == d + 1, "coords must be [N, d + 1]")
    require(int(batch_size) >= 1, "batch_size must be >= 1")
    require(all(int(r) >= 1 for r in spatial_shape), "spatial_shape entries must be >= 1")
    bounds = [int(batch_size), *(int(r) for r in spatial_shape)]
    require(all(0 <= int(v) < b for row in coords for v, b in zip(row, bounds)), "site outside the grid")
    require(len({tuple(row) for row in coords.tolist()}) == len(coords), "repeated site")
    return d


def check_features(inputs, n=None):
    features = inputs["features"]
    require(features.ndim == 2, "features must be [N, C]")
    require(features.shape[0] == (len(inputs["coords"]) if n is None else n), "one feature row per site")


def attr_list(inputs, name, d):
    a = inputs[name]
    require(a.ndim == 1, f"{name} must be a list of ints")
    require(len(a) == d, f"{name} needs one entry per spatial dimension")
    return [int(v) for v in a]


class Geometry:
    """SiteKernelMap's checked geometry, in Python integers."""

    def __init__(self, inputs, public=False):
        self.mode = inputs["mode"]
        spatial_shape, batch_size = inputs["spatial_shape"], inputs["batch_size"]
        kernel = inputs["kernel_size"]
        require(kernel.ndim == 1 and 1 <= len(kernel) <= 4, "kernel_size must have 1 to 4 entries")
        d = len(kernel) if not public else len(spatial_shape)
        self.kernel, self.strides, self.padding, self.dilation = (attr_list(inputs, n, d) for n in GEOMETRY)
        for j in range(d):
            require(self.kernel[j] >= 1 and self.strides[j] >= 1 and self.dilation[j] >= 1 and self.padding[j] >= 0,
                    "kernel_size, strides and dilation >= 1, padding >= 0")
            if self.mode == "submanifold":
                require(self.kernel[j] % 2 == 1, "a submanifold convolution needs an odd kernel")
                require(self.strides[j] == 1 and self.padding[j] == 0, "submanifold: strides 1, padding 0")
        self.volume = math.prod(self.kernel)
        require(self.volume <= MAX_VOLUME, "more than 2^20 offsets")
        require(spatial_shape.ndim == 1 and len(spatial_shape) == d, "spatial_shape must have d extents")
        require(batch_size.ndim == 0, "batch_size must be a scalar")
        self.batch = int(batch_size)
        require(self.batch >= 1, "batch_size must be >= 1")
        self.in_shape = [int(r) for r in spatial_shape]
        require(all(r >= 1 for r in self.in_shape), "spatial_shape entries must be >= 1")
        self.out_shape = []
        for r, k, s, p, dl in zip(self.in_shape, self.kernel, self.strides, self.padding, self.dilation):
            span = dl * (k - 1)
            # The op's geometry arithmetic is checked 64-bit: each term must fit int64.
            if self.mode == "submanifold":
                terms, out = [span, 2 * p], r
            elif self.mode == "strided":
                terms = [span, 2 * p, r + 2 * p, r + 2 * p - span, r + 2 * p - span - 1]
                out = (r + 2 * p - span - 1) // s + 1 if r + 2 * p - span - 1 >= 0 else 0
            else:
                terms = [span, 2 * p, (r - 1) * s, (r - 1) * s - 2 * p, (r - 1) * s - 2 * p + span]
                out = (r - 1) * s - 2 * p + span + 1
                terms.append(out)
            require(all(-2**63 <= t < 2**63 for t in terms), "the geometry overflows 64-bit arithmetic")
            require(1 <= out <= INT32_MAX, "output extent outside [1, 2^31 - 1]")
            self.out_shape.append(out)
        require(self.batch * math.prod(max(a, b) for a, b in zip(self.in_shape, self.out_shape)) < 2**63,
                "key overflow")
        self.d = d

    def offsets(self):
        return list(itertools.product(*map(range, self.kernel)))

    def output_of(self, x, q):
        """The output coordinate an input site x reaches through offset q, or None."""
        out = []
        for j in range(self.d):
            if self.mode == "submanifold":
                v = x[j] - (q[j] - (self.kernel[j] - 1) // 2) * self.dilation[j]
            elif self.mode == "strided":
                t = x[j] + self.padding[j] - q[j] * self.dilation[j]
                if t < 0 or t % self.strides[j]:
                    return None
                v = t // self.strides[j]
            else:
                v = x[j] * self.strides[j] - self.padding[j] + q[j] * self.dilation[j]
            if not 0 <= v < self.out_shape[j]:
                return None
            out.append(v)
        return tuple(out)


def ref_kernel_map(inputs, public=False):
    g = Geometry(inputs, public)
    coords = inputs["coords"]
    require(coords.ndim == 2 and coords.shape[1] == g.d + 1, "coords must be [N, d + 1]")
    bounds = [g.batch, *g.in_shape]
    require(all(0 <= int(v) < b for row in coords for v, b in zip(row, bounds)), "site outside the grid")
    require(len({tuple(row) for row in coords.tolist()}) == len(coords), "repeated site")
    cap(g.volume * max(len(coords), 1), "map search")
    sites = [(int(row[0]), tuple(int(v) for v in row[1:])) for row in coords]
    row_of = {site: i for i, site in enumerate(sites)}
    by_offset = []
    for q in g.offsets():
        pairs = []
        for i, (b, x) in enumerate(sites):
            o = g.output_of(x, q)
            if o is not None:
                pairs.append((i, (b, o)))
        by_offset.append(pairs)
    if g.mode == "submanifold":
        out_sites = sites
        by_offset = [[(i, row_of[o]) for i, o in pairs if o in row_of] for pairs in by_offset]
    else:
        out_sites = sorted({o for pairs in by_offset for _, o in pairs})
        out_row = {o: r for r, o in enumerate(out_sites)}
        by_offset = [[(i, out_row[o]) for i, o in pairs] for pairs in by_offset]
    splits = np.cumsum([0] + [len(p) for p in by_offset]).astype(np.int32)
    in_rows = np.array([i for pairs in by_offset for i, _ in pairs], np.int32)
    out_rows = np.array([o for pairs in by_offset for _, o in pairs], np.int32)
    out_coords = np.array([[b, *o] for b, o in out_sites], np.int32).reshape(-1, g.d + 1)
    return dict(out_coords=out_coords, out_spatial_shape=np.array(g.out_shape, np.int32), in_rows=in_rows,
                out_rows=out_rows, offset_splits=splits)


def check_map_rows(in_rows, out_rows, splits, volume, num_in, num_out):
    """SiteSparseConv's map checks: shapes, rising splits, rows in range, each output row at
    most once per offset."""
    require(in_rows.ndim == 1 and out_rows.ndim == 1 and len(in_rows) == len(out_rows),
            "in_rows and out_rows must be vectors of equal length")
    require(splits.ndim == 1 and len(splits) == volume + 1, "offset_splits must have volume + 1 entries")
    pairs = len(in_rows)
    require(int(splits[0]) == 0 and int(splits[-1]) == pairs, "offset_splits must rise from 0 to the pairs")
    for q in range(volume):
        begin, end = int(splits[q]), int(splits[q + 1])
        require(begin <= end <= pairs, "offset_splits must rise")
        rows = out_rows[begin:end].tolist()
        require(all(0 <= int(i) < num_in for i in in_rows[begin:end]), "in_rows outside the input rows")
        require(all(0 <= o < num_out for o in rows), "out_rows outside the output rows")
        require(len(set(rows)) == len(rows), "an output row twice for one offset")


def conv_along(features, filters, in_rows, out_rows, splits, num_out):
    """Approx of sum over pairs features[i] @ filters[q] into out[o] (float64)."""
    f, w = features.astype(np.float64), filters.astype(np.float64)
    out = np.zeros((num_out, w.shape[2]))
    bound = np.zeros_like(out)
    with np.errstate(invalid="ignore", over="ignore"):
        for q in range(len(splits) - 1):
            for p in range(int(splits[q]), int(splits[q + 1])):
                i, o = int(in_rows[p]), int(out_rows[p])
                out[o] += f[i] @ w[q]
                bound[o] += np.abs(f[i]) @ np.abs(w[q])
    return out, bound


def ref_site_conv_op(inputs):
    features, filters, num_out, neighbours = (inputs[n] for n in ("features", "filters", "num_out", "neighbours"))
    require(features.ndim == 2, "features must be [N, Cin]")
    require(filters.ndim == 3 and filters.shape[1] == features.shape[1], "filters must be [K, Cin, Cout]")
    require(num_out.ndim == 0 and int(num_out) >= 0, "num_out must be a non-negative scalar")
    check_map_rows(inputs["in_rows"], inputs["out_rows"], inputs["offset_splits"], filters.shape[0],
                   len(features), int(num_out))
    # A neighbour table is read unchecked, so it is taken with a trusted map only.
    require(neighbours.size == 0 and neighbours.ndim == 1, "neighbours must be empty for an untrusted map")
    require(not np.any(np.isnan(features)), "features hold NaN")
    cap(int(num_out) * filters.shape[2], "output")
    out, bound = conv_along(features, filters, inputs["in_rows"], inputs["out_rows"], inputs["offset_splits"],
                            int(num_out))
    return Approx(out, bound, features.dtype)


def ref_filter_grad(inputs):
    features, out_grad, splits = inputs["features"], inputs["out_grad"], inputs["offset_splits"]
    require(features.ndim == 2 and out_grad.ndim == 2, "features and out_grad must be matrices")
    require(splits.ndim == 1 and len(splits) >= 1, "offset_splits must be a non-empty vector")
    volume = len(splits) - 1
    check_map_rows(inputs["in_rows"], inputs["out_rows"], splits, volume, len(features), len(out_grad))
    cap(volume * features.shape[1] * out_grad.shape[1], "filter gradient")
    f, g = features.astype(np.float64), out_grad.astype(np.float64)
    grad = np.zeros((volume, f.shape[1], g.shape[1]))
    bound = np.zeros_like(grad)
    with np.errstate(invalid="ignore", over="ignore"):
        for q in range(volume):
            for p in range(int(splits[q]), int(splits[q + 1])):
                i, o = int(inputs["in_rows"][p]), int(inputs["out_rows"][p])
                grad[q] += np.outer(f[i], g[o])
                bound[q] += np.outer(np.abs(f[i]), np.abs(g[o]))
    return Approx(grad, bound, features.dtype)


def neighbour_table_of(in_rows, out_rows, splits, num_out):
    volume = len(splits) - 1
    table = np.full((num_out, volume + 2), -1, np.int64)
    masks = np.zeros(num_out, np.uint64)
    for q in range(volume):
        for p in range(int(splits[q]), int(splits[q + 1])):
            table[int(out_rows[p]), q] = int(in_rows[p])
            masks[int(out_rows[p])] |= np.uint64(1 << q)
    order = np.argsort(masks, kind="stable")
    table[:, volume] = masks[order].astype(np.uint32).view(np.int32)
    table[:, volume + 1] = order
    return table.astype(np.int32)


def ref_neighbour_table_op(inputs):
    splits, num_in, num_out = inputs["offset_splits"], inputs["num_in"], inputs["num_out"]
    require(splits.ndim == 1 and len(splits) >= 2, "offset_splits must be a vector of volume + 1 >= 2 entries")
    require(num_in.ndim == 0 and num_out.ndim == 0 and int(num_in) >= 0 and int(num_out) >= 0,
            "num_in and num_out must be non-negative scalars")
    require(len(splits) - 1 <= MAX_TABLE_VOLUME, "a neighbour table holds at most 32 offsets")
    check_map_rows(inputs["in_rows"], inputs["out_rows"], splits, len(splits) - 1, int(num_in), int(num_out))
    cap(int(num_out) * len(splits), "table")
    return neighbour_table_of(inputs["in_rows"], inputs["out_rows"], splits, int(num_out))


# --- raw op targets -------------------------------------------------------------------------------

MAP_MUTABLE = ["coords", "spatial_shape", "batch_size", *GEOMETRY]


def run_kernel_map_op(inputs):
    coords, spatial_shape, batch_size = constants(inputs, "coords", "spatial_shape", "batch_size")
    out = ops.site_kernel_map(coords, spatial_shape, batch_size, mode=inputs["mode"],
                              **{n: inputs[n].tolist() for n in GEOMETRY}, builder=inputs["builder"])
    return dict(zip(("out_coords", "out_spatial_shape", "in_rows", "out_rows", "offset_splits"), numpy_of(out)))


def make_kernel_map_op(rng):
    return dict(make_map_input(rng), builder=str(rng.choice(["hash", "sort"])))


def make_conv_op(rng):
    """A valid map of random sites, features and filters for SiteSparseConv."""
    inputs = make_map_input(rng)
    m = ref_kernel_map(inputs)
    features = inputs["features"]
    volume = len(m["offset_splits"]) - 1
    filters = rng.standard_normal((volume, features.shape[1], int(rng.integers(1, 4)))).astype(features.dtype)
    return dict(features=features, filters=filters, in_rows=m["in_rows"], out_rows=m["out_rows"],
                offset_splits=m["offset_splits"], num_out=np.array(len(m["out_coords"]), np.int32),
                neighbours=np.zeros(0, np.int32), dataflow=str(rng.choice(["auto", "pairs"])),
                cpu_products=str(rng.choice(["auto", "portable"])))


def run_conv_op(inputs):
    args = constants(inputs, "features", "filters", "in_rows", "out_rows", "offset_splits", "num_out", "neighbours")
    return ops.site_sparse_conv(*args, dataflow=inputs["dataflow"], cpu_products=inputs["cpu_products"]).numpy()


EPILOGUE_FORMS = {1: ("shift",), 2: ("scale", "shift"), 4: ("mean", "variance", "scale", "shift")}


def make_conv_epilogue_op(rng):
    """make_conv_op with an epilogue of a random form: a shift, a scale and a shift, or a
    batch norm's statistics too; random epsilon and activation."""
    inputs = make_conv_op(rng)
    cout, dtype = inputs["filters"].shape[2], inputs["features"].dtype
    form = int(rng.choice(sorted(EPILOGUE_FORMS)))
    for name in EPILOGUE_FORMS[form]:
        low, high = (0.05, 4.0) if name == "variance" else (-3.0, 3.0)
        inputs[name] = rng.uniform(low, high, cout).astype(dtype)
    return dict(inputs, form=form, epsilon=float(rng.choice([1e-5, 1e-3, 0.5])),
                activation=str(rng.choice(["none", "relu"])))


def run_conv_epilogue_op(inputs):
    args = constants(inputs, "features", "filters", "in_rows", "out_rows", "offset_splits", "num_out", "neighbours")
    epilogue = [tf.constant(inputs[name]) for name in EPILOGUE_FORMS[inputs["form"]]]
    return ops.site_sparse_conv(*args, epilogue=epilogue, epsilon=inputs["epsilon"], activation=inputs["activation"],
                                dataflow=inputs["dataflow"], cpu_products=inputs["cpu_products"]).numpy()


def ref_conv_epilogue_op(inputs):
    """act((v - mean) / sqrt(variance + epsilon) * scale + shift) of ref_site_conv_op's sums,
    in float64; the bound grows by the epilogue's own terms (the op forms one scale and one
    shift per column first)."""
    sums = ref_site_conv_op(inputs)
    v = {name: inputs[name].astype(np.float64) for name in EPILOGUE_FORMS[inputs["form"]]}
    epsilon = float(np.float32(inputs["epsilon"]))  # the op's attr is a float32
    scale = v.get("scale", 1.0) * (1.0 / np.sqrt(v["variance"] + epsilon) if "variance" in v else 1.0)
    shift = v["shift"] - v.get("mean", 0.0) * scale
    value = sums.value * scale + shift
    bound = sums.bound * np.abs(scale) + np.abs(v["shift"]) + np.abs(v.get("mean", 0.0) * scale)
    if inputs["activation"] == "relu":
        # max(-inf, 0) is exactly 0 in any order of the sum (a NaN stays NaN, +inf stays +inf)
        bound = np.where(value == -np.inf, 0.0, bound)
        value = np.where(value < 0, 0.0, value)
    return Approx(value, bound, sums.dtype)


def make_filter_grad_op(rng):
    inputs = make_conv_op(rng)
    out_grad = rng.standard_normal((int(inputs["num_out"]), inputs["filters"].shape[2])).astype(
        inputs["features"].dtype)
    return dict((n, inputs[n]) for n in ("features", "in_rows", "out_rows", "offset_splits", "cpu_products")) | dict(
        out_grad=out_grad)


def run_filter_grad_op(inputs):
    args = constants(inputs, "features", "out_grad", "in_rows", "out_rows", "offset_splits")
    return ops.site_sparse_conv_filter_grad(*args, cpu_products=inputs["cpu_products"]).numpy()


def make_table_op(rng):
    inputs = make_map_input(rng, max_kernel=3)
    if len(inputs["kernel_size"]) == 4:  # at most 32 offsets
        inputs = make_map_input(rng, max_kernel=1)
    m = ref_kernel_map(inputs)
    return dict(in_rows=m["in_rows"], out_rows=m["out_rows"], offset_splits=m["offset_splits"],
                num_in=np.array(len(inputs["coords"]), np.int32), num_out=np.array(len(m["out_coords"]), np.int32))


def run_table_op(inputs):
    return ops.site_neighbour_table(*constants(inputs, "in_rows", "out_rows", "offset_splits", "num_in",
                                               "num_out")).numpy()


def make_submanifold_table_op(rng):
    """Sites and a submanifold geometry of at most 32 offsets for SiteSubmanifoldNeighbours."""
    inputs = random_site_tensor(rng)
    d = len(inputs["spatial_shape"])
    geometry = random_geometry(rng, d, "submanifold")
    if d == 4:  # 3^4 > 32 offsets
        geometry["kernel_size"][1:] = 1
    return dict(inputs, **{n: geometry[n] for n in ("kernel_size", "dilation")})


def run_submanifold_table_op(inputs):
    coords, spatial_shape, batch_size = constants(inputs, "coords", "spatial_shape", "batch_size")
    return ops.site_submanifold_neighbours(coords, spatial_shape, batch_size,
                                           kernel_size=inputs["kernel_size"].tolist(),
                                           dilation=inputs["dilation"].tolist()).numpy()


def ref_submanifold_table(inputs):
    d = len(inputs["kernel_size"])
    require(inputs["dilation"].ndim == 1 and len(inputs["dilation"]) == d,
            "dilation needs one entry per spatial dimension")
    geometry = dict(inputs, mode="submanifold", strides=np.ones(d, np.int64), padding=np.zeros(d, np.int64))
    volume = math.prod(int(k) for k in inputs["kernel_size"]) if inputs["kernel_size"].ndim == 1 else 0
    if 0 < volume <= MAX_VOLUME and all(int(k) >= 1 and int(k) % 2 == 1 for k in inputs["kernel_size"]):
        require(volume <= MAX_TABLE_VOLUME, "a neighbour table holds kernels of at most 32 offsets")
    m = ref_kernel_map(geometry)
    return neighbour_table_of(m["in_rows"], m["out_rows"], m["offset_splits"], len(inputs["coords"]))


def make_table_pairs_op(rng):
    inputs = make_submanifold_table_op(rng)
    return dict(neighbours=ref_submanifold_table(inputs))


def ref_table_pairs(inputs):
    table = inputs["neighbours"]
    require(table.ndim == 2 and table.shape[1] >= 3, "neighbours must be [N, volume + 2]")
    n, volume = table.shape[0], table.shape[1] - 2
    require(volume <= MAX_TABLE_VOLUME and volume % 2 == 1, "neighbours: an odd volume of at most 32")
    require(np.all((table[:, :volume] >= -1) & (table[:, :volume] < n)), "neighbours entry outside [-1, N)")
    pairs = [[(i, int(table[i, volume - 1 - q])) for i in range(n) if table[i, volume - 1 - q] >= 0]
             for q in range(volume)]
    splits = np.cumsum([0] + [len(p) for p in pairs]).astype(np.int32)
    return dict(in_rows=np.array([i for p in pairs for i, _ in p], np.int32),
                out_rows=np.array([o for p in pairs for _, o in p], np.int32), offset_splits=splits)


def run_table_pairs_op(inputs):
    out = ops.site_table_pairs(*constants(inputs, "neighbours"))
    return dict(zip(("in_rows", "out_rows", "offset_splits"), numpy_of(out)))


# --- public function targets ----------------------------------------------------------------------

def site_tensor_of(inputs, coords="coords"):
    """The inputs' SiteSparseTensor, non-finite features let in: what the function under
    test does with them is the question."""
    return make_site_sparse(*constants(inputs, coords, "features", "spatial_shape", "batch_size"),
                            non_finite="allow")


def site_parts(y):
    return dict(coords=y.coords.numpy(), features=y.features.numpy(), spatial_shape=y.spatial_shape.numpy(),
                batch_size=y.batch_size.numpy())


def ref_make_site_sparse(inputs):
    """The constructor holds its parts (int32, nothing wrapped); shapes must agree, the
    extents and the batch size be >= 1 and the features finite. The sites themselves are checked by the ops
    that read them."""
    coords, features, spatial_shape, batch_size = (inputs[n] for n in SITES)
    for name in ("coords", "spatial_shape", "batch_size"):
        value = inputs[name].astype(np.int64)
        require(np.all((value >= -2**31) & (value <= INT32_MAX)), f"{name} outside int32")
    require(spatial_shape.ndim == 1 and np.all(spatial_shape >= 1), "spatial_shape: a vector of extents >= 1")
    require(coords.ndim == 2 and features.ndim == 2 and batch_size.ndim == 0, "ranks")
    require(batch_size >= 1, "batch_size: at least one sample")
    require(len(coords) == len(features), "one feature row per site")
    require(coords.shape[1] == len(spatial_shape) + 1, "coords must be [N, d + 1]")
    require(np.all(np.isfinite(features)), "features hold NaN or infinite values")
    return dict(coords=coords.astype(np.int32), features=features, spatial_shape=spatial_shape.astype(np.int32),
                batch_size=batch_size.astype(np.int32))


def make_sites_int64(rng):
    inputs = random_site_tensor(rng)
    return dict(inputs, coords=inputs["coords"].astype(np.int64))


def make_public_map(rng):
    return make_map_input(rng)


def run_public_map(inputs):
    m = kernel_map(site_tensor_of(inputs), *(inputs[n].tolist() for n in GEOMETRY), mode=inputs["mode"])
    return dict(out_coords=m.out_coords.numpy(), out_spatial_shape=m.out_spatial_shape.numpy(),
                in_rows=m.in_rows.numpy(), out_rows=m.out_rows.numpy(), offset_splits=m.offset_splits.numpy())


def ref_public_map(inputs):
    check_sites(inputs)
    check_features(inputs)
    return ref_kernel_map(inputs, public=True)


def make_hand_map(rng):
    """A hand-built (untrusted) map of random sites, as its parts, and inverse or not."""
    inputs = make_map_input(rng, max_kernel=3)
    if len(inputs["kernel_size"]) == 4:  # at most 32 offsets
        inputs = make_map_input(rng, max_kernel=1)
    m = ref_kernel_map(inputs)
    return dict(m, in_coords=inputs["coords"], in_spatial_shape=inputs["spatial_shape"], mode=inputs["mode"],
                **{n: inputs[n] for n in GEOMETRY}, inverse=bool(rng.random() < 0.5))


def hand_map_of(inputs):
    return KernelMap(*constants(inputs, "in_rows", "out_rows", "offset_splits", "in_coords", "out_coords",
                                "in_spatial_shape", "out_spatial_shape"), inputs["mode"],
                     *(tuple(inputs[n].tolist()) for n in GEOMETRY), trusted=False)


def ref_public_table(inputs):
    num_in, num_out = len(inputs["in_coords"]), len(inputs["out_coords"])
    if inputs["inverse"]:
        inputs = dict(inputs, in_rows=inputs["out_rows"], out_rows=inputs["in_rows"])
        num_in, num_out = num_out, num_in
    volume = math.prod(inputs["kernel_size"].tolist())
    splits = inputs["offset_splits"]
    require(splits.ndim == 1 and 2 <= len(splits) <= MAX_TABLE_VOLUME + 1, "volume + 1 offset_splits, 1 to 32 offsets")
    check_map_rows(inputs["in_rows"], inputs["out_rows"], inputs["offset_splits"], len(inputs["offset_splits"]) - 1,
                   num_in, num_out)
    require(len(inputs["offset_splits"]) == volume + 1, "the map's offsets are its kernel's")
    return neighbour_table_of(inputs["in_rows"], inputs["out_rows"], inputs["offset_splits"], num_out)


def make_site_conv(rng, mode=None):
    inputs = random_site_tensor(rng)
    while True:
        mode = mode or str(rng.choice(["submanifold", "strided", "transposed"]))
        geometry = random_geometry(rng, len(inputs["spatial_shape"]), mode)
        try:
            Geometry(dict(inputs, mode=mode, **geometry))
            break
        except Invalid:
            continue
    cin = inputs["features"].shape[1]
    cout = int(rng.integers(1, 4))
    kernel = rng.standard_normal((*geometry["kernel_size"].tolist(), cin, cout)).astype(inputs["features"].dtype)
    bias = rng.standard_normal(cout).astype(kernel.dtype)
    return dict(inputs, mode=mode, kernel=kernel, bias=bias, **{n: geometry[n] for n in ("strides", "padding",
                                                                                          "dilation")})


def ref_site_conv(inputs):
    """site_conv / site_conv_transpose: the map of the kernel's geometry, then the pairs'
    products, plus the bias."""
    d = check_sites(inputs)
    check_features(inputs)
    kernel, bias = inputs["kernel"], inputs["bias"]
    require(kernel.ndim == d + 2, "the kernel must be [k1, ..., kd, Cin, Cout]")
    require(kernel.shape[-2] == inputs["features"].shape[1], "kernel input channels")
    for name in ("strides", "padding", "dilation"):
        attr_list(inputs, name, d)
    geometry = dict(inputs, kernel_size=np.array(kernel.shape[:d], np.int64))
    if inputs["mode"] == "submanifold":
        strides, dilation, padding = (inputs[n].tolist() for n in ("strides", "dilation", "padding"))
        require(strides == [1] * d, "submanifold: strides 1")
        require(all(k % 2 for k in kernel.shape[:d]), "submanifold: an odd kernel")
        same = [dl * (k - 1) // 2 for k, dl in zip(kernel.shape[:d], dilation)]
        require(padding in ([0] * d, same), "submanifold: padding 0 or same")
        geometry["padding"] = np.zeros(d, np.int64)
    m = ref_kernel_map(geometry)
    require(bias.ndim == 1 and len(bias) == kernel.shape[-1], "bias must be [Cout]")
    filters = kernel.reshape(-1, *kernel.shape[-2:])
    with np.errstate(invalid="ignore", over="ignore"):  # NaN features carry into their rows
        out, bound = conv_along(inputs["features"], filters, m["in_rows"], m["out_rows"], m["offset_splits"],
                                len(m["out_coords"]))
        out, bound = out + bias, bound + np.abs(bias.astype(np.float64))
    result = dict(coords=m["out_coords"], features=Approx(out, bound, inputs["features"].dtype),
                  spatial_shape=m["out_spatial_shape"], batch_size=inputs["batch_size"])
    if np.any(np.isnan(inputs["features"])):
        # Let in by non_finite="allow": SiteSparseConv refuses them on the CPU, while over its
        # own (trusted) map on the GPU it skips the NaN scan, which would need a host round
        # trip, and the NaN reaches exactly the output rows it feeds (site_conv_op.cc;
        # tests/site/test_conv.py tests both sides). The 1 x ... x 1 path refuses them on both.
        raise MayRefuse("features hold NaN", result)
    return result


def run_site_conv(inputs):
    x = site_tensor_of(inputs)
    kernel, bias = constants(inputs, "kernel", "bias")
    kwargs = {n: inputs[n].tolist() for n in ("strides", "padding", "dilation")}
    if inputs["mode"] == "transposed":
        y = site_conv_transpose(x, kernel, bias, **kwargs)
    else:
        y = site_conv(x, kernel, bias, subm=inputs["mode"] == "submanifold", **kwargs)
    return site_parts(y)


def run_site_conv_gradient(inputs):
    """d loss / d (features, kernel, bias) of loss = sum(weights * site_conv(...).features),
    with fixed weights (cos of the output's flat index)."""
    features, kernel, bias = constants(inputs, "features", "kernel", "bias")
    with tf.GradientTape() as tape:
        tape.watch([features, kernel, bias])
        x = make_site_sparse(tf.constant(inputs["coords"]), features, *constants(inputs, "spatial_shape", "batch_size"),
                             non_finite="allow")
        kwargs = {n: inputs[n].tolist() for n in ("strides", "padding", "dilation")}
        if inputs["mode"] == "transposed":
            y = site_conv_transpose(x, kernel, bias, **kwargs)
        else:
            y = site_conv(x, kernel, bias, subm=inputs["mode"] == "submanifold", **kwargs)
        weights = tf.cos(tf.cast(tf.reshape(tf.range(tf.size(y.features)), tf.shape(y.features)), y.features.dtype))
        loss = tf.reduce_sum(weights * y.features)
    return numpy_of(tape.gradient(loss, [features, kernel, bias]))


def ref_site_conv_gradient(inputs):
    """The gradients along the map of ref_site_conv; where the forward may refuse (NaN
    features), so may the gradient, whose expected values then carry the NaN."""
    try:
        forward, nan_features = ref_site_conv(inputs), False
    except MayRefuse as may:
        forward, nan_features = may.expected, True
    d = len(inputs["spatial_shape"])
    kernel, features = inputs["kernel"], inputs["features"]
    geometry = dict(inputs, kernel_size=np.array(kernel.shape[:d], np.int64))
    if inputs["mode"] == "submanifold":
        geometry["padding"] = np.zeros(d, np.int64)
    m = ref_kernel_map(geometry)
    num_out, cout = forward["features"].value.shape
    g = np.cos(np.arange(num_out * cout, dtype=np.float64).astype(features.dtype).astype(np.float64)).reshape(
        num_out, cout)
    w = kernel.reshape(-1, *kernel.shape[-2:]).astype(np.float64)
    f = features.astype(np.float64)
    features_grad, features_bound = np.zeros(f.shape), np.zeros(f.shape)
    filters_grad, filters_bound = np.zeros(w.shape), np.zeros(w.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for q in range(len(w)):
            for p in range(int(m["offset_splits"][q]), int(m["offset_splits"][q + 1])):
                i, o = int(m["in_rows"][p]), int(m["out_rows"][p])
                features_grad[i] += w[q] @ g[o]
                features_bound[i] += np.abs(w[q]) @ np.abs(g[o])
                filters_grad[q] += np.outer(f[i], g[o])
                filters_bound[q] += np.outer(np.abs(f[i]), np.abs(g[o]))
    dtype = features.dtype
    grads = [Approx(features_grad, features_bound, dtype),
             Approx(filters_grad.reshape(kernel.shape), filters_bound.reshape(kernel.shape), dtype),
             Approx(g.sum(0), np.abs(g).sum(0), dtype)]
    if nan_features:
        raise MayRefuse("features hold NaN", grads)
    return grads


def make_cached_conv(rng):
    """site_conv along a hand-built (untrusted) map stored under an indice_key."""
    inputs = make_site_conv(rng)
    d = len(inputs["spatial_shape"])
    geometry = dict(inputs, kernel_size=np.array(inputs["kernel"].shape[:d], np.int64))
    if inputs["mode"] == "submanifold":
        geometry["padding"] = np.zeros(d, np.int64)
    m = ref_kernel_map(geometry)
    return dict(inputs, **m, map_kernel_size=geometry["kernel_size"])


def run_cached_conv(inputs):
    x = site_tensor_of(inputs)
    d = len(inputs["spatial_shape"])
    geometry = [tuple(inputs["map_kernel_size"].tolist())] + [tuple(inputs[n].tolist()) for n in (
        "strides", "padding", "dilation")]
    if inputs["mode"] == "submanifold":
        geometry[2] = (0,) * d
    kmap = KernelMap(*constants(inputs, "in_rows", "out_rows", "offset_splits", "coords", "out_coords",
                                "spatial_shape", "out_spatial_shape"), inputs["mode"], *geometry, trusted=False)
    x = x.with_map("key", kmap)
    kernel, bias = constants(inputs, "kernel", "bias")
    kwargs = {n: inputs[n].tolist() for n in ("strides", "padding", "dilation")}
    if inputs["mode"] == "transposed":
        y = site_conv_transpose(x, kernel, bias, indice_key="key", **kwargs)
    else:
        y = site_conv(x, kernel, bias, subm=inputs["mode"] == "submanifold", indice_key="key", **kwargs)
    return site_parts(y)


def check_hand_built(inputs, built):
    """A hand-built map under an indice_key must be the map SiteKernelMap builds for its
    stated geometry over its input sites."""
    for name, want in built.items():
        given = inputs[name]
        require(given.shape == want.shape and np.array_equal(given, want),
                f"the hand-built map's {name} are not those of its stated geometry")


def ref_cached_conv(inputs):
    """The convolution along the cached map's pairs onto its output sites; the kernel must
    be of the map's geometry."""
    d = check_sites(inputs)
    check_features(inputs)
    kernel, bias = inputs["kernel"], inputs["bias"]
    require(kernel.ndim == d + 2 and kernel.shape[-2] == inputs["features"].shape[1],
            "the kernel must be [k1, ..., kd, Cin, Cout]")
    require(list(kernel.shape[:d]) == inputs["map_kernel_size"].tolist(), "the cached map's kernel size")
    require(bias.ndim == 1 and len(bias) == kernel.shape[-1], "bias must be [Cout]")
    out_coords = inputs["out_coords"]
    geometry = dict(inputs, kernel_size=inputs["map_kernel_size"])
    if inputs["mode"] == "submanifold":
        geometry["padding"] = np.zeros(d, np.int64)
    check_hand_built(inputs, ref_kernel_map(geometry))
    filters = kernel.reshape(-1, *kernel.shape[-2:])
    num_out = len(out_coords)
    check_map_rows(inputs["in_rows"], inputs["out_rows"], inputs["offset_splits"], len(filters),
                   len(inputs["features"]), num_out)
    require(not np.any(np.isnan(inputs["features"])), "features hold NaN")
    out, bound = conv_along(inputs["features"], filters, inputs["in_rows"], inputs["out_rows"],
                            inputs["offset_splits"], num_out)
    with np.errstate(invalid="ignore", over="ignore"):
        out, bound = out + bias, bound + np.abs(bias.astype(np.float64))
    return dict(coords=out_coords, features=Approx(out, bound, inputs["features"].dtype),
                spatial_shape=inputs["out_spatial_shape"], batch_size=inputs["batch_size"])


def make_inverse_conv(rng):
    """x: the output sites of a strided convolution (its map under an indice_key, hand-built),
    and the kernel of the inverse convolution back onto that convolution's input sites."""
    inputs = make_site_conv(rng, mode="strided")
    d = len(inputs["spatial_shape"])
    m = ref_kernel_map(dict(inputs, kernel_size=np.array(inputs["kernel"].shape[:d], np.int64)))
    features = rng.standard_normal((len(m["out_coords"]), int(rng.integers(1, 4)))).astype(inputs["kernel"].dtype)
    kernel = rng.standard_normal((*inputs["kernel"].shape[:d], features.shape[1], int(rng.integers(1, 4)))).astype(
        features.dtype)
    return dict(m, in_coords=inputs["coords"], in_spatial_shape=inputs["spatial_shape"],
                batch_size=inputs["batch_size"], features=features, kernel=kernel,
                map_kernel_size=np.array(kernel.shape[:d], np.int64),
                bias=rng.standard_normal(kernel.shape[-1]).astype(kernel.dtype),
                **{n: inputs[n] for n in ("strides", "padding", "dilation")})


def run_inverse_conv(inputs):
    kmap = KernelMap(*constants(inputs, "in_rows", "out_rows", "offset_splits", "in_coords", "out_coords",
                                "in_spatial_shape", "out_spatial_shape"), "strided",
                     *(tuple(inputs[n].tolist()) for n in ("map_kernel_size", "strides", "padding", "dilation")),
                     trusted=False)
    x = make_site_sparse(*constants(inputs, "out_coords", "features", "out_spatial_shape", "batch_size"),
                         kernel_maps={"key": kmap}, non_finite="allow")
    y = site_inverse_conv(x, *constants(inputs, "kernel"), "key", bias=tf.constant(inputs["bias"]))
    return site_parts(y)


def ref_inverse_conv(inputs):
    """The reversed pairs, onto the strided convolution's input sites."""
    features, kernel, bias = inputs["features"], inputs["kernel"], inputs["bias"]
    require(features.ndim == 2 and len(features) == len(inputs["out_coords"]), "one feature row per site")
    d = len(inputs["in_spatial_shape"])
    require(kernel.ndim == d + 2 and kernel.shape[-2] == features.shape[1], "kernel [k..., Cin, Cout]")
    require(list(kernel.shape[:d]) == inputs["map_kernel_size"].tolist(), "the strided convolution's kernel size")
    in_coords = inputs["in_coords"]
    require(in_coords.ndim == 2 and in_coords.shape[1] == d + 1, "the map's input sites are [N, d + 1]")
    check_hand_built(inputs, ref_kernel_map(dict(
        inputs, coords=in_coords, spatial_shape=inputs["in_spatial_shape"], mode="strided",
        kernel_size=inputs["map_kernel_size"], dilation=inputs["dilation"])))
    filters = kernel.reshape(-1, *kernel.shape[-2:])
    num_out = len(in_coords)
    check_map_rows(inputs["out_rows"], inputs["in_rows"], inputs["offset_splits"], len(filters), len(features),
                   num_out)
    require(not np.any(np.isnan(features)), "features hold NaN")
    require(bias.ndim == 1 and len(bias) == kernel.shape[-1], "bias must be [Cout]")
    out, bound = conv_along(features, filters, inputs["out_rows"], inputs["in_rows"], inputs["offset_splits"],
                            num_out)
    with np.errstate(invalid="ignore", over="ignore"):
        out, bound = out + bias, bound + np.abs(bias.astype(np.float64))
    return dict(coords=inputs["in_coords"], features=Approx(out, bound, features.dtype),
                spatial_shape=inputs["in_spatial_shape"], batch_size=inputs["batch_size"])


def make_pool(rng):
    inputs = random_site_tensor(rng)
    d = len(inputs["spatial_shape"])
    return dict(inputs, pool_size=rng.integers(1, 4, d).astype(np.int64), strides=rng.integers(1, 3, d).astype(
        np.int64), padding=rng.integers(0, 2, d).astype(np.int64), mode=str(rng.choice(["max", "avg"])))


def ref_pool(inputs):
    d = check_sites(inputs)
    check_features(inputs)
    m = ref_kernel_map(dict(inputs, mode="strided", kernel_size=inputs["pool_size"], dilation=np.ones(d, np.int64)))
    features = inputs["features"]
    rows = [[] for _ in range(len(m["out_coords"]))]
    for i, o in zip(m["in_rows"], m["out_rows"]):
        rows[o].append(i)
    f = features.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if inputs["mode"] == "max":
            out = np.array([f[r].max(0) for r in rows]).reshape(-1, features.shape[1]).astype(features.dtype)
            return dict(coords=m["out_coords"], features=out, spatial_shape=m["out_spatial_shape"],
                        batch_size=inputs["batch_size"])
        out = np.array([f[r].mean(0) for r in rows]).reshape(-1, features.shape[1])
        bound = np.array([np.abs(f[r]).mean(0) for r in rows]).reshape(out.shape)
    return dict(coords=m["out_coords"], features=Approx(out, bound, features.dtype),
                spatial_shape=m["out_spatial_shape"], batch_size=inputs["batch_size"])


def run_pool(inputs):
    y = site_pool(site_tensor_of(inputs), inputs["pool_size"].tolist(), inputs["strides"].tolist(),
                  inputs["padding"].tolist(), mode=inputs["mode"])
    return site_parts(y)


def make_global_pool(rng):
    return dict(random_site_tensor(rng), mode=str(rng.choice(["max", "mean", "sum"])))


def ref_global_pool(inputs):
    """Per batch element over its sites (a valid site tensor): max (0 for no site), mean or
    sum; a NaN feature makes its channel's pool NaN."""
    check_sites(inputs)
    check_features(inputs)
    coords, features, batch_size = inputs["coords"], inputs["features"], int(inputs["batch_size"])
    batch = coords[:, 0].astype(np.int64)
    f = features.astype(np.float64)
    out, bound = np.zeros((batch_size, f.shape[1])), np.zeros((batch_size, f.shape[1]))
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(batch_size):
            rows = f[batch == b]
            if len(rows):
                if inputs["mode"] == "max":
                    out[b] = rows.max(0)
                else:
                    out[b] = rows.sum(0) / (len(rows) if inputs["mode"] == "mean" else 1)
                bound[b] = np.abs(rows).sum(0) / (len(rows) if inputs["mode"] != "sum" else 1)
    return out.astype(features.dtype) if inputs["mode"] == "max" else Approx(out, bound, features.dtype)


def ref_select(inputs):
    """Per batch element the k sites of largest feature norm (float32, as TensorFlow's norm
    of the float32 features), ties to the lower row, in row order; k an int >= 1 (any
    larger than the site count keeps all), NaN scores refused."""
    check_sites(inputs)
    check_features(inputs)
    coords, features, k = inputs["coords"], inputs["features"], inputs["k"]
    require(k.ndim == 0 and int(k) >= 1, "k must be an int >= 1")
    k = int(k)
    with np.errstate(invalid="ignore", over="ignore"):
        f32 = features.astype(np.float32)
        score = np.sqrt(np.sum(f32 * f32, axis=1, dtype=np.float32))
    require(not np.any(np.isnan(score)), "NaN scores")
    batch = coords[:, 0].astype(np.int64)
    kept = []
    for b in range(int(inputs["batch_size"])):
        rows = sorted(np.flatnonzero(batch == b), key=lambda r: (-score[r], r))
        if len(rows) > k and score[rows[k - 1]] != score[rows[k]] and \
                abs(float(score[rows[k - 1]]) - float(score[rows[k]])) <= 1e-5 * float(score[rows[k]]):
            raise NotRun("k-selection tie within rounding")
        kept += rows[:k]
    kept = np.sort(np.array(kept, np.int64))
    return dict(coords=coords[kept], features=features[kept], spatial_shape=inputs["spatial_shape"],
                batch_size=inputs["batch_size"])


def make_select(rng):
    return dict(random_site_tensor(rng), k=np.array(int(rng.integers(1, 5)), np.int64))


def run_select(inputs):
    return site_parts(select_sites(site_tensor_of(inputs), inputs["k"].tolist()))


def ref_site_to_dense(inputs):
    check_sites(inputs)
    check_features(inputs)
    shape = [int(inputs["batch_size"]), *inputs["spatial_shape"].tolist(), inputs["features"].shape[1]]
    cap(math.prod(shape), "dense output")
    dense = np.zeros(shape, inputs["features"].dtype)
    for row, f in zip(inputs["coords"], inputs["features"]):
        dense[tuple(row)] = f
    return dense


def make_dense_grid(rng):
    inputs = random_site_tensor(rng)
    grid = np.zeros((int(inputs["batch_size"]), *inputs["spatial_shape"].tolist(), inputs["features"].shape[1]),
                    inputs["features"].dtype)
    grid[tuple(inputs["coords"].T)] = inputs["features"]
    return dict(dense=grid)


def ref_site_from_dense(inputs):
    dense = inputs["dense"]
    require(dense.ndim >= 3, "dense must be [B, R1, ..., Rd, C]")
    require(np.all(np.isfinite(dense)), "NaN or infinite entries (refused unless non_finite='allow')")
    occupied = np.any(dense != 0, axis=-1)
    coords = np.argwhere(occupied).astype(np.int32)
    expected = dict(coords=coords, features=dense[occupied].reshape(-1, dense.shape[-1]),
                    spatial_shape=np.array(dense.shape[1:-1], np.int32), batch_size=np.array(dense.shape[0], np.int32))
    if dense.size == 0:
        raise MayRefuse("a dense grid of no cells", expected)
    return expected


def run_site_from_dense(inputs):
    return site_parts(site_from_dense(inputs["dense"]))


def ref_to_channel_sparse(inputs):
    check_sites(inputs)
    check_features(inputs)
    features = inputs["features"]
    dims = [int(inputs["batch_size"]), *inputs["spatial_shape"].tolist(), features.shape[1]]
    require(math.prod(dims) < 2**63, "key overflow")
    spatial = math.prod(dims[1:-1])
    entries = []
    for row, f in zip(inputs["coords"], features):
        lin = 0
        for x, r in zip(row[1:], dims[1:-1]):
            lin = lin * r + int(x)
        for c, v in enumerate(f):
            if v != 0:
                entries.append(((int(row[0]) * dims[-1] + c) * spatial + lin, v))
    entries.sort()
    return (np.array([k for k, _ in entries], np.int64), np.array([v for _, v in entries], features.dtype),
            np.array(dims, np.int64))


def run_to_channel_sparse(inputs):
    y = to_channel_sparse(site_tensor_of(inputs))
    return numpy_of((y.keys, y.values, y.dense_shape))


def make_channel(rng):
    inputs = random_site_tensor(rng)
    keys, values, dims = ref_to_channel_sparse(inputs)
    return dict(keys=keys, values=values, dense_shape=dims)


def ref_from_channel_sparse(inputs):
    """Sites of the stored entries, sorted; x must be valid (sorted unique keys in range, no
    NaN values)."""
    keys, values, dense_shape = inputs["keys"], inputs["values"], inputs["dense_shape"]
    require(dense_shape.ndim == 1 and 3 <= len(dense_shape) <= 6, "dense_shape must have 3 to 6 entries")
    dims = [int(v) for v in dense_shape]
    require(all(v > 0 for v in dims) and all(v <= INT32_MAX for v in dims) and math.prod(dims) < 2**63,
            "dense_shape entries positive, at most 2^31 - 1, product below 2^63")
    require(keys.ndim == 1 and values.ndim == 1 and len(keys) == len(values), "one value per key")
    require(all(0 <= int(k) < math.prod(dims) for k in keys), "key out of range")
    require(len(set(keys.tolist())) == len(keys), "repeated key")
    spatial = math.prod(dims[1:-1])
    cap(len(keys) * dims[-1], "features")
    sites = {}
    for k, v in zip(keys.tolist(), values):
        segment, lin = divmod(k, spatial)
        b, c = divmod(segment, dims[-1])
        x = []
        for r in reversed(dims[1:-1]):
            lin, xj = divmod(lin, r)
            x.append(xj)
        sites.setdefault((b, *reversed(x)), {})[c] = v
    order = sorted(sites)
    features = np.zeros((len(order), dims[-1]), values.dtype)
    for r, site in enumerate(order):
        for c, v in sites[site].items():
            features[r, c] = v
    expected = dict(coords=np.array(order, np.int32).reshape(-1, len(dims) - 1), features=features,
                    spatial_shape=np.array(dims[1:-1], np.int32), batch_size=np.array(dims[0], np.int32))
    require(all(int(a) < int(b) for a, b in zip(keys[:-1], keys[1:])), "keys sorted")
    require(not np.any(np.isnan(values)), "NaN values")
    return expected


def run_from_channel_sparse(inputs):
    x = ts.ChannelSparseTensor(*constants(inputs, "keys", "values", "dense_shape"))
    return site_parts(from_channel_sparse(x))


def make_voxelize(rng):
    d = int(rng.integers(1, 4))
    n = int(rng.integers(1, 12))
    dtype = rng.choice([np.float32, np.float64])
    shape = rng.integers(2, 5, d).astype(np.int32)
    batch = int(rng.integers(1, 3))
    return dict(points=rng.uniform(-0.3, 2.3, (n, d)).astype(dtype), voxel_size=np.array(0.5, dtype),
                spatial_shape=shape, batch_index=rng.integers(0, batch, n).astype(np.int32),
                batch_size=np.array(batch, np.int32), features=rng.standard_normal((n, 2)).astype(dtype),
                origin=np.zeros(d, dtype), reduction=str(rng.choice(["mean", "max", "first"])),
                non_finite=str(rng.choice(["raise", "drop"])))


def ref_voxelize(inputs):
    points, voxel_size, spatial_shape = inputs["points"], inputs["voxel_size"], inputs["spatial_shape"]
    batch_index, batch_size, features, origin = (inputs[n] for n in ("batch_index", "batch_size", "features",
                                                                     "origin"))
    require(points.ndim == 2 and 1 <= points.shape[1] <= 4, "points must be [N, d], 1 <= d <= 4")
    n, d = points.shape
    require(voxel_size.ndim == 0 or (voxel_size.ndim == 1 and len(voxel_size) in (1, d)),
            "voxel_size: a scalar or one per axis")
    require(np.all(np.isfinite(voxel_size) & (voxel_size > 0)), "voxel_size must be positive and finite")
    require(spatial_shape.ndim == 1 and len(spatial_shape) == d, "spatial_shape must have d extents")
    require(np.all(spatial_shape >= 1), "spatial_shape entries must be >= 1")
    require(batch_size.ndim == 0 and int(batch_size) >= 1, "batch_size must be a scalar >= 1")
    require(batch_index.ndim == 1 and len(batch_index) == n, "one batch index per point")
    require(np.all((batch_index >= 0) & (batch_index < int(batch_size))), "batch_index must lie in [0, batch_size)")
    require(features.ndim == 2 and len(features) == n, "features must be [N, F]")
    require(origin.ndim == 1 and len(origin) == d, "origin must have d entries")
    require(np.all(np.isfinite(origin)), "origin must be finite")
    require(int(batch_size) * math.prod(spatial_shape.tolist()) < 2**63, "key overflow")
    finite = np.all(np.isfinite(points), axis=1)
    if inputs["non_finite"] == "raise":
        require(np.all(finite), "points hold NaN or Inf")
    require(np.all(np.isfinite(features)[finite]), "features hold NaN or Inf")
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        cells = np.floor((points - origin) / voxel_size)
        # a point below the origin is outside even where the quotient underflows to -0
        cells = np.where(points < origin, np.minimum(cells, -1), cells)
    inside = finite & np.all((cells >= 0) & (cells < spatial_shape), axis=1)
    sites = sorted({(int(batch_index[i]), *cells[i].astype(np.int64).tolist()) for i in np.flatnonzero(inside)})
    row = {s: r for r, s in enumerate(sites)}
    point_to_site = np.full(n, -1, np.int32)
    members = [[] for _ in sites]
    for i in np.flatnonzero(inside):
        r = row[(int(batch_index[i]), *cells[i].astype(np.int64).tolist())]
        point_to_site[i] = r
        members[r].append(i)
    f = features.astype(np.float64)
    reduction = inputs["reduction"]
    if reduction == "max":
        out = np.array([f[m].max(0) for m in members]).reshape(-1, features.shape[1]).astype(features.dtype)
    elif reduction == "first":
        out = np.array([f[m[0]] for m in members]).reshape(-1, features.shape[1]).astype(features.dtype)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            mean = np.array([f[m].mean(0) for m in members]).reshape(-1, features.shape[1])
            bound = np.array([np.abs(f[m]).mean(0) for m in members]).reshape(mean.shape)
        out = Approx(mean, bound, features.dtype)
    return (dict(coords=np.array(sites, np.int32).reshape(-1, d + 1), features=out,
                 spatial_shape=spatial_shape, batch_size=batch_size), point_to_site)


def run_voxelize(inputs):
    x, point_to_site = voxelize_sites(*constants(inputs, "points", "voxel_size", "spatial_shape", "batch_index",
                                                 "batch_size", "features", "origin"),
                                      reduction=inputs["reduction"], non_finite=inputs["non_finite"])
    return site_parts(x), point_to_site.numpy()


CONV_MUTABLE = ["coords", "features", "spatial_shape", "batch_size", "kernel", "bias", "strides", "padding", "dilation"]
SITE_NAMES = ("coords", "features", "spatial_shape", "batch_size", "site", "sites", "batch", "coordinate")
MAP_NAMES = ("in_rows", "out_rows", "offset_splits", "num_out", "num_in", "neighbours", "kernel map", "output row",
             "kernel")
# --- row batch norm (RowBatchNorm, RowBatchNormGrad, RowScaleShift, RowNormalize) ---------------
# References in float64 from the float32 inputs; Approx bounds hold each result's rounding:
# the sums about a pivot (the first row) in any order, the mean's rounding where the rows sit
# far from zero. Non-finite inputs give non-finite results (a NaN or infinite term makes the
# bound non-finite, and the results there must be too). RowBatchNorm and RowBatchNormGrad
# sum in float64 (row_batch_norm.h), so rows up to float32's largest values are compared.


def make_rows(rng):
    n, c = int(rng.integers(1, 7)), int(rng.integers(1, 4))
    return dict(x=(rng.standard_normal((n, c)) * rng.uniform(0.5, 3) + rng.uniform(-3, 3)).astype(np.float32),
                gamma=rng.uniform(0.5, 1.5, c).astype(np.float32), beta=rng.standard_normal(c).astype(np.float32),
                epsilon=np.array(1e-3, np.float32))


def check_rows(inputs, x_name, vectors):
    x = inputs[x_name]
    require(x.ndim == 2, f"{x_name} must be rows [N, C]")
    for name in vectors:
        require(inputs[name].ndim == 1 and len(inputs[name]) == x.shape[1], f"{name}: one entry per column")


def epsilon_of(inputs):
    """The epsilon attr the case passes: the array's one value (a float attr takes any size-1
    array's value)."""
    return float(np.asarray(inputs["epsilon"], np.float32).reshape(-1)[0])


def ref_row_batch_norm(inputs):
    check_rows(inputs, "x", ("gamma", "beta"))
    e = epsilon_of(inputs)
    require(math.isfinite(e) and e > 0, "epsilon must be a finite number > 0")
    with np.errstate(all="ignore"):
        x = inputs["x"].astype(np.float64)
    n, c = x.shape
    if n == 0:
        nan = np.full(c, np.nan, np.float32)
        return np.zeros((0, c), np.float32), nan, nan, nan
    with np.errstate(all="ignore"):
        g, b = inputs["gamma"].astype(np.float64), inputs["beta"].astype(np.float64)
        m = x.mean(0)
        v = ((x - m) ** 2).mean(0)
        inv = 1 / np.sqrt(v + e)
        spread = np.abs(x - x[0]).max(0)
        var_bound = 4 * n * spread ** 2 + v
        var_rel = 1 + var_bound / (v + e)
        mean_bound = np.abs(x).max(0) + n * spread
        y = (x - m) * inv * g + b
        y_bound = np.abs(g) * inv * (np.abs(x - m) * var_rel + np.abs(x) + mean_bound) + np.abs(b)
        inv_bound = inv * var_rel
    return (Approx(y, y_bound, np.float32), Approx(m, mean_bound, np.float32), Approx(v, var_bound, np.float32),
            Approx(inv, inv_bound, np.float32))


def run_row_batch_norm(inputs):
    return numpy_of(ops.row_batch_norm(inputs["x"], inputs["gamma"], inputs["beta"], epsilon=epsilon_of(inputs)))


def make_row_grad(rng):
    rows = make_rows(rng)
    x = rows["x"]
    mean = x.mean(0).astype(np.float32)
    return dict(dy=rng.standard_normal(x.shape).astype(np.float32), x=x, gamma=rows["gamma"], mean=mean,
                inv_std=(1 / np.sqrt(x.var(0) + 1e-3)).astype(np.float32))


def ref_row_batch_norm_grad(inputs):
    check_rows(inputs, "x", ("gamma", "mean", "inv_std"))
    require(inputs["dy"].shape == inputs["x"].shape, "dy must have x's shape")
    n, c = inputs["x"].shape
    if n == 0:
        return np.zeros((0, c), np.float32), np.zeros(c, np.float32), np.zeros(c, np.float32)
    with np.errstate(all="ignore"):
        dy, x = inputs["dy"].astype(np.float64), inputs["x"].astype(np.float64)
        g, m, inv = (inputs[k].astype(np.float64) for k in ("gamma", "mean", "inv_std"))
        xc = x - m
        db = dy.sum(0)
        dg = inv * (dy * xc).sum(0)
        dx = g * inv * (dy - db / n - xc * inv * dg / n)
        db_bound = np.abs(dy).sum(0)
        reach = np.abs(xc) + np.abs(x) + np.abs(m)  # x - mean with its rounding
        dg_bound = np.abs(inv) * (np.abs(dy) * reach).sum(0)
        dx_bound = np.abs(g * inv) * (np.abs(dy) + db_bound / n + reach * np.abs(inv) * dg_bound / n)
    # The op sums and forms dx's coefficients in float64 and rounds each result once
    # (row_batch_norm.h): no float32 intermediate overflows where a result is finite.
    return Approx(dx, dx_bound, np.float32), Approx(dg, dg_bound, np.float32), Approx(db, db_bound, np.float32)


def run_row_batch_norm_grad(inputs):
    return numpy_of(ops.row_batch_norm_grad(*constants(inputs, "dy", "x", "gamma", "mean", "inv_std")))


def make_scale_shift(rng):
    rows = make_rows(rng)
    return dict(x=rows["x"], scale=rows["gamma"], shift=rows["beta"])


def ref_row_scale_shift(inputs):
    check_rows(inputs, "x", ("scale", "shift"))
    with np.errstate(all="ignore"):
        x, s, t = (inputs[k].astype(np.float64) for k in ("x", "scale", "shift"))
        return Approx(x * s + t, np.abs(x) * np.abs(s) + np.abs(t), np.float32)


def make_normalize(rng):
    rows = make_rows(rng)
    x, c = rows["x"], rows["x"].shape[1]
    return dict(x=x, mean=(x.mean(0) + rng.normal(0, 0.3, c)).astype(np.float32),
                variance=(x.var(0) * rng.uniform(0.5, 1.5, c)).astype(np.float32), gamma=rows["gamma"],
                beta=rows["beta"], epsilon=rows["epsilon"])


def ref_row_normalize(inputs):
    check_rows(inputs, "x", ("mean", "variance", "gamma", "beta"))
    e = epsilon_of(inputs)
    require(math.isfinite(e) and e > 0, "epsilon must be a finite number > 0")
    with np.errstate(all="ignore"):
        x, m, v, g, b = (inputs[k].astype(np.float64) for k in ("x", "mean", "variance", "gamma", "beta"))
        inv = 1 / np.sqrt(v + e)
        # variance + epsilon rounds relative to |variance| + epsilon (cancellation where the
        # variance is near -epsilon), and the scale with it.
        # An infinite variance scales by exactly 0 (y = beta where x - mean is finite).
        var_rel = np.where(np.isinf(v), 1.0, 1 + (np.abs(v) + e) / np.abs(v + e))
        return Approx((x - m) * g * inv + b, (np.abs(x) + np.abs(m)) * np.abs(g) * inv * var_rel + np.abs(b),
                      np.float32)


def run_row_normalize(inputs):
    return ops.row_normalize(*constants(inputs, "x", "mean", "variance", "gamma", "beta"),
                             epsilon=epsilon_of(inputs)).numpy()


ROW_NAMES = ("x", "rows", "columns", "gamma", "beta", "epsilon", "dy", "mean", "inv_std", "scale", "shift",
             "variance")


GEOMETRY_NAMES = GEOMETRY + ("kernel", "submanifold", "output spatial extent", "key overflow")
SOFT = pytest.mark.soft_placement  # TensorFlow's sorts and segment reductions of int32 rows
TARGETS = [
    # raw ops
    Target("SiteKernelMap", make_kernel_map_op, run_kernel_map_op, ref_kernel_map, assert_equal,
           SITE_NAMES + GEOMETRY_NAMES, mutable=MAP_MUTABLE),
    Target("SiteSparseConv", make_conv_op, run_conv_op, ref_site_conv_op, assert_equal,
           ("features", "filters") + MAP_NAMES,
           mutable=["features", "filters", "in_rows", "out_rows", "offset_splits", "num_out", "neighbours"],
           groups=[("in_rows", "out_rows")]),
    # the epilogue's vectors stay valid (test_conv_epilogue.py refuses bad ones); the map and rows are fuzzed
    Target("SiteSparseConv (epilogue)", make_conv_epilogue_op, run_conv_epilogue_op, ref_conv_epilogue_op,
           assert_equal, ("features", "filters") + MAP_NAMES,
           mutable=["features", "filters", "in_rows", "out_rows", "offset_splits", "num_out", "neighbours"],
           groups=[("in_rows", "out_rows")]),
    Target("SiteSparseConvFilterGrad", make_filter_grad_op, run_filter_grad_op, ref_filter_grad, assert_equal,
           ("features", "out_grad") + MAP_NAMES, groups=[("in_rows", "out_rows")]),
    Target("SiteNeighbourTable", make_table_op, run_table_op, ref_neighbour_table_op, assert_equal, MAP_NAMES,
           groups=[("in_rows", "out_rows")]),
    Target("SiteSubmanifoldNeighbours", make_submanifold_table_op, run_submanifold_table_op, ref_submanifold_table,
           assert_equal, SITE_NAMES + GEOMETRY_NAMES,
           mutable=["coords", "spatial_shape", "batch_size", "kernel_size", "dilation"]),
    Target("SiteTablePairs", make_table_pairs_op, run_table_pairs_op, ref_table_pairs, assert_equal,
           ("neighbours",)),
    Target("RowBatchNorm", make_rows, run_row_batch_norm, ref_row_batch_norm, assert_equal, ROW_NAMES,
           subnormals_flushed=True),
    Target("RowBatchNormGrad", make_row_grad, run_row_batch_norm_grad, ref_row_batch_norm_grad, assert_equal,
           ROW_NAMES, groups=[("dy", "x")], subnormals_flushed=True),
    Target("RowScaleShift", make_scale_shift, lambda i: ops.row_scale_shift(*constants(i, "x", "scale", "shift"))
           .numpy(), ref_row_scale_shift, assert_equal, ROW_NAMES, subnormals_flushed=True),
    Target("RowNormalize", make_normalize, run_row_normalize, ref_row_normalize, assert_equal, ROW_NAMES,
           subnormals_flushed=True),
    # public functions
    Target("make_site_sparse", lambda rng: random_site_tensor(rng),
           lambda i: site_parts(make_site_sparse(*constants(i, *SITES))),
           ref_make_site_sparse, assert_equal, SITE_NAMES),
    Target("make_site_sparse (int64 coords)", make_sites_int64,
           lambda i: site_parts(make_site_sparse(*(i[n] for n in SITES))),
           ref_make_site_sparse, assert_equal, SITE_NAMES, mutable=["coords"]),
    Target("kernel_map", make_public_map, run_public_map, ref_public_map, assert_equal,
           SITE_NAMES + GEOMETRY_NAMES, mutable=MAP_MUTABLE),
    Target("neighbour_table", make_hand_map,
           lambda i: neighbour_table(hand_map_of(i), inverse=i["inverse"]).numpy(), ref_public_table, assert_equal,
           MAP_NAMES, mutable=["in_rows", "out_rows", "offset_splits", "in_coords", "out_coords"],
           groups=[("in_rows", "out_rows")]),
    *(Target(name, lambda rng, mode=mode: make_site_conv(rng, mode), run_site_conv, ref_site_conv, assert_equal,
             SITE_NAMES + GEOMETRY_NAMES + ("bias", "kernel"), mutable=CONV_MUTABLE, groups=[("coords", "features")])
      for name, mode in (("site_conv (submanifold)", "submanifold"), ("site_conv (strided)", "strided"),
                         ("site_conv_transpose", "transposed"))),
    Target("site_conv gradient", make_site_conv, run_site_conv_gradient, ref_site_conv_gradient, assert_equal,
           SITE_NAMES + GEOMETRY_NAMES + ("bias", "kernel"), mutable=CONV_MUTABLE, groups=[("coords", "features")]),
    Target("site_conv (cached map)", make_cached_conv, run_cached_conv, ref_cached_conv, assert_equal,
           SITE_NAMES + MAP_NAMES + GEOMETRY_NAMES + ("bias", "indice_key"),
           mutable=["features", "kernel", "bias", "in_rows", "out_rows", "offset_splits", "out_coords"],
           groups=[("in_rows", "out_rows")]),
    Target("site_inverse_conv", make_inverse_conv, run_inverse_conv, ref_inverse_conv, assert_equal,
           SITE_NAMES + MAP_NAMES + GEOMETRY_NAMES + ("bias", "indice_key"),
           mutable=["features", "kernel", "bias", "in_rows", "out_rows", "offset_splits", "in_coords"],
           groups=[("in_rows", "out_rows")]),
    Target("site_pool", make_pool, run_pool, ref_pool, assert_equal, SITE_NAMES + GEOMETRY_NAMES + ("pool_size",),
           mutable=["coords", "features", "spatial_shape", "batch_size", "pool_size", "strides", "padding"],
           groups=[("coords", "features")], subnormals_flushed=True),
    Target("global_pool", make_global_pool, lambda i: global_pool(site_tensor_of(i), i["mode"]).numpy(),
           ref_global_pool, assert_equal, SITE_NAMES, groups=[("coords", "features")], subnormals_flushed=True),
    Target("select_sites", make_select, run_select, ref_select, assert_equal, SITE_NAMES + ("k", "scores"),
           groups=[("coords", "features")], subnormals_flushed=True),
    Target("site_to_dense", lambda rng: random_site_tensor(rng),
           lambda i: site_to_dense(site_tensor_of(i)).numpy(), ref_site_to_dense, assert_equal, SITE_NAMES,
           groups=[("coords", "features")]),
    Target("site_from_dense", make_dense_grid, run_site_from_dense, ref_site_from_dense, assert_equal,
           ("dense", "site_from_dense"), subnormals_flushed=True),
    Target("voxelize_sites", make_voxelize, run_voxelize, ref_voxelize, assert_equal,
           ("points", "voxel_size", "spatial_shape", "batch_index", "batch_size", "features", "origin"),
           mutable=["points", "voxel_size", "spatial_shape", "batch_index", "batch_size", "features", "origin"],
           groups=[("points", "batch_index", "features")], subnormals_flushed=True),
    Target("to_channel_sparse", lambda rng: random_site_tensor(rng), run_to_channel_sparse, ref_to_channel_sparse,
           assert_equal, SITE_NAMES, groups=[("coords", "features")], subnormals_flushed=True),
    Target("from_channel_sparse", make_channel, run_from_channel_sparse, ref_from_channel_sparse, assert_equal,
           ("keys", "values", "dense_shape", "key", "channelsparsetensor"), groups=[("keys", "values")]),
]
# The conversions, pooling and selection are TensorFlow ops, some (sorts, int32 segment
# reductions) without GPU kernels: they run with soft placement, as their own tests do.
SOFT_TARGETS = {"site_pool", "global_pool", "select_sites", "site_to_dense", "site_from_dense", "voxelize_sites",
                "to_channel_sparse", "from_channel_sparse"}


@pytest.mark.parametrize("target", [pytest.param(t, marks=[SOFT] if t.name in SOFT_TARGETS else [])
                                    for t in TARGETS], ids=repr)
def test_fuzz(target, device, fuzz_examples, fuzz_seed):
    run_fuzz(target, device, fuzz_examples, fuzz_seed)
