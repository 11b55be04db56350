"""Timing shared by the benchmarks: wait for the device, the median wall time of
synchronised calls, and the device time per call with many calls in one graph loop
(device_s_per_call) or queued back to back from Python (queued_s_per_call)."""
import statistics
import time

import tensorflow as tf


def sync():
    """Waits for the device's queued work."""
    if hasattr(tf.test.experimental, "sync_devices"):
        tf.test.experimental.sync_devices()
    else:  # older TensorFlow: a tiny read-back orders after everything queued before it
        tf.reduce_sum(tf.zeros([1])).numpy()


def median_time(fn, warmup, repeats, args=(), budget_s=None):
    """Median seconds of `repeats` synchronised calls fn(*args) after `warmup` calls; with
    budget_s, stops early once the timed calls exceed it (at least 3 of them)."""
    for _ in range(warmup):
        fn(*args)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        sync()
        times.append(time.perf_counter() - start)
        if budget_s is not None and sum(times) > budget_s and len(times) >= 3:
            break
    return statistics.median(times)


def device_s_per_call(fn, calls, args=()):
    """Seconds per call of fn(*args) with `calls` calls in one graph loop, synchronised once
    (the median of 3 loops after a warm-up loop); TensorFlow's per-call dispatch from Python
    is not in it. One element of every output feeds a running sum, so graph pruning keeps
    all the work."""
    @tf.function
    def loop(*a):
        def step(i, total):
            firsts = [tf.reduce_sum(tf.cast(tf.reshape(t, [-1])[:1], tf.float32)) for t in tf.nest.flatten(fn(*a))]
            return i + 1, total + tf.add_n(firsts)
        return tf.while_loop(lambda i, _: i < calls, step, (tf.constant(0), tf.constant(0.0)))[1]
    loop(*args)
    sync()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        loop(*args)
        sync()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def queued_s_per_call(fn, calls, args=(), setup=None, op_by_op=True):
    """Seconds per call of fn(*args) on the device: `calls` calls queued back to back from
    Python in eager mode (fn's Python function, op by op, so no tf.function dispatch per
    call) and synchronised once; the median of 3 such runs after a warm-up. The device
    stays busy as long as queueing an op takes less host time than running it, so this is
    the device time of all but the fastest calls (those it overstates). setup(): tensors
    built once (not timed) and passed to fn after args. op_by_op=False calls fn itself
    (a tf.function: one dispatch per call, for long chains whose eager gradient tape would
    keep the host busier than the device).

    Why not device_s_per_call (many calls in one graph loop) for the site-sparse ops:
    TensorFlow's control-flow kernels hold int32 tensors in host memory, so the maps' rows
    and neighbour tables that enter the loop are copied to the device again in every
    iteration, which on an H200 made a 20 MB neighbour table cost 1.47 ms per call
    against 0.13 ms queued eagerly (lidar frame, 5 cm, C 64, fp16; its kernels: 0.14 ms).
    """
    if op_by_op:
        fn = getattr(fn, "python_function", fn)
    extra = tuple(tf.nest.flatten(setup())) if setup is not None else ()
    fn(*args, *extra)
    sync()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args, *extra)
        sync()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)
