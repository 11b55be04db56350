"""The Fig. 6 study's bookkeeping (experiments/pruning.py, experiments/summarize.py): run
naming per (lambda, threshold), the comparison against lambda = 0 it reports, and its results
files (the seeds of one figure in one file, one row per line, not overwritten unasked)."""
import argparse
import json
import os
import sys
import types

import pytest

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments")
sys.path.insert(0, EXPERIMENTS)
import common  # noqa: E402
import pruning  # noqa: E402
import summarize  # noqa: E402


def test_each_lambda_trains_once_per_threshold_and_the_baseline_once():
    args = types.SimpleNamespace(lambdas=[0.0, 0.3], prune_eps=[0.01, 0.002], lam_terms=["weights+biases"],
                                 finetune_epochs=[0])
    assert pruning.configurations(args) == {
        "pruning_0.0": (0.0, 0.0, None, 0), "pruning_0.3_eps0.01": (0.3, 0.01, "weights+biases", 0),
        "pruning_0.3_eps0.002": (0.3, 0.002, "weights+biases", 0)}
    one = types.SimpleNamespace(lambdas=[0.0, 0.1], prune_eps=[0.01], lam_terms=["weights"],
                                finetune_epochs=[0])  # names as before
    assert list(pruning.configurations(one)) == ["pruning_0.0", "pruning_0.1"]


def test_runs_carry_the_eq4_terms_in_their_names_only_where_the_study_varies_them():
    args = types.SimpleNamespace(lambdas=[0.0, 0.1], prune_eps=[0.03], lam_terms=["weights+biases", "weights"],
                                 finetune_epochs=[0])
    assert pruning.configurations(args) == {"pruning_0.0": (0.0, 0.0, None, 0),
                                            "pruning_0.1_weights+biases": (0.1, 0.03, "weights+biases", 0),
                                            "pruning_0.1_weights": (0.1, 0.03, "weights", 0)}
    assert pruning.label({"lambda": 0.1, "prune_eps": 0.03, "lam_terms": "weights"}) == "λ = 0.1, ε = 0.03, weights only"
    assert pruning.label({"lambda": 0.1, "prune_eps": 0.03, "lam_terms": "weights+biases"}) == "λ = 0.1, ε = 0.03"
    assert summarize.run_label({"lambda": 0.3, "prune_eps": 0.01, "lam_terms": "weights"}) == "0.3 (ε = 0.01, weights only)"


def test_runs_carry_the_fine_tuning_in_names_where_varied_and_always_in_labels():
    args = types.SimpleNamespace(lambdas=[0.0, 0.3], prune_eps=[0.03], lam_terms=["weights+biases"],
                                 finetune_epochs=[0, 10])
    assert pruning.configurations(args) == {"pruning_0.0": (0.0, 0.0, None, 0),
                                            "pruning_0.3_ft0": (0.3, 0.03, "weights+biases", 0),
                                            "pruning_0.3_ft10": (0.3, 0.03, "weights+biases", 10)}
    one = types.SimpleNamespace(lambdas=[0.3], prune_eps=[0.03], lam_terms=["weights+biases"], finetune_epochs=[10])
    assert pruning.configurations(one) == {"pruning_0.3": (0.3, 0.03, "weights+biases", 10)}
    row = {"lambda": 0.3, "prune_eps": 0.03, "lam_terms": "weights+biases", "finetune_epochs": 10}
    assert pruning.label(row) == "λ = 0.3, ε = 0.03, last 10 epochs fine-tuned"
    assert summarize.run_label(row) == "0.3 (ε = 0.03, last 10 epochs fine-tuned)"
    assert pruning.label({**row, "lam_density": "channel"}) == "λ = 0.3, ε = 0.03, ρ per channel, last 10 epochs fine-tuned"


def rows_of(run, lam, eps, accuracy, cpu_seconds):
    """Two epochs of one run; the last re-timed on a CPU."""
    rows = [{"run": run, "lambda": lam, "prune_eps": eps, "epoch": e, "present_weights": 100, "sec_per_epoch": 9.0,
             "val_accuracy": accuracy, "val_examples": 1000} for e in (1, 2)]
    rows[-1]["retimed"] = [{"device": "CPU (4 cores)", "train_examples": 10, "sec_per_epoch": cpu_seconds,
                            "cpu_sec_per_epoch": 2 * cpu_seconds, "sec_runs": [cpu_seconds],
                            "cpu_sec_runs": [2 * cpu_seconds]}]
    return rows


@pytest.mark.parametrize("accuracy,seconds,met", [(0.80, 3.9, True), (0.80, 4.1, False), (0.75, 3.0, False)])
def test_the_goal_needs_60_percent_less_time_and_accuracy_within_two_standard_errors(accuracy, seconds, met):
    rows = rows_of("pruning_0.3", 0.3, 0.01, accuracy, seconds) + rows_of("pruning_0.0", 0.0, 0.0, 0.81, 10.0)
    assert [run[0]["run"] for run in pruning.runs_of(rows)] == ["pruning_0.0", "pruning_0.3"]
    lines, verdicts = summarize.pruning_table(rows)
    assert verdicts == [met]
    saving = 1 - seconds / 10.0
    assert any(f"{saving:.0%} less time per epoch on CPU (4 cores)" in line for line in lines), lines


def test_layer_table_reads_the_layers_of_each_runs_last_row():
    layers = [{"layer": "sparse_conv1_1", "rho_up": 0.12, "density": 0.0581, "present_weights": 58, "weights": 216}]
    pruned, base = rows_of("pruning_0.3", 0.3, 0.01, 0.8, 4.0), rows_of("pruning_0.0", 0.0, 0.0, 0.81, 10.0)
    pruned[-1]["layers"] = layers
    lines = summarize.layer_table(pruning.runs_of(pruned + base))
    assert "| λ | sparse_conv1_1 |" in lines
    assert "| 0.3 (ε = 0.01) | 58/216 (0.058; 0.12) |" in lines  # the baseline recorded none: no row
    assert not any(line.startswith("| 0.0") for line in lines)
    assert summarize.layer_table(pruning.runs_of(base)) == []


def test_runs_of_keeps_the_seeds_of_one_file_apart():
    rows = [dict(row, seed=seed) for seed in (1, 0) for row in rows_of("pruning_0.3", 0.3, 0.01, 0.8, 4.0)]
    assert [(run[0]["seed"], len(run)) for run in pruning.runs_of(rows)] == [(0, 2), (1, 2)]
    assert list(pruning.seeds_of(rows)) == [0, 1]
    assert list(pruning.seeds_of(rows_of("pruning_0.0", 0.0, 0.0, 0.81, 10.0))) == [0]  # rows naming none


def test_a_seed_replaces_only_its_own_rows_one_row_per_line(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    args = types.SimpleNamespace(results_name="study", seed=1)
    old = [dict(row, seed=seed) for seed in (0, 1, 2) for row in rows_of("pruning_0.0", 0.0, 0.0, 0.81, 10.0)]
    common.write_json("study.json", old)
    new = [dict(row, seed=1) for row in rows_of("pruning_0.3", 0.3, 0.01, 0.8, 4.0)]
    rows = pruning.save_rows(new, args)
    assert rows == old[:2] + new + old[4:]
    text = (tmp_path / "study.json").read_text()
    assert json.loads(text) == rows and len(text.splitlines()) == len(rows) + 2


def test_a_run_that_would_replace_results_needs_replace(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", str(tmp_path))
    common.write_json("study.json", [{"seed": 0}])
    parser = argparse.ArgumentParser()
    common.refuse_to_overwrite(parser, "study.json", False, lambda row: row["seed"] == 1)  # another seed: goes on
    common.refuse_to_overwrite(parser, "study.json", True, lambda row: row["seed"] == 0)
    common.refuse_to_overwrite(parser, "absent.json", False)
    with pytest.raises(SystemExit):
        common.refuse_to_overwrite(parser, "study.json", False, lambda row: row["seed"] == 0)


@pytest.mark.parametrize("accuracy,seconds,met", [(0.80, [3.8, 4.2, 3.4], True), (0.80, [4.2, 4.2, 3.8], False),
                                                  (0.77, [3.0, 3.0, 3.0], False)])
def test_the_pooled_goal_averages_the_seeds_saving_and_pools_their_standard_errors(accuracy, seconds, met):
    seeds = [pruning.runs_of(rows_of("pruning_0.3", 0.3, 0.03, accuracy, s) + rows_of("pruning_0.0", 0.0, 0.0, 0.81, 10.0))
             for s in seconds]
    line, verdict = summarize.pooled_seed_line("16³", seeds, 0)
    assert verdict is met
    saving = sum(1 - s / 10.0 for s in seconds) / 3
    assert f"{saving:.0%} less wall time per epoch on CPU (4 cores) on average" in line, line
    se = ((accuracy * (1 - accuracy) + 0.81 * 0.19) / 1000) ** 0.5  # each seed's; pooled: / sqrt(3)
    assert f"two pooled standard errors: {2 * se / 3 ** 0.5 * 100:.1f} points" in line, line
    assert line.endswith("**goal met**.") is met
    assert summarize.pooled_seed_line("16³", seeds[:1], 0) == ("", None)  # one seed pools nothing
