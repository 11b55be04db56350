"""Training on several devices and hosts with tf.distribute, for both op families.

`tf-sparseconv train --strategy` offers three of TensorFlow's strategies:

- default: TensorFlow's default strategy, one device;
- mirrored: tf.distribute.MirroredStrategy over this host's GPUs (without GPUs, over its
  logical CPU devices: one unless the program configured more);
- multi-worker: tf.distribute.MultiWorkerMirroredStrategy over the hosts TF_CONFIG lists,
  each with its GPUs (or its CPU).

Sparse batches differ in size, so they are never cut by the strategy: each replica builds
its own (per_replica_dataset, through strategy.distribute_datasets_from_function). Every
host draws the same global batches (same seed, same order) and makes the parts of its own
replicas (data.ReplicaSplit): replica r of R trains on examples [r B / R, (r + 1) B / R) of
a global batch of B, so the replicas together see exactly the one-device batch. Keras scales
each replica's mean loss by 1 / R and sums the gradients, Eq. 4 reads the density of the
global batch (DirectSparseConv all-reduces it) and the site nets' batch norm can be
synchronized, so a step on R replicas is a step on one device, up to float rounding.

Other strategies (TPUStrategy, ParameterServerStrategy, CentralStorageStrategy) are
refused by check_strategy: the op library has no TPU kernels, and Keras 3 trains with
neither of the other two.
"""
import contextlib
import json
import math
import os
import re
import signal
import socket
import threading

import tensorflow as tf

from tf_sparseconv.data.pipeline import ReplicaSplit
from tf_sparseconv.inputs import count_arg

STRATEGIES = ("default", "mirrored", "multi-worker")
# How the replicas all-reduce their gradients, per strategy: between the workers of
# multi-worker (tf.distribute.experimental.CommunicationImplementation), between the GPUs of
# mirrored (its cross_device_ops: NcclAllReduce, HierarchicalCopyAllReduce, ReductionToOneDevice).
# The last of each is the one that needs no GPU, the default on a host without.
COLLECTIVES_OF = {"multi-worker": ("nccl", "ring"), "mirrored": ("nccl", "hierarchical-copy", "one-device")}
COLLECTIVES = tuple(dict.fromkeys(c for served in COLLECTIVES_OF.values() for c in served))
# How a step's gradients go into all-reduces (--gradient-all-reduce): packed, TensorFlow's
# default, as one pack that waits for the last gradient of the backward pass; per-gradient,
# one all-reduce per gradient, each queued as soon as its gradient is made, so the reduction
# of the last layers' gradients overlaps the backward pass of the first, but each is also a
# point where the host waits for the GPU (slower for the library's models on two H200s:
# docs/training.md). ReductionToOneDevice (one-device) always reduces each gradient on its
# own and has no choice to make.
GRADIENT_ALL_REDUCES = ("packed", "per-gradient")
TF_CONFIG_EXAMPLE = ('TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
                     '"task": {"type": "worker", "index": 0}}\' (index 1 on host2)')
TRAINING_JOBS = ("chief", "worker")


def cluster_from_tf_config(environ=None):
    """(workers, task_id, chief) of the cluster the TF_CONFIG environment variable describes,
    as MultiWorkerMirroredStrategy reads it (https://www.tensorflow.org/guide/distributed_training):
    workers counts the chief and worker tasks, task_id is this task's place among them (the
    chief first) and chief says whether this task writes the results. ValueError (one line)
    for a missing or malformed TF_CONFIG."""
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        raise ValueError(f"--strategy multi-worker reads the cluster from the TF_CONFIG environment variable, which is "
                         f"not set; set it on every host, e.g. {TF_CONFIG_EXAMPLE}")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos}); expected e.g. "
                         f"{TF_CONFIG_EXAMPLE}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict) \
            or not isinstance(config.get("task"), dict):
        raise ValueError(f"TF_CONFIG must be a JSON object with a 'cluster' object and a 'task' object; expected e.g. "
                         f"{TF_CONFIG_EXAMPLE}")
    cluster, task = config["cluster"], config["task"]
    other = sorted(set(cluster) - set(TRAINING_JOBS))
    if other:
        raise ValueError(f"TF_CONFIG's cluster has the job(s) {other}; MultiWorkerMirroredStrategy trains on "
                         f"{' and '.join(TRAINING_JOBS)} tasks only (parameter servers and evaluators are not served)")
    addresses = []
    for job in TRAINING_JOBS:
        tasks = cluster.get(job, [])
        if not isinstance(tasks, list) or not all(isinstance(a, str) and _is_address(a) for a in tasks):
            raise ValueError(f"TF_CONFIG's cluster['{job}'] must be a list of 'host:port' addresses, got {tasks!r}")
        addresses += tasks
    if not addresses:
        raise ValueError(f"TF_CONFIG's cluster lists no worker; expected e.g. {TF_CONFIG_EXAMPLE}")
    if len(cluster.get("chief", [])) > 1:
        raise ValueError(f"TF_CONFIG's cluster has {len(cluster['chief'])} chief tasks; at most one")
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"TF_CONFIG's cluster lists an address twice: {addresses}")
    kind, index = task.get("type"), task.get("index")
    if kind not in cluster:
        raise ValueError(f"TF_CONFIG's task type {kind!r} is not a job of its cluster ({sorted(cluster)})")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[kind]):
        raise ValueError(f"TF_CONFIG's task index {index!r} is not in 0..{len(cluster[kind]) - 1} (the "
                         f"{len(cluster[kind])} '{kind}' task(s) of its cluster)")
    chiefs = len(cluster.get("chief", []))
    task_id = index if kind == "chief" else chiefs + index
    return len(addresses), task_id, task_id == 0


def free_local_ports(count):
    """count ports on 127.0.0.1 that nothing listens on now (for a cluster on this host)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_tf_config(ports, index):
    """The TF_CONFIG (JSON text) of worker index of a cluster of workers on 127.0.0.1, one
    per port: e.g. one worker process per GPU of this host."""
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def _is_address(text):
    host, _, port = text.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def local_devices(name):
    """The devices one host's replicas run on under strategy name: the GPUs, or without
    them the CPU devices (mirrored: every logical CPU device; multi-worker: the CPU)."""
    gpus = tf.config.list_physical_devices("GPU")
    if name == "default":
        return ["GPU:0" if gpus else "CPU:0"]
    if gpus:
        return [f"GPU:{i}" for i in range(len(gpus))]
    if name == "mirrored":
        return [device.name for device in tf.config.list_logical_devices("CPU")]
    return ["CPU:0"]


def expected_replicas(name, environ=None):
    """How many replicas strategy name will train on, known before it is created (it
    reads TF_CONFIG and the device lists only); ValueError for a setup it cannot serve."""
    if name not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {STRATEGIES}, got {name!r}")
    if name == "default":
        return 1
    workers = cluster_from_tf_config(environ)[0] if name == "multi-worker" else 1
    gpus = tf.config.list_physical_devices("GPU")
    if gpus and not _library_has_gpu_kernels():
        raise ValueError(f"--strategy {name} would put its replicas on the {len(gpus)} GPU(s) of this host, but the "
                         "tf_sparseconv op library was built without CUDA kernels; rebuild it on a machine with nvcc "
                         "(docs/install.md) or use --strategy default")
    # A multi-worker host must not list logical devices before the strategy configures
    # its collectives: count its GPUs (or its one CPU).
    return workers * (len(gpus) if gpus else len(local_devices(name)))


def _library_has_gpu_kernels():
    from tf_sparseconv import _build_info
    return bool(getattr(_build_info, "CUDA", False))


def collective_of(strategy, collective=None):
    """How the replicas of strategy all-reduce their gradients: collective (COLLECTIVES_OF[strategy])
    where given, else nccl where this host has GPUs, and without GPUs ring (multi-worker) or
    one-device (mirrored over logical CPUs); None for the default strategy. ValueError for one
    that cannot serve: a collective of another strategy, or one that needs GPUs on a host
    without (TensorFlow would fall back to another, silently)."""
    if strategy not in COLLECTIVES_OF:
        if collective is not None:
            raise ValueError(f"--collective {collective} chooses how the replicas of --strategy mirrored or "
                             f"multi-worker all-reduce their gradients; --strategy {strategy} takes none")
        return None
    served = COLLECTIVES_OF[strategy]
    if collective is not None and collective not in served:
        raise ValueError(f"--collective {collective} is not an all-reduce of --strategy {strategy}; it takes one of "
                         f"{', '.join(served)}")
    gpus = bool(tf.config.list_physical_devices("GPU"))
    without_gpus = served[-1]
    if collective is not None and collective != without_gpus and not gpus:
        raise ValueError(f"--collective {collective} all-reduces between GPUs and this host has none; use "
                         f"--collective {without_gpus} (or leave it out)")
    return collective or ("nccl" if gpus else without_gpus)


def check_gradient_all_reduce(strategy, collective, gradient_all_reduce):
    """gradient_all_reduce (GRADIENT_ALL_REDUCES, or None: packed where there is a choice)
    for strategy's collective (as collective_of resolved it); ValueError where it has no
    meaning: the default strategy (nothing to all-reduce) and one-device."""
    if gradient_all_reduce is None:
        return None if strategy not in COLLECTIVES_OF or collective == "one-device" else "packed"
    if gradient_all_reduce not in GRADIENT_ALL_REDUCES:
        raise ValueError(f"--gradient-all-reduce must be one of {GRADIENT_ALL_REDUCES}, got {gradient_all_reduce!r}")
    if strategy not in COLLECTIVES_OF:
        raise ValueError(f"--gradient-all-reduce {gradient_all_reduce} chooses how the replicas of --strategy mirrored "
                         f"or multi-worker all-reduce their gradients; --strategy {strategy} has one replica")
    if collective == "one-device":
        raise ValueError(f"--gradient-all-reduce {gradient_all_reduce}: --collective one-device sums each gradient on "
                         "its own and has no packs; use --collective nccl or hierarchical-copy to choose")
    return gradient_all_reduce


def mirrored_cross_device_ops(collective, gradient_all_reduce="packed"):
    """MirroredStrategy's cross_device_ops for a mirrored collective (collective_of), with
    its gradients packed or all-reduced one by one (check_gradient_all_reduce; num_packs 1
    is TensorFlow's default, 0 reduces each tensor on its own)."""
    num_packs = 0 if gradient_all_reduce == "per-gradient" else 1
    if collective == "nccl":
        return tf.distribute.NcclAllReduce(num_packs=num_packs)
    if collective == "hierarchical-copy":
        return tf.distribute.HierarchicalCopyAllReduce(num_packs=num_packs)
    if collective == "one-device":
        return tf.distribute.ReductionToOneDevice()
    raise ValueError(f"--collective must be one of {COLLECTIVES_OF['mirrored']} for --strategy mirrored, "
                     f"got {collective!r}")


def make_strategy(name, collective=None, gradient_all_reduce=None):
    """The tf.distribute strategy of name (STRATEGIES); collective: how its replicas
    all-reduce (collective_of), gradient_all_reduce: their gradients packed or one by one
    (check_gradient_all_reduce). multi-worker must be made before TensorFlow runs anything
    else in the process, as TensorFlow requires."""
    collective = collective_of(name, collective)
    gradient_all_reduce = check_gradient_all_reduce(name, collective, gradient_all_reduce)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        cross_device_ops = mirrored_cross_device_ops(collective, gradient_all_reduce)
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy(cross_device_ops=cross_device_ops)  # every GPU
        return tf.distribute.MirroredStrategy(local_devices(name), cross_device_ops=cross_device_ops)
    if name == "multi-worker":
        cluster_from_tf_config()
        # TensorFlow's default (AUTO) runs NCCL only where the session config asks for it, so
        # the workers' gradients would go the ring through host memory over gRPC (2 H100s,
        # 2026-11-28: a step of 2 x 32 shapes took 170 ms against one replica's 59 ms).
        implementation = {"nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
                          "ring": tf.distribute.experimental.CommunicationImplementation.RING}[collective]
        # bytes_per_pack 0 (TensorFlow's default) is one pack; 1 byte puts each gradient in a pack of its own.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=implementation, bytes_per_pack=1 if gradient_all_reduce == "per-gradient" else 0)
        return _interruptible(lambda: tf.distribute.MultiWorkerMirroredStrategy(communication_options=options))
    raise ValueError(f"--strategy must be one of {STRATEGIES}, got {name!r}")


def _interruptible(make):
    """make(), with Ctrl-C (SIGINT) ending the process while it blocks: a worker waits inside
    TensorFlow's C++ until every worker of TF_CONFIG has connected, where Python's own SIGINT
    handler never runs (it runs between bytecodes). SIGTERM does not end the wait either:
    TensorFlow's preemption notifier takes it."""
    if threading.current_thread() is not threading.main_thread():
        return make()
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        return make()
    finally:
        signal.signal(signal.SIGINT, previous)


def unreachable_tasks(environ=None, seconds=2.0):
    """(job, index, address) of the other tasks of TF_CONFIG's cluster whose address does
    not accept a TCP connection within seconds (their process ended or their host is gone);
    empty without a valid TF_CONFIG."""
    environ = os.environ if environ is None else environ
    try:
        cluster_from_tf_config(environ)
        config = json.loads(environ["TF_CONFIG"])
    except (ValueError, KeyError):
        return []
    me = (config["task"]["type"], config["task"]["index"])
    silent = []
    for job in TRAINING_JOBS:
        for index, address in enumerate(config["cluster"].get(job, [])):
            if (job, index) == me:
                continue
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=seconds).close()
            except OSError:
                silent.append((job, index, address))
    return silent


class ClusterFailure(RuntimeError):
    """A worker of a multi-worker cluster stopped; the run cannot go on."""


_UNHEALTHY_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


@contextlib.contextmanager
def cluster_failures_named(strategy):
    """Turns TensorFlow's error for a lost worker of a MultiWorkerMirroredStrategy cluster
    (its peers stop at their next collective once the coordination service misses the
    worker's heartbeats) into a ClusterFailure of one line naming the lost task(s)."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as e:
        if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise
        message = str(e)
        tasks = sorted(set(_UNHEALTHY_TASK.findall(message.split("unhealthy", 1)[-1])))
        lost = ", ".join(f"{job} {index}" for job, index in tasks) if "unhealthy" in message and tasks else None
        if lost:
            why = f"the cluster lost {lost} (it stopped sending heartbeats)"
        else:
            # A peer killed mid-collective resets its connection before the coordination
            # service misses its heartbeats; the peers whose address no longer answers name it.
            silent = unreachable_tasks()
            named = ", ".join(f"{job} {index} ({address} no longer accepts connections)"
                              for job, index, address in silent)
            why = (f"the cluster lost {named}" if silent else
                   f"the cluster's collective operations failed ({message.strip().splitlines()[0][:200]})")
        raise ClusterFailure(
            why
            + "; stop every worker and run the same commands again (with --backup-dir they resume from the "
              "last finished epoch)") from None


def check_strategy(strategy):
    """Raises ValueError unless the op library and Keras can train under strategy: the
    default strategy, OneDeviceStrategy, MirroredStrategy or MultiWorkerMirroredStrategy."""
    served = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy,
              tf.distribute.OneDeviceStrategy)
    if isinstance(strategy, served) or strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy():
        return strategy
    name = type(strategy).__name__
    why = ("the op library has no TPU kernels" if "TPU" in name else
           "Keras 3's fit does not train under it" if "ParameterServer" in name or "CentralStorage" in name else
           "it is not one of the strategies tested with the sparse ops")
    raise ValueError(f"{name} cannot train tf_sparseconv models ({why}); use MirroredStrategy (one host) or "
                     "MultiWorkerMirroredStrategy (several hosts)")


def is_chief(strategy):
    """Whether this process writes the run's results, checkpoints and summaries (all but
    one process of a multi-worker cluster only train)."""
    return bool(strategy.extended.should_checkpoint)


def replica_values(strategy, value):
    """An int of every replica, in replica order (a collective: every worker must call it)."""
    @tf.function
    def gather():
        return strategy.gather(strategy.run(lambda: tf.constant([value], tf.int64)), axis=0)
    return [int(v) for v in gather().numpy()]


def per_replica_dataset(strategy, make, repeat=True):
    """A distributed dataset whose replicas hold their own sparse batches: make(split) ->
    tf.data.Dataset of one input pipeline's replica batches, in replica order, for the
    data.ReplicaSplit split (data.point_cloud_dataset(..., split=split) makes them).
    repeat: cycle through the data, so model.fit(..., steps_per_epoch=steps_per_epoch(...))
    runs whole epochs (Keras counts the steps of a distributed dataset wrongly otherwise)."""
    check_strategy(strategy)

    def dataset_fn(context):
        local = context.num_replicas_in_sync // context.num_input_pipelines
        split = ReplicaSplit(context.num_replicas_in_sync, context.input_pipeline_id * local, local)
        dataset = make(split)
        return dataset.repeat() if repeat else dataset

    return strategy.distribute_datasets_from_function(dataset_fn)


def steps_per_epoch(num_examples, global_batch_size, drop_remainder):
    """Steps of one pass over num_examples in global batches (the last one incomplete
    unless drop_remainder)."""
    num_examples = count_arg(num_examples, "num_examples", "steps_per_epoch", 0)
    global_batch_size = count_arg(global_batch_size, "global_batch_size", "steps_per_epoch")
    if drop_remainder:
        return num_examples // global_batch_size
    return math.ceil(num_examples / global_batch_size)
