"""Memory bounds known before running: arithmetic, measured peaks never above them, and
inference that refuses or splits batches over budget."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import keras

from tf_sparseconv import from_dense, keras_layers as kl
from tf_sparseconv.models import octnet3
from tf_sparseconv.models.memory_bound import BoundedInference, MemoryBudgetExceeded, largest_batch_within, memory_bound

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "..", "shared", "data", "modelnet40_train.npz")


def classifier(resolution=32):
    inputs = keras.Input((None, 3))
    h = kl.VoxelizePoints(resolution)(inputs)
    h = kl.DirectSparseConv(8, 3, rho_up=2.0 / resolution, activation="relu", name="conv1")(h)
    h = kl.DirectSparseConv(8, 3, rho_up=2.0 / resolution, activation="relu", name="conv2")(h)
    h = kl.SparseMaxPool(2, name="pool1")(h)
    h = kl.DirectSparseConv(16, 3, rho_up=4.0 / resolution, activation="relu", name="conv3")(h)
    h = kl.SparseMaxPool(2, name="pool2")(h)
    h = keras.layers.Flatten()(kl.SparseToDense(name="to_dense")(h))
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def random_surfaces(rng, batch, points):
    """Points on random sphere shells: surface-like, ~1/r density as in the paper's §4.1."""
    direction = rng.normal(size=(batch, points, 3))
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    radius = rng.uniform(0.3, 0.95, (batch, 1, 1))
    return (direction * radius).astype(np.float32)


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_bytes_of(fn):
    """Peak resident memory added while fn runs (the kernel's high-water mark, reset first)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kb("VmRSS")
    result = fn()
    return (_status_kb("VmHWM") - before) * 1024, result


def test_conv_output_bound_is_batch_times_channels_times_k():
    model = classifier(32)
    bound = memory_bound(model, batch_size=4)
    conv1 = next(b for b in bound.layers if b.name == "conv1")
    k = math.ceil(2.0 / 32 * 32 ** 3)
    assert conv1.output_entries == 4 * 8 * k
    assert bound.total_bytes == sum(b.output_bytes for b in bound.layers) + max(b.temporary_bytes for b in bound.layers)
    assert memory_bound(model, 8).total_bytes > bound.total_bytes


def test_measured_entries_never_exceed_the_bound(rng):
    model = classifier(32)
    points = random_surfaces(rng, 6, 4096)
    bound = {b.name: b for b in memory_bound(model, 6, points_per_sample=4096).layers}
    h = points
    for layer in model.layers[1:]:
        h = layer(h)
        if isinstance(h, dict):
            assert int(tf.shape(h["keys"])[0]) <= bound[layer.name].output_entries


def test_padded_convolutions_allocate_the_planners_bound(rng):
    """A padded convolution's output length is the planner's bound for its layer (issue 24:
    one number), where the k-selection bound binds; elsewhere the op's tighter cap (input
    length x an input channel's present weights) and never more than the planner's."""
    model = octnet3(16, 5, (0.1, 0.3), padded_convs=True, padded_pools=True)
    bound = {b.name: b.output_entries for b in memory_bound(model, batch_size=3).layers}
    layers = [layer for layer in model.layers if isinstance(layer, (kl.DirectSparseConv, kl.SparseMaxPool))]
    dense = np.where(rng.random((3, 16, 16, 16, 1)) < 0.08, 1.0, 0.0).astype(np.float32)

    @tf.function  # padded dicts pass between Keras layers inside traced functions
    def lengths(h):
        out = []
        for layer in layers:
            out.append(tf.shape(h["keys"])[0])
            h = layer(h)
        return out + [tf.shape(h["keys"])[0]]

    length = [int(n) for n in lengths(kl.as_keras_inputs(from_dense(dense)))]
    checked = 0
    for i, layer in enumerate(layers):
        if isinstance(layer, kl.DirectSparseConv):
            cout = layer.kernel_shape[-1]
            assert length[i + 1] == min(length[i] * 27 * cout, bound[layer.name]), layer.name
            checked += length[i + 1] == bound[layer.name]
        assert length[i + 1] <= bound[layer.name], layer.name
    assert checked >= 4  # the k-selection bound binds in most layers of this net


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc peak-RSS reset")


def probe(*args):
    """peak_memory_probe.py's JSON for args, run in a fresh process."""
    # The bound is the CPU kernels': the probe runs with any GPU hidden.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="-1",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peak_memory_probe.py")
    result = subprocess.run([sys.executable, script, *map(str, args)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@needs_proc
@pytest.mark.parametrize("source", ["random", "modelnet40"])
def test_measured_peak_memory_never_exceeds_the_bound(source):
    if source == "modelnet40" and not os.path.exists(DATA):
        pytest.skip("../shared/data/modelnet40_train.npz is absent")
    rows = probe(source, 32, 16, 8192)
    for row in rows:
        assert row["measured"] <= row["bound"], f"{row['layer']}: measured {row['measured']} B > bound {row['bound']} B"
    conv_peaks = [row["measured"] for row in rows if row["layer"].startswith("conv")]
    assert min(conv_peaks) > 0, "the measurement must see the convolutions' memory"


@needs_proc
@pytest.mark.parametrize("core, batch, points", [("octnet3", 4, 1000), ("site_resnet", 4, 1000),
                                                 ("site_resnet-select", 4, 1000),
                                                 ("octnet3", 2, 400_000), ("octnet3-normals", 4, 1000),
                                                 ("octnet3-normals", 2, 20_000)])
def test_serving_models_peak_stays_under_the_bound_for_small_and_large_clouds(core, batch, points):
    row = probe("serving", core, 32, batch, points)
    assert row["logits"] == [batch, 10]
    assert 0 < row["measured"] <= row["bound"], row
    if points > 100_000:
        # The voxelization dominates: the bound follows it within a small factor, not the whole grid.
        assert row["bound"] < 3 * row["measured"], row


@needs_proc
def test_split_mode_keeps_the_measured_peak_of_large_clouds_under_the_budget():
    from tests.models.peak_memory_probe import serving_model
    # The CPU's bound: the probe runs with the GPU hidden.
    budget = memory_bound(serving_model("octnet3", 32), 3, 200_000, device="cpu").total_bytes
    row = probe("serving", "octnet3", 32, 8, 200_000, budget)
    assert row["calls"] == 3 and row["logits"] == [8, 10]
    assert 0 < row["measured"] <= row["bound"] <= budget, row


def test_refuse_mode_rejects_a_batch_over_budget(rng):
    model = classifier(16)
    budget = memory_bound(model, 3, points_per_sample=500).total_bytes
    runner = BoundedInference(model, budget, on_exceed="refuse", points_per_sample=500)
    assert runner.chunk_size == 3 == largest_batch_within(model, budget, 500)
    points = random_surfaces(rng, 3, 500)
    np.testing.assert_allclose(runner(points).numpy(), model(points).numpy(), rtol=1e-6)
    with pytest.raises(MemoryBudgetExceeded, match="a batch of 4 point clouds of 500 points is bounded by") as e:
        runner(random_surfaces(rng, 4, 500))
    assert (e.value.bound_bytes, e.value.budget_bytes) == (memory_bound(model, 4, 500).total_bytes, budget)
    assert (e.value.batch_size, e.value.points_per_sample, e.value.largest_batch) == (4, 500, 3)


def test_split_mode_runs_within_budget_and_matches_the_full_batch(rng):
    model = classifier(16)
    runner = BoundedInference(model, memory_bound(model, 3, points_per_sample=500).total_bytes, on_exceed="split")
    points = random_surfaces(rng, 8, 500)
    plan = runner.plan(points)
    assert (plan.chunk_size, plan.chunks) == (3, 3) and plan.chunk_bytes <= runner.budget_bytes < plan.batch_bytes
    np.testing.assert_allclose(runner(points).numpy(), model(points).numpy(), rtol=1e-5, atol=1e-6)


def test_split_mode_bounds_the_points_per_cloud_it_is_given(rng):
    # Planned for 100 points per cloud, the runner re-plans for the clouds it gets.
    model = classifier(16)
    budget = memory_bound(model, 3, points_per_sample=100).total_bytes
    runner = BoundedInference(model, budget, points_per_sample=100)
    assert runner.chunk_size == 3
    points = random_surfaces(rng, 6, 5000)
    plan = runner.plan(points)
    assert plan.points_per_sample == 5000 and plan.chunk_size == largest_batch_within(model, budget, 5000) == 2
    assert plan.chunk_bytes == memory_bound(model, 2, 5000).total_bytes <= budget
    np.testing.assert_allclose(runner(points).numpy(), model(points).numpy(), rtol=1e-5, atol=1e-6)


def test_point_cloud_models_need_the_points_per_cloud_to_plan():
    with pytest.raises(ValueError, match="give points_per_sample"):
        largest_batch_within(classifier(16), 1 << 30)
    assert BoundedInference(classifier(16), 1 << 30).chunk_size is None  # planned per call


def test_voxelization_bound_grows_with_the_points_per_cloud():
    model = classifier(32)
    # The CPU's bound (the default is the GPU's where one is visible), for a host of two
    # worker threads: on many cores the per-thread convolution scratch, which does not grow
    # with the points, can be the largest temporary of the small clouds' pass.
    small, large = (memory_bound(model, 4, points, device="cpu", threads=2) for points in (1000, 400_000))
    voxelize = next(b for b in large.layers if b.kind == "voxelize")
    # At least the float64 coordinates and their scaled copy per point, twice for the allocator's pool.
    assert voxelize.temporary_bytes > 2 * 48 * 4 * 400_000
    assert large.layers[0].name == "inputs" and large.layers[0].output_bytes == 4 * 400_000 * 3 * 4
    # The per-point part grows with the points, so the growth is compared, not the ratio.
    assert large.total_bytes - small.total_bytes > 2 * 48 * 4 * (400_000 - 1000)
    # On any host the voxelization's own temporaries grow so.
    small, large = (next(b for b in memory_bound(model, 4, points, device="cpu", threads=32).layers
                         if b.kind == "voxelize") for points in (1000, 400_000))
    assert large.temporary_bytes - small.temporary_bytes > 2 * 48 * 4 * (400_000 - 1000)


def classifier_on_sparse_input():
    inputs = kl.sparse_input((8, 8, 8, 1))
    h = kl.DirectSparseConv(4, 3, rho_up=0.2, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Flatten()(kl.SparseToDense()(h)))


def test_split_mode_splits_channel_sparse_batches(rng):
    model = classifier_on_sparse_input()
    grids = (rng.random((5, 8, 8, 8, 1)) < 0.1).astype(np.float32)
    batch = kl.as_keras_inputs(from_dense(grids))
    runner = BoundedInference(model, memory_bound(model, 2).total_bytes)
    assert runner.chunk_size == 2
    np.testing.assert_allclose(runner(batch).numpy(), model(batch).numpy(), rtol=1e-6)


def test_budget_below_one_sample_is_refused_even_in_split_mode():
    model = classifier(16)
    runner = BoundedInference(model, 64 << 20, on_exceed="split")
    clouds = np.zeros((2, 2_000_000, 3), np.float32)  # never voxelized: the plan refuses first
    one = memory_bound(model, 1, 2_000_000).total_bytes
    message = (f"even one of these point clouds of 2,000,000 points is bounded by {one / 2**20:,.1f} MB "
               r".*over the budget of 64.0 MB: raise budget_bytes or give clouds of fewer points")
    with pytest.raises(MemoryBudgetExceeded, match=message) as e:
        runner(clouds)
    assert (e.value.bound_bytes, e.value.budget_bytes, e.value.largest_batch) == (one, 64 << 20, 0)
    with pytest.raises(MemoryBudgetExceeded, match="even one of these examples is bounded by"):
        BoundedInference(classifier_on_sparse_input(), 1024)(kl.as_keras_inputs(from_dense(np.ones((2, 8, 8, 8, 1),
                                                                                                   np.float32))))


def test_budget_must_be_a_positive_number_of_bytes():
    for budget in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="budget_bytes must be a positive whole number of bytes"):
            BoundedInference(classifier(16), budget)


def test_serving_model_is_bounded_through_its_core_beside_the_dense_grid():
    from tf_sparseconv import models
    core = models.octnet3(16, 3, rhos=(0.3, 0.5), fc_units=16)
    serving = models.point_cloud_classifier(core, 16)
    bound, core_bound = memory_bound(serving, 4), memory_bound(core, 4)
    voxelize, *layers = bound.layers
    assert voxelize.name == "point_cloud_to_sparse" and voxelize.kind == "voxelize"
    assert voxelize.output_entries == 4 * 16 ** 3 and voxelize.dense_bytes == 4 * 16 ** 3 * 4
    assert [(b.name, b.output_entries) for b in layers] == [(b.name, b.output_entries) for b in core_bound.layers]
    conv = layers[0]
    # a ReLU convolution: its pre-activation and activation outputs, as the sparse bound counts both
    assert conv.output_entries == 4 * 8 * math.ceil(0.3 * 16 ** 3) and conv.dense_bytes == 2 * 4 * 16 ** 3 * 8 * 4
    assert bound.dense_bytes == sum(b.dense_bytes for b in bound.layers)
    assert bound.activation_bytes == core_bound.activation_bytes + voxelize.output_bytes
    table = bound.table()
    assert f"vs dense grid {bound.dense_bytes / 2**20:.2f} MB" in table
    assert "voxelization grows with the points per cloud and is not in the bound; give points_per_sample" in table
    sparse = [b for b in bound.layers if b.kind in ("voxelize", "sparse_conv", "sparse_max_pool")]
    assert (f"at most {sum(b.output_entries for b in sparse):,} stored entries vs "
            f"{sum(math.prod(b.output_shape) for b in sparse):,} dense grid elements") in table
    # with the points per cloud known, the voxelized grid is capped, its temporaries are
    # counted and so is the float32 copy of the clouds
    capped = memory_bound(serving, 4, points_per_sample=100)
    inputs, voxelize, conv_capped = capped.layers[:3]
    assert (inputs.name, inputs.output_bytes) == ("inputs", 4 * 100 * 3 * 4)
    assert voxelize.output_entries == 4 * 100 and capped.notes == ()
    assert voxelize.temporary_bytes > 4 * 100 * 3 * 8
    assert conv_capped.output_entries == conv.output_entries


def test_serving_models_of_images_bound():
    from tf_sparseconv import models
    images = models.image_classifier(models.octnet3(28, 10, rhos=(0.05, 0.10), spatial_dims=2, fc_units=16))
    bound = memory_bound(images, 2)
    assert [b.kind for b in bound.layers[:3]] == ["input", "image", "sparse_conv"]
    assert bound.layers[0].output_bytes == 2 * 28 * 28 * 4 and bound.layers[1].output_entries == 2 * 28 * 28
    assert bound.layers[2].output_entries == 2 * 8 * math.ceil(0.05 * 28 * 28)


def test_site_models_are_bounded_per_grid_of_sites():
    from tf_sparseconv import models
    core = models.site_resnet(3, 8, channels=(4, 6))
    serving = models.point_cloud_classifier(core, 8)
    bound = memory_bound(serving, 2, points_per_sample=100)
    layers = {b.name: b for b in bound.layers}
    assert layers["sparse_to_site"].kind == "to_site" and layers["sparse_to_site"].output_entries == 2 * 100
    # submanifold layers keep the sites (at most the points, 100 per cloud), the stride-2
    # level at most the 4^3 cells per cloud
    assert layers["stem"].output_entries == 2 * 100 * 4 and layers["level0_block1_add"].output_entries == 2 * 100 * 4
    assert layers["down1"].output_entries == 2 * 64 * 6 == layers["level1_block1_relu"].output_entries
    # the stem builds level 0's submanifold map: 27 pairs per site at most, 4-byte rows
    assert layers["stem"].output_bytes >= 2 * 100 * 27 * 8 + 2 * 100 * 4 * 4
    assert layers["level0_block1_conv1"].output_bytes == 2 * 100 * 4 * 4  # the map is reused
    assert layers["global_pool"].output_bytes == 2 * 6 * 4
    assert memory_bound(core, 2).total_bytes < memory_bound(core, 4).total_bytes
    # k-selection keeps at most k sites per sample: the grid's later layers count those, and
    # the first convolution after it builds a new map over them (the select drops the maps)
    selected = models.point_cloud_classifier(models.site_resnet(3, 8, channels=(4, 6), select_k=10), 8)
    kept = {b.name: b for b in memory_bound(selected, 2, points_per_sample=100).layers}
    assert kept["select"].kind == "site_select" and kept["select"].output_entries == 2 * 10 * 4
    assert kept["level0_block1_add"].output_entries == 2 * 10 * 4
    assert kept["level0_block1_conv1"].output_bytes >= 2 * 10 * 27 * 8 + 2 * 10 * 4 * 4
    assert memory_bound(selected, 2, points_per_sample=100).total_bytes < bound.total_bytes
    assert memory_bound(models.point_cloud_classifier(models.site_resnet(3, 8, channels=(4, 6), select_k=1000), 8),
                        2, points_per_sample=100).layers[6].output_entries == 2 * 100 * 4  # k above the sites


def test_split_mode_runs_a_serving_model_within_budget(rng):
    from tf_sparseconv import models
    serving = models.point_cloud_classifier(models.octnet3(8, 3, rhos=(0.5, 0.5), fc_units=8), 8)
    runner = BoundedInference(serving, memory_bound(serving, 3, points_per_sample=100).total_bytes)
    assert runner.plan(random_surfaces(rng, 7, 100)).chunk_size == 3
    points = random_surfaces(rng, 7, 100) * 4 + 2  # normalised by the model
    # On a GPU the dense head's matmuls run in TF32 with algorithms chosen per batch size, so
    # a chunk of one and the whole batch agree to TF32's precision, not float32's.
    tolerance = dict(rtol=2e-3, atol=2e-4) if tf.config.list_physical_devices("GPU") else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runner(points).numpy(), serving(points).numpy(), **tolerance)


def test_the_threads_of_another_host_change_only_the_cpu_scratch():
    net = octnet3(16, 4)
    one, many = (memory_bound(net, 4, device="cpu", threads=n).total_bytes for n in (1, 64))
    assert one < many
    gpu_one, gpu_many = (memory_bound(net, 4, device="gpu", threads=n).total_bytes for n in (1, 64))
    assert gpu_one <= gpu_many
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        memory_bound(net, 4, threads=0)


def _conv_net(dataflow, resolution=64):
    inputs = keras.Input((None, 3))
    h = kl.VoxelizePoints(resolution)(inputs)
    h = kl.DirectSparseConv(8, 3, rho_up=0.05, activation="relu", dataflow=dataflow, name="conv")(h)
    return keras.Model(inputs, kl.SparseToDense()(h))


def test_the_gpu_bound_under_auto_covers_the_atomic_sums():
    # 16 clouds of 2,000 points on a 64^3 grid: 6.9M contribution slots, past the 2^20 from which
    # 'auto' may take the atomic sums on the GPU in place of the sort, whose buffers follow the
    # slots where the atomic sums' bits and ranks follow the grid.
    bounds = {dataflow: memory_bound(_conv_net(dataflow), 16, points_per_sample=2000, device="gpu").total_bytes
              for dataflow in ("auto", "sort", "atomic")}
    assert bounds["atomic"] > bounds["sort"]
    assert bounds["auto"] == bounds["atomic"]


def test_batch_sizes_points_and_budgets_that_are_not_whole_positive_numbers_are_refused():
    # Before: batch_size 0, -1, 2.5 or True gave a bound (-1: a negative one), points_per_sample
    # 0 or -5 one below the smallest cloud's, a NaN budget a largest batch of 0; NaN, infinity
    # and None raised raw int() or comparison errors.
    net, clouds = octnet3(16, 4), classifier(16)
    for batch in (0, -1, 2.5, True, None, "4", float("nan")):
        with pytest.raises(ValueError, match=r"memory_bound: batch_size must be a whole number >= 1"):
            memory_bound(net, batch)
    for points in (0, -5, 2.5, float("nan")):
        with pytest.raises(ValueError, match=r"memory_bound: points_per_sample must be a whole number >= 1"):
            memory_bound(clouds, 2, points)
        with pytest.raises(ValueError, match=r"BoundedInference: points_per_sample must be a whole number >= 1"):
            BoundedInference(clouds, 1 << 30, points_per_sample=points)
    for threads in (float("nan"), float("inf"), "4"):
        with pytest.raises(ValueError, match="threads must be a positive integer"):
            memory_bound(net, 4, threads=threads)
    for budget in (-1, float("nan"), float("inf"), "1e9", None):
        with pytest.raises(ValueError, match=r"largest_batch_within: budget_bytes must be a whole number of bytes"):
            largest_batch_within(net, budget)
    for budget in (float("nan"), float("inf"), None):
        with pytest.raises(ValueError, match="BoundedInference: budget_bytes must be a positive whole number of bytes"):
            BoundedInference(net, budget)
    assert largest_batch_within(net, 0) == 0 and memory_bound(net, 2.0).batch_size == 2
    # int32 was bounded at 4 bytes a value, a string dtype at 0
    for dtype in ("int32", tf.string, "complex"):
        with pytest.raises(ValueError, match=r"memory_bound: dtype must be the models' floating-point type"):
            memory_bound(net, 4, dtype=dtype)
    assert memory_bound(net, 4, dtype="float16").total_bytes < memory_bound(net, 4).total_bytes


def test_clouds_of_no_points_are_refused_by_the_model_not_the_planner():
    with pytest.raises(tf.errors.InvalidArgumentError, match="point cloud 0 of the batch has no points"):
        BoundedInference(classifier(16), 1 << 30)(np.zeros((2, 0, 3), np.float32))
