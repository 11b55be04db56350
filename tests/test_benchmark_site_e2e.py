"""benchmarks/site_e2e_gpu.py and site_networks.py: the networks' structure (every step reads
tensors made before it, channel counts agree, the stages issue 24 names), a small CPU run of
our phase (the exchange spconv's side reads: inputs, batch-norm statistics, outputs at the
input sites, a gradient per convolution), its output and loss against a NumPy evaluation of
the same steps, and the merge into issue 24's row keys."""
import itertools
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


def _rows(coords):
    return {tuple(c): i for i, c in enumerate(coords.tolist())}


def numpy_forward(steps, weights, coords, features):
    """The steps in float64 NumPy, batch norm in training mode (over this batch's sites), with
    the site convention of csrc/site/kernel_map/site_geometry.h -> (coords, features)."""
    t, maps = {"x": (coords, features.astype(np.float64))}, {}
    for step in steps:
        op, out = step[0], step[1]
        if op == "conv":
            _, _, src, kind, cin, cout, k, key = step
            c, f = t[src]
            w = weights[out].astype(np.float64).reshape(k ** 3, cin, cout)
            offsets = list(itertools.product(range(k), repeat=3))
            if kind == "subm":  # output o reads input o + (q - (k - 1) / 2)
                rows, y = _rows(c), np.zeros((len(c), cout))
                for q, qi in enumerate(offsets):
                    shift = np.array(qi) - (k - 1) // 2
                    for o, site in enumerate(c):
                        x = rows.get((int(site[0]), *(site[1:] + shift).tolist()))
                        if x is not None:
                            y[o] += f[x] @ w[q]
                t[out] = (c, y)
            elif kind == "down":  # input x feeds output x // 2 through offset x % 2
                out_c = np.unique(np.concatenate([c[:, :1], c[:, 1:] // 2], 1), axis=0)
                rows, y, pairs = _rows(out_c), np.zeros((len(out_c), cout)), []
                for x, site in enumerate(c):
                    o = rows[(int(site[0]), *(site[1:] // 2).tolist())]
                    q = offsets.index(tuple((site[1:] % 2).tolist()))
                    y[o] += f[x] @ w[q]
                    pairs.append((x, o, q))
                maps[key] = (c, pairs)
                t[out] = (out_c, y)
            else:  # back through the pairs of the strided map of the same key
                fine, pairs = maps[key]
                y = np.zeros((len(fine), cout))
                for x, o, q in pairs:
                    y[x] += f[o] @ w[q]
                t[out] = (fine, y)
        elif op == "bn":
            c, f = t[step[2]]
            t[out] = (c, (f - f.mean(0)) / np.sqrt(f.var(0) + site_networks.BN_EPS))
        elif op == "relu":
            c, f = t[step[2]]
            t[out] = (c, np.maximum(f, 0))
        else:
            (ca, fa), (cb, fb) = t[step[2]], t[step[3]]
            assert np.array_equal(ca, cb)
            t[out] = (ca, fa + fb if op == "add" else np.concatenate([fa, fb], 1))
    return t[steps[-1][1]]


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
                           "--reps", "1", "--exchange", str(exchange), "--kernels", "4",
                           "--bn", "fused", "keras", "block"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ours = json.loads((exchange / "ours.json").read_text())
    assert [(r["network"], r["pass"], r["bn"]) for r in ours["rows"]] == [
        ("unet5_lidar_5cm", "fwd", "fused"), ("unet5_lidar_5cm", "train", "fused"),  # no batch norm: once
        ("resunet42_lidar_5cm_b2", "fwd", "fused"), ("resunet42_lidar_5cm_b2", "train", "fused"),
        ("resunet42_lidar_5cm_b2", "fwd", "keras"), ("resunet42_lidar_5cm_b2", "train", "keras"),
        ("resunet42_lidar_5cm_b2", "fwd", "block"), ("resunet42_lidar_5cm_b2", "train", "block")]
    # Keras' layer and the blocks (batch norm folded into the convolutions) give the same network, within
    # float32's spread here (the deepest level's statistics are of two sites; Keras' layer parts by 1e-3 too)
    assert all(0 < r["rel_err_vs_first_bn"] <= 2e-3 for r in ours["rows"] if r["bn"] != "fused")
    assert all("rel_err_vs_first_bn" not in r for r in ours["rows"] if r["bn"] == "fused")
    assert all(r["ours_s"] > 0 and r["ours_host_syncs"] == 0 and r["ours_deferred_read_backs"] == 0
               for r in ours["rows"])  # the CPU never reads back
    assert all(r["coords_dtype"] == "int64" for r in ours["rows"])  # on the GPU, as spconv's indices
    traced = [json.loads(line) for line in (exchange / "kernels.jsonl").read_text().splitlines()]
    assert [(r["network"], r["pass"], r["side"]) for r in traced] == [
        (r["network"], r["pass"], "ours") for r in ours["rows"]]
    assert all(r["gpu_busy_s"] == 0 and r["kernels"] == [] and r["calls"] == 3 for r in traced)  # no GPU plane
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
        # the inference output with statistics from this batch is the training-mode forward;
        # the tolerance allows for Keras' float32 variance over the two sites of the deepest level
        steps = site_networks.network(run.split("_")[0])
        want_coords, want = numpy_forward(steps, site_networks.conv_weights(run.split("_")[0], steps), coords,
                                          inputs["features"])
        order = np.lexsort(want_coords.T[::-1])
        assert np.array_equal(got[np.lexsort(got.T[::-1])], want_coords[order])
        features = reference["out_features"][np.lexsort(got.T[::-1])]
        assert np.abs(features - want[order]).max() <= 2e-3 * np.abs(want).max()
        loss = np.mean(site_networks.site_scores(want_coords) * (want @ site_networks.loss_channel_weights(
            want.shape[1])))
        assert abs(float(reference["loss"]) - loss) <= 2e-3 * abs(loss) and loss != 0
    assert set(np.load(exchange / "resunet42_lidar_5cm_b2_inputs.npz")["coords"][:, 0]) == {0, 1}
    bn = np.load(exchange / "resunet42_lidar_5cm_b2_bn.npz")
    assert len(bn.files) == 2 * 49 and (bn["stem1_bn_var"] > 0).all()

    (exchange / "spconv.json").write_text(json.dumps({
        "rows": [{"network": "unet5_lidar_5cm", "dtype": "fp32", "pass": p, "algo": "native", "spconv_s": s,
                  "spconv_gpu_s": s / 2} for p, s in (("fwd", 0.002), ("train", 0.006))],
        "rel_err": {"unet5_lidar_5cm": {"output": 1e-6, "loss": 3e-6, "gradients": 2e-3}}}))
    out, kernels_out = tmp_path / "rows.jsonl", tmp_path / "kernels.jsonl"
    done = subprocess.run([sys.executable, "benchmarks/site_e2e_gpu.py", "--phase", "merge", "--exchange",
                           str(exchange), "--out", str(out), "--kernels-out", str(kernels_out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["network"], r["pass"]) for r in rows] == [("unet5_lidar_5cm", "fwd"), ("unet5_lidar_5cm", "train")]
    by_pass = {r["pass"]: r for r in ours["rows"] if r["network"] == "unet5_lidar_5cm"}
    for r in rows:
        for key in ("network", "dtype", "pass", "ours_s", "spconv_s", "max_rel_err", "device", "date"):
            assert key in r, key
        assert r["ours_s"] == by_pass[r["pass"]]["ours_s"]
        assert r["ratio"] == r["spconv_s"] / r["ours_s"]
    assert rows[0]["max_rel_err"] == 1e-6 and "grad_rel_err" not in rows[0]  # fwd: the outputs
    assert rows[1]["max_rel_err"] == 3e-6 and rows[1]["grad_rel_err"] == 2e-3  # train: and the loss
    assert "no spconv row" in done.stdout  # resunet42's rows had no partner: left out, said so
    merged = [json.loads(line) for line in kernels_out.read_text().splitlines()]
    assert [r["network"] for r in merged] == [r["network"] for r in traced]
    assert all(r["device"] == rows[0]["device"] and r["date"] == rows[0]["date"] for r in merged)


def test_the_call_variants_agree_and_keep_their_traces(tmp_path):
    """benchmarks/call_variants.py: the same forward call built five ways gives the same
    output (the script checks it and fails otherwise) and a time each; two traces kept."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "benchmarks/call_variants.py", "--networks", "unet5_lidar_5cm", "--tiny",
                           "--dtype", "fp32", "--rounds", "1", "--reps", "1", "--trace", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    timed = [line.split()[0] for line in done.stdout.splitlines() if line.strip().endswith(")")]
    assert timed == ["base", "frozen", "nochecks", "int64", "function"], done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "unet5_lidar_5cm_fp32_base.xplane.pb", "unet5_lidar_5cm_fp32_int64.xplane.pb"]
    done = subprocess.run([sys.executable, "benchmarks/call_variants.py", "--networks", "unet5_lidar_5cm", "--tiny",
                           "--dtype", "fp32", "--rounds", "1", "--reps", "1", "--variants", "nochecks"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    timed = [line.split()[0] for line in done.stdout.splitlines() if line.strip().endswith(")")]
    assert timed == ["base", "nochecks"], done.stdout  # base: what the others are checked against


def test_the_cpu_training_call_benchmark_writes_its_row(tmp_path):
    out = tmp_path / "rows.jsonl"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "benchmarks/site_train_cpu.py", "--tiny", "--label", "test", "--warmup", "0",
                           "--reps", "2", "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["label"] == "test" and row["network"] == "resunet42_lidar_5cm_b1" and len(row["seconds"]) == 2
    assert row["median_s"] > 0 and row["n_sites"] > 0 and "summary: test" in done.stdout
