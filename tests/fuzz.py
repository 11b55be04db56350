"""The fuzz harness of tests/channel/test_fuzz.py and tests/site/test_fuzz.py.

A fuzz target is an op (raw or public) with three functions: `make(rng)`, a small valid
input (a dict of numpy arrays); `run(inputs)`, the op on them (numpy results); and
`reference(inputs)`, the expected results of any input, or the verdict that the op must
refuse it (raise Invalid). Each case, drawn by hypothesis, takes a valid input, applies
one mutation (a bit flip, a special value such as NaN, 2^31 or 2^32 + 1, swapped,
duplicated or dropped rows, an extra row, a changed shape), runs the op and asserts
exactly one outcome:

- refused: InvalidArgumentError, ValueError, TypeError or ResourceExhaustedError, raised
  by the op itself (not a TensorFlow op inside it, e.g. GatherV2 or ScatterNd), its
  message naming one of the op's inputs; only where the reference says the input is
  invalid (a mutation that leaves the input valid must not be refused);
- equal: the result equals the reference's for the mutated input.

Every case's outcome is counted per target and device (OUTCOMES); tests/conftest.py
prints the table after the session and writes it as JSON with --fuzz-report. Cases are
deterministic (derandomize): --fuzz-examples sets how many run per target and device, and
--fuzz-seed S draws a different, equally reproducible set of cases from seed S.
"""
import collections
import re

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, note, reject, seed, settings
from hypothesis import strategies as st

# (target, device kind, outcome) -> cases; outcome: "equal", "refused:<ErrorType>" or
# "not run:<why>" (a valid input the case does not run: see NotRun).
OUTCOMES = collections.Counter()

# The largest output (elements) a case may produce; a valid input beyond it is not run.
MAX_ELEMENTS = 1 << 22

REFUSALS = (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError, ValueError, TypeError)
# Messages of TensorFlow's own ops and shape machinery that reach the user when a wrapper
# passes bad input on instead of checking it: not a clear error.
INTERNAL_MESSAGE = re.compile(
    r"GatherV2|ScatterNd|UnsortedSegment|segment_ids|Dimension -|does not index into|Incompatible shapes|"
    r"ConcatOp|Reshape|StridedSlice|Check failed|Shape \(.*\) must have rank|Shapes must be equal rank|"
    r"is not compatible with expected shape|out of bounds", re.IGNORECASE)
OUR_OP = "TfSparseconv>"


class Invalid(Exception):
    """The reference's verdict: the op must refuse this input."""


class MayRefuse(Exception):
    """The input is outside the op's contract but has a defined result: the op may refuse
    it or return `expected`."""

    def __init__(self, reason, expected):
        super().__init__(reason)
        self.expected = expected


class NotRun(Exception):
    """A valid input that the case does not run (its output exceeds MAX_ELEMENTS, or its
    result is not determined, e.g. a k-selection tie within rounding); counted, not run."""


def require(condition, reason):
    if not condition:
        raise Invalid(reason)


def cap(elements, what):
    if elements > MAX_ELEMENTS:
        raise NotRun(f"{what} over the cap")


# --- mutations ------------------------------------------------------------------------------------

SPECIAL_INTS = (-1, 0, 1, 2**31 - 1, 2**31, 2**32 + 1, -2**31, 2**62, 2**63 - 1, -2**63)
SPECIAL_FLOATS = (np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, 1e300, -0.0, 5e-324)


def special(value, dtype):
    """value in dtype, as a C cast would store it: integers wrap (2^32 + 1 -> 1 in int32),
    floats overflow to infinity."""
    dtype = np.dtype(dtype)
    if dtype == bool:
        return bool(value)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype.kind in "iu":
            return np.array(int(value) & 0xFFFFFFFFFFFFFFFF, np.uint64).astype(np.int64).astype(dtype)
        return np.array(value, np.float64).astype(dtype)


def _reshapes(a):
    if a.ndim == 0:
        return ("add_axis",)
    options = ["add_axis", "add_last_axis", "drop_axis"]
    if a.ndim >= 2:
        options += ["flatten", "transpose"]
    return tuple(options)


def mutation_strategy(inputs, mutable, groups):
    """One mutation of inputs[name] (name in mutable), or of rows of all arrays in a group
    (arrays with a row each, e.g. coords and features, swapped or truncated together): the
    kind of mutation first, each kind as likely, then the array and the place."""
    kinds = collections.defaultdict(list)
    for name in mutable:
        a = inputs[name]
        if a.size:
            index = st.integers(0, a.size - 1)
            bits = 1 if a.dtype == bool else 8 * a.itemsize
            kinds["bit_flip"].append(st.tuples(st.just("bit_flip"), st.just(name), index, st.integers(0, bits - 1)))
            values = (True, False) if a.dtype == bool else SPECIAL_INTS if a.dtype.kind in "iu" else SPECIAL_FLOATS
            kinds["set"].append(st.tuples(st.just("set"), st.just(name), index, st.sampled_from(values)))
        if a.ndim >= 1 and len(a) >= 2:
            pair = st.lists(st.integers(0, len(a) - 1), min_size=2, max_size=2, unique=True)
            kinds["swap"].append(st.tuples(st.just("swap"), st.just(name), pair))
            kinds["duplicate"].append(st.tuples(st.just("duplicate"), st.just(name), pair))
        if a.ndim >= 1 and len(a) >= 1:
            kinds["truncate"].append(st.tuples(st.just("truncate"), st.just(name), st.integers(0, len(a) - 1)))
            kinds["extend"].append(st.tuples(st.just("extend"), st.just(name), st.integers(0, len(a) - 1)))
        kinds["reshape"].append(st.tuples(st.just("reshape"), st.just(name), st.sampled_from(_reshapes(a))))
    for group in groups:
        n = len(inputs[group[0]])
        if n >= 2:
            pair = st.lists(st.integers(0, n - 1), min_size=2, max_size=2, unique=True)
            kinds["swap_rows_of"].append(st.tuples(st.just("swap_rows_of"), st.just(group), pair))
            kinds["truncate_rows_of"].append(st.tuples(st.just("truncate_rows_of"), st.just(group),
                                                       st.integers(0, n - 1)))
    return st.one_of([st.just(("none",))] + [st.one_of(options) for options in kinds.values()])


def _reshaped(a, how):
    if how == "add_axis":
        return a[None]
    if how == "add_last_axis":
        return a[..., None]
    if how == "drop_axis":
        return a[0] if len(a) else np.zeros(a.shape[1:], a.dtype)
    if how == "flatten":
        return a.reshape(-1)
    return a.T


def apply_mutation(inputs, mutation):
    """A copy of inputs with the mutation applied."""
    out = dict(inputs)
    kind = mutation[0]
    if kind == "none":
        return out
    if kind in ("swap_rows_of", "truncate_rows_of"):
        for name in mutation[1]:
            a = inputs[name].copy()
            if kind == "swap_rows_of":
                i, j = mutation[2]
                a[[i, j]] = a[[j, i]]
            else:
                a = a[:mutation[2]]
            out[name] = a
        return out
    name = mutation[1]
    a = inputs[name].copy()
    if kind == "bit_flip":
        flat = a.reshape(-1)
        if a.dtype == bool:
            flat[mutation[2]] = not flat[mutation[2]]
        else:
            bits = flat.view(f"u{a.itemsize}")
            bits[mutation[2]] ^= np.array(1 << mutation[3], bits.dtype)
    elif kind == "set":
        a.reshape(-1)[mutation[2]] = special(mutation[3], a.dtype)
    elif kind == "swap":
        i, j = mutation[2]
        a[[i, j]] = a[[j, i]]
    elif kind == "duplicate":
        i, j = mutation[2]
        a[j] = a[i]
    elif kind == "truncate":
        a = a[:mutation[2]]
    elif kind == "extend":
        a = np.concatenate([a, a[mutation[2]:mutation[2] + 1]])
    elif kind == "reshape":
        a = _reshaped(a, mutation[2])
    else:
        raise AssertionError(kind)
    out[name] = np.ascontiguousarray(a)
    return out


# --- outcomes -------------------------------------------------------------------------------------

def device_kind(device):
    return tf.DeviceSpec.from_string(device).device_type.lower()


def message_of(error):
    """The first line of the error's message, without TensorFlow's function-node prefix."""
    text = error.message if isinstance(error, tf.errors.OpError) else str(error)
    first = text.strip().splitlines()[0] if text.strip() else ""
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first)


def raising_op(error):
    """The TensorFlow op that raised an OpError in eager mode ([Op:Name] in its text), or None."""
    found = re.search(r"\[Op:([^\]]+)\]", str(error))
    return found.group(1) if found else None


def assert_clear_refusal(error, target):
    message = message_of(error)
    op = raising_op(error)
    assert op is None or op.startswith(OUR_OP) or op in ("Assert", "AssertGuard"), \
        f"{target.name}: refused by TensorFlow's {op}, not by the op: {message}"
    assert not INTERNAL_MESSAGE.search(message), f"{target.name}: an internal message: {message}"
    lowered = message.lower()
    assert any(re.search(rf"\b{re.escape(word.lower())}\b", lowered) for word in target.names), \
        f"{target.name}: the message names none of {target.names}: {message}"


class Target:
    """An op under fuzzing; see the module docstring. mutable: the input names that
    mutations touch (default all); groups: tuples of inputs with a row each, whose rows
    are also swapped or truncated together; names: words of which a refusal's message
    must hold one (the op's inputs and attributes)."""

    def __init__(self, name, make, run, reference, compare, names, mutable=None, groups=(), subnormals_flushed=False):
        self.name, self.make, self.run, self.reference, self.compare = name, make, run, reference, compare
        self.names, self.mutable, self.groups = tuple(names), mutable, tuple(groups)
        # Whether a subnormal input may change the result through TensorFlow's CPU kernels,
        # which run with subnormal floats flushed to zero (v != 0, v > 0, max, 0 + v): such
        # inputs are not run.
        self.subnormals_flushed = subnormals_flushed

    def __repr__(self):
        return self.name


def has_subnormal(a):
    if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
        return False
    magnitude = np.abs(a[np.isfinite(a)])
    return bool(np.any((magnitude > 0) & (magnitude < np.finfo(a.dtype).tiny)))


def record(target, device, outcome):
    OUTCOMES[(target.name, device_kind(device), outcome)] += 1


def check_case(target, device, inputs, description):
    """Runs one case: refused (clearly, and only if the reference says invalid) or equal."""
    if target.subnormals_flushed and any(has_subnormal(a) for a in inputs.values()):
        record(target, device, "not run:subnormal value")
        reject()
    verdict, expected = "valid", None
    try:
        expected = target.reference(inputs)
    except Invalid as reason:
        verdict, expected = "invalid", str(reason)
    except MayRefuse as reason:
        verdict, expected = "may refuse", reason.expected
    except NotRun as why:
        record(target, device, f"not run:{why}")
        reject()
    try:
        with tf.device(device):
            actual = target.run(inputs)
    except NotRun as why:
        record(target, device, f"not run:{why}")
        reject()
    except REFUSALS as error:
        assert verdict != "valid", \
            f"{target.name} refused a valid input ({description}): {type(error).__name__}: {message_of(error)}"
        assert_clear_refusal(error, target)
        record(target, device, f"refused:{type(error).__name__}")
        return
    assert verdict != "invalid", f"{target.name} accepted an invalid input ({description}: {expected})"
    target.compare(actual, expected, device)
    record(target, device, "equal")


def run_fuzz(target, device, examples, fuzz_seed=None):
    """`examples` cases of target on device, deterministic for a given count and fuzz_seed
    (None: the fixed cases of every default run)."""

    @settings(max_examples=examples, derandomize=fuzz_seed is None, database=None, deadline=None,
              print_blob=False, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def case(data):
        input_seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
        inputs = target.make(np.random.default_rng(input_seed))
        mutable = target.mutable if target.mutable is not None else sorted(
            name for name, value in inputs.items() if isinstance(value, np.ndarray))
        mutation = data.draw(mutation_strategy(inputs, mutable, target.groups), label="mutation")
        description = " ".join(str(m) for m in mutation)
        note(f"{target.name} on {device}: {description}")
        check_case(target, device, apply_mutation(inputs, mutation), description)

    if fuzz_seed is not None:
        case = seed(fuzz_seed)(case)
    case()


# --- comparisons ----------------------------------------------------------------------------------

class Approx:
    """An expected float array from a sum: value (float64), bound (the sum of the terms'
    magnitudes, NaN or infinite where a term is) and the dtype of the op's result."""

    def __init__(self, value, bound, dtype):
        self.value, self.bound, self.dtype = np.asarray(value, np.float64), np.asarray(bound, np.float64), dtype


# Relative to the sum of the terms' magnitudes: float32 sums in any order; the GPU's
# float32 products may run in TF32 (10 mantissa bits), TensorFlow's default.
TOLERANCE = {(np.float64, "cpu"): 1e-12, (np.float64, "gpu"): 1e-12, (np.float32, "cpu"): 1e-5,
             (np.float32, "gpu"): 5e-3}


def assert_approx(actual, expected, device, what):
    actual = np.asarray(actual)
    assert actual.shape == expected.value.shape, f"{what}: shape {actual.shape}, expected {expected.value.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {np.dtype(expected.dtype)}"
    big = np.finfo(expected.dtype).max / 4
    with np.errstate(invalid="ignore", over="ignore"):
        non_finite_terms = ~np.isfinite(expected.bound)
        # A sum with an infinite or NaN term is not finite, in any order.
        assert np.all(~np.isfinite(actual[non_finite_terms])), f"{what}: a finite value where a term is not"
        compared = ~non_finite_terms & (expected.bound <= big)  # beyond: the dtype may overflow
        tol = TOLERANCE[(np.dtype(expected.dtype).type, device_kind(device))]
        error = np.abs(actual[compared].astype(np.float64) - expected.value[compared])
        allowed = tol * expected.bound[compared] + np.finfo(expected.dtype).tiny
        bad = np.nonzero(~(error <= allowed))[0]
    assert not bad.size, (f"{what}: {bad.size} values differ, e.g. {actual[compared][bad[:3]]} against "
                          f"{expected.value[compared][bad[:3]]}")


def assert_equal(actual, expected, device, what="result"):
    """Exact equality of nested results (tuples, lists, dicts, arrays; NaN equals NaN),
    Approx for the sums."""
    if isinstance(expected, Approx):
        assert_approx(actual, expected, device, what)
    elif isinstance(expected, dict):
        assert set(actual) == set(expected), f"{what}: fields {sorted(actual)}, expected {sorted(expected)}"
        for key in expected:
            assert_equal(actual[key], expected[key], device, f"{what}.{key}")
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{what}: {len(actual)} parts, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_equal(a, e, device, f"{what}[{i}]")
    else:
        actual, expected = np.asarray(actual), np.asarray(expected)
        assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
        assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
        np.testing.assert_array_equal(actual, expected, err_msg=what)


def numpy_of(result):
    """Tensors (nested in tuples, lists, dicts) as numpy arrays."""
    if isinstance(result, dict):
        return {k: numpy_of(v) for k, v in result.items()}
    if isinstance(result, (tuple, list)):  # op outputs are namedtuples: plain tuples here
        return tuple(numpy_of(v) for v in result)
    return result.numpy() if hasattr(result, "numpy") else np.asarray(result)


def constants(inputs, *names):
    """tf.constant of each named input (under the caller's device scope)."""
    return [tf.constant(inputs[name]) for name in names]


# --- the outcome table ----------------------------------------------------------------------------

def outcome_rows():
    return [dict(target=t, device=d, outcome=o, cases=n) for (t, d, o), n in sorted(OUTCOMES.items())]


def merge_rows(rows):
    for row in rows:
        OUTCOMES[(row["target"], row["device"], row["outcome"])] += row["cases"]


def outcome_table():
    """Lines of the per-target table: cases, then each outcome class's count."""
    per_target = collections.defaultdict(collections.Counter)
    for (target, device, outcome), n in OUTCOMES.items():
        per_target[(target, device)][outcome] += n
    lines = []
    for (target, device), counts in sorted(per_target.items()):
        classes = ", ".join(f"{outcome} {n}" for outcome, n in sorted(counts.items()))
        lines.append(f"{target:<34} {device:<4} {sum(counts.values()):>6}  {classes}")
    return lines
