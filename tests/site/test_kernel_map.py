"""Kernel maps (SiteKernelMap) and neighbour tables (SiteNeighbourTable): pairs against a
brute-force search and tables against NumPy on each device; bad sites and geometry
rejected; both GPU builders ('hash' and 'sort') identical to the CPU's map (all modes, 1-D
to 4-D, shuffled and empty inputs) and the GPU's tables to the CPU's, with the CPU's
error messages for every bad input."""
import itertools

import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv._op_library import ops
from tf_sparseconv.site import kernel_map, neighbour_table
from tf_sparseconv.site.tensor import make_site_sparse

from tests.device import CPU, GPU, assert_same_error
from tests.site.helpers import hand_built, random_coords, random_sites


def test_submanifold_kernel_map_pairs_match_a_brute_force_search(rng, device):
    coords, _ = random_sites(rng, 2, (5, 6), 0.4, 1)
    with tf.device(device):
        x = make_site_sparse(coords, np.zeros((len(coords), 1), np.float32), (5, 6), 2)
        m = kernel_map(x, 3, mode="submanifold")
    splits = m.offset_splits.numpy()
    where = {tuple(c): i for i, c in enumerate(coords)}
    for q, (dx, dy) in enumerate(itertools.product(range(3), range(3))):
        expected = sorted((where[(b, u + dx - 1, v + dy - 1)], o) for o, (b, u, v) in enumerate(coords)
                          if (b, u + dx - 1, v + dy - 1) in where)
        got = sorted(zip(m.in_rows.numpy()[splits[q]:splits[q + 1]], m.out_rows.numpy()[splits[q]:splits[q + 1]]))
        assert got == expected


@pytest.mark.parametrize("coords,match", [
    ([[0, 1, 1], [0, 2, 2], [0, 1, 1]], "sites 0 and 2 have the same coordinates"),
    ([[0, 1, 1], [0, 4, 2]], "coordinate 4 in spatial dimension 0, outside"),
    ([[-1, 1, 1]], "batch index -1, outside"),
    ([[2, 1, 1]], "batch index 2, outside"),
])
def test_bad_sites_are_rejected(coords, match):
    x = make_site_sparse(np.array(coords, np.int32), np.ones((len(coords), 1), np.float32), (4, 4), 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        kernel_map(x, 3, mode="submanifold")


# --- both GPU builders == CPU ---------------------------------------------------------------------

BUILDERS = ["hash", "sort"]


def raw_map(device, coords, shape, batch, mode, kernel, strides, padding, dilation, builder="hash"):
    with tf.device(device):
        outputs = ops.site_kernel_map(tf.constant(coords, tf.int32), tf.constant(shape, tf.int32),
                                      tf.constant(batch, tf.int32), mode=mode, kernel_size=list(kernel),
                                      strides=list(strides), padding=list(padding), dilation=list(dilation),
                                      builder=builder)
    return outputs


def assert_same_map(gpu, cpu):
    names = ("out_coords", "out_spatial_shape", "in_rows", "out_rows", "offset_splits")
    for name, g, c in zip(names, gpu, cpu):
        assert g.dtype == c.dtype, name
        np.testing.assert_array_equal(g.numpy(), c.numpy(), err_msg=name)


MAP_CASES = [
    # (batch, shape, kernel, strides, padding, dilation, density)
    pytest.param(2, (40,), (3,), (1,), (0,), (1,), 0.4, id="1d"),
    pytest.param(2, (40,), (5,), (2,), (1,), (2,), 0.4, id="1d-dilated"),
    pytest.param(3, (13, 11), (3, 3), (2, 2), (1, 1), (1, 1), 0.3, id="2d"),
    pytest.param(1, (12, 9), (3, 5), (1, 2), (0, 1), (2, 1), 0.35, id="2d-anisotropic"),
    pytest.param(2, (24, 24, 24), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), 0.15, id="3d-multi-tile"),
    pytest.param(2, (9, 8, 7), (2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1), 0.3, id="3d-k2s2"),
    pytest.param(1, (6, 5, 7), (3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1), 1.0, id="3d-full"),
    pytest.param(2, (6, 5, 6, 5), (3, 3, 3, 3), (2, 1, 2, 1), (1, 0, 1, 0), (1, 1, 1, 1), 0.2, id="4d"),
]


def geometry_for(mode, kernel, strides, padding, dilation):
    """Submanifold maps need odd kernels, stride 1 and padding 0."""
    if mode != "submanifold":
        return kernel, strides, padding, dilation
    d = len(kernel)
    return tuple(k | 1 for k in kernel), (1,) * d, (0,) * d, dilation


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("mode", ["submanifold", "strided", "transposed"])
@pytest.mark.parametrize("batch,shape,kernel,strides,padding,dilation,density", MAP_CASES)
def test_kernel_map_matches_cpu_exactly(rng, builder, mode, batch, shape, kernel, strides, padding, dilation,
                                        density, gpu):
    coords = random_coords(rng, batch, shape, density)
    geometry = geometry_for(mode, kernel, strides, padding, dilation)
    cpu = raw_map(CPU, coords, shape, batch, mode, *geometry)
    gpu = raw_map(GPU, coords, shape, batch, mode, *geometry, builder=builder)
    for t in (gpu[0], gpu[2], gpu[3]):
        assert "GPU" in t.device, f"expected a GPU result, got one on {t.device}"
    assert_same_map(gpu, cpu)
    assert int(cpu[4].numpy()[-1]) > 0 or len(coords) == 0


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("mode", ["submanifold", "strided", "transposed"])
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_kernel_map_of_no_sites_is_empty_on_gpu(builder, mode, d, gpu):
    geometry = geometry_for(mode, (3,) * d, (2,) * d, (1,) * d, (1,) * d)
    coords = np.zeros((0, d + 1), np.int32)
    cpu = raw_map(CPU, coords, (5,) * d, 2, mode, *geometry)
    gpu = raw_map(GPU, coords, (5,) * d, 2, mode, *geometry, builder=builder)
    assert_same_map(gpu, cpu)
    assert gpu[0].shape == (0, d + 1) and gpu[2].shape == (0,)
    np.testing.assert_array_equal(gpu[4].numpy(), np.zeros(3 ** d + 1))


@pytest.mark.parametrize("builder", BUILDERS)
def test_kernel_map_of_one_site_and_of_the_largest_batch_index(builder, gpu):
    coords = np.array([[4, 0, 6]], np.int32)
    for mode in ("submanifold", "strided", "transposed"):
        geometry = geometry_for(mode, (3, 3), (2, 2), (1, 1), (1, 1))
        assert_same_map(raw_map(GPU, coords, (3, 7), 5, mode, *geometry, builder=builder),
                        raw_map(CPU, coords, (3, 7), 5, mode, *geometry))


def test_sort_builder_searches_long_key_ranges_in_global_memory(rng, gpu):
    """A sparse row above a dense one: a chunk of 256 sorted sites of the sparse row spans
    2048 columns, so its queries shifted into the dense row range over more keys than a
    block stages in shared memory, and the search runs in global memory instead."""
    width = 6000
    sparse = np.stack([np.zeros(width // 8), np.zeros(width // 8), np.arange(0, width, 8)], 1)
    dense = np.stack([np.zeros(width), np.ones(width), np.arange(width)], 1)
    coords = np.concatenate([sparse, dense]).astype(np.int32)
    coords = coords[rng.permutation(len(coords))]
    geometry = ((3, 3), (1, 1), (0, 0), (1, 1))
    cpu = raw_map(CPU, coords, (3, width), 1, "submanifold", *geometry)
    for builder in BUILDERS:
        assert_same_map(raw_map(GPU, coords, (3, width), 1, "submanifold", *geometry, builder=builder), cpu)


def test_kernel_map_of_a_lidar_like_surface_matches_cpu(rng, gpu):
    """Many sites (tens of thousands) on a few planes: long runs of neighbours."""
    grid = np.zeros((1, 160, 160, 24), bool)
    grid[0, :, :, 2] = rng.random((160, 160)) < 0.9                      # ground
    grid[0, 40, :, :] = rng.random((160, 24)) < 0.7                       # a wall
    coords = np.argwhere(grid).astype(np.int32)
    coords = coords[rng.permutation(len(coords))]
    for mode, geometry in [("submanifold", ((3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1))),
                           ("strided", ((3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1))),
                           ("transposed", ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)))]:
        cpu = raw_map(CPU, coords, (160, 160, 24), 1, mode, *geometry)
        for builder in BUILDERS:
            assert_same_map(raw_map(GPU, coords, (160, 160, 24), 1, mode, *geometry, builder=builder), cpu)


def test_kernel_map_python_wrapper_passes_the_builder_through(rng, gpu):
    coords = random_coords(rng, 2, (8, 8, 8), 0.2)
    with tf.device(GPU):
        x = make_site_sparse(coords, np.ones((len(coords), 1), np.float32), (8, 8, 8), 2)
        maps = [kernel_map(x, 3, strides=2, padding=1, builder=b) for b in BUILDERS]
    for name in ("in_rows", "out_rows", "offset_splits", "out_coords"):
        np.testing.assert_array_equal(getattr(maps[0], name).numpy(), getattr(maps[1], name).numpy())
    # The builders' maps are identical by design: the traced op's attribute shows the builder reached it.
    for builder in BUILDERS:
        graph = tf.function(lambda t: kernel_map(t, 3, strides=2, padding=1, builder=builder).in_rows
                            ).get_concrete_function(x).graph
        attrs = [op.get_attr("builder") for op in graph.get_operations() if op.type.endswith("SiteKernelMap")]
        assert attrs == [builder.encode()], builder


# --- errors on the GPU: the CPU's messages ----------------------------------------------------------

BAD_SITES = [
    pytest.param([[0, 1, 1], [0, 2, 2], [0, 1, 1]], "sites 0 and 2 have the same coordinates", id="duplicate"),
    pytest.param([[0, 1, 1], [0, 3, 3], [0, 2, 2], [0, 3, 3], [0, 1, 1]], "sites 1 and 3 have the same",
                 id="duplicates-lowest-later-row"),
    pytest.param([[0, 1, 1], [0, 2, 1], [0, 1, 1], [0, 2, 1], [0, 1, 1]], "sites 0 and 2 have the same",
                 id="triplicate"),
    pytest.param([[0, 1, 1], [0, 4, 2]], "coordinate 4 in spatial dimension 0, outside", id="coordinate"),
    pytest.param([[0, 1, 1], [0, 1, -2], [0, 9, 1]], "coordinate -2 in spatial dimension 1, outside",
                 id="first-of-two-coordinates"),
    pytest.param([[-1, 1, 1]], "batch index -1, outside", id="negative-batch"),
    pytest.param([[0, 1, 1], [2, 1, 1]], "batch index 2, outside", id="batch"),
    pytest.param([[0, 1, 1], [0, 1, 1], [0, 7, 1]], "coordinate 7 in spatial dimension 0",
                 id="range-before-duplicates"),
]


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("mode", ["submanifold", "strided", "transposed"])
@pytest.mark.parametrize("coords,phrase", BAD_SITES)
def test_bad_sites_give_the_cpu_error_on_gpu(coords, phrase, mode, builder, gpu):
    geometry = geometry_for(mode, (3, 3), (2, 2), (1, 1), (1, 1))
    coords = np.array(coords, np.int32)
    assert_same_error(lambda: ops.site_kernel_map(
        tf.constant(coords), tf.constant([4, 4]), tf.constant(2), mode=mode, kernel_size=list(geometry[0]),
        strides=list(geometry[1]), padding=list(geometry[2]), dilation=list(geometry[3]), builder=builder), phrase)


def test_bad_geometry_gives_the_cpu_error_on_gpu(rng, gpu):
    coords = random_coords(rng, 1, (4, 4), 0.5)

    def map_of(k, mode):
        x = make_site_sparse(coords, np.ones((len(coords), 2), np.float32), (4, 4), 1)
        return kernel_map(x, k, mode=mode)
    assert_same_error(lambda: map_of(2, "submanifold"), "needs an odd kernel")
    assert_same_error(lambda: map_of(7, "strided"), "output spatial extent")


# --- neighbour tables (SiteNeighbourTable) --------------------------------------------------------

def numpy_neighbour_table(in_rows, out_rows, splits, num_out):
    volume = len(splits) - 1
    table = np.full((num_out, volume + 2), -1, np.int64)
    masks = np.zeros(num_out, np.int64)
    for q in range(volume):
        for p in range(splits[q], splits[q + 1]):
            table[out_rows[p], q] = in_rows[p]
            masks[out_rows[p]] |= 1 << q
    order = np.argsort(masks, kind="stable")
    table[:, volume] = masks[order].astype(np.uint32).view(np.int32)
    table[:, volume + 1] = order
    return table


@pytest.mark.parametrize("mode,kernel,strides", [("submanifold", 3, 1), ("strided", 2, 2), ("strided", 3, 2)])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_neighbour_table_matches_numpy(rng, mode, kernel, strides, inverse, device):
    coords, features = random_sites(rng, 2, (7, 6, 7), 0.3, 1)
    with tf.device(device):
        x = make_site_sparse(coords, features, (7, 6, 7), 2)
        kmap = kernel_map(x, kernel, strides, mode=mode)
        table = neighbour_table(kmap, inverse=inverse).numpy()
    in_rows, out_rows = kmap.in_rows.numpy(), kmap.out_rows.numpy()
    num_in, num_out = len(coords), int(kmap.out_coords.shape[0])
    if inverse:
        in_rows, out_rows, num_out = out_rows, in_rows, num_in
    expected = numpy_neighbour_table(in_rows, out_rows, kmap.offset_splits.numpy(), num_out)
    np.testing.assert_array_equal(table, expected)
    # Every output row appears once among the sorted rows, its mask beside it, and the
    # masks hold every pair's offset bit.
    volume = kernel ** 3
    assert sorted(table[:, volume + 1]) == list(range(num_out))
    masks = table[:, volume].view(np.uint32)
    assert np.all(np.diff(masks) >= 0)
    expected_masks = np.zeros(num_out, np.uint32)
    for q in range(volume):
        expected_masks[table[:, q] >= 0] |= np.uint32(1 << q)
    np.testing.assert_array_equal(masks, expected_masks[table[:, volume + 1]])


def test_neighbour_table_of_one_offset(device):
    with tf.device(device):
        table = ops.site_neighbour_table(in_rows=[1, 0], out_rows=[0, 2], offset_splits=[0, 2], num_in=2, num_out=3)
    # input row per output row; then the rows sorted by mask (row 1 has none) beside their masks
    np.testing.assert_array_equal(table.numpy(), [[1, 0, 1], [-1, 1, 0], [0, 1, 2]])


def test_kernel_map_and_neighbour_table_refuse_options_they_do_not_have(rng):
    """An unknown mode or builder names kernel_map (was TensorFlow's attr message); a flag
    that is not a bool, e.g. the string 'no', is refused, not taken by its truth value; a
    neighbour table of something other than a map is a TypeError."""
    coords, features = random_sites(rng, 1, (4, 4), 0.5, 2)
    x = make_site_sparse(coords, features, (4, 4), 1)
    with pytest.raises(ValueError, match=r"kernel_map: mode must be one of \('submanifold', 'strided', 'transposed'\), "
                                         r"got 'bogus'"):
        kernel_map(x, 3, mode="bogus")
    with pytest.raises(ValueError, match=r"kernel_map: builder must be one of \('hash', 'sort'\), got None"):
        kernel_map(x, 3, mode="submanifold", builder=None)
    kmap = kernel_map(x, 3, mode="submanifold", builder="sort")
    for flag in ("no", 1, None):
        with pytest.raises(ValueError, match=f"neighbour_table: inverse must be True or False, got {flag!r}"):
            neighbour_table(kmap, inverse=flag)
    assert neighbour_table(kmap, inverse=np.bool_(False)).shape[0] == len(coords)
    with pytest.raises(TypeError, match="neighbour_table takes a KernelMap .*, got str"):
        neighbour_table("abc")


def test_neighbour_table_rejects_bad_maps():
    ok = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_in=4, num_out=2)
    assert ops.site_neighbour_table(**ok).shape == (2, 2 + 2 * 1)
    cases = [
        (dict(in_rows=[0, 1, 4]), "in_rows\\[2\\] = 4 is outside \\[0, 4\\)"),
        (dict(out_rows=[1, 1, 0]), "output row 1 appears twice for kernel offset 0"),
        (dict(offset_splits=[0, 3, 2]), "offset_splits must rise"),
        (dict(offset_splits=[0, 1, 2] + [3] * 31), "1 to 32 offsets"),
        (dict(num_in=-1), "non-negative"),
    ]
    for kwargs, match in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            ops.site_neighbour_table(**dict(ok, **kwargs))


def test_neighbour_table_refuses_a_map_whose_splits_are_not_its_kernels(rng, device):
    # The op takes the volume from the splits: a hand-built map with another count of them
    # used to give a table of another width than its kernel's.
    coords = random_coords(rng, 1, (5, 5), 0.4)
    with tf.device(device):
        x = make_site_sparse(coords, np.ones((len(coords), 1), np.float32), (5, 5), 1)
        m = kernel_map(x, 3, mode="submanifold")
        splits = m.offset_splits.numpy()
        bad = hand_built(m, offset_splits=tf.constant(np.concatenate([splits, splits[-1:]])))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"neighbour_table: the map's offset_splits must "
                                                                 r"have one entry per offset of its kernel \(3, 3\)"):
            neighbour_table(bad)
        assert neighbour_table(hand_built(m)).shape == (len(coords), 9 + 2)


def test_which_dataflows_build_neighbour_tables(monkeypatch, rng):
    import importlib
    maps = importlib.import_module("tf_sparseconv.site.kernel_map")
    coords, features = random_sites(rng, 1, (6, 6, 6), 0.4, 2)
    x = make_site_sparse(coords, features, (6, 6, 6), 1)
    small, large = kernel_map(x, 3, mode="submanifold"), kernel_map(x, 5, mode="submanifold")
    half = (tf.float16, tf.bfloat16)
    monkeypatch.setattr(maps, "gpu_visible", lambda: True)
    for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
        assert maps.wants_tables(dtype, small, "auto") == (dtype in half), dtype
        assert maps.wants_tables(dtype, small, "outputs"), dtype
        assert not maps.wants_tables(dtype, small, "pairs"), dtype
        assert not maps.wants_tables(dtype, large, "outputs"), "125 offsets: no table"
        assert not maps.wants_tables(dtype, hand_built(small), "outputs"), "a table is read with a trusted map only"
    monkeypatch.setattr(maps, "gpu_visible", lambda: False)
    assert not maps.wants_tables(tf.float16, small, "auto") and not maps.wants_tables(tf.float32, small, "outputs")


TABLE_CASES = [
    # (batch, shape, kernel, strides, padding, mode)
    pytest.param(2, (9, 8, 9), (3, 3, 3), (1, 1, 1), (0, 0, 0), "submanifold", id="3d-subm"),
    pytest.param(2, (10, 9, 10), (2, 2, 2), (2, 2, 2), (0, 0, 0), "strided", id="3d-k2s2"),
    pytest.param(3, (11, 12), (3, 3), (2, 2), (1, 1), "strided", id="2d-strided"),
    pytest.param(1, (40, 40, 40), (3, 3, 3), (1, 1, 1), (0, 0, 0), "submanifold", id="3d-subm-many-sites"),
]


@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
@pytest.mark.parametrize("batch,shape,kernel,strides,padding,mode", TABLE_CASES)
def test_neighbour_table_matches_cpu_exactly(rng, batch, shape, kernel, strides, padding, mode, inverse, gpu):
    coords = random_coords(rng, batch, shape, 0.05 if max(shape) > 20 else 0.3)
    with tf.device(CPU):
        x = make_site_sparse(coords, np.ones((len(coords), 1), np.float32), shape, batch)
        kmap = kernel_map(x, kernel, strides, padding, mode=mode)
    tables = {}
    for device in (CPU, GPU):
        with tf.device(device):
            tables[device] = neighbour_table(kmap, inverse=inverse).numpy()
    np.testing.assert_array_equal(tables[GPU], tables[CPU])
    assert tables[CPU].shape[1] == np.prod(kernel) + 2


def test_neighbour_table_ops_give_the_cpu_errors_on_gpu(rng, gpu):
    ok = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_in=4, num_out=2)

    def table(**kwargs):
        return ops.site_neighbour_table(**dict(ok, **kwargs))
    assert_same_error(lambda: table(in_rows=[0, 1, 4]), "in_rows\\[2\\] = 4 is outside \\[0, 4\\)")
    assert_same_error(lambda: table(out_rows=[0, 2, 0]), "out_rows\\[1\\] = 2 is outside \\[0, 2\\)")
    assert_same_error(lambda: table(out_rows=[1, 1, 0]), "output row 1 appears twice for kernel offset 0")
    assert_same_error(lambda: table(offset_splits=[0, 3, 2]), "offset_splits must rise")
    assert_same_error(lambda: table(offset_splits=[0, 1, 2] + [3] * 31), "1 to 32 offsets")
    features = tf.constant(rng.standard_normal((4, 2)), tf.float32)
    conv = dict(in_rows=[0, 1, 2], out_rows=[0, 1, 0], offset_splits=[0, 2, 3], num_out=2)
    for width in (3, 5, 6):  # volume 2: the table has 2 + 2 columns
        assert_same_error(lambda: ops.site_sparse_conv(features, tf.ones([2, 2, 3]), **conv,
                                                       neighbours=tf.zeros([2, width], tf.int32),
                                                       map_is_trusted=True),
                          "neighbours must be SiteNeighbourTable's")
    with tf.device(CPU):
        good = table()
    assert_same_error(lambda: ops.site_sparse_conv(features, tf.ones([2, 2, 3]), **conv, neighbours=good),
                      "accepted with map_is_trusted only")


@pytest.mark.parametrize("kernel,mode", [((1001,) * 3, "transposed"), ((2**21,), "strided"),
                                         ((2**31 - 1,) * 4, "strided")], ids=["10^9", "2^21", "overflow"])
def test_kernel_map_refuses_kernel_volumes_beyond_the_limit(kernel, mode):
    # Used to size per-offset tables by the volume: gigabytes, or SIGSEGV.
    x = make_site_sparse(np.zeros((1, len(kernel) + 1), np.int32), np.ones((1, 1), np.float32), (4,) * len(kernel), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"kernel_size \[.*\] has more than 1048576 \(2\^20\)"):
        kernel_map(x, kernel, mode=mode)


def test_a_refused_call_leaves_the_next_call_its_own_inputs(device, rng):
    # On the GPU, TensorFlow's eager runtime once ran the call after a failed kernel
    # construction with the failed call's host-memory inputs: here its spatial_shape (4, 4, 4),
    # which put the site at z = 4 outside the grid. Attributes are now refused by Compute.
    coords = np.array([[0, 0, 0, 4], [0, 1, 2, 7], [1, 7, 5, 1]], np.int32)
    with tf.device(device):
        refused = make_site_sparse(np.zeros((1, 4), np.int32), np.ones((1, 1), np.float32), (4, 4, 4), 1)
        with pytest.raises(tf.errors.InvalidArgumentError, match="has more than 1048576"):
            kernel_map(refused, (1001,) * 3, mode="transposed")
        x = make_site_sparse(coords, rng.normal(size=(3, 2)).astype(np.float32), (8, 8, 8), 2)
        got = kernel_map(x, 3, mode="strided", strides=2)
    with tf.device(CPU):
        expected = kernel_map(make_site_sparse(coords, np.zeros((3, 2), np.float32), (8, 8, 8), 2), 3,
                              mode="strided", strides=2)
    np.testing.assert_array_equal(got.out_spatial_shape.numpy(), [3, 3, 3])
    for field in ("out_coords", "in_rows", "out_rows", "offset_splits"):
        np.testing.assert_array_equal(getattr(got, field).numpy(), getattr(expected, field).numpy())


@pytest.mark.parametrize("mode,shape,geometry", [
    # (5 - 1) * 2^62 wrapped to 0, giving an output extent of 3.
    ("transposed", 5, dict(strides=2**62)),
    ("strided", 4, dict(padding=2**62)),
    ("transposed", 4, dict(padding=2**62)),
    ("strided", 4, dict(dilation=2**62)),
    ("submanifold", 4, dict(dilation=2**62)),
], ids=["transposed-stride", "strided-padding", "transposed-padding", "strided-dilation", "submanifold-dilation"])
def test_geometry_arithmetic_that_overflows_int64_is_refused(mode, shape, geometry):
    x = make_site_sparse([[0, 1]], [[1.0]], (shape,), 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the geometry of dimension 0 overflows 64-bit arithmetic"):
        kernel_map(x, 3, mode=mode, **geometry)


def test_geometry_near_the_int64_limit_that_fits_is_exact():
    # One stride of 2^62 leaves one output cell; a stretch that cancels against the padding
    # gives the exact small extent, (2 - 1) 2^62 - 2^62 + 2 + 1 = 3.
    x = make_site_sparse([[0, 1], [0, 3]], [[1.0], [2.0]], (4,), 1)
    assert kernel_map(x, 3, strides=2**62).out_spatial_shape.numpy().tolist() == [1]
    y = make_site_sparse([[0, 0]], [[1.0]], (2,), 1)
    m = kernel_map(y, 3, strides=2**62, padding=2**61, mode="transposed")
    assert m.out_spatial_shape.numpy().tolist() == [3]
    assert m.in_rows.shape == [0]  # site 0 lands at -2^61 + q: outside


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("strides,dilation", [((1, 2**63 - 1), (1, 1)), ((2**63 - 1, 2), (3, 1)),
                                              ((2**63 - 2, 2**62), (1, 1))],
                         ids=["stride-max", "stride-max-dilated", "strides-near-max"])
def test_strided_map_with_a_stride_near_the_int64_limit_matches_cpu(rng, builder, strides, dilation, gpu):
    # The GPU's output table is sized by the sites an input reaches, ceil(k / period) per
    # dimension with period = s / gcd(s, dil); computed as (k + period - 1) / period that
    # wrapped for a stride near 2^63 and left the table one slot ("a hash table filled up").
    reaching = [[1, dilation[0] - 1, 0]]
    coords = np.unique(np.concatenate([random_coords(rng, 2, (9, 8), 0.4), reaching]).astype(np.int32), axis=0)
    geometry = ((3, 2), strides, (1, 0), dilation)
    cpu = raw_map(CPU, coords, (9, 8), 2, "strided", *geometry)
    assert_same_map(raw_map(GPU, coords, (9, 8), 2, "strided", *geometry, builder=builder), cpu)
    assert int(cpu[4].numpy()[-1]) > 0  # site (1, dil - 1, 0) reaches output (1, 0, 0) through q = (1, 0)
