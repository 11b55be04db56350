"""How often the library's ops made the host wait for the GPU.

Each wait (a GPU op reading an output size or a check's result back before it returns)
stalls the host until the GPU has finished everything queued before it, so the next ops
cannot be queued ahead of the GPU's work. host_sync_count() reads the library's own count
of these waits; the difference over one training step is the step's number of waits:

    before = tf_sparseconv.host_sync_count()
    model.train_on_batch(x, y)
    print(tf_sparseconv.host_sync_count() - before)

CPU kernels never wait. TensorFlow's own waits (e.g. .numpy(), or its ops with data-
dependent output sizes) are not counted.

deferred_read_back_count() counts the read-backs that do not wait: SiteKernelMap on the
GPU reads its pair counts back asynchronously (its outputs are allocated in a callback
once the GPU has passed the copy; no thread blocks, so the ops that do not need the map
are queued meanwhile).
"""
import tensorflow as tf

from tf_sparseconv._op_library import ops as _ops


def _count(what):
    with tf.device("/CPU:0"):  # the count lives on the host, whatever the caller's device scope
        count = _ops.host_sync_count(what=what)
    return int(count) if tf.executing_eagerly() else count


def host_sync_count():
    """The number of waits since the library was loaded: an int in eager mode (an int64
    scalar tensor inside tf.function, read where the function reaches it)."""
    return _count("waits")


def deferred_read_back_count():
    """The number of read-backs queued without a wait since the library was loaded (as
    host_sync_count: an int in eager mode, a tensor inside tf.function)."""
    return _count("deferred")
