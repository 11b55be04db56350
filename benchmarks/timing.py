"""Timing shared by the benchmarks: wait for the device, the median wall time of
synchronised calls, and the device time per call with many calls in one graph loop
(device_s_per_call) or queued back to back from Python (queued_s_per_call)."""
import ctypes
import statistics
import time

import tensorflow as tf

_CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_cudart = None  # loaded on first use where a GPU is visible; False: not loadable


def _cuda_runtime():
    global _cudart
    if _cudart is None:
        _cudart = False
        if tf.config.list_physical_devices("GPU"):
            for name in _CUDART_NAMES:
                try:
                    lib = ctypes.CDLL(name)
                    lib.cudaDeviceSynchronize.restype = ctypes.c_int
                    _cudart = lib
                    break
                except (OSError, AttributeError):
                    continue
    return _cudart or None


def sync_method():
    """'cudaDeviceSynchronize' or 'sync_devices': what sync() waits with in this process."""
    return "cudaDeviceSynchronize" if _cuda_runtime() is not None else "sync_devices"


def sync_devices():
    """TensorFlow's own wait: a SyncDevice op dispatched on every device, then the eager
    executors' wait."""
    if hasattr(tf.test.experimental, "sync_devices"):
        tf.test.experimental.sync_devices()
    else:  # older TensorFlow: a tiny read-back orders after everything queued before it
        tf.reduce_sum(tf.zeros([1])).numpy()


def sync():
    """Waits for the device's queued work. With a GPU: cudaDeviceSynchronize through the
    CUDA runtime (TensorFlow's streams live in the device's primary context, which the
    runtime API shares), the call torch.cuda.synchronize makes, so that our synchronised
    calls and spconv's pay the same wait; tf.test.experimental.sync_devices dispatches an
    op per device first, which adds to every call. check_sync() tests that both waits see
    the same device work. Without a GPU or a loadable runtime: sync_devices."""
    cudart = _cuda_runtime()
    if cudart is None:
        sync_devices()
        return
    status = cudart.cudaDeviceSynchronize()
    if status != 0:
        raise RuntimeError(f"cudaDeviceSynchronize failed with CUDA error {status}")


def check_sync(size=4096, steps=10, repeats=5):
    """(seconds with sync_devices, seconds with sync()) of one tf.function of `steps`
    matrix products of size x size, medians: a device-bound call that both must wait for.
    Raises if sync() returns clearly earlier than sync_devices (it would not be waiting for
    TensorFlow's work)."""
    a = tf.random.normal([size, size]) * (1.0 / size)

    @tf.function
    def chain(x):
        for _ in range(steps):
            x = tf.matmul(x, x)
        return x

    by_tf = median_time(chain, 1, repeats, (a,), wait=sync_devices)
    by_sync = median_time(chain, 1, repeats, (a,))
    if by_sync < 0.8 * by_tf:
        raise RuntimeError(f"sync() ({sync_method()}) returned after {by_sync * 1e3:.3f} ms against "
                           f"{by_tf * 1e3:.3f} ms for sync_devices: it does not wait for TensorFlow's work")
    return by_tf, by_sync


def synchronised_call_s(fn, args=(), wait=sync):
    """Seconds of one call fn(*args) up to the end of its device work (wait())."""
    start = time.perf_counter()
    fn(*args)
    wait()
    return time.perf_counter() - start


def median_time(fn, warmup, repeats, args=(), budget_s=None, wait=sync):
    """Median seconds of `repeats` synchronised calls fn(*args) after `warmup` calls; with
    budget_s, stops early once the timed calls exceed it (at least 3 of them). wait: how
    each call is waited for (sync by default)."""
    for _ in range(warmup):
        fn(*args)
    wait()
    times = []
    for _ in range(repeats):
        times.append(synchronised_call_s(fn, args, wait))
        if budget_s is not None and sum(times) > budget_s and len(times) >= 3:
            break
    return statistics.median(times)


def interleaved_medians(fns, args, warmup, repeats, rounds=3):
    """median_time for several functions on the same args, in `rounds` interleaved rounds
    (each function warmed up first, then every round times each function in turn), so that
    a slow start or drift of the machine lands on all of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn(*args)
    sync()
    times = [[] for _ in fns]
    per_round = max(1, -(-repeats // rounds))
    for _ in range(rounds):
        for fn, acc in zip(fns, times):
            acc.extend(synchronised_call_s(fn, args) for _ in range(per_round))
    return tuple(statistics.median(acc) for acc in times)


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
    and neighbour tables that enter the loop would be copied to the device again in every
    iteration (docs/gpu-kernels.md).
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
