"""What a benchmark row records about its run: the checkout's commit and the GPU's name."""
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def checkout_commit():
    """The checkout's short commit hash, or None outside a git checkout. BENCHMARK_COMMIT
    overrides it where the tree travels without its history (the lent GPU: dev/device_unpack.sh
    sets it to the commit dev/device_parts.sh packed)."""
    if os.environ.get("BENCHMARK_COMMIT"):
        return os.environ["BENCHMARK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def gpu_name():
    """The name of the first GPU TensorFlow sees (e.g. 'NVIDIA H200'), or None without one."""
    import tensorflow as tf  # here: callers that only need the commit need not load TensorFlow
    gpus = tf.config.list_physical_devices("GPU")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else None


def checks_mode():
    """Which of the library's input checks the run made: "every op" with
    TF_SPARSECONV_CHECK_EVERY_OP=1 (each op re-checks its inputs, on the GPU with a wait per
    call), else "boundary" (only tensors entering from the user are checked)."""
    return "every op" if os.environ.get("TF_SPARSECONV_CHECK_EVERY_OP", "0") == "1" else "boundary"


def gpu_thread_mode():
    """How TensorFlow launches GPU work in the run: TF_GPU_THREAD_MODE ("gpu_private": each GPU
    launches from its own host threads, TF_GPU_THREAD_COUNT of them) or "global" (TensorFlow's
    default: every GPU's launches share the inter-op thread pool)."""
    mode = os.environ.get("TF_GPU_THREAD_MODE", "global")
    return f"{mode} x{os.environ.get('TF_GPU_THREAD_COUNT', 2)}" if mode != "global" else mode
