"""Running a test on a device: the device strings of tests/conftest.py's `device` and `gpu`
fixtures, running a function there, checking where results live, and comparing the error
messages of both devices. Imported as `tests.device`, so that a subprocess finds it too."""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

CPU, GPU = "/CPU:0", "/GPU:0"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpu_visible():
    return bool(tf.config.list_physical_devices("GPU"))


def on(device, fn, *args, **kwargs):
    """fn(*args) with its numpy arguments turned into tensors on `device`, run there."""
    with tf.device(device):
        args = [tf.constant(a) if isinstance(a, np.ndarray) else a for a in args]
        return fn(*args, **kwargs)


def assert_on(device, *tensors):
    """Every tensor lives on `device`'s kind of device (tests marked soft_placement check this)."""
    kind = tf.DeviceSpec.from_string(device).device_type
    for t in tensors:
        assert tf.DeviceSpec.from_string(t.device).device_type == kind, \
            f"expected a {kind} result, got one on {t.device}"


def assert_on_gpu(*tensors):
    for t in tensors:
        assert "GPU" in t.device, f"expected a GPU result, got one on {t.device}"


def first_line(error):
    """The error's own first line, without TensorFlow's device-specific function-node prefix."""
    message = str(error.message).split(" [Op:")[0].splitlines()[0]
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", message)


def assert_same_error(fn, phrase):
    """fn() raises InvalidArgumentError matching phrase on the CPU and the GPU, with one message."""
    messages = {}
    for device in (CPU, GPU):
        with pytest.raises(tf.errors.InvalidArgumentError, match=phrase) as error:
            with tf.device(device):
                fn()
        messages[device] = first_line(error.value)
    assert messages[GPU] == messages[CPU]


def run_in_own_process(script):
    """stdout of `script` (dedented) run by a fresh interpreter at the repository root, for
    settings that cannot be undone (e.g. op determinism); fails the test with its output if it
    exits non-zero."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
