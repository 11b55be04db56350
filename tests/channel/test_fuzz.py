"""Fuzzing every op of the channel family (tests/fuzz.py): each raw op of the library and
each public function, on each device, from small valid inputs with one mutation each;
every case is refused with a clear error or equals the sparse reference below (numpy, on
the entries themselves, so that a mutated dense_shape of 2^31 cells per axis costs
nothing)."""
import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv._op_library import ops
from tests.fuzz import (Approx, NotRun, Target, assert_equal, cap, constants, numpy_of, require,
                        run_fuzz)

MAX_SEGMENTS = 1 << 24


# --- valid inputs ---------------------------------------------------------------------------------

def random_dense(rng, d=None, dtype=None):
    """A small [B, R1..Rd, C] array with ~30 % non-zeros (float32 or float64)."""
    d = int(rng.integers(1, 5)) if d is None else d
    shape = (int(rng.integers(1, 3)), *(int(r) for r in rng.integers(2, 6 if d < 4 else 4, d)),
             int(rng.integers(1, 4)))
    dtype = rng.choice([np.float32, np.float64]) if dtype is None else dtype
    present = rng.random(shape) < 0.3
    return np.where(present, rng.standard_normal(shape), 0.0).astype(dtype)


def key_order(dense):
    """[B, R..., C] flattened in key order (b, c, spatial)."""
    d = dense.ndim - 2
    return np.transpose(dense, (0, d + 1, *range(1, d + 1))).reshape(-1)


def random_sparse(rng, d=None, dtype=None):
    """keys, values, dense_shape of a random_dense array."""
    dense = random_dense(rng, d, dtype)
    flat = key_order(dense)
    keys = np.nonzero(flat)[0].astype(np.int64)
    return dict(keys=keys, values=flat[keys], dense_shape=np.array(dense.shape, np.int64))


def random_filter(rng, d, cin, dtype):
    kernel = [int(rng.choice([1, 3])) for _ in range(d)]
    cout = int(rng.integers(1, 4))
    w = rng.standard_normal((*kernel, cin, cout)).astype(dtype)
    return w, rng.random(w.shape) < 0.7


# --- the reference --------------------------------------------------------------------------------

class Layout:
    """The key layout of a checked dense_shape, in Python integers."""

    def __init__(self, dims):
        self.dims = dims
        self.batch, self.channels, self.extents = dims[0], dims[-1], dims[1:-1]
        self.d = len(dims) - 2
        self.spatial = math.prod(self.extents)
        self.num_keys = self.batch * self.channels * self.spatial

    def decode(self, key):
        """(b, x, c) of a key."""
        segment, lin = divmod(int(key), self.spatial)
        b, c = divmod(segment, self.channels)
        x = []
        for extent in reversed(self.extents):
            lin, xj = divmod(lin, extent)
            x.append(xj)
        return b, tuple(reversed(x)), c

    def encode(self, b, x, c):
        lin = 0
        for xj, extent in zip(x, self.extents):
            lin = lin * extent + xj
        return (b * self.channels + c) * self.spatial + lin

    def with_channels(self, channels):
        return Layout([*self.dims[:-1], channels])


def layout_of_dims(dims):
    require(3 <= len(dims) <= 6, "dense_shape must have 3 to 6 entries")
    require(all(v > 0 for v in dims), "dense_shape entries must be positive")
    require(all(v <= 2**31 - 1 for v in dims[1:-1]), "spatial extent over 2^31 - 1")
    require(math.prod(dims) < 2**63, "key overflow")
    return Layout(dims)


def layout_of(dense_shape):
    require(dense_shape.ndim == 1, "dense_shape must be 1-D")
    return layout_of_dims([int(v) for v in dense_shape])


def check_vector(a, what):
    require(a.ndim == 1, f"{what} must be 1-D")


def check_values(keys, values):
    require(values.ndim == 1 and len(values) == len(keys), "one value per key")


def check_sorted_keys(keys, layout):
    check_vector(keys, "keys")
    require(all(0 <= int(k) < layout.num_keys for k in keys), "key out of range")
    require(all(int(a) < int(b) for a, b in zip(keys[:-1], keys[1:])), "keys sorted and unique")


def check_no_nan(a, what):
    require(not np.any(np.isnan(a)), f"{what} contains NaN")


def check_segments(batch, channels):
    require(batch * channels <= MAX_SEGMENTS, "more than 2^24 segments")


def checked_tensor(inputs, nan=True):
    """The layout of a valid channel-sparse tensor (keys, values, dense_shape)."""
    keys, values = inputs["keys"], inputs["values"]
    layout = layout_of(inputs["dense_shape"])
    check_vector(keys, "keys")
    check_values(keys, values)
    check_sorted_keys(keys, layout)
    if nan:
        check_no_nan(values, "values")
    return layout


def ref_validate(inputs):
    checked_tensor(inputs)
    return inputs["keys"], inputs["values"]


def ref_encode(inputs):
    layout = layout_of(inputs["dense_shape"])
    indices = inputs["indices"]
    require(indices.ndim == 2 and indices.shape[1] == layout.d + 2, "indices must be [N, d + 2]")
    bounds = [layout.batch, *layout.extents, layout.channels]
    require(all(0 <= int(v) < bound for row in indices for v, bound in zip(row, bounds)), "index out of range")
    return np.array([layout.encode(int(r[0]), [int(v) for v in r[1:-1]], int(r[-1])) for r in indices],
                    np.int64).reshape(-1)


def decoded(keys, layout):
    return np.array([[b, *x, c] for b, x, c in map(layout.decode, keys)], np.int64).reshape(-1, layout.d + 2)


def ref_decode(inputs):
    layout = layout_of(inputs["dense_shape"])
    keys = inputs["keys"]
    check_vector(keys, "keys")
    require(all(0 <= int(k) < layout.num_keys for k in keys), "key out of range")
    return decoded(keys, layout)


def ref_reorder(inputs):
    layout = layout_of(inputs["dense_shape"])
    keys, values = inputs["keys"], inputs["values"]
    check_vector(keys, "keys")
    check_values(keys, values)
    require(all(0 <= int(k) < layout.num_keys for k in keys), "key out of range")
    require(len(set(keys.tolist())) == len(keys), "duplicate keys")
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order], order.astype(np.int64)


def dense_index(layout, key):
    b, x, c = layout.decode(key)
    return (b, *x, c)


def ref_to_dense(inputs):
    layout = checked_tensor(inputs, nan=False)
    cap(layout.num_keys, "dense output")
    dense = np.zeros(layout.dims, inputs["values"].dtype)
    for k, v in zip(inputs["keys"], inputs["values"]):
        dense[dense_index(layout, k)] = v
    return dense


def layout_of_dense(dense):
    require(dense.ndim >= 3, "dense must have rank 3 to 6")
    require(dense.size > 0, "dense tensor has a zero dimension")
    return layout_of_dims(list(dense.shape))


def ref_gather_dense(inputs):
    dense = inputs["dense"]
    layout = layout_of_dense(dense)
    check_sorted_keys(inputs["keys"], layout)
    return np.array([dense[dense_index(layout, k)] for k in inputs["keys"]], dense.dtype).reshape(-1)


def ref_from_dense(inputs, public=False):
    dense = inputs["dense"]
    layout = layout_of_dense(dense)
    flat = key_order(dense)
    keys = np.nonzero(flat != 0)[0].astype(np.int64)  # NaN is not 0: kept
    if public:  # from_dense refuses non-finite entries unless non_finite='allow'
        require(np.all(np.isfinite(dense)), "NaN or infinite entries")
    return keys, flat[keys], np.array(layout.dims, np.int64)


def ref_relu(inputs):
    checked_tensor(inputs)
    kept = np.nonzero(inputs["values"] > 0)[0]
    return inputs["keys"][kept], inputs["values"][kept], kept.astype(np.int64)


def check_strides(strides, layout, public):
    """The max-pool strides: one int >= 1 per spatial dimension (the public function also
    takes one int for all)."""
    if public and strides.ndim == 0:
        strides = np.full(layout.d, strides)
    require(strides.ndim == 1, "strides must be a list of ints")
    require(all(1 <= int(s) <= 2**31 - 1 for s in strides), "strides must be >= 1 (int32)")
    require(len(strides) == layout.d, "one stride per spatial dimension")
    return [int(s) for s in strides]


def ref_max_pool(inputs, public=False):
    layout = layout_of(inputs["dense_shape"])
    keys, values = inputs["keys"], inputs["values"]
    check_vector(keys, "keys")
    check_values(keys, values)
    check_segments(layout.batch, layout.channels)
    strides = check_strides(inputs["strides"], layout, public)
    check_sorted_keys(keys, layout)
    check_no_nan(values, "values")
    out = Layout([layout.batch, *(-(-r // s) for r, s in zip(layout.extents, strides)), layout.channels])
    best = {}
    for i, (k, v) in enumerate(zip(keys, values)):
        b, x, c = layout.decode(k)
        key = out.encode(b, [xj // s for xj, s in zip(x, strides)], c)
        if key not in best or v > values[best[key]]:  # ties: the smaller key, the earlier entry
            best[key] = i
    out_keys = np.array(sorted(best), np.int64)
    argmax = np.array([best[k] for k in sorted(best)], np.int64)
    return out_keys, values[argmax], np.array(out.dims, np.int64), argmax


class Attrs:
    """DirectSparseConv's k, rho_up and temp_limit_bytes, checked as its kernel does."""

    def __init__(self, inputs):
        for name in ("k", "rho_up", "temp_limit_bytes"):
            require(inputs[name].ndim == 0, f"{name} must be a scalar")
        self.selection, self.dataflow = inputs["selection"], inputs["dataflow"]
        self.k = int(inputs["k"])
        self.rho_up = float(np.float32(inputs["rho_up"]))  # the attr is a float
        self.temp_limit_bytes = int(inputs["temp_limit_bytes"])
        require(self.temp_limit_bytes >= 0, "temp_limit_bytes must be >= 0")
        require(self.k >= 0, "k must be >= 0")
        require(not math.isnan(self.rho_up) and 0 <= self.rho_up <= 1, "rho_up must be in (0, 1]")
        if self.selection == "none":
            require(self.k == 0 and self.rho_up == 0, "k / rho_up given with selection='none'")
        else:
            require((self.k > 0) != (self.rho_up > 0), "exactly one of k and rho_up")

    def effective_k(self, spatial):
        return self.k if self.k > 0 else math.ceil(self.rho_up * spatial)


def checked_conv(inputs):
    """(layout, kernel sizes, cout) of DirectSparseConv(Backprop)'s inputs 0-4, checked."""
    layout = layout_of(inputs["dense_shape"])
    keys, values, w, mask = inputs["keys"], inputs["values"], inputs["filter"], inputs["mask"]
    check_vector(keys, "keys")
    check_values(keys, values)
    require(w.ndim == layout.d + 2, "filter must have rank d + 2")
    kernel = w.shape[:layout.d]
    require(all(k % 2 == 1 for k in kernel), "kernel sizes must be odd")
    require(w.shape[layout.d] == layout.channels, "channel mismatch")
    cout = w.shape[-1]
    require(cout > 0, "filter has zero output channels")
    require(mask.shape == w.shape, "filter_mask must have the filter's shape")
    check_segments(layout.batch, layout.channels)
    check_segments(layout.batch, cout)
    check_sorted_keys(keys, layout)
    check_no_nan(values, "input values")
    check_no_nan(w, "filter")
    return layout, kernel, cout


def conv_pairs(layout, kernel, cout, keys, mask):
    """Every (input entry, offset q, output channel, output key) of the touched set."""
    half = [(k - 1) // 2 for k in kernel]
    out = layout.with_channels(cout)
    pairs = []
    for i, key in enumerate(keys):
        b, x, ic = layout.decode(key)
        for q in itertools.product(*map(range, kernel)):
            y = [xj - qj + h for xj, qj, h in zip(x, q, half)]
            if not all(0 <= yj < r for yj, r in zip(y, layout.extents)):
                continue
            for oc in range(cout):
                if mask[(*q, ic, oc)]:
                    pairs.append((i, q, ic, oc, out.encode(b, y, oc)))
    return pairs


def ref_direct_conv(inputs):
    layout, kernel, cout = checked_conv(inputs)
    bias = inputs["bias"]
    require(bias.ndim == 1 and len(bias) == cout, "bias must have shape [cout]")
    check_no_nan(bias, "bias")
    attrs = Attrs(inputs)
    out = layout.with_channels(cout)
    require(out.num_keys < 2**63, "output key overflow")
    if attrs.dataflow == "dense":
        cap(layout.batch * layout.spatial * max(layout.channels, cout), "dense dataflow grid")
    if attrs.dataflow in ("bitmap", "atomic"):  # a bit per input (bitmap) and per output key (on the GPU)
        cap(layout.batch * layout.spatial * (layout.channels + cout) // 32, "bitmap dataflow grid")
    keys, values, w = inputs["keys"], inputs["values"].astype(np.float64), inputs["filter"].astype(np.float64)
    sums, bounds = {}, {}
    with np.errstate(invalid="ignore", over="ignore"):
        for i, q, ic, oc, key in conv_pairs(layout, kernel, cout, keys, inputs["mask"]):
            term = values[i] * w[(*q, ic, oc)]
            sums[key] = sums.get(key, 0.0) + term
            bounds[key] = bounds.get(key, 0.0) + abs(term)
        out_keys = np.array(sorted(sums), np.int64)
        oc_of = [out.decode(k)[2] for k in out_keys]
        value = np.array([sums[k] + bias[oc] for k, oc in zip(out_keys, oc_of)], np.float64)
        bound = np.array([bounds[k] + abs(float(bias[oc])) for k, oc in zip(out_keys, oc_of)], np.float64)
    segments = out_keys // out.spatial
    touched = np.bincount(segments, minlength=layout.batch * cout).reshape(layout.batch, cout).astype(np.int64)
    positive = np.bincount(segments, value > 0, minlength=layout.batch * cout).reshape(layout.batch, cout)
    # A value within rounding of 0, or with a non-finite term, has no determined sign.
    sign_unknown = np.any(~np.isfinite(bound) | (np.abs(value) <= 1e-4 * bound))
    kept = np.arange(len(out_keys))
    if attrs.selection != "none":
        if not np.all(np.isfinite(bound)):
            raise NotRun("k-selection among non-finite values")
        k = attrs.effective_k(layout.spatial)
        score = value if attrs.selection == "signed" else np.abs(value)
        big = np.finfo(inputs["values"].dtype).max / 4
        kept = []
        for s in np.unique(segments):
            idx = np.nonzero(segments == s)[0]
            if len(idx) > k and np.any(bound[idx] > big):
                # Terms beyond the dtype's range: the op's sums overflow to inf, as a dense
                # float32 convolution's do, and its ties among them break by key, so which
                # entries survive is the rounding's choice (fuzz seed 53: a filter of 3e38).
                raise NotRun("k-selection among values beyond the dtype's range")
            order = sorted(idx, key=lambda i: (-score[i], out_keys[i]))
            if len(order) > k and abs(score[order[k - 1]] - score[order[k]]) <= 1e-4 * max(bound[order[k - 1]],
                                                                                           bound[order[k]]):
                raise NotRun("k-selection tie within rounding")
            kept.extend(order[:k])
        kept = np.array(sorted(kept), np.int64)
    dtype = inputs["values"].dtype
    if inputs.get("activation", "none") == "relu":  # the fused ReLU: of the kept entries, those > 0
        if not np.all(np.isfinite(bound)) or np.any(bound > np.finfo(dtype).max / 4):
            raise NotRun("fused ReLU over non-finite values")  # NaN (refused) or not: the op's rounding decides
        if np.any(np.abs(value[kept]) <= 1e-4 * bound[kept]):
            raise NotRun("fused ReLU of a value within rounding of 0")
        kept = kept[value[kept] > 0]
    return dict(keys=out_keys[kept], values=Approx(value[kept], bound[kept], dtype),
                dense_shape=np.array(out.dims, np.int64), touched=touched,
                positive=None if sign_unknown else positive.astype(np.int64))


def compare_conv(actual, expected, device):
    if expected["positive"] is None:  # a value within rounding of 0: its sign is not determined
        actual = dict(actual, positive=None)
    assert_equal(actual, expected, device)


def ref_backprop(inputs):
    layout, kernel, cout = checked_conv(inputs)
    out = layout.with_channels(cout)
    out_keys, out_grad = inputs["out_keys"], inputs["out_grad"]
    check_vector(out_keys, "output keys")
    check_values(out_keys, out_grad)
    require(out.num_keys < 2**63, "output key overflow")
    check_sorted_keys(out_keys, out)
    values, w, g = (inputs[n].astype(np.float64) for n in ("values", "filter", "out_grad"))
    row = {int(k): j for j, k in enumerate(out_keys)}
    in_grad, in_bound = np.zeros(len(values)), np.zeros(len(values))
    filter_grad, filter_bound = np.zeros(w.shape), np.zeros(w.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for i, q, ic, oc, key in conv_pairs(layout, kernel, cout, inputs["keys"], inputs["mask"]):
            if key in row:
                term = g[row[key]] * w[(*q, ic, oc)]
                in_grad[i] += term
                in_bound[i] += abs(term)
                term = values[i] * g[row[key]]
                filter_grad[(*q, ic, oc)] += term
                filter_bound[(*q, ic, oc)] += abs(term)
        channel = np.array([out.decode(k)[2] for k in out_keys], np.int64)
        bias_grad = np.array([g[channel == oc].sum() for oc in range(cout)])
        bias_bound = np.array([np.abs(g[channel == oc]).sum() for oc in range(cout)])
    dtype = inputs["values"].dtype
    return [Approx(in_grad, in_bound, dtype), Approx(filter_grad, filter_bound, dtype),
            Approx(bias_grad, bias_bound, dtype)]


# --- the targets ----------------------------------------------------------------------------------

def tensor_of(inputs):
    keys, values, dense_shape = (tf.constant(inputs[n]) for n in ("keys", "values", "dense_shape"))
    return ts.ChannelSparseTensor(keys, values, dense_shape)


def parts(x):
    return numpy_of((x.keys, x.values, x.dense_shape))


TENSOR = ("keys", "values", "dense_shape", "channel", "key", "input")


def make_indices(rng):
    sparse = random_sparse(rng)
    layout = Layout([int(v) for v in sparse["dense_shape"]])
    indices = decoded(sparse["keys"], layout)
    return dict(indices=indices[rng.permutation(len(indices))], dense_shape=sparse["dense_shape"])


def make_shuffled(rng):
    sparse = random_sparse(rng)
    order = rng.permutation(len(sparse["keys"]))
    return dict(sparse, keys=sparse["keys"][order], values=sparse["values"][order])


def make_gather(rng):
    sparse = random_sparse(rng)
    dense = rng.standard_normal(tuple(sparse["dense_shape"])).astype(sparse["values"].dtype)
    return dict(keys=sparse["keys"], dense_shape=sparse["dense_shape"], dense=dense)


def ref_public_gather_dense(inputs):
    """gather_dense(x, dense): x's keys (and dense_shape) must be those of dense's shape."""
    layout = layout_of(inputs["dense_shape"])
    check_sorted_keys(inputs["keys"], layout)
    require(list(inputs["dense"].shape) == layout.dims, "dense must have x's dense_shape")
    return ref_gather_dense(inputs)


def run_public_gather_dense(inputs):
    keys, dense_shape, dense = constants(inputs, "keys", "dense_shape", "dense")
    x = ts.ChannelSparseTensor(keys, tf.zeros(tf.shape(keys)[:1], dense.dtype), dense_shape)
    return ts.gather_dense(x, dense).values.numpy()


def make_dense(rng):
    return dict(dense=random_dense(rng))


def make_pool(rng):
    sparse = random_sparse(rng)
    d = len(sparse["dense_shape"]) - 2
    return dict(sparse, strides=rng.integers(1, 4, d).astype(np.int64))


def make_conv(rng):
    sparse = random_sparse(rng, d=int(rng.integers(1, 4)))
    d, cin = len(sparse["dense_shape"]) - 2, int(sparse["dense_shape"][-1])
    w, mask = random_filter(rng, d, cin, sparse["values"].dtype)
    selection = str(rng.choice(["none", "signed", "abs"]))
    k = int(rng.integers(1, 4)) if selection != "none" and rng.random() < 0.5 else 0
    rho_up = float(np.float32(rng.choice([0.1, 0.5]))) if selection != "none" and k == 0 else 0.0
    return dict(sparse, filter=w, mask=mask, bias=rng.standard_normal(w.shape[-1]).astype(w.dtype),
                selection=selection, k=np.array(k, np.int64), rho_up=np.array(rho_up, np.float64),
                temp_limit_bytes=np.array(0 if rng.random() < 0.5 else 4096, np.int64),
                dataflow=str(rng.choice(["auto", "sort", "dense", "bitmap", "atomic"])),
                activation=str(rng.choice(["none", "relu"])))


def dataflow_here(inputs):
    """The case's dataflow where the op runs now: 'bitmap' and 'atomic' are the GPU's (the CPU
    refuses them, tests/channel/test_direct_conv.py), so the CPU runs their results' twin, 'sort'."""
    on_cpu = tf.identity(tf.zeros([])).device.endswith("CPU:0")
    return "sort" if inputs["dataflow"] in ("bitmap", "atomic") and on_cpu else inputs["dataflow"]


CONV_MUTABLE = ["keys", "values", "dense_shape", "filter", "mask", "bias", "k", "rho_up", "temp_limit_bytes"]
# What a refusal of a convolution with max_entries may name.
CAPPED_NAMES = ("filter", "bias", "k", "rho_up", "temp_limit_bytes", "kernel", "selection", "output", "max_entries")


def run_raw_conv(inputs):
    keys, values, dense_shape, w, mask, bias = constants(inputs, "keys", "values", "dense_shape", "filter", "mask",
                                                         "bias")
    out = ops.direct_sparse_conv(keys, values, dense_shape, w, mask, bias, selection=inputs["selection"],
                                 k=inputs["k"].tolist(), rho_up=inputs["rho_up"].tolist(),
                                 dataflow=dataflow_here(inputs), temp_limit_bytes=inputs["temp_limit_bytes"].tolist(),
                                 activation=inputs.get("activation", "none"))
    return dict(zip(("keys", "values", "dense_shape", "touched", "positive"), numpy_of(out)))


def make_capped_conv(rng):
    """make_conv's input with max_entries (issue 24) around the exact output's count: one below
    it (refused: the output has more entries), at it, or above it."""
    inputs = make_conv(rng)
    try:
        count = len(ref_direct_conv(inputs)["keys"])
    except NotRun:
        count = 1
    return dict(inputs, max_entries=np.array(max(1, count + int(rng.integers(-1, 3))), np.int64))


def ref_capped_conv(inputs, minimum=0):
    """ref_direct_conv, refused where the output has more entries than max_entries (0: no cap;
    the public function takes none below 1)."""
    cap_given = np.asarray(inputs["max_entries"])
    require(cap_given.ndim == 0, "max_entries must be a scalar")
    cap_given = int(cap_given)
    require(cap_given >= minimum, f"max_entries must be >= {minimum}")
    out = ref_direct_conv(inputs)
    require(cap_given == 0 or len(out["keys"]) <= cap_given, "more entries than max_entries")
    return out


def run_raw_capped_conv(inputs, padded_output=False):
    keys, values, dense_shape, w, mask, bias = constants(inputs, "keys", "values", "dense_shape", "filter", "mask",
                                                         "bias")
    out = ops.direct_sparse_conv(keys, values, dense_shape, w, mask, bias, selection=inputs["selection"],
                                 k=inputs["k"].tolist(), rho_up=inputs["rho_up"].tolist(),
                                 dataflow=dataflow_here(inputs), temp_limit_bytes=inputs["temp_limit_bytes"].tolist(),
                                 activation=inputs.get("activation", "none"), padded_output=padded_output,
                                 max_entries=inputs["max_entries"].tolist())
    result = dict(zip(("keys", "values", "dense_shape", "touched", "positive"), numpy_of(out[:5])))
    if padded_output:  # the live entries, then only padding, the padded length at most max_entries
        live = int(np.searchsorted(result["keys"], PADDING_KEY))
        assert np.all(result["keys"][live:] == PADDING_KEY) and not np.any(result["values"][live:]), \
            "a padded output's tail is not padding"
        cap_given = int(inputs["max_entries"])
        assert cap_given == 0 or len(result["keys"]) <= cap_given, "a padded output longer than max_entries"
        result.update(keys=result["keys"][:live], values=result["values"][:live])
    return result


def public_activation(inputs):
    return None if inputs.get("activation", "none") == "none" else inputs["activation"]


def run_public_conv(inputs, make_tensor=tensor_of, padded_output=False):
    w, mask, bias = constants(inputs, "filter", "mask", "bias")
    k, rho_up = inputs["k"].tolist(), inputs["rho_up"].tolist()
    max_entries = inputs["max_entries"].tolist() if "max_entries" in inputs else None
    y, touched, positive = ts.direct_conv(
        make_tensor(inputs), w, bias, mask, selection=inputs["selection"], k=None if k == 0 else k,
        rho_up=None if rho_up == 0 else rho_up, dataflow=dataflow_here(inputs),
        temp_limit_bytes=inputs["temp_limit_bytes"].tolist(), activation=public_activation(inputs),
        return_counts=True, padded_output=padded_output, max_entries=max_entries)
    if max_entries is not None and padded_output:
        assert int(y.num_entries) <= max_entries, "a padded output longer than max_entries"
    if padded_output:  # the live entries, then only padding
        live = int(y.live_entries)
        assert np.all(y.keys.numpy()[live:] == PADDING_KEY) and not np.any(y.values.numpy()[live:]), \
            "a padded output's tail is not padding"
        y = y.without_padding()
    return dict(zip(("keys", "values", "dense_shape", "touched", "positive"), numpy_of(
        (y.keys, y.values, y.dense_shape, touched, positive))))


def make_backprop(rng):
    inputs = make_conv(rng)
    inputs.update(selection="none", k=np.array(0, np.int64), rho_up=np.array(0.0), dataflow="auto", activation="none")
    out_keys = ref_direct_conv(inputs)["keys"]
    out_grad = rng.standard_normal(len(out_keys)).astype(inputs["values"].dtype)
    return dict((n, inputs[n]) for n in ("keys", "values", "dense_shape", "filter", "mask")) | dict(
        out_keys=out_keys, out_grad=out_grad, dataflow=str(rng.choice(["auto", "sort", "dense", "bitmap", "atomic"])))


def run_backprop(inputs):
    args = constants(inputs, "keys", "values", "dense_shape", "filter", "mask", "out_keys", "out_grad")
    return numpy_of(list(ops.direct_sparse_conv_backprop(*args, dataflow=inputs["dataflow"])))


def ref_backprop_with_dataflow(inputs):
    if inputs["dataflow"] == "dense":
        layout = layout_of(inputs["dense_shape"])
        if inputs["filter"].ndim >= 1:
            cap(layout.batch * layout.spatial * max(layout.channels, inputs["filter"].shape[-1]), "dense grid")
    return ref_backprop(inputs)


def output_weights(keys):
    """A fixed weight per output key: the gradient tests' loss is sum(weights * values)."""
    return np.cos(keys.astype(np.float64))


def loss_weights(y):
    """output_weights of y's keys, computed by NumPy as the references do (a GPU's cos may
    differ from NumPy's in the last bit, which the exact gradient comparisons would see)."""
    return tf.constant(output_weights(y.keys.numpy()).astype(y.values.dtype.as_numpy_dtype))


def ref_conv_gradient(inputs):
    forward = ref_direct_conv(inputs)
    out_keys = forward["keys"]
    grads = ref_backprop(dict(inputs, out_keys=out_keys, out_grad=output_weights(out_keys).astype(
        inputs["values"].dtype)))
    return grads


def run_conv_gradient(inputs):
    values, w, bias = constants(inputs, "values", "filter", "bias")
    keys, dense_shape, mask = constants(inputs, "keys", "dense_shape", "mask")
    k, rho_up = inputs["k"].tolist(), inputs["rho_up"].tolist()
    with tf.GradientTape() as tape:
        tape.watch([values, w, bias])
        y = ts.direct_conv(ts.ChannelSparseTensor(keys, values, dense_shape), w, bias, mask,
                           selection=inputs["selection"], k=None if k == 0 else k,
                           rho_up=None if rho_up == 0 else rho_up, dataflow=dataflow_here(inputs),
                           activation=public_activation(inputs))
        loss = tf.reduce_sum(y.values * loss_weights(y))
    return numpy_of(tape.gradient(loss, [values, w, bias]))


def run_pool_gradient(inputs):
    values = tf.constant(inputs["values"])
    with tf.GradientTape() as tape:
        tape.watch(values)
        y = ts.sparse_max_pool(ts.ChannelSparseTensor(tf.constant(inputs["keys"]), values,
                                                      tf.constant(inputs["dense_shape"])),
                               inputs["strides"].tolist())
        loss = tf.reduce_sum(y.values * loss_weights(y))
    return tape.gradient(loss, values).numpy()


def ref_pool_gradient(inputs):
    out_keys, _, _, argmax = ref_max_pool(inputs, public=True)
    grad = np.zeros(len(inputs["values"]), inputs["values"].dtype)
    grad[argmax] = output_weights(out_keys).astype(grad.dtype)
    return grad


def run_relu_gradient(inputs):
    values = tf.constant(inputs["values"])
    with tf.GradientTape() as tape:
        tape.watch(values)
        y = ts.sparse_relu(ts.ChannelSparseTensor(tf.constant(inputs["keys"]), values,
                                                  tf.constant(inputs["dense_shape"])))
        loss = tf.reduce_sum(y.values * loss_weights(y))
    return tape.gradient(loss, values).numpy()


def ref_relu_gradient(inputs):
    keys, _, kept = ref_relu(inputs)
    grad = np.zeros(len(inputs["values"]), inputs["values"].dtype)
    grad[kept] = output_weights(keys).astype(grad.dtype)
    return grad


def ref_from_sparse_tensor(inputs):
    encoded = ref_encode(inputs)
    values = inputs["values"]
    check_values(encoded, values)
    keys, values, _ = ref_reorder(dict(keys=encoded, values=values, dense_shape=inputs["dense_shape"]))
    require(np.all(np.isfinite(values)), "NaN or infinite values (refused unless non_finite='allow')")
    return keys, values, inputs["dense_shape"]


def run_from_sparse_tensor(inputs):
    indices, values, dense_shape = constants(inputs, "indices", "values", "dense_shape")
    try:
        sp = tf.SparseTensor(indices, values, dense_shape)
    except (ValueError, TypeError):
        raise NotRun("tf.SparseTensor refuses the parts") from None
    return parts(ts.from_sparse_tensor(sp))


def make_sparse_tensor(rng):
    inputs = make_indices(rng)
    values = rng.standard_normal(len(inputs["indices"])).astype(rng.choice([np.float32, np.float64]))
    return dict(inputs, values=values)


def ref_to_sparse_tensor(inputs):
    """A valid tensor (validate) as indices in row-major order."""
    checked_tensor(inputs)
    indices = decoded(inputs["keys"], layout_of(inputs["dense_shape"]))
    order = np.lexsort(indices.T[::-1]) if len(indices) else np.zeros(0, np.int64)
    return indices[order], inputs["values"][order], inputs["dense_shape"]


def run_to_sparse_tensor(inputs):
    sp = ts.to_sparse_tensor(tensor_of(inputs))
    return numpy_of((sp.indices, sp.values, sp.dense_shape))


def ref_tensor(inputs):
    """The ChannelSparseTensor constructor: dtypes and ranks, one value per key; it holds its parts."""
    keys, values, dense_shape = inputs["keys"], inputs["values"], inputs["dense_shape"]
    check_vector(keys, "keys")
    check_vector(values, "values")
    check_vector(dense_shape, "dense_shape")
    require(len(keys) == len(values), "as many values as keys")
    return keys, values, dense_shape


# --- padded inputs (issue 24): a tensor made by a library op may end in padding ---------------------

PADDING_KEY = 2 ** 63 - 1


def with_padding(inputs):
    """inputs with 1 to 4 padding entries (key PADDING_KEY, value 0) after the (mutated) entries,
    where keys and values are vectors of one length; as they are otherwise."""
    keys, values = np.asarray(inputs["keys"]), np.asarray(inputs["values"])
    if keys.ndim != 1 or values.ndim != 1 or len(keys) != len(values) or keys.dtype != np.int64:
        return inputs
    pad = 1 + len(keys) % 4
    return dict(inputs, keys=np.concatenate([keys, np.full(pad, PADDING_KEY, np.int64)]),
                values=np.concatenate([values, np.zeros(pad, values.dtype)]))


def padded_tensor_of(inputs):
    keys, values, dense_shape = (tf.constant(inputs[n]) for n in ("keys", "values", "dense_shape"))
    return ts.ChannelSparseTensor(keys, values, dense_shape, padded=True)


def live_part(reference, values_checked):
    """The reference of an op on a padded input: the op reads the entries before the padding
    (a mutation may have made the last keys padding too); where it checks values for NaN, it
    checks the padding's as well."""
    def ref(inputs):
        keys, values = np.asarray(inputs["keys"]), np.asarray(inputs["values"])
        if keys.ndim == 1 and values.ndim == 1 and len(keys) == len(values) and keys.dtype == np.int64:
            live = len(keys)
            while live > 0 and keys[live - 1] == PADDING_KEY:
                live -= 1
            if values_checked:
                check_no_nan(values[live:], "values")
            inputs = dict(inputs, keys=keys[:live], values=values[:live])
        return reference(inputs)
    return ref


def run_padded(fn):
    """fn's result on a padded copy of the inputs, its padding dropped."""
    def run(inputs):
        return fn(padded_tensor_of(with_padding(inputs)), inputs)
    return run


def run_padded_pool_gradient(inputs):
    padded = with_padding(inputs)
    x = padded_tensor_of(padded)
    with tf.GradientTape() as tape:
        tape.watch(x.values)
        y = ts.sparse_max_pool(x, inputs["strides"].tolist(), padded_output=True).without_padding()
        loss = tf.reduce_sum(y.values * loss_weights(y))
    grad = tape.gradient(loss, x.values).numpy()
    live = int(np.searchsorted(padded["keys"], PADDING_KEY))  # a mutated last key may be padding too
    assert not np.any(grad[live:]), "a gradient at the padding"
    return grad[:live]


PADDED_TARGETS = [
    Target("validate (padded)", random_sparse, run_padded(lambda x, i: parts(ts.validate(x).without_padding())[:2]),
           live_part(ref_validate, True), assert_equal, TENSOR),
    Target("to_dense (padded)", random_sparse, run_padded(lambda x, i: ts.to_dense(x).numpy()),
           live_part(ref_to_dense, False), assert_equal, TENSOR + ("to_dense",)),
    Target("sparse_relu (padded)", random_sparse, run_padded(lambda x, i: parts(ts.sparse_relu(x))[:2]),
           live_part(lambda i: ref_relu(i)[:2], True), assert_equal, TENSOR + ("relu",), subnormals_flushed=True),
    Target("sparse_max_pool (padded in and out)", make_pool,
           run_padded(lambda x, i: parts(ts.sparse_max_pool(x, i["strides"].tolist(),
                                                            padded_output=True).without_padding())),
           live_part(lambda i: ref_max_pool(i, public=True)[:3], True), assert_equal,
           TENSOR + ("strides", "max_pool"), subnormals_flushed=True),
    Target("sparse_max_pool gradient (padded in and out)", make_pool, run_padded_pool_gradient,
           live_part(ref_pool_gradient, True), assert_equal, TENSOR + ("strides", "max_pool"),
           subnormals_flushed=True),
    Target("direct_conv (padded)", make_conv, lambda i: run_public_conv(with_padding(i), padded_tensor_of),
           live_part(ref_direct_conv, True), compare_conv,
           TENSOR + ("filter", "bias", "k", "rho_up", "temp_limit_bytes", "kernel", "selection", "output"),
           mutable=CONV_MUTABLE, subnormals_flushed=True),
    Target("direct_conv (padded in and out)", make_conv,
           lambda i: run_public_conv(with_padding(i), padded_tensor_of, padded_output=True),
           live_part(ref_direct_conv, True), compare_conv,
           TENSOR + ("filter", "bias", "k", "rho_up", "temp_limit_bytes", "kernel", "selection", "output"),
           mutable=CONV_MUTABLE, subnormals_flushed=True),
    Target("direct_conv (max_entries, padded in and out)", make_capped_conv,
           lambda i: run_public_conv(with_padding(i), padded_tensor_of, padded_output=True),
           live_part(lambda i: ref_capped_conv(i, minimum=1), True), compare_conv,
           TENSOR + CAPPED_NAMES, mutable=CONV_MUTABLE + ["max_entries"], subnormals_flushed=True),
]


TARGETS = [
    # raw ops
    Target("ChannelSparseValidate", random_sparse,
           lambda i: numpy_of(ops.channel_sparse_validate(*constants(i, "keys", "values", "dense_shape"))),
           ref_validate, assert_equal, TENSOR),
    Target("ChannelSparseEncodeKeys", make_indices,
           lambda i: numpy_of(ops.channel_sparse_encode_keys(*constants(i, "indices", "dense_shape"))),
           ref_encode, assert_equal, ("indices", "index", "dense_shape")),
    Target("ChannelSparseDecodeKeys", make_shuffled,
           lambda i: numpy_of(ops.channel_sparse_decode_keys(*constants(i, "keys", "dense_shape"))),
           ref_decode, assert_equal, TENSOR, mutable=["keys", "dense_shape"]),
    Target("ChannelSparseReorder", make_shuffled,
           lambda i: numpy_of(ops.channel_sparse_reorder(*constants(i, "keys", "values", "dense_shape"))),
           ref_reorder, assert_equal, TENSOR + ("reorder", "duplicate"), groups=[("keys", "values")]),
    Target("ChannelSparseToDense", random_sparse,
           lambda i: numpy_of(ops.channel_sparse_to_dense(*constants(i, "keys", "values", "dense_shape"))),
           ref_to_dense, assert_equal, TENSOR + ("to_dense",)),
    Target("ChannelSparseGatherDense", make_gather,
           lambda i: numpy_of(ops.channel_sparse_gather_dense(*constants(i, "keys", "dense"))),
           ref_gather_dense, assert_equal, TENSOR + ("dense", "gather_dense"), mutable=["keys", "dense"]),
    Target("DenseToChannelSparse", make_dense, lambda i: numpy_of(ops.dense_to_channel_sparse(i["dense"])),
           ref_from_dense, assert_equal, ("dense",), subnormals_flushed=True),
    Target("DirectSparseConv", make_conv, run_raw_conv, ref_direct_conv, compare_conv,
           TENSOR + ("filter", "bias", "k", "rho_up", "temp_limit_bytes", "kernel", "selection", "output"),
           mutable=CONV_MUTABLE, subnormals_flushed=True),
    Target("DirectSparseConv (max_entries)", make_capped_conv, run_raw_capped_conv, ref_capped_conv, compare_conv,
           TENSOR + CAPPED_NAMES, mutable=CONV_MUTABLE + ["max_entries"], subnormals_flushed=True),
    Target("DirectSparseConv (max_entries, padded output)", make_capped_conv,
           lambda i: run_raw_capped_conv(i, padded_output=True), ref_capped_conv, compare_conv,
           TENSOR + CAPPED_NAMES, mutable=CONV_MUTABLE + ["max_entries"], subnormals_flushed=True),
    Target("DirectSparseConvBackprop", make_backprop, run_backprop, ref_backprop_with_dataflow, assert_equal,
           TENSOR + ("filter", "output", "kernel"),
           mutable=["keys", "values", "dense_shape", "filter", "mask", "out_keys", "out_grad"],
           groups=[("out_keys", "out_grad")]),
    Target("SparseMaxPool", make_pool,
           lambda i: numpy_of(ops.sparse_max_pool(*constants(i, "keys", "values", "dense_shape"),
                                                  strides=i["strides"].tolist())),
           ref_max_pool, assert_equal, TENSOR + ("strides", "max_pool"), subnormals_flushed=True),
    Target("SparseRelu", random_sparse,
           lambda i: numpy_of(ops.sparse_relu(*constants(i, "keys", "values", "dense_shape"))),
           ref_relu, assert_equal, TENSOR + ("relu",), subnormals_flushed=True),
    # public functions
    Target("ChannelSparseTensor", random_sparse, lambda i: parts(tensor_of(i)), ref_tensor, assert_equal, TENSOR),
    Target("validate", random_sparse, lambda i: parts(ts.validate(tensor_of(i)))[:2], ref_validate, assert_equal,
           TENSOR),
    Target("encode_keys", make_indices, lambda i: ts.encode_keys(i["indices"], i["dense_shape"]).numpy(),
           ref_encode, assert_equal, ("indices", "index", "dense_shape")),
    Target("decode_keys", make_shuffled, lambda i: ts.decode_keys(i["keys"], i["dense_shape"]).numpy(),
           ref_decode, assert_equal, TENSOR, mutable=["keys", "dense_shape"]),
    Target("reorder", make_shuffled, lambda i: parts(ts.reorder(*constants(i, "keys", "values", "dense_shape"))),
           lambda i: ref_reorder(i)[:2] + (i["dense_shape"],), assert_equal, TENSOR + ("reorder", "duplicate"),
           groups=[("keys", "values")]),
    Target("to_dense", random_sparse, lambda i: ts.to_dense(tensor_of(i)).numpy(), ref_to_dense, assert_equal,
           TENSOR + ("to_dense",)),
    Target("from_dense", make_dense, lambda i: parts(ts.from_dense(i["dense"])),
           lambda i: ref_from_dense(i, public=True), assert_equal,
           ("dense",), subnormals_flushed=True),
    Target("gather_dense", make_gather, run_public_gather_dense, ref_public_gather_dense, assert_equal,
           TENSOR + ("dense", "gather_dense")),
    Target("from_sparse_tensor", make_sparse_tensor, run_from_sparse_tensor, ref_from_sparse_tensor, assert_equal,
           ("indices", "index", "dense_shape", "values", "key", "duplicate"), groups=[("indices", "values")]),
    Target("to_sparse_tensor", random_sparse, run_to_sparse_tensor, ref_to_sparse_tensor, assert_equal, TENSOR),
    Target("direct_conv", make_conv, run_public_conv, ref_direct_conv, compare_conv,
           TENSOR + ("filter", "bias", "k", "rho_up", "temp_limit_bytes", "kernel", "selection", "output"),
           mutable=CONV_MUTABLE, subnormals_flushed=True),
    Target("direct_conv gradient", make_conv, run_conv_gradient, ref_conv_gradient, assert_equal,
           TENSOR + ("filter", "bias", "k", "rho_up", "kernel", "selection", "output"),
           mutable=["keys", "values", "dense_shape", "filter", "mask", "bias"], subnormals_flushed=True),
    Target("sparse_relu", random_sparse, lambda i: parts(ts.sparse_relu(tensor_of(i)))[:2],
           lambda i: ref_relu(i)[:2], assert_equal, TENSOR + ("relu",), subnormals_flushed=True),
    Target("sparse_relu gradient", random_sparse, run_relu_gradient, ref_relu_gradient, assert_equal,
           TENSOR + ("relu",), subnormals_flushed=True),
    Target("sparse_max_pool", make_pool,
           lambda i: parts(ts.sparse_max_pool(tensor_of(i), i["strides"].tolist())),
           lambda i: ref_max_pool(i, public=True)[:3], assert_equal, TENSOR + ("strides", "max_pool"),
           subnormals_flushed=True),
    Target("sparse_max_pool gradient", make_pool, run_pool_gradient, ref_pool_gradient, assert_equal,
           TENSOR + ("strides", "max_pool"), subnormals_flushed=True),
]


@pytest.mark.parametrize("target", TARGETS + PADDED_TARGETS, ids=repr)
def test_fuzz(target, device, fuzz_examples, fuzz_seed):
    run_fuzz(target, device, fuzz_examples, fuzz_seed)
