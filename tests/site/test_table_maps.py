"""Submanifold maps built as neighbour tables (SiteSubmanifoldNeighbours), their pairs
(SiteTablePairs) and the convolution that reads the table alone (SiteSparseConv's
map_is_table): the same table, pairs, values and gradients as SiteKernelMap's map on each
device; bad sites, bad tables and calls the table cannot serve refused; and, in a traced
inference, no op that counts pairs left for the function to run."""
import importlib

import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv._op_library import ops
from tf_sparseconv.site import kernel_map, neighbour_table, site_conv
from tf_sparseconv.site.tensor import make_site_sparse

from tests.device import CPU, assert_same_error
from tests.site.helpers import random_coords

maps = importlib.import_module("tf_sparseconv.site.kernel_map")

CASES = [
    # (batch, shape, kernel, dilation, density)
    pytest.param(2, (30,), (3,), (1,), 0.4, id="1d"),
    pytest.param(3, (9, 11), (3, 5), (1, 2), 0.3, id="2d-dilated"),
    pytest.param(2, (9, 8, 10), (3, 3, 3), (1, 1, 1), 0.3, id="3d"),
    pytest.param(1, (24, 24, 24), (3, 3, 3), (1, 1, 1), 0.05, id="3d-sparse"),
    pytest.param(2, (5, 6, 5, 4), (3, 1, 3, 1), (1, 1, 1, 1), 0.3, id="4d"),
    pytest.param(2, (6, 7), (1, 1), (1, 1), 0.5, id="one-offset"),
]


def _ops_map(coords, shape, batch, kernel, dilation):
    d = len(shape)
    return ops.site_kernel_map(coords, shape, batch, mode="submanifold", kernel_size=list(kernel), strides=[1] * d,
                               padding=[0] * d, dilation=list(dilation))


@pytest.mark.parametrize("sites_checked", [False, True], ids=["checked-here", "checked-before"])
@pytest.mark.parametrize("batch,shape,kernel,dilation,density", CASES)
def test_table_and_its_pairs_are_the_kernel_maps(rng, batch, shape, kernel, dilation, density, sites_checked, device):
    coords = random_coords(rng, batch, shape, density)
    with tf.device(CPU):
        m = _ops_map(coords, shape, batch, kernel, dilation)
        want = ops.site_neighbour_table(m[2], m[3], m[4], len(coords), len(coords), map_is_trusted=True).numpy()
    with tf.device(device):
        table = ops.site_submanifold_neighbours(coords, shape, batch, kernel_size=list(kernel),
                                                dilation=list(dilation), sites_checked=sites_checked)
        pairs = ops.site_table_pairs(table)
    np.testing.assert_array_equal(table.numpy(), want)
    for got, expected in zip(pairs, m[2:]):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_table_of_no_sites(device):
    with tf.device(device):
        table = ops.site_submanifold_neighbours(np.zeros((0, 4), np.int32), [4, 4, 4], 1, kernel_size=[3, 3, 3],
                                                dilation=[1, 1, 1])
        in_rows, out_rows, splits = ops.site_table_pairs(table)
    assert table.shape == (0, 29) and in_rows.shape == (0,) and out_rows.shape == (0,)
    np.testing.assert_array_equal(splits.numpy(), np.zeros(28))


@pytest.mark.parametrize("coords,phrase", [
    ([[0, 1, 1], [0, 2, 2], [0, 1, 1]], "sites 0 and 2 have the same coordinates"),
    ([[0, 1, 1], [0, 4, 2]], "coordinate 4 in spatial dimension 0, outside"),
    ([[2, 1, 1]], "batch index 2, outside"),
])
def test_bad_sites_get_the_kernel_maps_error(coords, phrase):
    assert_same_error(lambda: ops.site_submanifold_neighbours(np.array(coords, np.int32), [4, 4], 2,
                                                              kernel_size=[3, 3], dilation=[1, 1]), phrase)


def test_bad_geometry_and_bad_tables_are_refused(rng):
    coords = random_coords(rng, 1, (6, 6), 0.5)
    table = ops.site_submanifold_neighbours(coords, [6, 6], 1, kernel_size=[3, 3], dilation=[1, 1]).numpy()
    for kernel, phrase in (([5, 7], "at most 32 offsets"), ([2, 3], "needs an odd kernel")):
        assert_same_error(lambda: ops.site_submanifold_neighbours(coords, [6, 6], 1, kernel_size=kernel,
                                                                  dilation=[1, 1]), phrase)
    for row, column, value in ((0, 0, len(coords)), (3, 8, -2)):
        bad = table.copy()
        bad[row, column] = value
        assert_same_error(lambda: ops.site_table_pairs(bad),
                          rf"neighbours\[{row}, {column}\] = {value} is outside \[-1, {len(coords)}\)")
    assert_same_error(lambda: ops.site_table_pairs(table[:, 1:]), "with an odd volume of at most 32")


def _table_conv(features, filters, table, **attrs):
    empty = tf.zeros([0], tf.int32)
    return ops.site_sparse_conv(features, filters, empty, empty, tf.zeros([filters.shape[0] + 1], tf.int32),
                                table.shape[0], table, map_is_trusted=True, map_is_submanifold=True,
                                map_is_table=True, **attrs)


def _pairs_conv(features, filters, m, num_out):
    # The pairs dataflow without a table: on the GPU the pair tiles, another kernel than the table's.
    return ops.site_sparse_conv(features, filters, m[2], m[3], m[4], num_out, tf.zeros([0], tf.int32),
                                map_is_trusted=True, map_is_submanifold=True, dataflow="pairs")


@pytest.mark.parametrize("dtype,cin,cout", [(tf.float64, 8, 16), (tf.float16, 8, 16), (tf.float16, 128, 64)],
                         ids=["float64", "half", "half-128-channels"])
def test_table_conv_gives_the_pairs_values_and_gradients(rng, dtype, cin, cout, device):
    if device != CPU and dtype == tf.float64:
        pytest.skip("the GPU reads a table alone in its half-precision tiles (refusals: the test below)")
    shape, batch = (8, 7, 9), 2
    coords = random_coords(rng, batch, shape, 0.3)
    with tf.device(device):
        m = _ops_map(coords, shape, batch, (3, 3, 3), (1, 1, 1))
        table = ops.site_submanifold_neighbours(coords, shape, batch, kernel_size=[3, 3, 3], dilation=[1, 1, 1])
        x = tf.constant(rng.standard_normal((len(coords), cin)), dtype)
        w = tf.constant(rng.standard_normal((27, cin, cout)) / 8, dtype)
        dy = tf.constant(rng.standard_normal((len(coords), cout)), dtype)
        results = []
        for conv in (lambda x, w: _table_conv(x, w, table), lambda x, w: _pairs_conv(x, w, m, len(coords))):
            with tf.GradientTape() as tape:
                tape.watch([x, w])
                y = conv(x, w)
            results.append([y, *tape.gradient(y, [x, w], output_gradients=dy)])
    tol = dict(rtol=2e-2, atol=2e-2 * np.sqrt(cin / 8)) if dtype == tf.float16 else dict(rtol=1e-12, atol=1e-12)
    for got, want in zip(*results):
        np.testing.assert_allclose(got.numpy().astype(np.float64), want.numpy().astype(np.float64), **tol)


def test_table_conv_gradient_against_finite_differences(rng):
    shape, batch = (5, 6, 5), 1
    coords = random_coords(rng, batch, shape, 0.4)
    with tf.device(CPU):  # float64: the GPU reads a table alone in its half-precision tiles only
        table = ops.site_submanifold_neighbours(coords, shape, batch, kernel_size=[3, 3, 3], dilation=[1, 1, 1])
        x = tf.constant(rng.standard_normal((len(coords), 2)), tf.float64)
        w = tf.constant(rng.standard_normal((27, 2, 3)), tf.float64)
        theoretical, numerical = tf.test.compute_gradient(lambda x, w: _table_conv(x, w, table), [x, w])
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, rtol=1e-6, atol=1e-6)


def test_table_conv_refuses_inputs_that_are_not_a_table_map(rng):
    coords = random_coords(rng, 1, (6, 6), 0.5)
    n = len(coords)  # shape and attribute checks: the same on each device
    m = _ops_map(coords, (6, 6), 1, (3, 3), (1, 1))
    table = ops.site_submanifold_neighbours(coords, [6, 6], 1, kernel_size=[3, 3], dilation=[1, 1])
    x, w = tf.ones([n, 8]), tf.ones([9, 8, 8])
    phrase = "map_is_table reads the map from neighbours alone"
    with pytest.raises(tf.errors.InvalidArgumentError, match=phrase):
        ops.site_sparse_conv(x, w, m[2], m[3], m[4], n, table, map_is_trusted=True, map_is_submanifold=True,
                             map_is_table=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=phrase):  # not claimed submanifold
        ops.site_sparse_conv(x, w, tf.zeros([0], tf.int32), tf.zeros([0], tf.int32), tf.zeros([10], tf.int32), n,
                             table, map_is_trusted=True, map_is_table=True)
    bad = table.numpy()
    bad[0, 0] = n
    with tf.device(CPU), pytest.raises(tf.errors.InvalidArgumentError, match=r"is outside \[-1, "):
        _table_conv(x, w, tf.constant(bad))  # the CPU checks the table's rows (the GPU trusts them)


def test_gpu_refuses_a_table_conv_its_tiles_cannot_run(rng, gpu):
    coords = random_coords(rng, 1, (6, 6), 0.5)
    n = len(coords)
    with tf.device(gpu):
        table = ops.site_submanifold_neighbours(coords, [6, 6], 1, kernel_size=[3, 3], dilation=[1, 1])
        for x, w, attrs, phrase in (
                (tf.ones([n, 8]), tf.ones([9, 8, 8]), {}, "this dataflow reads the pairs"),
                (tf.ones([n, 8], tf.float16), tf.ones([9, 8, 8], tf.float16), dict(dataflow="pairs"),
                 "this dataflow reads the pairs"),
                (tf.ones([n, 6], tf.float16), tf.ones([9, 6, 8], tf.float16), {}, "multiples of 8")):
            with pytest.raises(tf.errors.InvalidArgumentError, match=phrase):
                _table_conv(x, w, table, **attrs)


def _features(rng, coords, channels, dtype):
    return rng.standard_normal((len(coords), channels)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_layers_read_table_maps_where_a_gpu_would(monkeypatch, rng, dtype):
    # On the CPU with a GPU pretended: the layers take the table path (the CPU op derives the
    # table's pairs) and must give what the pairs give.
    shape = (10, 9, 8)
    coords = random_coords(rng, 2, shape, 0.3)
    features = _features(rng, coords, 8, dtype)
    w1 = rng.standard_normal((3, 3, 3, 8, 16)).astype(dtype) / 8
    w2 = rng.standard_normal((3, 3, 3, 16, 8)).astype(dtype) / 8

    def run(dataflow):
        # On the CPU where a GPU is visible as well: there float32 products are exact, not
        # TF32's, so both dataflows agree to float32 rounding.
        with tf.device(CPU):
            x = make_site_sparse(coords, features, shape, 2)
            with tf.GradientTape() as tape:
                tape.watch(x.features)
                h = site_conv(x, w1, subm=True, indice_key="s", dataflow=dataflow)
                y = site_conv(h, w2, subm=True, indice_key="s", dataflow=dataflow)
                loss = tf.reduce_sum(tf.cast(y.features, tf.float32) ** 2)
            return y, tape.gradient(loss, x.features)

    monkeypatch.setattr(maps, "gpu_visible", lambda: True)
    monkeypatch.setattr(maps, "gpu_tensor_tiles", lambda: True)
    table_y, table_grad = run("auto")
    pairs_y, pairs_grad = run("pairs")
    kmap = table_y.kernel_maps["s"]
    read = dtype == np.float16
    assert (kmap.neighbours is not None) == read, "fp16 'auto' builds a table map; float32 'auto' does not"
    if read:
        want = kernel_map(make_site_sparse(coords, features, shape, 2), 3, mode="submanifold")
        for field in ("in_rows", "out_rows", "offset_splits"):
            np.testing.assert_array_equal(getattr(kmap, field).numpy(), getattr(want, field).numpy())
        np.testing.assert_array_equal(kmap.neighbours.numpy(), neighbour_table(want).numpy())
    tol = 2e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(table_y.features.numpy().astype(np.float64),
                               pairs_y.features.numpy().astype(np.float64), rtol=tol, atol=tol)
    np.testing.assert_allclose(table_grad.numpy().astype(np.float64), pairs_grad.numpy().astype(np.float64),
                               rtol=tol, atol=tol)


def _ops_needed(fn, *args):
    """The op types a traced fn's outputs depend on (what its function runtime would run)."""
    graph = fn.get_concrete_function(*args).graph
    outputs = [t.op.name for t in graph.outputs]
    needed = tf.compat.v1.graph_util.extract_sub_graph(graph.as_graph_def(), outputs)
    return {node.op for node in needed.node}


def test_traced_inference_needs_no_pair_counts(monkeypatch, rng):
    monkeypatch.setattr(maps, "gpu_visible", lambda: True)
    monkeypatch.setattr(maps, "gpu_tensor_tiles", lambda: True)
    shape = (8, 8, 8)
    coords = random_coords(rng, 1, shape, 0.3)
    w1 = tf.constant(rng.standard_normal((3, 3, 3, 8, 8)), tf.float16)
    w2 = tf.constant(rng.standard_normal((3, 3, 3, 8, 8)), tf.float16)

    def forward(coords, features):
        x = make_site_sparse(coords, features, shape, 1)
        h = site_conv(x, w1, subm=True, indice_key="s")
        return site_conv(h, w2, subm=True, indice_key="s").features

    infer = tf.function(forward)

    @tf.function
    def gradient(coords, features):
        with tf.GradientTape() as tape:
            tape.watch([features, w1])
            loss = tf.reduce_sum(forward(coords, features))
        return tape.gradient(loss, [features, w1])

    spec = (tf.TensorSpec([None, 4], tf.int32), tf.TensorSpec([None, 8], tf.float16))
    needed = _ops_needed(infer, *spec)
    assert "TfSparseconv>SiteSubmanifoldNeighbours" in needed
    assert not needed & {"TfSparseconv>SiteTablePairs", "TfSparseconv>SiteKernelMap"}, needed
    x = _features(rng, coords, 8, np.float16)
    monkeypatch.setenv("TF_SPARSECONV_TABLE_MAPS", "0")  # the maps as SiteKernelMap's pairs
    pair_maps = tf.function(forward)
    assert "TfSparseconv>SiteKernelMap" in _ops_needed(pair_maps, *spec)
    np.testing.assert_allclose(infer(coords, x).numpy().astype(np.float32),
                               pair_maps(coords, x).numpy().astype(np.float32), rtol=2e-2, atol=2e-2)
    monkeypatch.delenv("TF_SPARSECONV_TABLE_MAPS")
    # The gradient needs the pairs (the filter gradient's), so a training step builds them.
    assert "TfSparseconv>SiteTablePairs" in _ops_needed(gradient, *spec)
    dx, dw = gradient(coords, x)
    assert dx.shape == x.shape and dw.shape == w1.shape


def test_only_table_maps_spare_their_pairs(monkeypatch, rng):
    # A map SiteKernelMap built keeps its pairs as the convolution's input even with a table
    # (its gradient needs no SiteTablePairs); a table map's convolution reads the table alone.
    monkeypatch.setattr(maps, "gpu_visible", lambda: True)
    monkeypatch.setattr(maps, "gpu_tensor_tiles", lambda: True)
    shape = (8, 8, 8)
    w = tf.constant(rng.standard_normal((3, 3, 3, 8, 8)), tf.float16)

    def convs(fn):
        graph = tf.function(fn).get_concrete_function(tf.TensorSpec([None, 4], tf.int32),
                                                      tf.TensorSpec([None, 8], tf.float16)).graph
        return [op.get_attr("map_is_table") for op in graph.get_operations()
                if op.type == "TfSparseconv>SiteSparseConv"]

    def float_first(coords, features):  # the map is built by a float32 layer: SiteKernelMap's
        x = make_site_sparse(coords, tf.cast(features, tf.float32), shape, 1)
        h = site_conv(x, tf.cast(w, tf.float32), subm=True, indice_key="s")
        return site_conv(h.with_features(tf.cast(h.features, tf.float16)), w, subm=True, indice_key="s").features

    def half_first(coords, features):
        x = make_site_sparse(coords, features, shape, 1)
        return site_conv(site_conv(x, w, subm=True, indice_key="s"), w, subm=True, indice_key="s").features

    assert convs(float_first) == [False, False]
    assert convs(half_first) == [True, True]
