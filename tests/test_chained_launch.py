"""Chained launches (programmatic dependent launch, csrc/common/gpu_util.cuh) change no result:
the same ops run in two processes, one with TF_SPARSECONV_CHAINED_LAUNCH=0 (every kernel an
ordinary launch), give the same bits. Op determinism on, so that no float atomics run."""
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The direct convolution in each dataflow (with k-selection and its gradients), max pooling,
# a submanifold and a strided site convolution with their kernel maps and gradients.
SCRIPT = r"""
import sys
import numpy as np
import tensorflow as tf
tf.config.experimental.enable_op_determinism()
import tf_sparseconv as ts
from tests.site.helpers import random_sites

device, path = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(7)
out = {}
with tf.device(device):
    shape = (2, 12, 12, 12, 3)
    dense = np.where(rng.random(shape) < 0.15, rng.standard_normal(shape), 0.0).astype(np.float32)
    x = ts.from_dense(dense)
    w = tf.constant(rng.standard_normal((3, 3, 3, 3, 4)).astype(np.float32))
    b = tf.constant(rng.standard_normal(4).astype(np.float32))
    for dataflow in ("sort", "bitmap", "dense") if "GPU" in device else ("sort", "dense"):
        values = tf.identity(x.values)
        with tf.GradientTape() as tape:
            tape.watch([values, w])
            y = ts.direct_conv(ts.ChannelSparseTensor(x.keys, values, x.dense_shape), w, b, dataflow=dataflow,
                               selection="signed", rho_up=0.05, activation="relu")
            loss = tf.reduce_sum(y.values * y.values)
        grad_values, grad_w = tape.gradient(loss, [values, w])
        out[dataflow + "_keys"], out[dataflow + "_values"] = y.keys.numpy(), y.values.numpy()
        out[dataflow + "_grad_values"], out[dataflow + "_grad_w"] = grad_values.numpy(), grad_w.numpy()
    pooled = ts.sparse_max_pool(x, 2)
    out["pool_keys"], out["pool_values"] = pooled.keys.numpy(), pooled.values.numpy()

    coords, features = random_sites(rng, 2, (16, 16, 16), 0.1, 8)
    features = tf.constant(features)
    kernel = tf.constant(rng.standard_normal((3, 3, 3, 8, 8)).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch([features, kernel])
        s = ts.make_site_sparse(coords, features, (16, 16, 16), 2)
        sub = ts.site_conv(s, kernel, subm=True)
        down = ts.site_conv(sub, kernel, strides=2)
        loss = tf.reduce_sum(sub.features * sub.features) + tf.reduce_sum(down.features)
    grad_features, grad_kernel = tape.gradient(loss, [features, kernel])
    out["subm"], out["down"] = sub.features.numpy(), down.features.numpy()
    out["down_coords"] = down.coords.numpy()
    out["site_grad_features"], out["site_grad_kernel"] = grad_features.numpy(), grad_kernel.numpy()
np.savez(path, **out)
"""


def run_ops(device, chained, path):
    env = dict(os.environ, TF_SPARSECONV_CHAINED_LAUNCH=chained, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", SCRIPT, device, path], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(path) as results:
        return {name: results[name] for name in results.files}


def test_chained_and_ordinary_launches_give_the_same_bits(gpu, tmp_path):
    chained = run_ops("/GPU:0", "1", str(tmp_path / "chained.npz"))
    ordinary = run_ops("/GPU:0", "0", str(tmp_path / "ordinary.npz"))
    assert chained.keys() == ordinary.keys()
    for name in chained:
        assert chained[name].size > 0, name
        np.testing.assert_array_equal(chained[name], ordinary[name], err_msg=name)
    assert np.any(chained["sort_values"] != 0) and np.any(chained["site_grad_kernel"] != 0)
