"""Timing shared by the benchmarks: wait for the device, the median wall time of
synchronised calls, and the device time per call with many calls in one graph loop."""
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
