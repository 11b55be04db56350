"""The OctNet3 builder (Table 4) and the training command, end to end on small data: its
argument checks (one line, exit code 2, nothing written), --out, the files it writes and
the model it saves (point clouds in, the training's logits out), its progress lines, and
that it learns."""
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv import data as datasets
from tf_sparseconv import keras_layers as kl
from tf_sparseconv.training import train
from tf_sparseconv.models import core_model, normalize_point_clouds, octnet3

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A run of a few seconds: 8^3, two sparse blocks, 6 shapes per class (40 train, 8 validation).
TINY = ["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--synthetic-per-class", "6",
        "--batch-size", "8"]


@pytest.mark.parametrize("resolution,sparse_convs,dense_convs", [(16, 6, 0), (32, 9, 3), (64, 9, 6)])
def test_octnet3_follows_table4(resolution, sparse_convs, dense_convs):
    model = octnet3(resolution, 40)
    layers = model.layers
    assert sum(isinstance(layer, kl.DirectSparseConv) for layer in layers) == sparse_convs
    assert sum(isinstance(layer, keras.layers.Conv3D) for layer in layers) == dense_convs
    assert model.output_shape == (None, 40)
    bounds = sorted({layer.rho_up for layer in layers if isinstance(layer, kl.DirectSparseConv) and layer.rho_up})
    assert bounds == sorted({rho for rho in {16: (), 32: (0.14, 0.33, 0.66), 64: (0.06, 0.14, 0.33)}[resolution]})


def test_octnet3_64_keeps_its_signal_only_with_he_initialisation():
    # Glorot halves the signal at every ReLU layer: after the 15 convolutions of the 64^3
    # net the logits are ~5e-4 on ModelNet40 and Adam then stays at the majority class.
    # He initialisation (the default) keeps them at order 0.1-1.
    import tensorflow as tf

    from tf_sparseconv import data as datasets
    from tf_sparseconv.training.train import keras_batches
    clouds, labels, _ = datasets.make_shapes(num_per_class=1, seed=3)
    x, _ = next(iter(keras_batches(datasets.point_cloud_dataset(clouds[:4], labels[:4], 64, 4, shuffle=False))))
    spread = {}

    def logits_spread(**kwargs):
        # On the CPU where a GPU is visible as well: the GPU's atomic sums add in a varying
        # order, and k-selection turns their last bits into other kept entries, so two GPU
        # calls of the same weights differ (here by 0.1 %); the CPU's sums are exact reruns.
        keras.utils.set_random_seed(0)
        with tf.device("/CPU:0"):
            return float(tf.math.reduce_std(octnet3(64, 40, **kwargs)(x, training=False)))

    for init in ("he_normal", "glorot_uniform"):
        spread[init] = logits_spread(kernel_initializer=init)
    assert spread["he_normal"] > 0.05 and spread["glorot_uniform"] < 0.005, spread
    assert logits_spread() == pytest.approx(spread["he_normal"])


def test_octnet3_for_mnist_is_two_dimensional():
    model = octnet3(28, 10, rhos=(0.05, 0.1), spatial_dims=2)
    assert all(layer.kernel.shape[:2] == (3, 3) for layer in model.layers if isinstance(layer, kl.DirectSparseConv))
    assert model.output_shape == (None, 10)


def test_octnet3_rejects_resolution_not_divisible_by_its_pools():
    with pytest.raises(ValueError, match="not divisible"):
        octnet3(18, 10, rhos=(0.1, 0.1, 0.1))


def test_train_on_synthetic_writes_results_and_a_loadable_model(tmp_path, capsys):
    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--epochs", "2",
                          "--synthetic-per-class", "6", "--batch-size", "8", "--lam", "0.1", "--prune-eps", "0.01",
                          "--vote-mirror", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "validation accuracy" in printed and "memory bound at batch 8" in printed
    assert "voting over each cloud and its mirror image" in printed
    with open(tmp_path / "results.json") as f:
        saved = json.load(f)
    assert saved["val_accuracy"] == pytest.approx(results["val_accuracy"])
    assert 0.0 <= saved["val_accuracy"] <= 1.0
    assert saved["val_accuracy_mirror_vote"] == pytest.approx(results["val_accuracy_mirror_vote"])
    assert 0.0 <= saved["val_accuracy_mirror_vote"] <= 1.0
    assert len(saved["sec_per_epoch"]) == 2 and saved["memory_bound_bytes"] > 0
    assert len(saved["layers"]) == 6 and all(0 < layer["density"] <= 1 for layer in saved["layers"])
    assert len(saved["pruning"]) == 2
    model = keras.models.load_model(tmp_path / "model.keras")
    assert model.output_shape == (None, 8)


def test_a_site_run_reports_the_memory_bound_of_its_sites(tmp_path, capsys):
    from tf_sparseconv.data import num_channels
    from tf_sparseconv.models import site_resnet
    from tf_sparseconv.models.memory_bound import memory_bound

    results = train.main(["--model", "site-resnet", "--dataset", "synthetic", "--resolution", "8",
                          "--site-channels", "8", "16", "--site-blocks", "1", "--synthetic-per-class", "6",
                          "--points", "64", "--batch-size", "8", "--epochs", "1", "--out", str(tmp_path)])
    assert "memory bound at batch 8: " in capsys.readouterr().out
    assert results["memory_bound_sites_per_sample"] == 64
    # the bound of the same net with at most 64 sites per sample, below the whole 8^3 grid's
    net = site_resnet(results["num_classes"], 8, in_channels=num_channels(results["features"]), channels=(8, 16),
                      blocks=1)
    assert results["memory_bound_bytes"] == memory_bound(net, 8, points_per_sample=64).total_bytes
    assert results["memory_bound_bytes"] < memory_bound(net, 8).total_bytes


def test_steps_per_execution_trains_the_same_weights(tmp_path, monkeypatch):
    # Keras runs N steps in one call of the traced function; the steps themselves (batches,
    # order, Eq. 4, pruning at the epoch's end) are the same.
    compiled, compile = [], keras.Model.compile

    def recording_compile(model, *args, **kwargs):
        compiled.append(kwargs.get("steps_per_execution", 1))
        return compile(model, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "compile", recording_compile)
    common = [*TINY, "--epochs", "2", "--lam", "0.1", "--prune-eps", "0.01", "--val-split", "none"]
    one = train.main([*common, "--out", str(tmp_path / "one")])
    three = train.main([*common, "--steps-per-execution", "3", "--out", str(tmp_path / "three")])
    assert (one["steps_per_execution"], three["steps_per_execution"]) == (1, 3)
    assert 3 in compiled and set(compiled) <= {1, 3}
    np.testing.assert_allclose(three["history"]["loss"], one["history"]["loss"], rtol=1e-5)
    a, b = (keras.models.load_model(tmp_path / run / "model.keras") for run in ("one", "three"))
    # On a GPU the atomic sums add in a varying order: two trainings of the same steps differ
    # in the last bits (one weight of 10^6 by 1.9e-6 on a lent H200, 2026-12-02).
    atol = 1e-5 if tf.config.list_physical_devices("GPU") else 1e-6
    for w, v in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(v, w, rtol=1e-5, atol=atol)


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "mnist_train.npz")), reason="../shared/data is absent")
def test_train_on_thresholded_mnist_subset(tmp_path):
    results = train.main(["--dataset", "mnist", "--data-dir", DATA, "--max-examples", "300", "--epochs", "1",
                          "--batch-size", "50", "--rho", "0.05", "0.1", "--out", str(tmp_path)])
    assert results["resolution"] == 28 and 0.0 <= results["val_accuracy"] <= 1.0
    # the saved model takes the images themselves and scores the held-out ones as training did
    split = json.loads((tmp_path / "split.json").read_text())
    assert split["data_path"] == os.path.abspath(os.path.join(DATA, "mnist_train.npz"))
    images, labels = datasets.load_mnist(split["data_path"])
    assert split["num_examples"] == len(labels) and split["labels_sha256"] == train.labels_sha256(labels)
    val = np.array(split["val_indices"])
    assert len(val) == 30
    model = keras.models.load_model(tmp_path / "model.keras")
    logits = model.predict(images[val], verbose=0)
    assert logits.shape == (30, 10)
    assert np.mean(np.argmax(logits, -1) == labels[val]) == pytest.approx(results["val_accuracy"])


def test_val_split_none_trains_on_every_example_and_scores_nothing(tmp_path, capsys):
    from tf_sparseconv import cli
    results = train.main(TINY + ["--epochs", "1", "--val-split", "none", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "48 training examples, none held out (--val-split none)" in printed
    assert "no validation (--val-split none: trained on all 48 examples) after 1 epochs" in printed
    assert f"tf-sparseconv evaluate {tmp_path / 'model.keras'} --data TEST" in printed
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert (saved["val_split"], saved["val_examples"], saved["val_accuracy"], saved["val_overall"],
            saved["val_mean_class"], saved["val_class_examples"]) == ("none", 0, None, None, None, None)
    assert not any(key.startswith("val_") for key in saved["history"])
    split = json.loads((tmp_path / "split.json").read_text())
    assert split["val_indices"] == [] and split["train_indices"] == list(range(48))
    # evaluate has no validation examples to score
    assert cli.main(["evaluate", str(tmp_path / "model.keras"), "--split", "val", "--out", str(tmp_path / "ev")]) == 2
    assert "--split val: the training run kept no validation examples" in capsys.readouterr().err


def test_balanced_split_and_rotation_vote_are_recorded_and_evaluate_repeats_the_vote(tmp_path, capsys):
    from tf_sparseconv import cli
    argv = TINY + ["--epochs", "1", "--val-split", "balanced", "--val-per-class", "2", "--val-max-fraction", "0.4",
                   "--vote", "rotations-3", "--out", str(tmp_path)]
    results = train.main(argv)
    printed = capsys.readouterr().out
    assert "voting over 3 rotations of each cloud about the up axis" in printed
    assert "validation mean per-class accuracy" in printed
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["command"] == "tf-sparseconv train " + " ".join(argv)
    assert (saved["val_split"], saved["val_per_class"], saved["val_max_fraction"], saved["val_fraction"]) == \
        ("balanced", 2, 0.4, None)
    # min(2, floor(0.4 * 6)) of each of the 8 classes
    assert saved["val_examples"] == 16 and saved["val_class_examples"] == [2] * 8
    assert saved["val_overall"] == pytest.approx(saved["val_accuracy"])
    # the Keras metric of the last epoch and the NumPy count of the final predictions agree
    assert saved["val_mean_class"] == pytest.approx(saved["history"]["val_mean_class_accuracy"][-1])
    scored = [a for a in saved["val_class_accuracy"].values() if a is not None]
    assert saved["val_mean_class"] == pytest.approx(np.mean(scored))
    assert saved["vote"] == "rotations-3" and 0 <= saved["val_overall_vote"] <= 1
    assert saved["val_accuracy_mirror_vote"] is None and saved["val_overall_test_weighted"] is None
    split = json.loads((tmp_path / "split.json").read_text())
    assert (split["val_split"], split["val_per_class"], split["val_max_fraction"]) == ("balanced", 2, 0.4)
    labels = datasets.make_shapes(num_per_class=6, seed=0)[1]
    np.testing.assert_array_equal(np.bincount(labels[split["val_indices"]]), [2] * 8)
    assert not set(split["val_indices"]) & set(split["train_indices"])
    # the saved model holds the weights, not the optimizer's state (Adam's two moments per weight)
    import h5py
    import zipfile
    with zipfile.ZipFile(tmp_path / "model.keras") as archive:
        archive.extract("model.weights.h5", tmp_path / "unpacked")
    with h5py.File(tmp_path / "unpacked" / "model.weights.h5") as weights:
        names = []
        weights.visit(names.append)
    assert "layers/functional/layers/direct_sparse_conv/vars/0" in names
    assert not any(name.startswith("layers/functional/optimizer") for name in names)  # the serving SGD: 2 scalars
    # the saved model voted over the same views by `evaluate` scores the same
    assert cli.main(["evaluate", str(tmp_path / "model.keras"), "--split", "val", "--vote", "rotations-3",
                     "--out", str(tmp_path / "eval")]) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["vote"] == "rotations-3"
    assert metrics["overall_accuracy"] == pytest.approx(saved["val_overall_vote"])
    assert metrics["mean_class_accuracy"] == pytest.approx(saved["val_mean_class_vote"])


def test_snapshots_hold_the_model_of_their_epoch(tmp_path):
    from tf_sparseconv.keras_layers import present_weight_count
    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--epochs", "3",
                          "--synthetic-per-class", "6", "--batch-size", "8", "--lam", "0.3", "--prune-eps", "0.05",
                          "--snapshot-epochs", "1", "3", "--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.glob("model_epoch*.keras")) == ["model_epoch1.keras", "model_epoch3.keras"]
    final = keras.models.load_model(tmp_path / "model.keras")
    first, last = (keras.models.load_model(tmp_path / f"model_epoch{e}.keras") for e in (1, 3))
    for a, b in zip(final.weights, last.weights):  # the last epoch's snapshot is the final model
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    kernels = [(a.numpy(), b.numpy()) for a, b in zip(first.weights, last.weights) if "kernel" in a.path]
    assert any(not np.array_equal(a, b) for a, b in kernels)  # two epochs of training apart
    # Each snapshot holds its epoch's pruning masks.
    assert [present_weight_count(m) for m in (first, last)] == [
        results["pruning"][e]["present_weights"] for e in (0, 2)]


def test_finetune_epochs_fix_the_pruned_structure_for_the_last_epochs(tmp_path):
    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--epochs", "3",
                          "--synthetic-per-class", "6", "--batch-size", "8", "--lam", "0.3", "--lam-reduction", "sum",
                          "--lam-density", "channel", "--prune-eps", "0.05", "--finetune-epochs", "1",
                          "--out", str(tmp_path)])
    assert results["finetune_epochs"] == 1 and results["lam_density"] == "channel"
    model = core_model(keras.models.load_model(tmp_path / "model.keras"))
    assert model.get_layer("sparse_conv1_1").density_regularizer.density == "channel"
    assert results["pruning"][2]["pruned"] == 0
    assert results["pruning"][2]["present_weights"] == results["pruning"][1]["present_weights"]


@pytest.mark.parametrize("extra,message", [
    (["--finetune-epochs", "1"], "--finetune-epochs ends regularisation and pruning"),
    (["--lam", "0.1", "--finetune-epochs", "3"], "--finetune-epochs must lie in 1..2"),
    (["--lam-terms", "weights"], "--lam-reduction, --lam-terms and --lam-density shape the Eq. 4 penalty"),
    (["--lam-reduction", "filter"], "--lam-reduction, --lam-terms and --lam-density shape the Eq. 4 penalty"),
    (["--lam-density", "channel"], "--lam-reduction, --lam-terms and --lam-density shape the Eq. 4 penalty"),
])
def test_options_without_effect_are_refused(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit):
        train.main(["--dataset", "synthetic", "--epochs", "3", "--out", str(tmp_path)] + extra)
    assert message in capsys.readouterr().err


def test_snapshot_epochs_outside_the_run_are_refused(tmp_path, capsys):
    for bad in ("0", "4"):
        with pytest.raises(SystemExit):
            train.main(["--dataset", "synthetic", "--epochs", "3", "--snapshot-epochs", bad, "--out", str(tmp_path)])
        assert "--snapshot-epochs must lie in 1..3" in capsys.readouterr().err


def test_features_give_the_model_its_input_channels(tmp_path):
    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--epochs", "1",
                          "--synthetic-per-class", "6", "--batch-size", "8", "--features", "occupancy", "offset",
                          "--out", str(tmp_path)])
    assert results["features"] == ["occupancy", "offset"]
    model = core_model(keras.models.load_model(tmp_path / "model.keras"))
    first = next(layer for layer in model.layers if isinstance(layer, kl.DirectSparseConv))
    assert tuple(first.kernel.shape)[-2] == 4  # occupancy + 3 offsets in


def test_estimated_normals_train_a_model_that_takes_x_y_z_and_estimates_them_itself(tmp_path, capsys):
    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--epochs", "1",
                          "--synthetic-per-class", "6", "--batch-size", "8", "--features", "occupancy", "normals",
                          "--estimate-normals", "8", "--augment", "rotate", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "estimating normals (8 neighbours per point): 48/48 clouds" in printed
    assert "point clouds [B, N, 3] -> logits" in printed
    assert results["estimate_normals"] == 8 and results["features"] == ["occupancy", "normals"]
    with open(tmp_path / "split.json") as f:
        assert "normals" not in json.load(f)  # --split val feeds x, y, z: the model estimates the rest
    model = keras.models.load_model(tmp_path / "model.keras")
    assert model.input_shape == (None, None, 3)
    first = next(layer for layer in core_model(model).layers if isinstance(layer, kl.DirectSparseConv))
    assert tuple(first.kernel.shape)[-2] == 4  # occupancy + 3 normal components in
    clouds, _, _ = datasets.make_shapes(num_per_class=1, seed=1)
    assert model.predict(clouds.astype(np.float32), verbose=0).shape == (len(clouds), 8)


def test_points_only_data_takes_the_normals_feature_when_it_is_estimated(tmp_path):
    path = _npz(tmp_path / "points.npz", points=np.zeros([4, 16, 3], np.uint8), labels=np.zeros(4, np.int64),
                classes=np.array(["a"]))
    with pytest.raises(ValueError, match="--estimate-normals K"):
        train.check_data("modelnet40", path, ("occupancy", "normals"))
    train.check_data("modelnet40", path, ("occupancy", "normals"), normals_estimated=True)


def test_vote_mirror_is_refused_for_mnist(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.main(["--dataset", "mnist", "--vote-mirror", "--out", str(tmp_path)])
    assert "--vote mirror applies to point clouds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--dataset", "mnist", "--features", "occupancy", "offset", "--out", str(tmp_path)])
    assert "--features applies to point clouds" in capsys.readouterr().err


def test_backup_dir_resumes_from_the_last_finished_epoch(tmp_path, capsys):
    # a constant rate: under the built-in shapes' default cosine schedule --epochs may not grow
    common = ["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--synthetic-per-class", "6",
              "--batch-size", "8", "--lr-schedule", "constant", "--backup-dir", str(tmp_path / "backup")]
    first = train.main(common + ["--epochs", "1", "--out", str(tmp_path / "a")])
    # Nothing left to train: the restored model is the first run's model, and its history is the first run's.
    again = train.main(common + ["--epochs", "1", "--out", str(tmp_path / "b")])
    weights_a = keras.models.load_model(tmp_path / "a" / "model.keras").get_weights()
    weights_b = keras.models.load_model(tmp_path / "b" / "model.keras").get_weights()
    assert len(weights_a) == len(weights_b) and all(np.array_equal(a, b) for a, b in zip(weights_a, weights_b))
    assert again["history"] == first["history"] and again["val_accuracy"] == pytest.approx(first["val_accuracy"])
    capsys.readouterr()
    resumed = train.main(common + ["--epochs", "2", "--out", str(tmp_path / "c")])
    assert "resuming from" in capsys.readouterr().out
    assert resumed["epochs"] == 2 and len(resumed["sec_per_epoch"]) == 2
    # the peak memory of every process that trained it, from the epoch log
    assert len(resumed["history"]["peak_rss_bytes"]) == 2
    assert resumed["peak_rss_bytes"] >= max(resumed["history"]["peak_rss_bytes"]) > 0
    assert resumed["history"]["loss"][0] == first["history"]["loss"][0]
    weights_c = keras.models.load_model(tmp_path / "c" / "model.keras").get_weights()
    assert any(not np.array_equal(a, c) for a, c in zip(weights_a, weights_c))


def test_backup_dir_refuses_a_changed_run_and_pruning(tmp_path, capsys):
    common = ["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--synthetic-per-class", "6",
              "--batch-size", "8", "--epochs", "1", "--backup-dir", str(tmp_path / "backup")]
    train.main(common + ["--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit):
        train.main(common + ["--lr", "0.01", "--out", str(tmp_path / "b")])
    assert "different arguments (lr: 0.001 there, 0.01 now)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(common + ["--prune-eps", "0.01", "--out", str(tmp_path / "c")])
    assert "cannot resume warning-shot pruning" in capsys.readouterr().err


def test_backup_saved_before_lam_terms_resumes_only_with_the_weights_only_penalty(tmp_path, capsys):
    """A run saved before --lam-terms existed pulled the weights only: resuming it under the
    new default (weights and biases) would change the regulariser mid-run, so it is refused."""
    parser = train.build_parser()
    argv = ["--dataset", "synthetic", "--lam", "0.3", "--lr-schedule", "constant", "--backup-dir", str(tmp_path)]
    old = {k: v for k, v in vars(train.parse_args(parser, argv)).items()
           if k not in train.RESUMABLE_CHANGES and k not in ("lam_terms", "finetune_epochs", "lam_density")}
    (tmp_path / "run_args.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit):
        train.prepare_backup_dir(parser, train.parse_args(parser, argv))
    assert "lam_terms: 'weights' there, 'weights+biases' now" in capsys.readouterr().err
    train.prepare_backup_dir(parser, train.parse_args(parser, argv + ["--lam-terms", "weights"]))


def test_backup_saved_before_the_eq4_options_needed_lam_resumes_a_baseline(tmp_path):
    """A lambda = 0 run saved before --lam-terms and --finetune-epochs existed resumes under
    the same arguments: the missing options take the values main() resolves them to."""
    parser = train.build_parser()
    argv = ["--dataset", "synthetic", "--lr-schedule", "constant", "--backup-dir", str(tmp_path)]
    old = {k: v for k, v in vars(train.parse_args(parser, argv)).items()
           if k not in train.RESUMABLE_CHANGES and k not in ("lam_terms", "finetune_epochs", "lam_density")}
    assert old["lam_reduction"] == "sum"
    (tmp_path / "run_args.json").write_text(json.dumps(old))
    train.prepare_backup_dir(parser, train.parse_args(parser, argv))


def test_cosine_schedule_decays_to_zero_and_fixes_the_epochs_of_a_backup(tmp_path, capsys):
    common = ["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--synthetic-per-class", "6",
              "--batch-size", "8", "--lr-schedule", "cosine", "--augment", "mirror",
              "--backup-dir", str(tmp_path / "backup")]
    results = train.main(common + ["--epochs", "2", "--snapshot-epochs", "2", "--out", str(tmp_path / "a")])
    assert results["lr_schedule"] == "cosine" and results["augment"] == "mirror" and results["device"]
    # the snapshot keeps the training's optimizer (model.keras is compiled for evaluation only)
    model = keras.models.load_model(tmp_path / "a" / "model_epoch2.keras")
    # 8 classes x 6 shapes, one per class held out: 40 training shapes, 5 batches an epoch
    assert int(model.optimizer.iterations.numpy()) == 10
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.0, abs=1e-9)
    capsys.readouterr()
    # the schedule spans the planned epochs, so a resumed run may not change them
    with pytest.raises(SystemExit):
        train.main(common + ["--epochs", "3", "--out", str(tmp_path / "b")])
    assert "epochs: 2 there, 3 now" in capsys.readouterr().err


def test_smoothed_crossentropy_matches_its_definition():
    from tf_sparseconv.training.losses import SmoothedSparseCrossentropy
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(6, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=6)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    for s in (0.0, 0.1, 0.3):
        target = np.full((6, 5), s / 5)
        target[np.arange(6), labels] += 1 - s
        got = float(SmoothedSparseCrossentropy(s)(labels, logits))
        assert got == pytest.approx(-(target * log_p).sum(axis=1).mean(), rel=1e-5)
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    assert float(SmoothedSparseCrossentropy(0.0)(labels, logits)) == pytest.approx(float(plain), rel=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        SmoothedSparseCrossentropy(1.0)


@pytest.mark.parametrize("smoothing", ["0.1", None, True, float("nan"), np.array([0.1, 0.2])])
def test_smoothed_crossentropy_refuses_a_smoothing_that_is_not_a_number(smoothing):
    # before: Python's comparison of a str or None, NumPy's truth value of an array
    from tf_sparseconv.training.losses import SmoothedSparseCrossentropy
    with pytest.raises(ValueError, match=r"SmoothedSparseCrossentropy: label_smoothing must be in \[0, 1\)"):
        SmoothedSparseCrossentropy(smoothing)
    loss = SmoothedSparseCrossentropy(np.float32(0.25))
    assert SmoothedSparseCrossentropy.from_config(loss.get_config()).label_smoothing == 0.25


@pytest.mark.parametrize("name", ["adam", "adagrad", "sgd"])
def test_weight_decay_shrinks_kernels_and_spares_biases(name):
    layer = keras.layers.Dense(3, bias_initializer="ones")
    layer.build((None, 4))
    kernel, bias = layer.kernel.numpy(), layer.bias.numpy()
    optimizer = train.build_optimizer(name, 0.1, weight_decay=0.5)
    # Adam's step of a zero gradient is zero, Adagrad's too: only the decay moves weights.
    optimizer.apply_gradients([(np.zeros_like(kernel), layer.kernel), (np.zeros_like(bias), layer.bias)])
    np.testing.assert_allclose(layer.kernel.numpy(), kernel * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(layer.bias.numpy(), bias)
    assert train.build_optimizer(name, 0.1).weight_decay is None


def test_sgd_is_nesterov_momentum_and_an_unknown_optimizer_is_refused():
    optimizer = train.build_optimizer("sgd", 0.1)
    assert (optimizer.momentum, optimizer.nesterov) == (0.9, True)
    # An L2 gradient 2 lambda w moves the weight by lr * (1 + momentum) * 2 lambda w in the
    # first Nesterov step: in proportion to the weight, not normalised away as under Adam.
    weight = keras.Variable(np.array([2.0, 0.5], np.float32))
    optimizer.apply_gradients([(2 * 0.3 * weight.numpy(), weight)])
    np.testing.assert_allclose(weight.numpy(), np.array([2.0, 0.5]) * (1 - 0.1 * 1.9 * 0.6), rtol=1e-6)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        train.build_optimizer("rmsprop", 0.1)


def test_weight_decay_and_label_smoothing_are_recorded_and_reload(tmp_path, capsys):
    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--epochs", "1",
                          "--synthetic-per-class", "6", "--batch-size", "8", "--weight-decay", "0.05",
                          "--label-smoothing", "0.1", "--snapshot-epochs", "1", "--out", str(tmp_path / "a")])
    assert results["weight_decay"] == 0.05 and results["label_smoothing"] == 0.1
    model = keras.models.load_model(tmp_path / "a" / "model_epoch1.keras")  # the smoothed loss deserialises
    assert model.loss.label_smoothing == pytest.approx(0.1)
    for flags, message in ((["--weight-decay", "-1"], "--weight-decay must be >= 0"),
                           (["--label-smoothing", "1"], "--label-smoothing must be in")):
        with pytest.raises(SystemExit):
            train.main(["--dataset", "synthetic", *flags, "--out", str(tmp_path / "b")])
        assert message in capsys.readouterr().err


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


def _bad_data(tmp):
    """{name: path} of data a run must refuse before loading it."""
    (tmp / "empty").mkdir()
    (tmp / "garbage.npz").write_bytes(np.random.default_rng(0).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    np.save(tmp / "pickled.npy", np.array([{"a": 1}], dtype=object))  # an .npy of pickled objects, named .npz
    os.rename(tmp / "pickled.npy", tmp / "pickled.npz")
    clouds = np.zeros([4, 16, 3], np.uint8)
    return {
        "missing": str(tmp / "nowhere"), "empty": str(tmp / "empty"), "garbage": str(tmp / "garbage.npz"),
        "pickled": str(tmp / "pickled.npz"),
        "objects": _npz(tmp / "objects.npz", points=clouds, labels=np.zeros(4, np.int64),
                        classes=np.array(["a", None], dtype=object)),
        "no_labels": _npz(tmp / "no_labels.npz", points=clouds, classes=np.array(["a"])),
        "float_points": _npz(tmp / "float_points.npz", points=clouds.astype(np.float32),
                             labels=np.zeros(4, np.int64), classes=np.array(["a"])),
        "short_labels": _npz(tmp / "short_labels.npz", points=clouds, labels=np.zeros(3, np.int64),
                             classes=np.array(["a"])),
        "points_npz": _npz(tmp / "points.npz", points=clouds, labels=np.zeros(4, np.int64), classes=np.array(["a"])),
        "mnist_32": _npz(tmp / "mnist_32.npz", images=np.zeros([4, 32, 32], np.uint8), labels=np.zeros(4, np.int64)),
        "mnist_12": _npz(tmp / "mnist_12.npz", images=np.zeros([4, 28, 28], np.uint8), labels=np.array([0, 12, 3, 4])),
        "one_class": _npz(tmp / "one_class.npz", points=np.random.default_rng(0).integers(0, 256, [4, 16, 3], np.uint8),
                          labels=np.zeros(4, np.int64), classes=np.array(["a", "b"])),
        "twice": _npz(tmp / "twice.npz", points=clouds, labels=np.array([0, 1, 2, 0]),
                      classes=np.array(["a", "b", "a"])),
    }


BAD_ARGUMENTS = [
    (["--val-split", "none", "--val-fraction", "0.2"],
     "--val-fraction does not apply to --val-split none, which holds out no examples"),
    (["--val-split", "none", "--vote", "mirror"],
     "--vote mirror scores the validation examples and --val-split none holds out none"),
    (["--resolution", "0"], "--resolution must be >= 1"),
    (["--resolution", "7"], "--resolution 7 has no Table 4 bounds: use one of 16, 32, 64, 128, or give --rho"),
    (["--resolution", "18", "--rho", "0.5", "0.5", "0.5"], "--resolution 18 is not divisible by 4"),
    (["--resolution", "8", "--rho", "0.5", "0.5", "0.5"], "--resolution 8 is too small for 3 sparse blocks"),
    (["--rho", "2.0", "1.5"], "--rho values must be in (0, 1] (1.0: no bound), got [2.0, 1.5]"),
    (["--rho", "0", "0.5"], "--rho values must be in (0, 1]"),
    (["--rho", *["0.5"] * 7], "OctNet3 has at most 6"),
    (["--model", "site-resnet", "--resolution", "2"], "--resolution 2 is too small for 3 site-resnet levels"),
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--lr", "-0.1"], "--lr must be > 0"),
    (["--val-fraction", "0"], "--val-fraction must be in (0, 1)"),
    (["--val-fraction", "1"], "--val-fraction must be in (0, 1)"),
    (["--max-examples", "-1"], "--max-examples must be >= 0"),
    (["--synthetic-per-class", "0"], "--synthetic-per-class must be >= 1"),
    (["--val-split", "balanced", "--val-fraction", "0.2"],
     "--val-fraction does not apply to --val-split balanced, which uses --val-per-class and --val-max-fraction"),
    (["--val-per-class", "20"], "--val-per-class does not apply to --val-split stratified, which uses --val-fraction"),
    (["--val-split", "balanced", "--val-per-class", "0"], "--val-per-class must be >= 1, got 0"),
    (["--val-split", "balanced", "--val-max-fraction", "1"], "--val-max-fraction must be in (0, 1)"),
    (["--val-split", "modelnet40-test"], "--val-split modelnet40-test follows the official ModelNet40 test split's "
                                         "classes; use it with --dataset modelnet40 or modelnet10, not synthetic"),
    (["--val-split", "random"], "argument --val-split: invalid choice: 'random'"),
    (["--vote", "rotations-1"], "argument --vote: the vote must be none, mirror or rotations-N"),
    (["--vote", "rotations-4", "--vote-mirror"], "--vote-mirror is --vote mirror; it cannot be combined with --vote "
                                                 "rotations-4"),
    (["--dataset", "mnist", "--vote", "rotations-4"], "--vote rotations-4 applies to point clouds, not to MNIST"),
    (["--resolution", "abc"], "argument --resolution: invalid int value: 'abc'"),
    (["--dataset", "mnist", "--resolution", "32"], "--resolution 32 does not apply to MNIST"),
    (["--dataset", "mnist", "--augment"], "--augment applies to point clouds"),
    (["--resolution", "16", "--lam", "0.1"], "at 16 every block is unbounded (rho 1.0); give --rho values below 1"),
    (["--dataset", "modelnet40", "--data-dir", "{missing}"],
     "--data-dir {missing} does not exist; expected a folder with modelnet40_train.npz"),
    (["--dataset", "modelnet40", "--data-dir", "{empty}"],
     "--data-dir {empty} holds neither modelnet40_train.npz nor the ModelNet layout <root>/<class>/{train,test}/*.off"),
    (["--dataset", "modelnet10", "--data-dir", "{missing}"], "--data-dir {missing} does not exist"),
    (["--dataset", "scannet", "--data-dir", "{missing}"], "--data-dir {missing} does not exist; expected a folder with "
                                                          "the ScanNet scans"),
    (["--dataset", "scannet", "--data-dir", "{empty}"], "--data-dir {empty} holds no scene* folders"),
    (["--dataset", "mnist", "--data-dir", "{empty}"], "--data-dir {empty} holds neither mnist_train.npz nor "
                                                      "train-images-idx3-ubyte[.gz]"),
    (["--dataset", "modelnet40", "--data-dir", "{garbage}"], "{garbage}: not a NumPy .npz archive (not a zip file)"),
    (["--dataset", "mnist", "--data-dir", "{garbage}"], "{garbage}: not a NumPy .npz archive (not a zip file)"),
    (["--dataset", "modelnet40", "--data-dir", "{pickled}"], "{pickled}: not a NumPy .npz archive (not a zip file)"),
    (["--dataset", "modelnet40", "--data-dir", "{objects}"], "{objects}[classes]: holds Python objects"),
    (["--dataset", "modelnet40", "--data-dir", "{no_labels}"], "{no_labels} lacks the arrays ['labels']"),
    (["--dataset", "modelnet40", "--data-dir", "{float_points}"],
     "{float_points}: array 'points' is float32 [4, 16, 3]; expected points uint8 [M, N, 3]"),
    (["--dataset", "modelnet40", "--data-dir", "{short_labels}"], "{short_labels}: 4 points but 3 labels"),
    (["--dataset", "mnist", "--data-dir", "{mnist_32}"], "{mnist_32}: images are 32x32"),
    (["--dataset", "modelnet40", "--data-dir", "{points_npz}", "--features", "normals"],
     "--features normals needs surface normals"),
    (["--features", "occupancy", "offset", "--estimate-normals", "16"],
     "--estimate-normals 16 estimates the normals feature; add normals to --features"),
    (["--features", "occupancy", "normals", "--estimate-normals", "2"],
     "--estimate-normals takes the neighbours per point as an integer from 3 to 256"),
    (["--steps-per-execution", "0"], "--steps-per-execution must be >= 1, got 0"),
    (["--seed", "-1"], "--seed must be a whole number from 0 to 4294967295, got -1"),
    (["--seed", "4294967296"], "--seed must be a whole number from 0 to 4294967295, got 4294967296"),
    (["--split-seed", "-1"], "--split-seed must be >= 0, got -1"),
    (["--lr", "inf"], "--lr must be > 0 (a finite number), got inf"),
    (["--lam", "nan"], "--lam must be >= 0 (a finite number), got nan"),
    (["--lam", "inf", "--rho", "0.5", "0.5"], "--lam must be >= 0 (a finite number), got inf"),
    (["--prune-eps", "nan"], "--prune-eps must be >= 0 (a finite number), got nan"),
    (["--weight-decay", "nan"], "--weight-decay must be >= 0 (a finite number), got nan"),
    (["--weight-decay", "inf"], "--weight-decay must be >= 0 (a finite number), got inf"),
    (["--resolution", "100000000", "--rho", "1", "1"], "--resolution 100000000 is too large: a batch of 8 grids of "
                                                      "100000000^3 voxels with 16 channels has more entries than"),
    (["--model", "site-resnet", "--resolution", "100000000"], "--resolution 100000000 is too large: a batch of 8 grids "
                                                              "of 100000000^3 voxels with 1 channel has more entries"),
    (["--resolution", "256", "--rho", "0.5", "0.5", "0.5"],
     "--resolution 256 is too large for 3 sparse blocks: pooling their last grid, 64, down to 4 takes 4 dense blocks, "
     "and OctNet3 has 6 blocks in all"),
    (["--backup-dir", "{garbage}/backup"], "--backup-dir {garbage}/backup cannot be written: {garbage} is a file, "
                                           "not a folder"),
    (["--dataset", "modelnet40", "--data-dir", "{points_npz}"],
     "{points_npz}[0]: 16 points all at one position, a cloud without a shape to classify"),
    (["--dataset", "modelnet40", "--data-dir", "{one_class}"],
     "{one_class}: examples of one class only (a); a classifier trains on examples of two classes or more"),
    (["--dataset", "mnist", "--data-dir", "{mnist_12}"], "{mnist_12}: labels must be the digits 0..9 (integers), got "
                                                         "0..12"),
    (["--dataset", "modelnet40", "--data-dir", "{twice}"], "{twice}: classes names 'a' more than once; each label "
                                                           "value needs its own name"),
    (["--max-examples", "3"], "--max-examples 3 keeps no example: the subset keeps its share of each of the 8 classes "
                              "of 48 examples, which rounds to none"),
    # found only once the data is there: 2 shapes per class leave no validation example
    (["--synthetic-per-class", "2"], "leaves 16 for training and 0 for validation"),
    (["--synthetic-per-class", "3", "--val-split", "balanced"], "--val-split balanced (--val-per-class 50, "
                                                                "--val-max-fraction 0.25) of 24 examples"),
]


@pytest.mark.parametrize("argv,message", BAD_ARGUMENTS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_arguments_end_in_one_line_with_exit_code_2_and_nothing_written(tmp_path, monkeypatch, capsys, argv,
                                                                            message):
    paths = _bad_data(tmp_path)
    # a small run should a bad argument pass unnoticed (the case's own values come later and win)
    argv = ["--synthetic-per-class", "6", "--epochs", "1"] + [a.format(**paths) for a in argv]
    message = message.replace("{train,test}", "{{train,test}}").format(**paths)
    run_dir = tmp_path / "run"
    monkeypatch.chdir(run_dir.parent)
    before = sorted(os.listdir(tmp_path))
    for out in ([], ["--out", str(run_dir)]):  # the default new folder under runs/, and a given one
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv + out)
        assert exit_info.value.code == 2
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tf-sparseconv train: error: "), captured.err
        assert message in lines[0]
        assert "allow_pickle" not in lines[0] and "Traceback" not in captured.err
        assert sorted(os.listdir(tmp_path)) == before  # neither runs/ nor the --out folder


def test_out_is_checked_first_and_never_replaced_without_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    for argv in ([], ["--epochs", "0", "--dataset", "modelnet40", "--data-dir", str(tmp_path / "nowhere")]):
        with pytest.raises(SystemExit) as exit_info:
            train.main(argv + ["--out", str(out)])
        assert exit_info.value.code == 2
        assert (f"--out {out} exists and is not empty; give a new folder (or leave --out out for a new one under "
                "runs/), or add --overwrite to replace the results there") in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path / "file"), "--overwrite"])
    assert f"--out {tmp_path / 'file'} is a file; give a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--out", str(tmp_path / "file" / "run")])
    assert exit_info.value.code == 2
    assert (f"--out {tmp_path / 'file' / 'run'} cannot be written: {tmp_path / 'file'} is a file, not a folder"
            in capsys.readouterr().err)
    assert (out / "results.json").read_text() == "{}"
    # --overwrite replaces the results of the run there and leaves other files alone
    (out / "model_epoch3.keras").write_text("old snapshot")
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events.out.tfevents.old").write_text("old")
    results = train.main(TINY + ["--epochs", "1", "--out", str(out), "--overwrite"])
    assert json.loads((out / "results.json").read_text())["val_accuracy"] == results["val_accuracy"]
    assert (out / "notes.txt").read_text() == "mine"
    assert not (out / "model_epoch3.keras").exists() and not (out / "tensorboard" / "events.out.tfevents.old").exists()


def test_a_model_too_large_for_memory_ends_in_one_line(tmp_path, monkeypatch, capsys):
    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[33554432,1024]")

    monkeypatch.setattr(train, "build_model", out_of_memory)
    with pytest.raises(SystemExit) as exit_info:
        train.main(TINY + ["--epochs", "1", "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["tf-sparseconv train: error: --resolution 8: the octnet3 model does not fit in this machine's "
                     "memory; use a lower --resolution or more --rho values (each halves the grid its classifier "
                     "reads)"]
    assert not (tmp_path / "run").exists()


def test_an_out_folder_that_cannot_be_made_ends_in_one_line(tmp_path, monkeypatch, capsys):
    def read_only(out, overwrite):
        raise PermissionError(13, "Permission denied", out)

    monkeypatch.setattr(train, "prepare_out", read_only)  # what no check beforehand sees: a read-only file system
    with pytest.raises(SystemExit) as exit_info:
        train.main(TINY + ["--epochs", "1", "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"tf-sparseconv train: error: --out {tmp_path / 'run'} cannot be "
                                                    "written: Permission denied"]


def test_default_out_is_a_new_folder_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = train.default_out("synthetic", "octnet3")
    assert re.fullmatch(r"runs/synthetic-octnet3-\d{8}-\d{6}", first)
    os.makedirs(first)
    second = train.default_out("synthetic", "octnet3")
    assert second != first and not os.path.exists(second)


def _events(folder):
    """{tag: {step: value}} of the scalar summaries written under folder."""
    scalars = {}
    for name in os.listdir(folder):
        for record in tf.data.TFRecordDataset(os.path.join(folder, name)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name == "scalars"
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def test_a_run_writes_the_serving_model_split_curve_and_tensorboard(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    results = train.main(TINY + ["--epochs", "2", "--snapshot-epochs", "2"])
    printed = capsys.readouterr().out
    (out,) = (tmp_path / "runs").iterdir()
    assert results["out"] == str(out) and out.name.startswith("synthetic-octnet3-")
    assert sorted(os.listdir(out)) == ["model.keras", "model_epoch2.keras", "results.json", "split.json",
                                       "tensorboard", "training_curve.png"]

    # split.json: the held-out examples of the generated data, and what identifies it
    clouds, labels, classes = datasets.make_shapes(num_per_class=6, seed=0)
    split = json.loads((out / "split.json").read_text())
    assert split["dataset"] == "synthetic" and split["data_path"] is None and split["synthetic_per_class"] == 6
    assert split["seed"] == 0 and split["val_fraction"] == 0.1 and split["max_examples"] == 0
    assert split["num_examples"] == 48 and split["labels_sha256"] == train.labels_sha256(labels)
    assert split["classes"] == list(classes)
    val, trained = np.array(split["val_indices"]), np.array(split["train_indices"])
    assert len(val) == 8 and sorted(np.concatenate([val, trained]).tolist()) == list(range(48))
    assert sorted(labels[val].tolist()) == list(range(8))  # one per class

    # model.keras takes point clouds and gives the logits the trained core gives on the training's batches
    model = keras.models.load_model(out / "model.keras")
    core = keras.models.load_model(out / "model_epoch2.keras")
    assert model.output_shape == (None, 8)
    normalized = normalize_point_clouds(clouds[val])
    batches = train.keras_batches(datasets.point_cloud_dataset(normalized, labels[val], 8, 8, shuffle=False))
    expected = core.predict(batches, verbose=0)
    logits = model.predict(clouds[val], verbose=0)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == labels[val]))
    assert accuracy == pytest.approx(results["val_accuracy"])
    # a fresh process needs nothing but `import tf_sparseconv` to load and use it
    np.save(tmp_path / "clouds.npy", clouds[val])
    script = ("import sys, keras, numpy as np, tf_sparseconv\n"
              "model = keras.models.load_model(sys.argv[1])\n"
              "print(' '.join(map(str, np.argmax(model.predict(np.load(sys.argv[2]), verbose=0), -1))))\n")
    done = subprocess.run([sys.executable, "-c", script, str(out / "model.keras"), str(tmp_path / "clouds.npy")],
                          capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(c) for c in np.argmax(logits, -1)]
    # clouds elsewhere and at another scale are normalised as in training, not clipped
    np.testing.assert_allclose(model.predict(clouds[val] * 7.5 + 3.0, verbose=0), logits, rtol=1e-4, atol=1e-4)
    assert model.evaluate(clouds[val], labels[val], verbose=0, return_dict=True)["accuracy"] == pytest.approx(accuracy)

    # the curve and the TensorBoard scalars of both epochs
    assert (out / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = results["history"]
    train_events = _events(out / "tensorboard" / "train")
    for tag, key in (("loss", "loss"), ("accuracy", "accuracy"), ("present_weights", "present_weights"),
                     ("density/sparse_conv1_1", "sparse_conv1_1_density")):
        assert train_events[tag] == pytest.approx({1: history[key][0], 2: history[key][1]}), tag
    assert history["present_weights"] == [results["present_weights"]] * 2
    val_events = _events(out / "tensorboard" / "validation")
    assert val_events["accuracy"] == pytest.approx({1: history["val_accuracy"][0], 2: history["val_accuracy"][1]})
    assert val_events["mean_class_accuracy"] == pytest.approx(
        {1: history["val_mean_class_accuracy"][0], 2: history["val_mean_class_accuracy"][1]})

    # outside a terminal: one short line per epoch, then the summary
    epoch_lines = [line for line in printed.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in epoch_lines] == ["1/2", "2/2"]
    assert all(len(line) < 100 for line in epoch_lines), epoch_lines
    assert re.fullmatch(r"epoch 2/2  loss \d+\.\d{4}  acc \d\.\d{4}  val_loss \d+\.\d{4}  val_acc \d\.\d{4}  "
                        r"val_mean_class \d\.\d{4}  \d+\.\d s", epoch_lines[1])
    assert max(len(line) for line in printed.splitlines()) < 200
    bound = results["memory_bound_bytes"] / 2 ** 20
    assert f"memory bound at batch 8: {bound:.1f} MB for any input" in printed
    assert results["memory_dense_bytes"] > 0 and "against the dense grid's" in printed
    assert results["memory_unbounded_bytes"] > results["memory_bound_bytes"]  # rho 0.5 bounds it
    assert f"tf-sparseconv evaluate {os.path.join('runs', out.name, 'model.keras')} --split val" in printed
    assert f"tf-sparseconv predict {os.path.join('runs', out.name, 'model.keras')} FILE" in printed


def test_a_few_epochs_on_the_built_in_shapes_learn_well_above_chance(tmp_path):
    """16^3 with density bounds (k-selection on), 60 shapes per class, a quarter held out, a
    constant rate: after 4 epochs the validation accuracy was 0.65 (chance: 1/8; 0.59 under
    a cosine schedule, 0.57 with 80 shapes per class: at 16^3 these few shapes overfit)."""
    results = train.main(["--dataset", "synthetic", "--resolution", "16", "--rho", "0.3", "0.6",
                          "--synthetic-per-class", "60", "--val-fraction", "0.25", "--batch-size", "8", "--epochs", "4",
                          "--lr-schedule", "constant", "--out", str(tmp_path / "run")])
    assert results["examples"] == 480 and len(json.loads((tmp_path / "run" / "split.json").read_text())[
        "val_indices"]) == 120
    assert results["val_accuracy"] >= 0.5, results["history"]["val_accuracy"]
    assert results["history"]["loss"][-1] < 0.75 * results["history"]["loss"][0]
    # k-selection held the first block's layers at their bound
    assert all(layer["density"] <= layer["rho_up"] + 1e-6 for layer in results["layers"])


def test_the_main_job_is_octnet3_at_32_with_table4_bounds_on_the_built_in_shapes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = train.parse_args(train.build_parser(), [])
    assert (args.model, args.dataset, args.resolution, args.rho) == ("octnet3", "synthetic", 32, None)
    assert train.DEFAULT_RHOS[32] == (0.14, 0.33, 0.66)
    assert (args.epochs, args.batch_size, args.lr_schedule, args.synthetic_per_class) == (
        train.RECIPES["synthetic"]["epochs"], 8, "cosine", train.DEFAULT_SYNTHETIC_PER_CLASS)
    assert args.out.startswith("runs/synthetic-octnet3-") and not os.path.exists("runs")
    mnist = _npz(tmp_path / "mnist.npz", images=np.zeros([4, 28, 28], np.uint8), labels=np.zeros(4, np.int64))
    other = train.parse_args(train.build_parser(), ["--dataset", "mnist", "--data-dir", mnist])
    assert (other.resolution, other.epochs, other.batch_size, other.lr_schedule) == (28, 8, 32, "constant")
