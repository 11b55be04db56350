"""ModelNet40 study's bookkeeping (experiments/modelnet40.py, issue 27): its recipes are
valid training commands on the test-balanced validation split, the rows it writes carry the
issue's schema (the voted scores where a run voted, the exact command), earlier rows are
migrated without losing a value, and test scores are attached to their run's row."""
import json
import os
import shlex
import sys

import pytest
import tensorflow as tf

from tf_sparseconv.training import train

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
sys.path.insert(0, EXPERIMENTS)
import common  # noqa: E402
import modelnet40  # noqa: E402
import summarize  # noqa: E402


def results_json(vote="none", model="octnet3"):
    """A results.json of tf-sparseconv train as main() writes it, with distinct numbers."""
    voted = vote != "none"
    return {"dataset": "modelnet40", "model": model, "resolution": 32, "epochs": 3, "examples": 9843,
            "batch_size": 32, "features": ["occupancy", "offset"], "augment": "rotate12" if voted else None,
            "val_split": "modelnet40-test", "val_fraction": None, "val_per_class": 50, "val_max_fraction": 0.25,
            "val_examples": 1191, "val_overall": 0.81, "val_mean_class": 0.71, "val_overall_test_weighted": 0.79,
            "val_overall_test_weighted_se": 0.012, "vote": vote,
            "val_overall_vote": 0.84 if voted else None, "val_mean_class_vote": 0.74 if voted else None,
            "val_overall_test_weighted_vote": 0.83 if voted else None,
            "val_overall_test_weighted_se_vote": 0.011 if voted else None,
            "memory_bound_bytes": None if model == "site-resnet" else 453983004,
            "memory_bound_note": "not computed" if model == "site-resnet" else None,
            "sec_per_epoch": [20.0, 13.0, 14.0], "device": "GPU: NVIDIA H200", "peak_rss_bytes": 2 ** 31,
            "peak_gpu_bytes": 2 ** 29, "command": "tf-sparseconv train --dataset modelnet40 --vote " + vote,
            "history": {"val_accuracy": [0.6, 0.7, 0.81], "val_mean_class_accuracy": [0.5, 0.6, 0.71],
                        "val_test_weighted_accuracy": [0.58, 0.69, 0.79]}}


@pytest.mark.parametrize("name", list(modelnet40.RECIPES))
def test_each_recipe_is_a_training_command_on_the_test_balanced_split(name):
    args = train.build_parser().parse_args(modelnet40.train_args(name, {}, "data", backup_root="/b"))
    assert (args.dataset, args.val_split, args.val_per_class) == ("modelnet40", "modelnet40-test", 50)
    assert args.lr_schedule == "cosine" and args.backup_dir == os.path.join("/b", name)
    assert args.model == ("site-resnet" if name.startswith("site") else "octnet3")
    assert args.resolution == (64 if "-64" in name else 32)
    smoke = train.build_parser().parse_args(modelnet40.train_args(name, {"--epochs": 1, "--resolution": 16}))
    assert (smoke.epochs, smoke.resolution) == (1, 16)  # the overrides come last and win


def test_a_row_has_the_issue_schema_and_the_voted_scores_where_the_run_voted():
    plain = modelnet40.result_row("octnet3-32", results_json())
    assert set(modelnet40.ROW_KEYS) <= set(plain)
    assert (plain["val_overall"], plain["val_mean_class"], plain["val_overall_test_weighted"]) == (0.81, 0.71, 0.79)
    assert plain["vote"] == "none" and "val_overall_unvoted" not in plain
    assert plain["train_s_per_epoch"] == pytest.approx(13.5)  # the first epoch (tracing) left out
    assert plain["command"] == "tf-sparseconv train --dataset modelnet40 --vote none"
    assert plain["reproduce"] is None  # not a recipe's command
    assert plain["val_split"] == "modelnet40-test 50 (at most 0.25 of a class)"
    assert plain["val_mean_class_per_epoch"] == [0.5, 0.6, 0.71]
    voted = modelnet40.result_row("octnet3-32-rotate12", results_json("rotations-12"))
    assert (voted["val_overall"], voted["val_mean_class"], voted["val_overall_test_weighted"],
            voted["val_overall_test_weighted_se"]) == (0.84, 0.74, 0.83, 0.011)
    assert (voted["val_overall_unvoted"], voted["val_mean_class_unvoted"]) == (0.81, 0.71)
    assert voted["vote"] == "rotations-12"
    site = modelnet40.result_row("site-resnet-32", results_json(model="site-resnet"))
    assert site["model"] == "site-resnet" and site["memory_bound_bytes"] is None and site["memory_bound_note"]


def test_a_recorded_command_is_matched_to_its_recipe_and_overrides():
    def recorded(name, overrides):
        flags = modelnet40.train_args(name, overrides, ".devdata", backup_root="/tmp/b")
        return shlex.join(["tf-sparseconv", "train", *flags, "--overwrite", "--out", "/tmp/r/" + name])

    assert modelnet40.reproducing_command(recorded("site-resnet-32", {})) == \
        "python experiments/modelnet40.py --run site-resnet-32"
    assert modelnet40.reproducing_command(recorded("octnet3-32", {"--epochs": 1, "--resolution": 16})) == \
        "python experiments/modelnet40.py --run octnet3-32 --epochs 1 --resolution 16"
    changed = recorded("octnet3-32", {}).replace("--weight-decay 0.5", "--weight-decay 0.2")
    assert modelnet40.reproducing_command(changed) is None


def test_earlier_rows_are_migrated_keeping_every_value():
    old = {"resolution": 32, "epochs": 40, "val_accuracy": 0.9035, "sec_per_epoch": 28.3, "peak_bytes": 3e9,
           "memory_bound_bytes": 453983004, "examples": 9843, "batch_size": 32, "rhos": [0.14, 0.33, 0.66],
           "device": "GPU: NVIDIA H200", "recipe": "adam lr 0.001 cosine", "val_accuracy_per_epoch": [0.8, 0.9035],
           "val_accuracy_mirror_vote": 0.9045, "note": "n"}
    new = modelnet40.migrated_row(old)
    assert set(modelnet40.ROW_KEYS) <= set(new)
    assert (new["val_overall"], new["train_s_per_epoch"], new["val_overall_mirror_vote"]) == (0.9035, 28.3, 0.9045)
    assert new["val_overall_per_epoch"] == [0.8, 0.9035] and new["val_split"] == "stratified 0.1"
    assert (new["model"], new["vote"], new["val_mean_class"], new["command"]) == ("octnet3", "none", None, None)
    assert all(new[k] == old[k] for k in ("peak_bytes", "examples", "rhos", "recipe", "note", "device"))
    assert modelnet40.migrated_row(new) == new


def test_the_committed_results_file_is_in_the_schema_and_renders():
    rows = common.read_json("modelnet40.json")
    assert rows and all(set(modelnet40.ROW_KEYS) <= set(row) for row in rows)
    lines = summarize.modelnet_section(rows)
    assert any("Earlier runs" in line for line in lines)


def test_added_runs_and_test_scores_land_in_their_rows(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(results_json("mirror")))
    (run / "model.keras").write_bytes(b"model")
    (run / "split.json").write_text("{}")
    kept = tmp_path / "models"
    modelnet40.main(["--add-results", "octnet3-32", str(run / "results.json"), "--keep-models", str(kept),
                     "--note", "two calls"])
    rows = common.read_json("modelnet40.json")
    assert len(rows) == 1 and rows[0]["vote"] == "mirror" and rows[0]["note"] == "two calls"
    assert rows[0]["model_file"] == str(kept / "octnet3-32" / "model.keras")
    assert (kept / "octnet3-32" / "model.keras").read_bytes() == b"model"
    modelnet40.main(["--add-results", "octnet3-32", str(run / "results.json")])  # the same run again: replaced
    assert len(common.read_json("modelnet40.json")) == 1
    metrics = {"overall_accuracy": 0.88, "mean_class_accuracy": 0.84, "examples": 2468, "vote": "mirror",
               "data": "/data/ModelNet40"}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    modelnet40.main(["--add-test", "octnet3-32", str(tmp_path / "metrics.json")])
    row = common.read_json("modelnet40.json")[0]
    assert (row["test_overall"], row["test_mean_class"], row["test_examples"], row["test_data"]) == \
        (0.88, 0.84, 2468, "ModelNet40")
    lines = summarize.modelnet_section(common.read_json("modelnet40.json"))
    row = "| octnet3-32 | octnet3 | 32³ | 3 | 9843 | mirror | 0.840 | 0.740 | 0.830 ± 0.011 | 0.880 / 0.840 | ≥ 0.9 |"
    assert any(row in line for line in lines), lines
    with pytest.raises(SystemExit, match="no row of recipe site-resnet-32"):
        modelnet40.main(["--add-test", "site-resnet-32", str(tmp_path / "metrics.json")])
    # a final model (the recipe on every training shape): its own row and table, no validation scores
    final_command = "tf-sparseconv train " + shlex.join(modelnet40.train_args("octnet3-32", {}, final=True)
                                                        + ["--out", "/tmp/x"])
    assert "--val-split none" in final_command and "--val-per-class" not in final_command
    assert "--vote" not in shlex.join(modelnet40.train_args("site-resnet-32-mirror", {}, final=True))
    final = dict(results_json(), val_split="none", val_overall=None, val_mean_class=None, val_examples=0,
                 command=final_command)
    (tmp_path / "final.json").write_text(json.dumps(final))
    modelnet40.main(["--add-results", "octnet3-32", str(tmp_path / "final.json")])
    row = [r for r in common.read_json("modelnet40.json") if r.get("final_of")][0]
    assert (row["run"], row["val_split"], row["val_overall"]) == ("octnet3-32-final", "none (every training shape)",
                                                                  None)
    assert row["reproduce"] == "python experiments/modelnet40.py --final octnet3-32"
    modelnet40.main(["--add-test", "octnet3-32-final", str(tmp_path / "metrics.json")])
    lines = summarize.modelnet_section(common.read_json("modelnet40.json"))
    assert any(line.startswith("| octnet3-32-final | octnet3-32 | 32³ | 3 | 0.880 / 0.840 |") for line in lines), lines
    capsys.readouterr()
    modelnet40.main(["--list"])
    listed = capsys.readouterr().out
    assert all(f"{name}: " in listed for name in modelnet40.RECIPES)
    assert "tf-sparseconv train --dataset modelnet40 --val-split modelnet40-test" in listed


def test_an_ensemble_row_takes_its_scores_from_evaluate_and_the_rest_from_its_members(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    name = "octnet3-32-ensemble4"
    members = modelnet40.ENSEMBLES[name][1]
    models = tmp_path / "models"
    for i, member in enumerate(members):
        run = tmp_path / member
        run.mkdir()
        validated = dict(results_json(), val_overall=0.80 + i / 100, memory_bound_bytes=10 + i,
                         sec_per_epoch=[20.0, 10.0 + i])
        (run / "results.json").write_text(json.dumps(validated))
        modelnet40.main(["--add-results", member, str(run / "results.json")])
        final = tmp_path / f"{member}-final"
        final.mkdir()
        (final / "results.json").write_text(json.dumps(dict(results_json(), val_split="none", val_overall=None)))
        for filename in ("model.keras", "split.json"):
            (final / filename).write_text("x")
        modelnet40.main(["--add-results", member, str(final / "results.json"), "--keep-models", str(models)])
    metrics = {"split": "val", "models": [f"{m}/model.keras" for m in members], "examples": 1191,
               "overall_accuracy": 0.893, "mean_class_accuracy": 0.861, "vote": "none"}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    modelnet40.main(["--add-ensemble", name, str(tmp_path / "metrics.json"), "--note", "CPU"])
    [row] = [r for r in common.read_json("modelnet40.json") if r["run"] == name]
    assert set(modelnet40.ROW_KEYS) <= set(row)
    assert (row["val_overall"], row["val_mean_class"], row["members"], row["note"]) == (0.893, 0.861, members, "CPU")
    assert row["member_val_overall"] == pytest.approx([0.80, 0.81, 0.82, 0.83])
    assert row["memory_bound_bytes"] == 13  # the members run one after another: the largest one's
    assert row["train_s_per_epoch"] == pytest.approx(10 + 11 + 12 + 13)
    assert row["model_file"] == [str(models / f"{m}-final" / "model.keras") for m in members]
    assert row["reproduce"].startswith("tf-sparseconv evaluate runs/modelnet40/octnet3-32/model.keras")
    lines = summarize.modelnet_section(common.read_json("modelnet40.json"))
    assert any(line.startswith(f"| {name} | octnet3 ensemble of 4 | 32³ |") for line in lines), lines
    with pytest.raises(SystemExit, match="on the validation split"):
        (tmp_path / "test.json").write_text(json.dumps(dict(metrics, split="all")))
        modelnet40.main(["--add-ensemble", name, str(tmp_path / "test.json")])
    with pytest.raises(SystemExit, match="not an ensemble"):
        modelnet40.main(["--add-ensemble", "octnet3-32", str(tmp_path / "metrics.json")])


def test_an_ensemble_is_built_into_one_model_from_its_members_finals(tmp_path, monkeypatch):
    import keras
    import numpy as np
    from tf_sparseconv.data import make_shapes
    from tf_sparseconv.models import load_model, octnet3, point_cloud_classifier, save_model

    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    name = "octnet3-32-ensemble4"
    members = modelnet40.ENSEMBLES[name][1]
    clouds, _, classes = make_shapes(num_per_class=2, num_points=64, seed=0)
    finals, models = [], []
    for i, member in enumerate(members):
        keras.utils.set_random_seed(i)
        model = point_cloud_classifier(octnet3(8, len(classes), rhos=(1.0,), fc_units=8), 8, class_names=classes,
                                       points_per_cloud=64)
        folder = tmp_path / "kept" / f"{member}-final"
        folder.mkdir(parents=True)
        save_model(model, folder / "model.keras")
        (folder / "split.json").write_text(json.dumps({"seed": 0, "classes": classes}))
        finals.append(str(folder / "model.keras"))
        models.append(model)
    row = {"run": name, "model_file": finals, "batch_size": 4, "device": "cpu", "examples": 9843,
           "val_split": "modelnet40-test 50", "resolution": 32, "epochs": 30, "val_overall": 0.9,
           "val_mean_class": 0.8, "model": "octnet3 ensemble of 4", "vote": "none", "train_s_per_epoch": 1.0}
    common.replace_rows("modelnet40.json", [row], lambda r: True)
    with pytest.raises(SystemExit, match="--keep-models"):
        modelnet40.main(["--build-ensemble", name])
    modelnet40.main(["--build-ensemble", name, "--keep-models", str(tmp_path / "models")])
    [built] = [r for r in common.read_json("modelnet40.json") if r["run"] == name]
    assert built["model_file"] == str(tmp_path / "models" / name / "model.keras")
    assert built["member_files"] == finals and built["memory_bound_bytes"] > 0
    assert json.loads((tmp_path / "models" / name / "split.json").read_text())["classes"] == list(classes)
    ensemble = load_model(built["model_file"])
    want = np.mean([keras.ops.convert_to_numpy(keras.ops.softmax(m.predict(clouds, verbose=0))) for m in models], 0)
    got = keras.ops.convert_to_numpy(keras.ops.softmax(ensemble.predict(clouds, verbose=0)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def evaluate_metrics(confusion, vote, classes):
    """tf-sparseconv evaluate's metrics.json on a validation split, from its confusion matrix."""
    confusion = [list(row) for row in confusion]
    examples = sum(map(sum, confusion))
    correct = sum(confusion[i][i] for i in range(len(confusion)))
    per_class = [row[i] / sum(row) for i, row in enumerate(confusion)]
    return {"split": "val", "vote": vote, "classes": classes, "examples": examples, "correct": correct,
            "overall_accuracy": correct / examples, "mean_class_accuracy": sum(per_class) / len(per_class),
            "confusion_matrix": confusion, "models": ["model.keras"]}


def test_a_run_without_its_results_json_is_added_from_evaluate_on_its_validation_split(tmp_path, monkeypatch):
    import numpy as np
    from tf_sparseconv.training.metrics import class_accuracies

    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    classes = ["airplane", "bathtub", "bed"]  # 100, 50 and 100 shapes in the official test split
    run = tmp_path / "octnet3-32-rotate12"
    run.mkdir()
    (run / "model.keras").write_text("x")
    split = {"val_split": "modelnet40-test", "val_per_class": 50, "val_max_fraction": 0.25, "num_examples": 9843,
             "val_indices": list(range(30))}
    (run / "split.json").write_text(json.dumps(split))
    voted = [[9, 1, 0], [2, 7, 1], [0, 0, 10]]
    plain = [[8, 1, 1], [3, 6, 1], [1, 0, 9]]
    for name, matrix, vote in (("voted.json", voted, "rotations-12"), ("plain.json", plain, "none")):
        (tmp_path / name).write_text(json.dumps(evaluate_metrics(matrix, vote, classes)))
    kept = tmp_path / "kept"
    modelnet40.main(["--add-evaluated", "octnet3-32-rotate12", str(run), str(tmp_path / "voted.json"),
                     str(tmp_path / "plain.json"), "--keep-models", str(kept), "--note", "lost"])
    [row] = [r for r in common.read_json("modelnet40.json") if r["run"] == "octnet3-32-rotate12"]
    assert set(modelnet40.ROW_KEYS) <= set(row)
    assert (row["val_overall"], row["val_overall_unvoted"]) == (pytest.approx(26 / 30), pytest.approx(23 / 30))
    assert row["val_mean_class"] == pytest.approx((0.9 + 0.7 + 1.0) / 3)
    assert row["val_overall_test_weighted"] == pytest.approx((100 * 0.9 + 50 * 0.7 + 100 * 1.0) / 250)
    labels = np.repeat([0, 1, 2], 10)
    predicted = np.array([0] * 9 + [1] + [0] * 2 + [1] * 7 + [2] + [2] * 10)
    expected = class_accuracies(labels, predicted, 3, [100, 50, 100])
    assert row["val_overall_test_weighted_se"] == pytest.approx(expected["weighted_se"])
    assert (row["vote"], row["epochs"], row["augment"]) == ("rotations-12", 60, "rotate12")
    assert row["features"] == ["occupancy", "offset"]
    assert row["val_split"] == "modelnet40-test 50 (at most 0.25 of a class)"
    assert row["train_s_per_epoch"] is None and row["memory_bound_bytes"] is None and row["note"] == "lost"
    assert row["reproduce"] == "python experiments/modelnet40.py --run octnet3-32-rotate12"
    assert row["model_file"] == str(kept / "octnet3-32-rotate12" / "model.keras")
    assert sorted(os.listdir(kept / "octnet3-32-rotate12")) == ["model.keras", "split.json"]
    with pytest.raises(SystemExit, match="--vote rotations-12"):  # the recipe's vote is missing
        modelnet40.main(["--add-evaluated", "octnet3-32-rotate12", str(run), str(tmp_path / "plain.json")])
    split["val_indices"] = list(range(31))
    (run / "split.json").write_text(json.dumps(split))
    with pytest.raises(SystemExit, match="examples differ"):
        modelnet40.main(["--add-evaluated", "octnet3-32-rotate12", str(run), str(tmp_path / "voted.json")])


def test_a_voting_ensemble_checks_its_vote_and_falls_back_to_its_kept_validated_members(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    monkeypatch.setattr(modelnet40, "REPO", str(tmp_path))
    name = "mixed-32-ensemble2"
    members = modelnet40.ENSEMBLES[name][1]
    assert modelnet40.ENSEMBLES[name][2] == "mirror"
    for member in members:
        run = tmp_path / "runs" / member
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(results_json()))
        for filename in ("model.keras", "split.json"):
            (run / filename).write_text("x")
        modelnet40.main(["--add-results", member, str(run / "results.json"), "--keep-models",
                         str(tmp_path / "kept")])
    metrics = {"split": "val", "models": ["a", "b"], "examples": 1191, "overall_accuracy": 0.9,
               "mean_class_accuracy": 0.87, "vote": "mirror"}
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    modelnet40.main(["--add-ensemble", name, str(tmp_path / "metrics.json")])
    [row] = [r for r in common.read_json("modelnet40.json") if r["run"] == name]
    assert row["vote"] == "mirror" and row["reproduce"].endswith("--split val --vote mirror")
    assert row["member_models"] == "validated"
    assert row["model_file"] == [os.path.join("kept", m, "model.keras") for m in members]
    (tmp_path / "none.json").write_text(json.dumps(dict(metrics, vote="none")))
    with pytest.raises(SystemExit, match="scored with --vote mirror"):
        modelnet40.main(["--add-ensemble", name, str(tmp_path / "none.json")])


@pytest.mark.parametrize("model", [["--rho", "0.5", "0.5"], ["--model", "site-resnet", "--site-channels", "8", "16",
                                                             "--site-blocks", "1", "--points", "64"]])
def test_a_bound_filled_from_a_command_is_the_one_train_reported(tmp_path, model):
    from tf_sparseconv.models.memory_bound import _worker_threads

    results = train.main(["--dataset", "synthetic", "--resolution", "8", "--synthetic-per-class", "6",
                          "--batch-size", "8", "--epochs", "1", *model, "--out", str(tmp_path / "run")])
    # train bounds the device it trained on: the GPU where one is visible.
    device = "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    bound, sites = modelnet40.training_bound(results["command"], device, _worker_threads(), results["num_classes"])
    assert bound == results["memory_bound_bytes"] and sites == results["memory_bound_sites_per_sample"]
    assert modelnet40.training_bound(results["command"], "cpu", 64, results["num_classes"])[0] > \
        modelnet40.training_bound(results["command"], "cpu", 2, results["num_classes"])[0]


def test_fill_bounds_fills_runs_without_one_and_then_their_ensembles(monkeypatch):
    monkeypatch.setattr(modelnet40, "training_bound", lambda command, device, threads: (
        {"a": 100, "b": 300}[command.split()[-1]], 1024 if command.endswith("b") else None))
    rows = [{"run": "a", "val_overall": 0.8, "memory_bound_bytes": None, "command": "tf-sparseconv train a",
             "device": "CPU (2 cores)"},
            {"run": "b", "val_overall": 0.8, "memory_bound_bytes": None, "command": "tf-sparseconv train b",
             "memory_bound_note": "not computed"},
            {"run": "c", "val_overall": 0.8, "memory_bound_bytes": 7, "command": "tf-sparseconv train c"},
            {"run": "e", "members": ["a", "b"], "memory_bound_bytes": None, "command": None}]
    a, b, c, e = modelnet40.filled_bounds(rows)
    assert (a["memory_bound_bytes"], b["memory_bound_bytes"], c["memory_bound_bytes"]) == (100, 300, 7)
    assert "cpu kernels" in a["memory_bound_from"] and "gpu kernels" in b["memory_bound_from"]
    assert b["memory_bound_sites_per_sample"] == 1024 and "memory_bound_note" not in b
    assert "memory_bound_from" not in c and e["memory_bound_bytes"] == 300
    assert rows[0]["memory_bound_bytes"] is None  # the rows given are left as they were


def test_the_summary_names_the_best_validated_kept_model_of_each_resolution_as_chosen(tmp_path):
    def row(run, resolution, val, vote="none", members=1):
        files = []
        for i in range(members):
            (tmp_path / f"{run}-{i}.keras").write_text("x")
            files.append(str(tmp_path / f"{run}-{i}.keras"))
        return dict(result_row(run, resolution, val), vote=vote, model_file=files if members > 1 else files[0])

    def result_row(run, resolution, val):
        r = modelnet40.result_row(run, dict(results_json(), resolution=resolution, val_overall=val))
        return dict(r, val_overall=val)

    rows = [row("a", 32, 0.88), row("ens", 32, 0.90, "mirror", members=3), row("b", 32, 0.89), row("c", 64, 0.87)]
    lines = summarize.modelnet_section(rows)
    text = "\n".join(lines)
    chosen = text[text.index("The chosen model of each resolution"):text.index("The other kept models")]
    assert "# ens" in chosen and "--vote mirror" in chosen and "# c" in chosen
    assert "# a" not in chosen and "# b" not in chosen
    others = text[text.index("The other kept models"):]
    assert "# a" in others and "# b" in others
