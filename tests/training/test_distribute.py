"""Training under tf.distribute, for both op families: one device and two replicas (two
logical CPUs under MirroredStrategy, two worker processes under MultiWorkerMirroredStrategy
on 127.0.0.1) train the same weights on the same global batches; warning-shot pruning leaves
every replica the same masks; synchronized batch norm over replicas holding different
numbers of sites computes the one-device statistics; the trainer's --strategy resumes from
its backups and refuses bad setups in one line; a worker that loses its peer stops with one
line naming it, and Ctrl-C stops a worker waiting for its peers.

The trainings run in fresh processes (tests/training/distribute_script.py): logical devices
and MultiWorkerMirroredStrategy must be set up before TensorFlow initialises."""
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tf_sparseconv.training import distribute, train

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "distribute_script.py")
TIMEOUT = 240  # seconds for one process (or both workers) to finish
# A small run of the trainer: 8^3, two sparse blocks with Eq. 4, 48 shapes (40 train, 8 val).
TINY = ["--dataset", "synthetic", "--resolution", "8", "--rho", "0.5", "0.5", "--synthetic-per-class", "6",
        "--batch-size", "8", "--lam", "0.1", "--lr-schedule", "constant"]
SITE_TINY = ["--model", "site-resnet", "--dataset", "synthetic", "--resolution", "8", "--site-channels", "8", "16",
             "--synthetic-per-class", "6", "--batch-size", "8"]


def environment(**extra):
    """The test processes' environment: CPUs only (a GPU would hold a one-device run, not
    the replicas), no TF_CONFIG but the one given."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="", **extra)
    return env


def hide_gpus(monkeypatch):
    """This process's replica counts as on a machine without GPUs."""
    devices = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [] if kind == "GPU" else devices(kind))


def run_processes(commands, cwd):
    """Runs the commands [(argv, env)] at once; (return code, output) of each. Every process
    is killed after TIMEOUT seconds, or when the test ends early (a worker whose peer died
    waits for it and ignores SIGTERM)."""
    processes = []
    try:
        for argv, env in commands:
            processes.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True, start_new_session=True))
        results = []
        for process in processes:
            output, _ = process.communicate(timeout=TIMEOUT)
            results.append((process.returncode, output))
        return results
    finally:
        end_all(processes)


def end_all(processes):
    """Kills what is still running of processes (each its own session) and reaps them."""
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def run_workers(argv_of_task, cwd):
    """Two MultiWorkerMirroredStrategy tasks on free ports of 127.0.0.1."""
    ports = distribute.free_local_ports(2)
    return run_processes([(argv_of_task(i), environment(TF_CONFIG=distribute.local_tf_config(ports, i)))
                          for i in range(2)], cwd)


def load(path):
    archive = np.load(path)
    runs = {}
    for key in archive.files:
        if key not in ("losses", "log_reductions", "all_reduces"):
            name, index = key.rsplit("/", 1)
            runs.setdefault(name, {})[int(index)] = archive[key]
    return {name: [w[i] for i in sorted(w)] for name, w in runs.items()}, json.loads(str(archive["losses"]))


def assert_same_training(expected, actual):
    (weights, losses), (other_weights, other_losses) = expected, actual
    assert sorted(weights) == sorted(other_weights) == ["fit_channel", "fit_site", "loop_channel", "loop_unet"]
    for name in weights:
        assert len(weights[name]) == len(other_weights[name])
        for i, (w, v) in enumerate(zip(weights[name], other_weights[name])):
            np.testing.assert_allclose(v, w, rtol=1e-4, atol=2e-5, err_msg=f"{name} weight {i}")
        np.testing.assert_allclose(other_losses[name], losses[name], rtol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory):
    """One process with two logical CPUs: the trainings on one device and on two replicas,
    and the pruning and batch-norm checks."""
    out = tmp_path_factory.mktemp("mirrored")
    [(code, output)] = run_processes([([sys.executable, SCRIPT, "mirrored", "--out", str(out)], environment())], REPO)
    assert code == 0, output[-3000:]
    with open(out / "checks.json") as f:
        checks = json.load(f)
    return load(out / "single.npz"), load(out / "mirrored.npz"), checks


def test_two_mirrored_replicas_train_the_weights_of_one_device(mirrored):
    # OctNet3 with k-selection and Eq. 4 (fit; custom loop with per-channel densities), a
    # site ResNet (fit) and a site UNet (custom loop) with synchronized batch norm. Without the all-reduce of Eq. 4's density,
    # replicas whose densities lie on either side of rho_up pull their weights their own way:
    # the per-channel run's weights then differ by ~1e-3, the fit's losses by ~2e-5.
    single, two_replicas, checks = mirrored
    assert checks["replicas"] == 2
    assert_same_training(single, two_replicas)
    assert all(losses[-1] < losses[0] for losses in single[1].values())  # and they trained


def test_warning_shot_pruning_leaves_every_replica_the_same_masks(mirrored):
    pruning = mirrored[2]["pruning"]
    assert pruning["replicas"] == 2 and pruning["pruned"] > 0
    assert pruning["replicas_equal"]  # masks, warnings and kernels, read from each replica's copy


def test_synchronized_batch_norm_over_replicas_of_5_and_11_sites_matches_one_device(mirrored):
    # Keras' own synchronized computation and the library's FusedBatchNormalization, which
    # waits for two all-reduces per replica and step (one forward, one in its gradient)
    # where Keras' waits for five (sums, squared sums and counts; two gradients); also in
    # float16 (mixed precision) against float64 arithmetic.
    close = {"outputs_close": True, "gradients_close": True, "mean_close": True, "variance_close": True}
    assert mirrored[2]["batch_norm"] == {"keras": dict(close, collectives_per_replica=5),
                                         "fused": dict(close, collectives_per_replica=2),
                                         "fused_far_from_zero": {"variance_close": True},
                                         "fused_float16": {"outputs_close": True, "gradients_close": True}}


def test_two_workers_train_the_weights_of_one_device(mirrored, tmp_path):
    results = run_workers(lambda i: [sys.executable, SCRIPT, "worker", "--out", str(tmp_path)], REPO)
    for code, output in results:
        assert code == 0, output[-3000:]
    for task in range(2):
        assert_same_training(mirrored[0], load(tmp_path / f"worker{task}.npz"))
        # The step logs (loss, accuracy, each convolution's density, ...) are averaged over the
        # workers as one vector: one reduction per traced step function, not one per log.
        log_reductions = json.loads(str(np.load(tmp_path / f"worker{task}.npz")["log_reductions"]))
        for name, counted in log_reductions.items():
            assert len(counted["logs"]) >= 2 and counted["reductions"] == 1, (name, counted)
        # The workers all-reduce each gradient on its own (--gradient-all-reduce per-gradient):
        # no all-reduce of the custom loops is larger than their largest variable (one pack of
        # every gradient would hold all of the variables' elements).
        all_reduces = json.loads(str(np.load(tmp_path / f"worker{task}.npz")["all_reduces"]))
        for name, sizes in all_reduces.items():
            assert sizes["largest_all_reduce"] == sizes["largest_variable"] < sizes["variable_elements"], (name, sizes)


def test_trainer_on_two_workers_resumes_from_the_backups(tmp_path):
    backup = tmp_path / "backup"

    def trainer(out, epochs):
        return lambda i: [sys.executable, "-m", "tf_sparseconv", "train", *TINY, "--strategy", "multi-worker",
                          "--epochs", str(epochs), "--backup-dir", str(backup), "--out", str(tmp_path / out)]

    first = run_workers(trainer("first", 1), REPO)
    assert all(code == 0 for code, _ in first), first[0][1][-3000:] + first[1][1][-3000:]
    assert "2 replicas (--strategy multi-worker), global batch 8 (4 per replica)" in first[0][1]
    assert "the chief writes the results" in first[1][1] and not os.path.exists(tmp_path / "first" / "worker1")
    assert sorted(os.listdir(backup / "worker1")) == sorted(n for n in os.listdir(backup) if n != "worker1")
    second = run_workers(trainer("second", 2), REPO)
    assert all(code == 0 for code, _ in second), second[0][1][-3000:] + second[1][1][-3000:]
    assert f"resuming from {backup}: 1 epoch(s) done" in second[0][1]
    assert f"resuming from {backup / 'worker1'}: 1 epoch(s) done" in second[1][1]
    assert len(re.findall(r"^epoch \d/2 ", second[0][1], re.M)) == 1  # only the second epoch ran
    with open(tmp_path / "first" / "results.json") as f:
        before = json.load(f)
    with open(tmp_path / "second" / "results.json") as f:
        after = json.load(f)
    assert (after["strategy"], after["replicas"], after["epochs"]) == ("multi-worker", 2, 2)
    assert after["collective"] == "ring"  # no GPU here: TensorFlow's ring; nccl is the default on GPUs
    assert after["history"]["loss"][0] == before["history"]["loss"][0]
    assert after["shapes_per_s"] > 0


@pytest.mark.parametrize("batch_norm", ["synchronized", "per-replica"])
def test_trainer_mirrored_over_two_logical_cpus_reports_replicas_and_throughput(tmp_path, batch_norm):
    [(code, output)] = run_processes(
        [([sys.executable, SCRIPT, "train", "--", *SITE_TINY, "--strategy", "mirrored", "--collective", "one-device",
           "--epochs", "1", "--vote-mirror", "--site-batch-norm", batch_norm, "--out", str(tmp_path / "run")],
          environment())], REPO)
    assert code == 0, output[-3000:]
    assert "on 2 replicas (4 examples each)" in output
    assert re.search(r"^2 replicas \(--strategy mirrored\), global batch 8 \(4 per replica\): [\d.]+ shapes/s",
                     output, re.M), output[-3000:]
    with open(tmp_path / "run" / "results.json") as f:
        results = json.load(f)
    assert (results["replicas"], results["batch_size_per_replica"]) == (2, 4)
    assert results["synchronized_bn"] == (batch_norm == "synchronized")
    assert results["collective"] == "one-device"
    assert 0 <= results["val_accuracy_mirror_vote"] <= 1


# --- a cluster that loses a worker, a worker that waits for its peers -------------------------

def start_worker(ports, index, out, epochs):
    argv = [sys.executable, "-m", "tf_sparseconv", "train", *TINY, "--strategy", "multi-worker", "--epochs",
            str(epochs), "--out", str(out)]
    env = environment(TF_CONFIG=distribute.local_tf_config(ports, index))
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_line(process, pattern, seconds):
    """Reads process's stdout until a line matches pattern (True) or it ends or time runs out."""
    deadline, seen = time.monotonic() + seconds, ""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=1):
                line = process.stdout.readline()
                if not line:
                    return False, seen
                seen += line
                if re.search(pattern, line):
                    return True, seen
    return False, seen


def test_a_worker_that_loses_its_peer_stops_with_one_line_naming_it(tmp_path):
    ports = distribute.free_local_ports(2)
    workers = [start_worker(ports, i, tmp_path / "run", 200) for i in range(2)]
    try:
        training, seen = wait_for_line(workers[0], r"^epoch 1/200 ", TIMEOUT)
        assert training, seen[-2000:]
        os.killpg(workers[1].pid, signal.SIGKILL)  # worker 1 dies mid-training
        _, errors = workers[0].communicate(timeout=120)  # heartbeats stop: worker 0 ends by itself
        assert workers[0].returncode == 1, errors[-3000:]
        assert "Traceback" not in errors
        # Worker 0 learns it from the missed heartbeats or, first, from a collective whose
        # connection the dying worker reset; either way the line names worker 1.
        assert re.search(r"^tf-sparseconv train: error: the cluster lost worker 1 \((it stopped sending heartbeats|"
                         rf"127\.0\.0\.1:{ports[1]} no longer accepts connections)\); "
                         r"stop every worker and run the same commands again", errors, re.M), errors[-3000:]
    finally:
        end_all(workers)


def test_unreachable_tasks_names_the_other_peers_whose_address_refuses_connections():
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    try:
        ports = [listening.getsockname()[1], *distribute.free_local_ports(2)]  # worker 0 listens, 1 and 2 do not
        silent = [("worker", i, f"127.0.0.1:{ports[i]}") for i in (1, 2)]
        for me, expected in [(0, silent), (1, silent[1:]), (2, silent[:1])]:
            environ = {"TF_CONFIG": distribute.local_tf_config(ports, me)}
            assert distribute.unreachable_tasks(environ, seconds=1) == expected
    finally:
        listening.close()
    assert distribute.unreachable_tasks({}) == []
    assert distribute.unreachable_tasks({"TF_CONFIG": "{"}) == []


LOST_WORKER_ERRORS = {
    "a reset connection": ("Collective ops is aborted by: recvmsg:Connection reset by peer",
                           "worker 1 (127.0.0.1:{port} no longer accepts connections)"),
    "missed heartbeats": ("The following tasks are unhealthy (stopped sending heartbeats):\n"
                          "/job:worker/replica:0/task:1", "worker 1 (it stopped sending heartbeats)")}


@pytest.mark.parametrize("case", sorted(LOST_WORKER_ERRORS))
def test_cluster_failures_named_names_the_lost_worker(monkeypatch, case):
    message, named = LOST_WORKER_ERRORS[case]
    ports = distribute.free_local_ports(2)  # this task is worker 0; nothing listens at worker 1's address
    monkeypatch.setenv("TF_CONFIG", distribute.local_tf_config(ports, 0))
    strategy = object.__new__(tf.distribute.MultiWorkerMirroredStrategy)  # only its type is read
    expected = f"the cluster lost {named.format(port=ports[1])}; stop every worker"
    with pytest.raises(distribute.ClusterFailure, match=re.escape(expected)):
        with distribute.cluster_failures_named(strategy):
            raise tf.errors.UnavailableError(None, None, message)


def test_a_worker_waiting_for_its_peers_stops_on_ctrl_c(tmp_path):
    ports = distribute.free_local_ports(2)
    worker = start_worker(ports, 0, tmp_path / "run", 1)  # worker 1 never comes
    try:
        waiting, seen = wait_for_line(worker, r"^\[0/4\] waiting for the 2 workers of TF_CONFIG", TIMEOUT)
        assert waiting, seen[-2000:]
        time.sleep(5)  # inside TensorFlow's wait for the cluster
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=30)
        assert worker.returncode == -signal.SIGINT
    finally:
        end_all([worker])


# --- bad setups: one line, exit code 2, nothing written ---------------------------------------

def two_workers(index=0):
    return distribute.local_tf_config([12345, 12346], index)


BAD_SETUPS = [
    (["--strategy", "multi-worker"], None, "--strategy multi-worker reads the cluster from the TF_CONFIG environment "
                                           "variable, which is not set; set it on every host, e.g. TF_CONFIG="),
    (["--strategy", "multi-worker"], "{not json", "TF_CONFIG is not valid JSON"),
    (["--strategy", "multi-worker"], "[1, 2]", "TF_CONFIG must be a JSON object with a 'cluster' object"),
    (["--strategy", "multi-worker"], '{"cluster": {"worker": ["127.0.0.1:1"]}}',
     "TF_CONFIG must be a JSON object with a 'cluster' object and a 'task' object"),
    (["--strategy", "multi-worker"], '{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG's cluster lists no worker"),
    (["--strategy", "multi-worker"], '{"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG's cluster['worker'] must be a list of 'host:port' addresses"),
    (["--strategy", "multi-worker"], two_workers(2), "TF_CONFIG's task index 2 is not in 0..1"),
    (["--strategy", "multi-worker"],
     '{"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}}',
     "TF_CONFIG's cluster has the job(s) ['ps']; MultiWorkerMirroredStrategy trains on chief and worker tasks only"),
    (["--strategy", "multi-worker", "--batch-size", "7"], two_workers(),
     "--batch-size 7 is the global batch and must be divisible by the 2 replicas of --strategy multi-worker "
     "(each trains on batch-size / 2 examples); use 6 or 8"),
    (["--strategy", "parameter-server"], None, "argument --strategy: invalid choice: 'parameter-server'"),
    (["--strategy", "mirrored", "--collective", "ring"], None,
     "--collective ring is not an all-reduce of --strategy mirrored; it takes one of nccl, hierarchical-copy, "
     "one-device"),
    (["--strategy", "mirrored", "--collective", "nccl"], None,
     "--collective nccl all-reduces between GPUs and this host has none; use --collective one-device"),
    (["--strategy", "mirrored", "--collective", "hierarchical-copy"], None,
     "--collective hierarchical-copy all-reduces between GPUs and this host has none; use --collective one-device"),
    (["--strategy", "multi-worker", "--collective", "one-device"], two_workers(),
     "--collective one-device is not an all-reduce of --strategy multi-worker; it takes one of nccl, ring"),
    (["--collective", "one-device"], None,
     "--collective one-device chooses how the replicas of --strategy mirrored or multi-worker all-reduce their "
     "gradients; --strategy default takes none"),
    (["--strategy", "multi-worker", "--collective", "nccl"], two_workers(),
     "--collective nccl all-reduces between GPUs and this host has none; use --collective ring"),
    (["--strategy", "multi-worker", "--collective", "mpi"], two_workers(), "argument --collective: invalid choice"),
    (["--gradient-all-reduce", "per-gradient"], None,
     "--gradient-all-reduce per-gradient chooses how the replicas of --strategy mirrored or multi-worker all-reduce "
     "their gradients; --strategy default has one replica"),
    (["--strategy", "mirrored", "--gradient-all-reduce", "packed"], None,
     "--gradient-all-reduce packed: --collective one-device sums each gradient on its own and has no packs"),
    (["--site-batch-norm", "per-replica"], None,
     "--site-batch-norm applies to --model site-resnet (octnet3 has no batch norm)"),
]


@pytest.mark.parametrize("argv,config,message", BAD_SETUPS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_setups_end_in_one_line_with_exit_code_2_and_nothing_written(tmp_path, monkeypatch, capsys, argv, config,
                                                                         message):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    if config is not None:
        monkeypatch.setenv("TF_CONFIG", config)
    monkeypatch.chdir(tmp_path)
    hide_gpus(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--synthetic-per-class", "6", "--epochs", "1", *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tf-sparseconv train: error: "), lines
    assert message in lines[0]
    assert os.listdir(tmp_path) == []


def test_replicas_on_gpus_without_gpu_kernels_are_refused(monkeypatch):
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
                        if kind == "GPU" else [])
    monkeypatch.setattr(distribute, "_library_has_gpu_kernels", lambda: False)
    with pytest.raises(ValueError, match="--strategy mirrored would put its replicas on the 1 GPU.* built without CUDA "
                                         "kernels; rebuild it .* or use --strategy default"):
        distribute.expected_replicas("mirrored")
    assert distribute.expected_replicas("default") == 1


def test_replicas_all_reduce_over_nccl_where_the_host_has_gpus(monkeypatch):
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])  # a host without GPUs
    assert distribute.collective_of("multi-worker") == "ring"
    assert distribute.collective_of("multi-worker", "ring") == "ring"
    assert distribute.collective_of("mirrored") == "one-device"
    assert distribute.collective_of("default") is None
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")]
                        if kind == "GPU" else [])
    assert distribute.collective_of("multi-worker") == "nccl"
    assert distribute.collective_of("multi-worker", "ring") == "ring"
    assert distribute.collective_of("mirrored") == "nccl"
    assert distribute.collective_of("mirrored", "hierarchical-copy") == "hierarchical-copy"
    assert distribute.collective_of("mirrored", "one-device") == "one-device"


@pytest.mark.parametrize("collective,kind", [("nccl", tf.distribute.NcclAllReduce),
                                             ("hierarchical-copy", tf.distribute.HierarchicalCopyAllReduce),
                                             ("one-device", tf.distribute.ReductionToOneDevice)])
def test_each_mirrored_collective_is_its_cross_device_ops(collective, kind):
    assert type(distribute.mirrored_cross_device_ops(collective)) is kind
    with pytest.raises(ValueError, match="--collective must be one of"):
        distribute.mirrored_cross_device_ops("ring")


@pytest.mark.parametrize("collective", ["nccl", "hierarchical-copy"])
def test_mirrored_gradients_go_packed_or_one_by_one(collective):
    # num_packs 1 concatenates every gradient into one all-reduce (TensorFlow's default);
    # 0 reduces each gradient on its own, as soon as the backward pass has made it.
    assert distribute.mirrored_cross_device_ops(collective)._num_packs == 1
    assert distribute.mirrored_cross_device_ops(collective, "packed")._num_packs == 1
    assert distribute.mirrored_cross_device_ops(collective, "per-gradient")._num_packs == 0


def test_gradient_all_reduce_is_checked_against_the_strategy_and_collective():
    check = distribute.check_gradient_all_reduce
    assert check("mirrored", "nccl", None) == "packed" and check("multi-worker", "ring", None) == "packed"
    assert check("mirrored", "nccl", "per-gradient") == "per-gradient"
    assert check("default", None, None) is None and check("mirrored", "one-device", None) is None
    with pytest.raises(ValueError, match="--strategy default has one replica"):
        check("default", None, "packed")
    with pytest.raises(ValueError, match="--collective one-device sums each gradient on its own"):
        check("mirrored", "one-device", "per-gradient")
    with pytest.raises(ValueError, match="must be one of"):
        check("mirrored", "nccl", "bucketed")


def test_strategies_the_op_library_cannot_serve_are_refused():
    with pytest.raises(ValueError, match=r"CentralStorageStrategy cannot train tf_sparseconv models \(Keras 3's fit "
                                         r"does not train under it\); use MirroredStrategy"):
        distribute.check_strategy(tf.distribute.experimental.CentralStorageStrategy())
    assert distribute.check_strategy(tf.distribute.get_strategy()) is tf.distribute.get_strategy()


def test_steps_per_epoch_counts_batches_of_at_least_one_example():
    assert distribute.steps_per_epoch(10, 4, False) == 3 and distribute.steps_per_epoch(10, 4, True) == 2
    # 0 was a ZeroDivisionError, -3 gave -3 steps, 2.5 gave 4 steps
    for size in (0, -3):
        with pytest.raises(ValueError, match="steps_per_epoch: global_batch_size must be >= 1"):
            distribute.steps_per_epoch(10, size, False)
    with pytest.raises(TypeError, match="steps_per_epoch: global_batch_size must be an int"):
        distribute.steps_per_epoch(10, 2.5, False)
    with pytest.raises(ValueError, match="steps_per_epoch: num_examples must be >= 0"):
        distribute.steps_per_epoch(-1, 4, False)


def test_tf_config_of_a_chief_and_workers():
    config = json.dumps({"cluster": {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]},
                         "task": {"type": "worker", "index": 1}})
    assert distribute.cluster_from_tf_config({"TF_CONFIG": config}) == (3, 2, False)
    assert distribute.cluster_from_tf_config({"TF_CONFIG": two_workers(0)}) == (2, 0, True)
