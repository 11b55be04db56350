"""benchmarks/site_e2e_gpu.py and site_networks.py: the networks' structure (every step reads
tensors made before it, channel counts agree, the stages issue 24 names), a small CPU run of
our phase (the exchange spconv's side reads: inputs, batch-norm statistics, outputs at the
input sites, a gradient per convolution) and the merge into issue 24's row keys."""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import site_networks  # noqa: E402
from site_scenes import CHAIN, LAYERS  # noqa: E402


def channels_of(steps, in_channels):
    """{tensor: channels}, checking each step's input channels against its producer's."""
    width = {"x": in_channels}
    for step in steps:
        op, out = step[0], step[1]
        assert out not in width, f"{out} is written twice"
        if op == "conv":
            _, _, src, kind, cin, cout, k, key = step
            assert width[src] == cin, step
            assert (kind, k) in (("subm", 3), ("subm", 1), ("down", 2), ("inv", 2)), step
            width[out] = cout
        elif op == "bn":
            assert width[step[2]] == step[3], step
            width[out] = step[3]
        elif op == "relu":
            width[out] = width[step[2]]
        elif op == "add":
            assert width[step[2]] == width[step[3]], step
            width[out] = width[step[2]]
        else:
            assert op == "concat", step
            width[out] = width[step[2]] + width[step[3]]
    return width


def test_resunet42_has_the_stages_issue_24_names():
    steps = site_networks.resunet42()
    width = channels_of(steps, 4)
    convs = [s for s in steps if s[0] == "conv"]
    assert len(convs) == 49
    assert [s[5] for s in convs if s[3] == "down"] == [32, 32, 64, 128]  # the width of the stage before
    assert [s[5] for s in convs if s[3] == "inv"] == [256, 128, 96, 96]
    assert width[steps[-1][1]] == 96
    assert width["stem2"] == 32 and [width[f"enc{i}_res2"] for i in range(1, 5)] == [32, 64, 128, 256]
    # each inverse convolution goes back through the strided one of its level
    downs = {s[7]: s for s in convs if s[3] == "down"}
    assert sorted(s[7] for s in convs if s[3] == "inv") == sorted(downs)
    assert len({s[7] for s in convs}) == 14
    assert sum(s[0] == "bn" for s in steps) == 49


def test_unet5_is_the_chain_with_its_weights():
    steps = site_networks.unet5()
    channels_of(steps, 64)
    spec = {name: (kind, cin, cout, k, key) for name, kind, _, cin, cout, k, _, key in LAYERS}
    assert [s[3:] for s in steps] == [spec[n] for n in CHAIN]
    weights = site_networks.conv_weights("unet5", steps)
    again = site_networks.conv_weights("unet5", steps)
    assert all(np.array_equal(weights[k], again[k]) for k in weights)
    assert weights["c0"].shape == (3, 3, 3, 64, 64) and weights["c1"].shape == (2, 2, 2, 64, 128)


def test_a_small_cpu_run_writes_the_exchange_and_merges_into_rows(tmp_path):
    exchange = tmp_path / "x"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "benchmarks/site_e2e_gpu.py", "--phase", "ours", "--tiny", "--dtypes",
                           "fp32", "--networks", "unet5_lidar_5cm", "resunet42_lidar_5cm_b2", "--warmup", "0",
                           "--reps", "1", "--exchange", str(exchange)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ours = json.loads((exchange / "ours.json").read_text())
    assert [(r["network"], r["pass"]) for r in ours["rows"]] == [
        ("unet5_lidar_5cm", "fwd"), ("unet5_lidar_5cm", "train"),
        ("resunet42_lidar_5cm_b2", "fwd"), ("resunet42_lidar_5cm_b2", "train")]
    assert all(r["ours_s"] > 0 and r["ours_host_syncs"] == 0 for r in ours["rows"])  # the CPU never waits
    for run, convs in (("unet5_lidar_5cm", 7), ("resunet42_lidar_5cm_b2", 49)):
        inputs = np.load(exchange / f"{run}_inputs.npz")
        reference = np.load(exchange / f"{run}_reference.npz")
        coords = inputs["coords"]
        # both networks end on the input's sites (the last level-0 steps)
        got = reference["out_coords"]
        assert np.array_equal(got[np.lexsort(got.T[::-1])], coords)
        assert np.isfinite(reference["out_features"]).all() and np.abs(reference["out_features"]).max() > 0
        grads = [k for k in reference.files if k.startswith("grad_")]
        assert len(grads) == convs and all(np.isfinite(reference[k]).all() for k in grads)
        assert float(reference["loss"]) > 0
    assert set(np.load(exchange / "resunet42_lidar_5cm_b2_inputs.npz")["coords"][:, 0]) == {0, 1}
    bn = np.load(exchange / "resunet42_lidar_5cm_b2_bn.npz")
    assert len(bn.files) == 2 * 49 and (bn["stem1_bn_var"] > 0).all()

    (exchange / "spconv.json").write_text(json.dumps({
        "rows": [{"network": "unet5_lidar_5cm", "dtype": "fp32", "pass": p, "algo": "native", "spconv_s": s,
                  "spconv_gpu_s": s / 2} for p, s in (("fwd", 0.002), ("train", 0.006))],
        "max_rel_err": {"unet5_lidar_5cm": 1e-6}}))
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, "benchmarks/site_e2e_gpu.py", "--phase", "merge", "--exchange",
                           str(exchange), "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["network"], r["pass"]) for r in rows] == [("unet5_lidar_5cm", "fwd"), ("unet5_lidar_5cm", "train")]
    by_pass = {r["pass"]: r for r in ours["rows"] if r["network"] == "unet5_lidar_5cm"}
    for r in rows:
        for key in ("network", "dtype", "pass", "ours_s", "spconv_s", "max_rel_err", "device", "date"):
            assert key in r, key
        assert r["ours_s"] == by_pass[r["pass"]]["ours_s"]
        assert r["ratio"] == r["spconv_s"] / r["ours_s"] and r["max_rel_err"] == 1e-6
    assert "no spconv row" in done.stdout  # resunet42's rows had no partner: left out, said so
