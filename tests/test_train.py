"""The OctNet3 builder (Table 4) and the training entry point, end to end on small data."""
import json
import os

import keras
import numpy as np
import pytest

from tf_sparseconv import keras_layers as kl
from tf_sparseconv import train
from tf_sparseconv.models import octnet3

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.mark.parametrize("resolution,sparse_convs,dense_convs", [(16, 6, 0), (32, 9, 3), (64, 9, 6)])
def test_octnet3_follows_table4(resolution, sparse_convs, dense_convs):
    model = octnet3(resolution, 40)
    layers = model.layers
    assert sum(isinstance(layer, kl.SparseConv) for layer in layers) == sparse_convs
    assert sum(isinstance(layer, keras.layers.Conv3D) for layer in layers) == dense_convs
    assert model.output_shape == (None, 40)
    bounds = sorted({layer.rho_up for layer in layers if isinstance(layer, kl.SparseConv) and layer.rho_up})
    assert bounds == sorted({rho for rho in {16: (), 32: (0.14, 0.33, 0.66), 64: (0.06, 0.14, 0.33)}[resolution]})


def test_octnet3_64_keeps_its_signal_only_with_he_initialisation():
    # Glorot halves the signal at every ReLU layer: after the 15 convolutions of the 64^3
    # net the logits are ~5e-4 on ModelNet40 and Adam then stays at the majority class.
    # He initialisation (the default) keeps them at order 0.1-1.
    import tensorflow as tf

    from tf_sparseconv import data as datasets
    from tf_sparseconv.train import keras_batches
    clouds, labels, _ = datasets.make_shapes(num_per_class=1, seed=3)
    x, _ = next(iter(keras_batches(datasets.point_cloud_dataset(clouds[:4], labels[:4], 64, 4, shuffle=False))))
    spread = {}
    for init in ("he_normal", "glorot_uniform"):
        keras.utils.set_random_seed(0)
        spread[init] = float(tf.math.reduce_std(octnet3(64, 40, kernel_initializer=init)(x, training=False)))
    assert spread["he_normal"] > 0.05 and spread["glorot_uniform"] < 0.005, spread
    keras.utils.set_random_seed(0)
    default = float(tf.math.reduce_std(octnet3(64, 40)(x, training=False)))
    assert default == pytest.approx(spread["he_normal"])


def test_octnet3_for_mnist_is_two_dimensional():
    model = octnet3(28, 10, rhos=(0.05, 0.1), spatial_dims=2)
    assert all(layer.kernel.shape[:2] == (3, 3) for layer in model.layers if isinstance(layer, kl.SparseConv))
    assert model.output_shape == (None, 10)


def test_octnet3_rejects_resolution_not_divisible_by_its_pools():
    with pytest.raises(ValueError, match="not divisible"):
        octnet3(18, 10, rhos=(0.1, 0.1, 0.1))


def test_train_on_synthetic_writes_results_and_a_loadable_model(tmp_path, capsys):
    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--epochs", "2",
                          "--synthetic-per-class", "6", "--batch-size", "8", "--lam", "0.1", "--prune-eps", "0.01",
                          "--vote-mirror", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "validation accuracy" in printed and "forward pass at batch 8" in printed
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


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "mnist_train.npz")), reason="../shared/data is absent")
def test_train_on_thresholded_mnist_subset(tmp_path):
    results = train.main(["--dataset", "mnist", "--data-dir", DATA, "--max-examples", "300", "--epochs", "1",
                          "--batch-size", "50", "--rho", "0.05", "0.1", "--out", str(tmp_path)])
    assert results["resolution"] == 28 and 0.0 <= results["val_accuracy"] <= 1.0


class _MeanXModel:
    """Logits [mean x + mean normal x, 0.5] per cloud: the first class wins where x leans positive."""

    def predict(self, clouds, verbose=0):
        x = clouds[..., 0].mean(axis=1) + (clouds[..., 3].mean(axis=1) if clouds.shape[-1] >= 6 else 0.0)
        return np.stack([x, np.full_like(x, 0.5)], axis=-1)


@pytest.mark.parametrize("columns", [3, 6])
def test_mirror_vote_averages_the_softmax_of_a_cloud_and_its_mirror_image(columns):
    clouds = np.zeros([3, 4, columns], np.float32)
    clouds[0, :, 0] = 3.0  # [3, .5]: p0 0.924; mirrored [-3, .5]: p0 0.029; mean 0.476 -> class 1
    clouds[1, :, 0] = 0.1  # [.1, .5] and [-.1, .5]: class 1 both ways
    if columns == 6:
        # [2, .5]: p0 0.818; with the normal mirrored too [-2, .5]: p0 0.076 -> class 1
        # (mirroring x alone would repeat [2, .5] and vote class 0)
        clouds[2, :, 3] = 2.0
    before = clouds.copy()
    labels = np.array([1, 1, 1])
    model = _MeanXModel()
    plain = np.mean(np.argmax(model.predict(clouds), axis=-1) == labels)
    assert plain == pytest.approx(1 / 3 if columns == 6 else 2 / 3)
    assert train.mirror_vote_accuracy(model, lambda view: view, clouds, labels) == pytest.approx(1.0)
    np.testing.assert_array_equal(clouds, before)  # the caller's clouds are not mirrored in place


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
    model = keras.models.load_model(tmp_path / "model.keras")
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
    model = keras.models.load_model(tmp_path / "model.keras")
    first = next(layer for layer in model.layers if isinstance(layer, kl.SparseConv))
    assert tuple(first.kernel.shape)[-2] == 4  # occupancy + 3 offsets in


def test_vote_mirror_is_refused_for_mnist(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train.main(["--dataset", "mnist", "--vote-mirror", "--out", str(tmp_path)])
    assert "--vote-mirror applies to point clouds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main(["--dataset", "mnist", "--features", "occupancy", "offset", "--out", str(tmp_path)])
    assert "--features applies to point clouds" in capsys.readouterr().err


def test_train_names_a_missing_dataset_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train.main(["--dataset", "scannet", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path)])


def test_backup_dir_resumes_from_the_last_finished_epoch(tmp_path, capsys):
    common = ["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--synthetic-per-class", "6",
              "--batch-size", "8", "--backup-dir", str(tmp_path / "backup")]
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
    argv = ["--dataset", "synthetic", "--lam", "0.3", "--backup-dir", str(tmp_path)]
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
    argv = ["--dataset", "synthetic", "--backup-dir", str(tmp_path)]
    old = {k: v for k, v in vars(train.parse_args(parser, argv)).items()
           if k not in train.RESUMABLE_CHANGES and k not in ("lam_terms", "finetune_epochs", "lam_density")}
    assert old["lam_reduction"] == "sum"
    (tmp_path / "run_args.json").write_text(json.dumps(old))
    train.prepare_backup_dir(parser, train.parse_args(parser, argv))


def test_cosine_schedule_decays_to_zero_and_fixes_the_epochs_of_a_backup(tmp_path, capsys):
    common = ["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--synthetic-per-class", "6",
              "--batch-size", "8", "--lr-schedule", "cosine", "--augment", "mirror",
              "--backup-dir", str(tmp_path / "backup")]
    results = train.main(common + ["--epochs", "2", "--out", str(tmp_path / "a")])
    assert results["lr_schedule"] == "cosine" and results["augment"] == "mirror" and results["device"]
    model = keras.models.load_model(tmp_path / "a" / "model.keras")
    # 8 classes x 6 shapes, one per class held out: 40 training shapes, 5 batches an epoch
    assert int(model.optimizer.iterations.numpy()) == 10
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.0, abs=1e-9)
    capsys.readouterr()
    # the schedule spans the planned epochs, so a resumed run may not change them
    with pytest.raises(SystemExit):
        train.main(common + ["--epochs", "3", "--out", str(tmp_path / "b")])
    assert "epochs: 2 there, 3 now" in capsys.readouterr().err


def test_smoothed_crossentropy_matches_its_definition():
    from tf_sparseconv.losses import SmoothedSparseCrossentropy
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
                          "--label-smoothing", "0.1", "--out", str(tmp_path)])
    assert results["weight_decay"] == 0.05 and results["label_smoothing"] == 0.1
    model = keras.models.load_model(tmp_path / "model.keras")  # the smoothed loss deserialises
    assert model.loss.label_smoothing == pytest.approx(0.1)
    for flags, message in ((["--weight-decay", "-1"], "--weight-decay must be >= 0"),
                           (["--label-smoothing", "1"], "--label-smoothing must be in")):
        with pytest.raises(SystemExit):
            train.main(["--dataset", "synthetic", *flags, "--out", str(tmp_path)])
        assert message in capsys.readouterr().err
