"""tf.data pipelines: element types and static shapes, batches equal direct voxelization,
seeded shuffling and augmentation, the stratified and balanced splits, the replicas' parts of a global
batch, and errors at construction."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts
from tf_sparseconv.data.mnist import images_to_channel_sparse
from tf_sparseconv.data.pipeline import (Augmentation, ReplicaSplit, augment_point_clouds, balanced_split,
                                         image_dataset, point_cloud_dataset, rotate_about_up, stratified_split)
from tf_sparseconv.data.synthetic import make_shapes
from tf_sparseconv.data.voxelize import voxelize_points

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(scope="module")
def shapes():
    return make_shapes(5, 256, seed=0, normals=True)


def test_stratified_split_is_fixed_disjoint_and_proportional(rng):
    labels = np.repeat(np.arange(4), [10, 20, 40, 3])
    train, val = stratified_split(labels, 0.25, seed=0)
    again = stratified_split(labels, 0.25, seed=0)
    np.testing.assert_array_equal(train, again[0])
    np.testing.assert_array_equal(val, again[1])
    assert np.intersect1d(train, val).size == 0 and len(train) + len(val) == len(labels)
    np.testing.assert_array_equal(np.bincount(labels[val]), [2, 5, 10, 1])  # round(0.25 * n_c)
    assert not np.array_equal(val, stratified_split(labels, 0.25, seed=1)[1])
    with pytest.raises(ValueError, match="val_fraction"):
        stratified_split(labels, 1.0)


def test_balanced_split_holds_out_per_class_capped_at_max_fraction():
    labels = np.repeat(np.arange(4), [10, 200, 40, 3])[::-1].copy()  # classes not in label order
    train, val = balanced_split(labels, 8, max_fraction=0.25, seed=0)
    again = balanced_split(labels, 8, max_fraction=0.25, seed=0)
    np.testing.assert_array_equal(train, again[0])
    np.testing.assert_array_equal(val, again[1])
    assert np.intersect1d(train, val).size == 0
    np.testing.assert_array_equal(np.union1d(train, val), np.arange(len(labels)))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(val) > 0)
    # min(8, floor(0.25 n_c)): 2 of 10, 8 of 200, 8 of 40, 0 of 3
    np.testing.assert_array_equal(np.bincount(labels[val], minlength=4), [2, 8, 8, 0])
    assert not np.array_equal(val, balanced_split(labels, 8, max_fraction=0.25, seed=1)[1])
    # drawn in stratified_split's per-class order: the first examples of the same permutation
    _, stratified = stratified_split(labels, 0.2, seed=0)  # 2, 40, 8, 1 of the classes
    assert set(val) <= set(stratified) | set(np.flatnonzero(labels == 3))


def test_balanced_split_takes_a_count_per_class_label():
    labels = np.repeat(np.arange(3), [100, 100, 100])
    _, val = balanced_split(labels, [20, 5, 0], max_fraction=0.5, seed=3)
    np.testing.assert_array_equal(np.bincount(labels[val], minlength=3), [20, 5, 0])
    with pytest.raises(ValueError, match="one per class label"):
        balanced_split(labels, [20, 5])
    with pytest.raises(ValueError, match=">= 0"):
        balanced_split(labels, [20, -1, 3])
    with pytest.raises(ValueError, match="max_fraction"):
        balanced_split(labels, 5, max_fraction=1.0)


def test_balanced_split_in_the_modelnet40_test_proportions():
    # training-set sizes large enough that the cap never binds: the held-out counts are
    # then exactly half of the official test's (100 -> 50, 86 -> 43, 50 -> 25, 20 -> 10)
    classes = sorted(ts.data.MODELNET40_TEST_COUNTS)
    labels = np.repeat(np.arange(40), 300)
    counts = ts.data.modelnet40_test_counts(classes, full=50)
    _, val = balanced_split(labels, counts, max_fraction=0.25, seed=0)
    held = np.bincount(labels[val], minlength=40)
    expected = np.array([ts.data.MODELNET40_TEST_COUNTS[c] for c in classes]) // 2
    np.testing.assert_array_equal(held, expected)
    assert held.sum() == 2468 // 2
    assert sorted(set(expected)) == [10, 25, 43, 50]


def test_rotate_about_up_turns_points_and_normals_counter_clockwise():
    clouds = np.array([[[1.0, 0.0, 0.5, 0.0, 1.0, 0.0], [0.0, 2.0, -1.0, 1.0, 0.0, 0.0]]])
    turned = rotate_about_up(clouds, np.pi / 2)
    np.testing.assert_allclose(turned, [[[0.0, 1.0, 0.5, -1.0, 0.0, 0.0], [-2.0, 0.0, -1.0, 0.0, 1.0, 0.0]]],
                               atol=1e-12)
    about_x = rotate_about_up(clouds[..., :3], np.pi / 2, up_axis=0)
    np.testing.assert_allclose(about_x, [[[1.0, -0.5, 0.0], [0.0, 1.0, 2.0]]], atol=1e-12)
    np.testing.assert_array_equal(clouds[0, 0], [1.0, 0.0, 0.5, 0.0, 1.0, 0.0])  # a copy


def test_stepped_rotation_augmentation_turns_by_multiples_of_its_step():
    clouds = np.tile(np.array([[[1.0, 0.0, 0.3]]]), (64, 1, 1))
    turned = augment_point_clouds(clouds, np.random.default_rng(0),
                                  Augmentation(rotation_steps=12, scale_range=(1, 1), jitter=0))
    angles = np.degrees(np.arctan2(turned[:, 0, 1], turned[:, 0, 0])) % 360
    steps = angles / 30
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
    assert len(np.unique(np.round(steps) % 12)) >= 8  # many of the 12 views drawn
    np.testing.assert_allclose(turned[..., 2], 0.3, atol=1e-6)
    assert ts.data.NAMED_AUGMENTATIONS["rotate12"].rotation_steps == 12


def test_small_turn_augmentation_stays_within_its_angle():
    clouds = np.tile(np.array([[[1.0, 0.0, 0.3]]]), (400, 1, 1))
    turned = augment_point_clouds(clouds, np.random.default_rng(0),
                                  dataclasses.replace(Augmentation.named("turn10"), scale_range=(1, 1), jitter=0))
    angles = np.degrees(np.arctan2(turned[:, 0, 1], turned[:, 0, 0]))
    assert np.abs(angles).max() <= 10 + 1e-4 and angles.min() < -8 and angles.max() > 8  # both ways, up to 10
    assert np.abs(angles).min() < 1  # uniform: small turns too
    np.testing.assert_allclose(turned[..., 2], 0.3, atol=1e-6)


def test_elements_are_channel_sparse_tensors_with_static_shapes(shapes):
    points, labels, _ = shapes
    dataset = point_cloud_dataset(points, labels, 8, 16, features=("occupancy", "normals"))
    x_spec, y_spec = dataset.element_spec
    assert isinstance(x_spec, ts.ChannelSparseTensor.Spec)
    assert x_spec.dense_shape.shape == [5] and x_spec.keys.shape.as_list() == [None]
    assert x_spec.values.dtype == tf.float32 and y_spec.shape.as_list() == [None] and y_spec.dtype == tf.int64
    sizes = []
    for x, y in dataset:
        assert isinstance(x, ts.ChannelSparseTensor)
        ts.validate(x)
        assert x.dense_shape.numpy().tolist() == [len(y), 8, 8, 8, 4]
        sizes.append(len(y))
    assert sizes == [16, 16, 8]
    dropped = point_cloud_dataset(points, labels, 8, 16, drop_remainder=True)
    assert dropped.element_spec[1].shape.as_list() == [16] and len(list(dropped)) == 2


def test_replica_parts_cut_each_global_batch_in_replica_order(shapes):
    # 40 shapes in global batches of 16, 16 and 8 over 3 replicas: parts of 6, 5, 5 (one
    # more for the first n % R replicas) and of 3, 3, 2; a pipeline making replicas 1 and 2
    # makes their parts of the same global batches (same seed, same shuffle).
    points, labels, _ = shapes
    whole = [y.numpy() for _, y in point_cloud_dataset(points, labels, 8, 16, seed=4)]
    assert [len(y) for y in whole] == [16, 16, 8]
    bounds = [[0, 6, 11, 16], [0, 6, 11, 16], [0, 3, 6, 8]]
    for first, count in ((0, 3), (1, 2)):
        parts = [(y.numpy(), w.numpy()) for _, y, w in point_cloud_dataset(
            points, labels, 8, 16, seed=4, split=ReplicaSplit(3, first, count))]
        assert len(parts) == 3 * count and all(np.all(w == 1) for _, w in parts)
        for step, batch in enumerate(whole):
            for i in range(count):
                r = first + i
                np.testing.assert_array_equal(parts[step * count + i][0], batch[bounds[step][r]:bounds[step][r + 1]])


def test_replicas_without_an_example_of_the_last_batch_get_a_weightless_filler(shapes, assert_same_channel_sparse):
    points, labels, _ = shapes
    parts = list(point_cloud_dataset(points[:5], labels[:5], 8, 4, shuffle=False, split=ReplicaSplit(3)))
    dropped = list(point_cloud_dataset(points[:5], labels[:5], 8, 4, shuffle=False, drop_remainder=True,
                                       split=ReplicaSplit(4, 2, 2)))
    assert [len(y) for _, y, _ in parts] == [2, 1, 1, 1, 1, 1]  # 4 = 2 + 1 + 1, then 1 example and 2 fillers
    assert [w.numpy().tolist() for _, _, w in parts[3:]] == [[1.0], [0.0], [0.0]]
    assert_same_channel_sparse(parts[4][0], parts[3][0])  # a filler repeats the batch's first example
    assert [len(element) for element in dropped] == [2, 2]  # (x, y): no weights
    assert [len(y) for _, y in dropped] == [1, 1]  # replicas 2 and 3 of 4, the last batch left out
    with pytest.raises(ValueError, match="global batch size 6 is not divisible by the 4 replicas"):
        point_cloud_dataset(points, labels, 8, 6, drop_remainder=True, split=ReplicaSplit(4))
    with pytest.raises(ValueError, match="ReplicaSplit needs 0 <= first"):
        ReplicaSplit(2, 1, 2)


def test_batch_equals_direct_voxelization(shapes, assert_same_channel_sparse):
    points, labels, _ = shapes
    dataset = point_cloud_dataset(points, labels, 16, 12, features=("occupancy", "count"), shuffle=False)
    for i, (x, y) in enumerate(dataset):
        expected = voxelize_points(points[12 * i:12 * (i + 1)], 16, features=("occupancy", "count"))
        assert_same_channel_sparse(x, expected)
        np.testing.assert_array_equal(ts.to_dense(x).numpy(), ts.to_dense(expected).numpy())
        np.testing.assert_array_equal(y.numpy(), labels[12 * i:12 * (i + 1)])


def test_shuffling_and_augmentation_are_seeded_and_change_per_epoch(shapes):
    points, labels, _ = shapes

    def epochs(dataset, n=2):
        iterator_epochs = []
        for _ in range(n):
            iterator_epochs.append([(x.keys.numpy(), y.numpy()) for x, y in dataset])
        return iterator_epochs

    make = lambda seed: point_cloud_dataset(points, labels, 16, 8, augmentation=Augmentation(), seed=seed)  # noqa: E731
    first, second = epochs(make(3)), epochs(make(3))
    for a, b in zip(first, second):
        for (keys_a, y_a), (keys_b, y_b) in zip(a, b):
            np.testing.assert_array_equal(keys_a, keys_b)
            np.testing.assert_array_equal(y_a, y_b)
    labels_epoch = [np.concatenate([y for _, y in epoch]) for epoch in first]
    assert sorted(labels_epoch[0]) == sorted(labels)
    assert not np.array_equal(labels_epoch[0], labels_epoch[1])
    assert not np.array_equal(labels_epoch[0], np.concatenate([y for _, y in epochs(make(4), 1)[0]]))
    # Unshuffled, every batch holds the same clouds each epoch: only the augmentation can change its keys.
    unshuffled = epochs(point_cloud_dataset(points, labels, 16, 8, augmentation=Augmentation(), seed=3, shuffle=False))
    assert not any(np.array_equal(keys_a, keys_b) for (keys_a, _), (keys_b, _) in zip(*unshuffled))


def test_augmentation_rotates_about_up_scales_and_jitters(rng):
    clouds = make_shapes(1, 200, seed=0, normals=True)[0][:3]
    rotated = augment_point_clouds(clouds, np.random.default_rng(0), Augmentation(scale_range=(1, 1), jitter=0))
    # About z: heights, horizontal radii and normal-to-point geometry are kept.
    np.testing.assert_allclose(rotated[..., 2], clouds[..., 2], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(rotated[..., :2], axis=2), np.linalg.norm(clouds[..., :2], axis=2),
                               atol=1e-5)
    np.testing.assert_allclose(np.sum(rotated[..., :3] * rotated[..., 3:], axis=2),
                               np.sum(clouds[..., :3] * clouds[..., 3:], axis=2), atol=1e-5)
    assert not np.allclose(rotated[..., :2], clouds[..., :2])
    scaled = augment_point_clouds(clouds, np.random.default_rng(0),
                                  Augmentation(rotate_up=False, scale_range=(0.5, 0.5), jitter=0))
    np.testing.assert_allclose(scaled[..., :3], clouds[..., :3] * 0.5, atol=1e-6)
    np.testing.assert_allclose(scaled[..., 3:], clouds[..., 3:], atol=1e-6)
    jittered = augment_point_clouds(clouds, np.random.default_rng(0),
                                    Augmentation(rotate_up=False, scale_range=(1, 1), jitter=0.01))
    assert 0 < np.abs(jittered[..., :3] - clouds[..., :3]).max() <= 0.03 + 1e-6


def test_anisotropic_scaling_scales_each_axis_apart_and_keeps_normals_normal_to_the_surface():
    clouds = make_shapes(1, 200, seed=0, normals=True)[0][:4]
    exact = dataclasses.replace(Augmentation.named("aniso"), jitter=0)
    aniso = augment_point_clouds(clouds, np.random.default_rng(0), exact)
    factors = aniso[..., :3] / np.where(np.abs(clouds[..., :3]) > 0.05, clouds[..., :3], np.nan)
    per_axis = np.nanmedian(factors, axis=1)  # [clouds, 3]: one factor per axis of each cloud
    expected = np.broadcast_to(per_axis[:, None], factors.shape)
    measured = np.isfinite(factors)
    np.testing.assert_allclose(factors[measured], expected[measured], atol=1e-4)
    assert ((per_axis >= 0.8 - 1e-6) & (per_axis <= 1.0 + 1e-6)).all()
    assert np.ptp(per_axis, axis=1).min() > 0  # the axes of a cloud got different factors
    np.testing.assert_allclose(np.linalg.norm(aniso[..., 3:], axis=-1), 1, atol=1e-5)
    # A tangent t of the surface (n . t = 0) stays tangent when it is scaled as the points are.
    t = np.cross(clouds[..., 3:], [0.3, 0.5, 0.8])
    np.testing.assert_allclose(np.sum(aniso[..., 3:] * (t * per_axis[:, None]), axis=-1), 0, atol=1e-5)


def test_image_dataset(rng, assert_same_channel_sparse):
    images = rng.integers(0, 256, (10, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 10)
    dataset = image_dataset(images, labels, 4, shuffle=False)
    assert dataset.element_spec[0].dense_shape.shape == [4]
    batches = list(dataset)
    assert [len(y) for _, y in batches] == [4, 4, 2]
    assert_same_channel_sparse(batches[1][0], images_to_channel_sparse(images[4:8]))


def test_keras_style_iteration_in_a_tf_function(shapes):
    # What Keras fit does with a dataset: iterate it inside a traced function.
    points, labels, _ = shapes
    dataset = point_cloud_dataset(points, labels, 8, 8)

    @tf.function
    def occupied_per_batch(ds):
        total = tf.constant(0, tf.int64)
        for x, _ in ds:
            total += tf.reduce_sum(tf.cast(ts.to_dense(x) > 0, tf.int64))
        return total

    expected = sum(int(x.num_entries) for x, _ in dataset)
    assert int(occupied_per_batch(dataset)) == expected


def test_errors(shapes):
    points, labels, _ = shapes
    with pytest.raises(ValueError, match="features"):
        point_cloud_dataset(points, labels, 8, 4, features=("colour",))
    with pytest.raises(ValueError, match="expected points"):
        point_cloud_dataset(points, labels[:3], 8, 4)
    bad = points.copy()
    bad[7, 0, 0] = np.nan
    with pytest.raises(ValueError, match="example 7 contains NaN"):
        point_cloud_dataset(bad, labels, 8, 4)
    with pytest.raises(ValueError, match="0 examples"):
        point_cloud_dataset(points[:0], labels[:0], 8, 4)


@pytest.mark.skipif(not (DATA / "modelnet40_train.npz").exists(), reason="../shared/data not available")
def test_real_modelnet_split_and_batch():
    from tf_sparseconv.data.modelnet import load_modelnet_npz
    points, labels, classes = load_modelnet_npz(DATA / "modelnet40_train.npz")
    train, val = stratified_split(labels, 0.1, seed=0)
    assert abs(len(val) - 984) <= 40 and set(labels[val]) == set(range(40))
    x, y = next(iter(point_cloud_dataset(points[val], labels[val], 32, 32, augmentation=Augmentation())))
    assert x.dense_shape.numpy().tolist() == [32, 32, 32, 32, 1]
    assert 0.01 < float(x.density()) < 0.05  # about 2.5 % at 32^3


def test_mirror_augmentation_negates_x_in_some_clouds_only():
    clouds = make_shapes(2, 100, seed=1, normals=True)[0][:16]
    exact = Augmentation(rotate_up=False, mirror_axes=(0,), scale_range=(1, 1), jitter=0)
    mirrored = augment_point_clouds(clouds, np.random.default_rng(3), exact)
    flip = np.array([-1.0, 1, 1, -1, 1, 1], np.float32)  # x of the point and of its normal
    kinds = []
    for m, c in zip(mirrored, clouds):
        if np.allclose(m, c, atol=1e-6):
            kinds.append("kept")
        else:
            np.testing.assert_allclose(m, c * flip, atol=1e-6)
            kinds.append("mirrored")
    assert set(kinds) == {"kept", "mirrored"}  # both among 16 clouds
    named = Augmentation.named("mirror")
    assert not named.rotate_up and named.mirror_axes == (0,) and named.jitter > 0
    assert Augmentation.named("rotate") == Augmentation() and not Augmentation.named("scale").mirror_axes
    with pytest.raises(ValueError, match="augmentation must be one of"):
        Augmentation.named("shear")


CLOUDS, CLOUD_LABELS, _ = make_shapes(1, 32)


@pytest.mark.parametrize("options,error,message", [
    # each failed inside tf.data on the first batch (resolution 0, 2.5, bounds (1, -1), an
    # augmentation name, 2-column points, normals missing), in TensorFlow's batch op
    # (batch_size 0) or conversions (2.5, None, seed 1.5, drop_remainder 'no'), or was taken:
    # resolution or batch_size True as 1, shuffle='no' as True, negative and float labels
    (dict(resolution=0), ValueError, "resolution must be a whole number >= 1"),
    (dict(resolution=2.5), ValueError, "resolution must be a whole number >= 1"),
    (dict(resolution=True), ValueError, "resolution must be a whole number >= 1"),
    (dict(batch_size=0), ValueError, "batch_size must be >= 1"),
    (dict(batch_size=2.5), TypeError, "batch_size must be an int"),
    (dict(batch_size=True), TypeError, "batch_size must be an int"),
    (dict(bounds=(1.0, -1.0)), ValueError, "bounds must be"),
    (dict(seed=-1), ValueError, r"seed must be in \[0, 2\^63 - 1\]"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(shuffle="no"), ValueError, "shuffle must be True or False"),
    (dict(drop_remainder="no"), ValueError, "drop_remainder must be True or False"),
    (dict(augmentation="rotate"), TypeError, "augmentation must be an Augmentation or None"),
    (dict(split=2), TypeError, "split must be a ReplicaSplit or None"),
    (dict(labels=CLOUD_LABELS - 3), ValueError, "labels must be class indices >= 0"),
    (dict(labels=CLOUD_LABELS + 0.5), TypeError, "labels must be integers"),
    (dict(points=CLOUDS[..., :2]), ValueError, r"points must be numbers \[M, N, 3\+\]"),
    (dict(features=("normals",)), ValueError, r"points must be numbers \[M, N, 6\+\]"),
])
def test_point_cloud_dataset_refuses_bad_arguments_when_called(options, error, message):
    arguments = dict(points=CLOUDS, labels=CLOUD_LABELS, resolution=8, batch_size=4)
    arguments.update(options)
    points, labels, resolution, batch_size = (arguments.pop(k) for k in ("points", "labels", "resolution",
                                                                         "batch_size"))
    with pytest.raises(error, match="point_cloud_dataset: " + message):
        point_cloud_dataset(points, labels, resolution, batch_size, **arguments)


def test_image_dataset_refuses_a_threshold_that_is_no_number_and_empty_images():
    images, labels = np.full((4, 5, 5), 200, np.uint8), np.zeros(4, np.int64)
    with pytest.raises(ValueError, match=r"image_dataset: threshold must be >= 0 \(a finite number\), got nan"):
        image_dataset(images, labels, 2, threshold=float("nan"))  # NaN dropped every pixel
    with pytest.raises(ValueError, match=r"image_dataset: images must be numbers \[M, H, W\] with H, W >= 1"):
        image_dataset(images[:, :0], labels, 2)
    with pytest.raises(ValueError, match="image_dataset: batch_size must be >= 1"):
        image_dataset(images, labels, 0)


@pytest.mark.parametrize("options,message", [
    # all were taken, and failed (or drew garbage) only when a batch was augmented
    (dict(rotation_steps=-1), "rotation_steps must be a whole number >= 0"),
    (dict(up_axis=5), r"up_axis must be a whole number in \[0, 2\]"),
    (dict(mirror_axes=(5,)), r"mirror_axes entry must be a whole number in \[0, 2\]"),
    (dict(mirror_axes=0), "mirror_axes must be a tuple"),
    (dict(scale_range=(1.0, 0.5)), "scale_range must be"),
    (dict(scale_range=(-1.0, 0.5)), "scale_range must be"),
    (dict(jitter=float("nan")), "jitter must be >= 0"),
    (dict(max_angle=float("inf")), r"max_angle must be in \[0, 180\]"),
    (dict(rotate_up="no"), "rotate_up must be True or False"),
])
def test_augmentation_refuses_options_it_cannot_apply(options, message):
    with pytest.raises(ValueError, match="Augmentation: " + message):
        Augmentation(**options)
    assert Augmentation(scale_range=(1.0, 1.0)).scale_range == (1.0, 1.0)  # a fixed scale stays allowed


def test_splits_and_replica_split_refuse_what_they_truncated_or_numpy_refused():
    labels = np.array([0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match="stratified_split: seed must be in"):
        stratified_split(labels, 0.5, seed=-1)  # NumPy's 'expected non-negative integer'
    with pytest.raises(ValueError, match="stratified_split: val_fraction must be in"):
        stratified_split(labels, "0.5")  # a str comparison error
    with pytest.raises(TypeError, match="stratified_split: labels must be integers"):
        stratified_split(labels + 0.5, 0.5)
    with pytest.raises(TypeError, match="balanced_split: per_class must be whole counts"):
        balanced_split(labels, 1.7)  # held out 1 per class
    with pytest.raises(ValueError, match="balanced_split: labels must be class indices >= 0"):
        balanced_split(labels - 1, 1)
    with pytest.raises(TypeError, match="ReplicaSplit: replicas must be an int"):
        ReplicaSplit(2.5)  # taken, with count 2.5
    with pytest.raises(TypeError, match="ReplicaSplit: first must be an int"):
        ReplicaSplit(4, 1.5)
