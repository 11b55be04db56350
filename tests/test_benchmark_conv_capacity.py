"""benchmarks/conv_capacity.py on a small stand-in for the ModelNet40 file: the caps come from
the calibration batches, the held-out batches' counts are checked against them, and a cap
below a held-out batch's live count is counted as refused, never written as a padded length."""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _modelnet_stand_in(path, shapes=12, seed=3):
    """Quantised clouds as modelnet40_train.npz holds them: points on spheres of random radii."""
    rng = np.random.default_rng(seed)
    directions = rng.standard_normal((shapes, 1024, 3))
    directions /= np.linalg.norm(directions, axis=2, keepdims=True)
    clouds = directions * rng.uniform(0.8, 0.95, (shapes, 1, 1))  # batch counts within 1.5x
    points = np.round((clouds + 1.0) / 2.0 * 255).astype(np.uint8)
    np.savez(path, points=points, labels=np.zeros(shapes, np.uint8), classes=np.array(["sphere"]))


def _run(tmp_path, margin):
    _modelnet_stand_in(tmp_path / "modelnet40_train.npz")
    out = tmp_path / f"capacity_{margin}.jsonl"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "benchmarks/conv_capacity.py", "--resolutions", "12", "--batch", "2",
                           "--calibrate", "1", "--held-out", "5", "--margin", str(margin), "--data-dir",
                           str(tmp_path), "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_caps_from_calibration_bound_the_held_out_batches(tmp_path):
    rows = _run(tmp_path, 2.0)
    assert [r["layer"] for r in rows] == [1, 2]
    for row in rows:
        assert row["held_out_batches"] == 5 and row["live_median"] <= row["live_max"] <= row["bound_median"]
        # twice the calibration batch's count holds these spheres: no batch refused
        assert row["overflows"] == 0 and row["capped_length_median"] == row["cap"] < row["bound_median"]
        assert row["cap_mb"] < row["bound_mb"]
    # the second layer's input is the first's padded output: its whole length without caps
    assert rows[1]["in_entries_median"] == rows[0]["bound_median"]


def test_a_cap_below_a_held_out_count_is_refused_and_counted(tmp_path):
    rows = _run(tmp_path, 1.0)
    # the calibration batch's own count as the cap: these held-out batches have more entries in
    # the first layer (the run checks that the capped chain refuses each of them)
    assert rows[0]["overflows"] == rows[0]["held_out_batches"] == 5
    for row in rows:
        assert (row["overflows"] > 0) == (row["live_max"] > row["cap"])
    # every batch refused: no capped length to report
    assert rows[0]["capped_length_median"] is None and rows[0]["cap_mb"] is None
