"""The site tests' TF32 setting: tests of the gpu fixture compare float32 GPU results with
the CPU's within 1e-5, which needs float32 products, so TF32 (TensorFlow's default on sm_80
and later, which SiteSparseConv follows) is off in them except where a test turns it on.
Tests of the device fixture run TensorFlow's default and allow TF32's tolerance."""
import pytest
import tensorflow as tf


@pytest.fixture(autouse=True)
def strict_float32_in_gpu_tests(request):
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    if "gpu" in request.fixturenames:
        tf.config.experimental.enable_tensor_float_32_execution(False)
    yield
    tf.config.experimental.enable_tensor_float_32_execution(previous)
