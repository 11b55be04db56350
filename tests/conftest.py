"""Shared fixtures: the device a test runs on (CPU, and the GPU where TensorFlow sees one,
with strict placement), a per-test seeded Generator, random sparse dense-arrays, fill levels,
value dtypes, the float64 gradient check and an exact ChannelSparseTensor comparison; the
fuzz modules' options (--fuzz-examples, --fuzz-report, --fuzz-seed) and their outcome table."""
import json
import sys
import zlib

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts  # noqa: E402
from tests.device import CPU, GPU, assert_on, gpu_visible

NO_GPU = "no GPU visible to TensorFlow"


# Fuzz cases per op and device in a default run (both fuzz modules: about 40 s of one CPU
# core); --fuzz-examples changes it, e.g. higher for a long run, lower under a sanitizer.
FUZZ_EXAMPLES = 100


def pytest_addoption(parser):
    group = parser.getgroup("fuzz", "the fuzz modules (tests/*/test_fuzz.py)")
    group.addoption("--fuzz-examples", type=int, default=FUZZ_EXAMPLES,
                    help=f"fuzz cases per op and device (default {FUZZ_EXAMPLES})")
    group.addoption("--fuzz-report", metavar="PATH", help="write the fuzz outcomes per op as JSON rows to PATH")
    group.addoption("--fuzz-seed", type=int, metavar="S",
                    help="draw other cases than the default run's fixed ones, from seed S (a long bug hunt)")


@pytest.fixture
def fuzz_examples(request):
    return request.config.getoption("--fuzz-examples")


@pytest.fixture
def fuzz_seed(request):
    return request.config.getoption("--fuzz-seed")


def _fuzz():
    """tests.fuzz where a fuzz module ran in this process (None otherwise)."""
    return sys.modules.get("tests.fuzz")


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands its fuzz outcomes to the controller."""
    fuzz = _fuzz()
    if fuzz is not None and hasattr(session.config, "workeroutput"):
        session.config.workeroutput["fuzz_outcomes"] = json.dumps(fuzz.outcome_rows())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    rows = getattr(node, "workeroutput", {}).get("fuzz_outcomes")
    if rows:
        from tests import fuzz
        fuzz.merge_rows(json.loads(rows))


def pytest_terminal_summary(terminalreporter, config):
    fuzz = _fuzz()
    if fuzz is None or not fuzz.OUTCOMES:
        return
    terminalreporter.section("fuzz cases per op and device: outcome classes")
    for line in fuzz.outcome_table():
        terminalreporter.write_line(line)
    path = config.getoption("--fuzz-report")
    if path:
        with open(path, "w") as f:
            for row in fuzz.outcome_rows():
                f.write(json.dumps(row) + "\n")
        terminalreporter.write_line(f"fuzz outcomes written to {path}")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: a test case that runs on the GPU (the gpu case of the device "
                                       "fixture, or a test of the gpu fixture); added at collection")


def pytest_collection_modifyitems(items):
    """Marks the GPU cases, so that `-m gpu` selects them (e.g. under compute-sanitizer)."""
    for item in items:
        params = getattr(item, "callspec", None)
        if "gpu" in item.fixturenames or (params is not None and params.params.get("device") == "gpu"):
            item.add_marker(pytest.mark.gpu)


def _gpu_or_skip(request):
    """"/GPU:0" with strict placement, or a skip where TensorFlow sees no GPU."""
    if not gpu_visible():
        pytest.skip(NO_GPU)
    request.getfixturevalue("strict_placement")
    return GPU


@pytest.fixture(params=["cpu", "gpu"])
def device(request):
    """The device the test builds its inputs and runs its ops on, under tf.device(device):
    "/CPU:0", and "/GPU:0" where TensorFlow sees a GPU (with strict placement)."""
    return CPU if request.param == "cpu" else _gpu_or_skip(request)


@pytest.fixture
def gpu(request):
    """For tests that exist because there is a GPU (GPU against CPU, bit-identical reruns,
    dataflows that agree): "/GPU:0", with strict placement; skipped without a GPU."""
    return _gpu_or_skip(request)


@pytest.fixture
def rng(request):
    """A Generator seeded from the test id: reproducible, and different for every test case."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def random_dense(rng):
    """make(shape, density, dtype, sign, empty_batch) -> a dense array with ~density non-zeros.

    The non-zeros are distinct multiples of 1/8 with magnitude >= 0.25 (exact in float32):
    no ties, and none within a finite-difference step of 0. sign: "mixed", "positive" or
    "negative". empty_batch: a batch index left without any entry.
    """
    def make(shape, density, dtype=np.float64, sign="mixed", empty_batch=None):
        present = rng.random(shape) < density
        if empty_batch is not None:
            present[empty_batch] = False
        n = int(present.sum())
        magnitudes = 0.25 + 0.125 * rng.permutation(n)
        signs = rng.choice([-1.0, 1.0], n) if sign == "mixed" else {"positive": 1.0, "negative": -1.0}[sign]
        dense = np.zeros(shape, dtype)
        dense[present] = signs * magnitudes
        return dense
    return make


@pytest.fixture(params=[dict(density=0.0), dict(density=0.3), dict(density=0.3, empty_batch=0),
                        dict(density=1.0)],
                ids=["empty", "sparse", "sparse-batch0-empty", "full"])
def fill(request):
    """Keyword arguments of random_dense: how many entries, and which batch element is empty."""
    return request.param


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.fixture
def assert_gradient_matches_numerical():
    """check(f, x, device): float64 theoretical Jacobian of f at x equals the numerical one (and
    is not 0), both computed on `device`, where f's result must live (the Jacobians' own
    machinery needs soft_placement on the GPU)."""
    def check(f, x, device=CPU):
        def on_device(v):
            y = f(v)
            assert_on(device, y)
            return y

        with tf.device(device):
            x = tf.constant(x, tf.float64)
            theoretical, numerical = tf.test.compute_gradient(on_device, [x])
        assert np.any(theoretical[0]), "vacuous gradient check: the Jacobian is all zero"
        np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-6)
        return theoretical[0]
    return check


@pytest.fixture
def assert_same_channel_sparse():
    """check(actual, expected): both ChannelSparseTensors with equal keys, values, dense_shape, dtype."""
    def check(actual, expected):
        assert isinstance(actual, ts.ChannelSparseTensor)
        assert actual.dtype == expected.dtype
        for name in ("keys", "values", "dense_shape"):
            np.testing.assert_array_equal(getattr(actual, name).numpy(), getattr(expected, name).numpy())
    return check


@pytest.fixture
def strict_placement(request):
    """For the GPU tests (the device and gpu fixtures apply it): an op without a GPU kernel
    must fail under tf.device('/GPU:0'), not run on the CPU; tests marked soft_placement
    (TensorFlow machinery with CPU-only ops, e.g. restoring a SavedModel or the numerical
    Jacobian) check instead that the results come from the GPU."""
    previous = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(request.node.get_closest_marker("soft_placement") is not None)
    yield
    tf.config.set_soft_device_placement(previous)
