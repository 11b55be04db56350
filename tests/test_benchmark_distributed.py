"""benchmarks/distributed.py (issue 26's scaling measure): its configurations, its scaling
summary, and one run of the site workload over two logical CPU replicas on the real LiDAR
frame (skipped where ../shared/data is absent), whose rows carry the issue's keys."""
import argparse
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import distributed  # noqa: E402
from tf_sparseconv.training import distribute  # noqa: E402

ISSUE_KEYS = {"workload", "strategy", "replicas", "device", "items_per_s", "date"}


def test_epoch_configurations_are_the_baseline_then_strong_and_weak_scaling():
    assert distributed.epoch_configurations([1, 2, 4], 32) == [
        (1, 32, "baseline"), (2, 32, "strong"), (2, 64, "weak"), (4, 32, "strong"), (4, 128, "weak")]
    # A global batch the replicas do not divide has no strong-scaling run.
    assert distributed.epoch_configurations([1, 3], 32) == [(1, 32, "baseline"), (3, 96, "weak")]
    # Without 1 the baseline is left to an earlier run (its row in the same results file).
    assert distributed.epoch_configurations([2], 32) == [(2, 32, "strong"), (2, 64, "weak")]
    assert distributed.epoch_configurations([1, 2], 32, ["weak"]) == [(1, 32, "baseline"), (2, 64, "weak")]


def test_scaling_lines_set_each_replica_count_against_one_replica():
    rows = [{"workload": "site_unet_lidar_step", "replicas": 1, "items_per_s": 10.0, "strategy": "mirrored"},
            {"workload": "site_unet_lidar_step", "replicas": 2, "items_per_s": 18.0, "strategy": "mirrored"},
            {"workload": "modelnet40_32_epoch", "replicas": 1, "items_per_s": 100.0, "scaling": "baseline",
             "global_batch": 32, "strategy": "default"},
            {"workload": "modelnet40_32_epoch", "replicas": 2, "items_per_s": 150.0, "scaling": "strong",
             "global_batch": 32, "strategy": "multi-worker"}]
    lines = distributed.scaling_lines(rows)
    assert lines == [
        "modelnet40_32_epoch: 2 replicas (multi-worker, strong, global batch 32) 150.00/s = 1.50x one replica's "
        "100.00/s (efficiency 75%)",
        "site_unet_lidar_step: 2 replicas (mirrored) 18.00/s = 1.80x one replica's 10.00/s (efficiency 90%)"]


def test_lidar_frames_of_the_replicas_are_mirrors_with_the_same_sites():
    if not any(os.path.exists(p) for p in distributed.LIDAR_PATHS):
        pytest.skip("lidar_scan.npz is not in ../shared/data")
    frames, extent = distributed.lidar_frames(4, 1.0)
    assert len(frames) == 4 and len(extent) == 3
    sizes = {len(coords) for coords, _, _ in frames}
    assert len(sizes) == 1
    base = {tuple(c) for c in frames[0][0][:, 1:]}
    mirrored_x = {(extent[0] - 1 - x, y, z) for x, y, z in base}
    assert {tuple(c) for c in frames[1][0][:, 1:]} == mirrored_x
    for coords, height, labels in frames:
        assert (coords[:, 0] == 0).all() and (coords[:, 1:] >= 0).all() and (coords[:, 1:] < extent).all()
        assert height.shape == (len(coords), 1) and set(labels.tolist()) == {0, 1}


def test_site_workload_over_two_logical_cpu_replicas_writes_rows_with_the_issue_keys(tmp_path):
    if not any(os.path.exists(p) for p in distributed.LIDAR_PATHS):
        pytest.skip("lidar_scan.npz is not in ../shared/data")
    out = tmp_path / "distributed.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_GPU_THREAD")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run([sys.executable, "benchmarks/distributed.py", "--workloads", "site_unet_lidar_step",
                           "--replicas", "1", "2", "--voxel", "2.0", "--unet-channels", "4", "8", "--steps", "1",
                           "--windows", "1", "--warmup", "1", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["replicas"] for r in rows] == [1, 2]
    for row in rows:
        assert ISSUE_KEYS <= set(row) and row["device"] == "cpu" and row["items_per_s"] > 0
        assert row["strategy"] == "mirrored" and row["workload"] == "site_unet_lidar_step"
        assert row["gpu_thread_mode"] == "global"  # TF_GPU_THREAD_MODE unset in this run
    assert "site_unet_lidar_step: 2 replicas" in done.stdout and "2 rows appended" in done.stdout


def test_multi_worker_configurations_run_a_worker_per_gpu_on_localhost(tmp_path):
    args = argparse.Namespace(
        epochs=2, seed=0, data_dir=None, synthetic_per_class=10, max_examples=0, train_args=[])
    [(argv, env)] = distributed.trainer_commands(args, 2, 32, "mirrored", 2, str(tmp_path))
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and "TF_CONFIG" not in env
    assert argv[argv.index("--strategy") + 1] == "mirrored" and argv[argv.index("--batch-size") + 1] == "32"
    assert "--collective" not in argv  # the trainer's own choice
    [(argv, _)] = distributed.trainer_commands(args, 2, 32, "mirrored", 2, str(tmp_path), "hierarchical-copy")
    assert argv[argv.index("--collective") + 1] == "hierarchical-copy"
    assert set(distributed.COLLECTIVES) == set(distribute.COLLECTIVES)
    assert "--gradient-all-reduce" not in argv
    [(argv, _)] = distributed.trainer_commands(args, 2, 32, "mirrored", 2, str(tmp_path), None, "per-gradient")
    assert argv[argv.index("--gradient-all-reduce") + 1] == "per-gradient"
    assert set(distributed.GRADIENT_ALL_REDUCES) == set(distribute.GRADIENT_ALL_REDUCES)
    workers = distributed.trainer_commands(args, 2, 64, "multi-worker", 2, str(tmp_path))
    configs = [json.loads(env["TF_CONFIG"]) for _, env in workers]
    assert [env["CUDA_VISIBLE_DEVICES"] for _, env in workers] == ["0", "1"]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    addresses = configs[0]["cluster"]["worker"]
    assert configs[1]["cluster"]["worker"] == addresses and len(set(addresses)) == 2
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert all(argv[argv.index("--strategy") + 1] == "multi-worker" for argv, _ in workers)


def test_a_configuration_past_its_timeout_is_ended_and_named_with_its_workers_output(tmp_path):
    args = argparse.Namespace(epochs=1, seed=0, data_dir=None, synthetic_per_class=10, max_examples=0,
                              train_args=[], timeout=2.0, logs=str(tmp_path / "logs"), cpus_per_replica=1)
    with pytest.raises(RuntimeError, match=r"ran past --timeout 2 s \(process 0 of 2\)") as error:
        distributed.run_trainer(args, 2, 16, "multi-worker", 0, str(tmp_path / "run"))
    assert "--- process 0:" in str(error.value) and "--- process 1:" in str(error.value)
    # --logs keeps each process's whole output, also of a configuration that failed
    assert sorted(os.listdir(tmp_path / "logs")) == ["multi-worker-2x8-process0.log", "multi-worker-2x8-process1.log"]


def test_rows_name_the_gpu_thread_mode_the_run_had(monkeypatch):
    import run_info
    monkeypatch.delenv("TF_GPU_THREAD_MODE", raising=False)
    monkeypatch.delenv("TF_GPU_THREAD_COUNT", raising=False)
    assert run_info.gpu_thread_mode() == "global"
    monkeypatch.setenv("TF_GPU_THREAD_MODE", "gpu_private")
    assert run_info.gpu_thread_mode() == "gpu_private x2"  # TensorFlow's default count
    monkeypatch.setenv("TF_GPU_THREAD_COUNT", "4")
    assert run_info.gpu_thread_mode() == "gpu_private x4"


def test_cpu_blocks_give_each_process_its_own_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert distributed.cpu_blocks(2, 2, 0) == [None, None]  # no pinning asked
    assert distributed.cpu_blocks(2, 2, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a worker per GPU
    assert distributed.cpu_blocks(1, 2, 3) == [[0, 1, 2, 3, 4, 5]]  # one mirrored process, two replicas
    assert distributed.cpu_blocks(1, 1, 4) == [[0, 1, 2, 3]]  # the baseline: what one worker has
    with pytest.raises(SystemExit, match="need 10 CPUs, this process may use 8"):
        distributed.cpu_blocks(2, 2, 5)


def test_cpu_blocks_stay_within_a_numa_node_where_they_can(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(distributed, "numa_node_of_cpu", lambda: {c: c % 2 for c in range(8)})  # interleaved
    assert distributed.cpu_blocks(2, 2, 4) == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize("named, want", [(None, 2), ("", 0), ("-1", 0), ("0", 1), ("1,0", 2), ("0,-1,1", 1),
                                         ("0,1,2,3", 2)])
def test_visible_gpus_follows_cuda_visible_devices(monkeypatch, named, want):
    """nvidia-smi lists every GPU of the host; the benchmark counts those CUDA lets it use."""
    listing = "GPU 0: NVIDIA H200 (UUID: GPU-a)\nGPU 1: NVIDIA H200 (UUID: GPU-b)\n"
    monkeypatch.setattr(distributed.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], 0, stdout=listing))
    if named is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", named)
    assert distributed.visible_gpus() == want
