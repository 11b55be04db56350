"""host_sync_count: the library's count of its host waits for the GPU."""
import numpy as np
import tensorflow as tf

import tf_sparseconv as ts
from tests.device import CPU
from tests.site.helpers import random_sites


def sites(rng):
    coords, features = random_sites(rng, 2, (8, 8, 8), 0.2, 4)
    return ts.make_site_sparse(coords, features, (8, 8, 8), 2)


def counted(fn):
    before = ts.host_sync_count()
    result = fn()
    return result, ts.host_sync_count() - before


def test_cpu_ops_never_wait(rng):
    with tf.device(CPU):
        x = sites(rng)
        kernel = tf.constant(rng.standard_normal((3, 3, 3, 4, 5)).astype(np.float32))
        _, waits = counted(lambda: ts.site_conv(x, kernel, subm=True).features.numpy())
        dense = np.where(rng.random((1, 6, 6, 6, 2)) < 0.2, 1.0, 0.0).astype(np.float32)
        _, more = counted(lambda: ts.sparse_relu(ts.from_dense(dense)).values.numpy())
    assert waits == 0 and more == 0


def counted_both(fn):
    """fn()'s result, its waits and its deferred read-backs."""
    waits, deferred = ts.host_sync_count(), ts.deferred_read_back_count()
    result = fn()
    return result, ts.host_sync_count() - waits, ts.deferred_read_back_count() - deferred


def test_cpu_kernel_map_reads_nothing_back(rng):
    with tf.device(CPU):
        _, waits, deferred = counted_both(lambda: ts.kernel_map(sites(rng), 3, mode="submanifold").in_rows.numpy())
    assert waits == 0 and deferred == 0


def test_gpu_kernel_map_reads_back_without_waiting_and_a_trusted_map_is_not_read_back(gpu, rng):
    with tf.device(gpu):
        x = sites(rng)
        kernel = tf.constant(rng.standard_normal((3, 3, 3, 4, 5)).astype(np.float32))
        kmap, waits, deferred = counted_both(lambda: ts.kernel_map(x, 3, mode="submanifold"))
        assert (waits, deferred) == (0, 1)  # the map's sizes, read back in a callback
        _, waits, deferred = counted_both(lambda: ts.site_conv(x.with_map("s", kmap), kernel, subm=True,
                                                               indice_key="s"))
        assert (waits, deferred) == (0, 0)  # a trusted (library-built) map is not checked again
        _, waits, deferred = counted_both(lambda: ts.site_conv(x, kernel, subm=True))
        assert (waits, deferred) == (0, 1)  # the map built inside


def test_gpu_site_unet_step_in_a_traced_function_does_not_wait(gpu, rng):
    """A site UNet's traced training step (maps built inside) makes no thread wait: every
    map's counts come back in callbacks, one per map."""
    from tf_sparseconv import keras_layers as kl
    from tf_sparseconv.models import site_unet
    with tf.device(gpu):
        coords, features = random_sites(rng, 2, (16, 16, 16), 0.1, 3)
        model = site_unet(4, 16, in_channels=3, channels=(8, 16))
        x = kl.as_site_keras_inputs(ts.make_site_sparse(coords, features, (16, 16, 16), 2))
        labels = tf.constant(rng.integers(0, 4, len(coords)), tf.int32)
        optimizer = tf.keras.optimizers.SGD(0.01)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        step().numpy()
        loss, waits, deferred = counted_both(lambda: step().numpy())
    assert np.isfinite(loss)
    assert waits == 0 and deferred >= 1


def conv_case(rng):
    """A channel-sparse input [2, 6, 6, 6, 2] and a 3^3 filter variable to 4 channels, on the current device."""
    dense = np.where(rng.random((2, 6, 6, 6, 2)) < 0.3, rng.standard_normal((2, 6, 6, 6, 2)), 0)
    return ts.from_dense(dense.astype(np.float32)), tf.Variable(rng.standard_normal((3, 3, 3, 2, 4)).astype(np.float32))


def test_gpu_gradients_of_checked_inputs_do_not_wait(gpu, rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    with tf.device(gpu):
        x, w = conv_case(rng)

        def step():
            with tf.GradientTape() as tape:
                y = ts.direct_conv(x, w)
                loss = tf.reduce_sum(ts.to_dense(y))
            return tape.gradient(loss, w)

        _, waits = counted(lambda: step().numpy())
        # DirectSparseConv (its output count) and ToDense (its key check) wait; their gradients
        # (DirectSparseConvBackprop, ChannelSparseGatherDense) were told the inputs are checked
        assert waits == 2
        monkeypatch.setenv(ts.checks.CHECK_EVERY_OP_ENV, "1")
        _, waits = counted(lambda: step().numpy())
        assert waits == 4  # every op checks again


def test_gpu_fused_relu_saves_the_relus_wait(gpu, rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    with tf.device(gpu):
        x, w = conv_case(rng)

        def step(fused):
            with tf.GradientTape() as tape:
                y = (ts.direct_conv(x, w, activation="relu") if fused else ts.sparse_relu(ts.direct_conv(x, w)))
                loss = tf.reduce_sum(ts.to_dense(y))
            return tape.gradient(loss, w)

        unfused, unfused_waits = counted(lambda: step(False).numpy())
        fused, fused_waits = counted(lambda: step(True).numpy())
    np.testing.assert_allclose(fused, unfused, rtol=1e-6, atol=1e-6)
    assert (unfused_waits, fused_waits) == (3, 2)  # conv, ReLU, ToDense -> conv (with its ReLU), ToDense


def test_the_count_is_readable_inside_tf_function():
    read = tf.function(ts.host_sync_count)
    assert read().dtype == tf.int64 and int(read()) == ts.host_sync_count()


def test_gpu_to_dense_of_the_librarys_keys_in_a_traced_step_does_not_wait(gpu, rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    with tf.device(gpu):
        x, w = conv_case(rng)

        def step(keys, values, dense_shape):
            with tf.GradientTape() as tape:
                y = ts.direct_conv(ts.ChannelSparseTensor(keys, values, dense_shape), w, activation="relu")
                loss = tf.reduce_sum(ts.to_dense(y))
            return tape.gradient(loss, w)

        traced = tf.function(step)
        traced(x.keys, x.values, x.dense_shape).numpy()  # tracing outside the count
        _, waits = counted(lambda: traced(x.keys, x.values, x.dense_shape).numpy())
        # DirectSparseConv reads its output size; ToDense trusts the keys it made, and the
        # gradients were told their inputs are checked
        assert waits == 1


def traced_step_waits(x, w, sparse_part):
    """{padded_output: the library's waits in one traced training step} of the loss
    sum(to_dense(sparse_part(x's tensor, padded_output))), its gradient for w, for both values
    of padded_output (each traced outside the count)."""
    def step(keys, values, dense_shape, padded_output):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ts.to_dense(sparse_part(ts.ChannelSparseTensor(keys, values, dense_shape),
                                                         padded_output)))
        return tape.gradient(loss, w)

    traced = tf.function(step)
    waits = {}
    for padded in (False, True):
        traced(x.keys, x.values, x.dense_shape, padded).numpy()
        _, waits[padded] = counted(lambda: traced(x.keys, x.values, x.dense_shape, padded).numpy())
    return waits


def test_gpu_padded_pooling_of_the_librarys_keys_in_a_traced_step_does_not_wait(gpu, rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    with tf.device(gpu):
        x, w = conv_case(rng)
        waits = traced_step_waits(x, w, lambda x, padded: ts.sparse_max_pool(
            ts.direct_conv(x, w, activation="relu"), 2, padded_output=padded))
    # the convolution reads its output size back; the exact pooling its output size too, the
    # padded one (of keys the convolution made) nothing; ToDense and the gradients trust them
    assert waits == {False: 2, True: 1}


def test_gpu_padded_relu_of_the_librarys_keys_in_a_traced_step_does_not_wait(gpu, rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    with tf.device(gpu):
        x, w = conv_case(rng)
        waits = traced_step_waits(x, w, lambda x, padded: ts.sparse_relu(
            ts.direct_conv(x, w, padded_output=True), padded_output=padded))
    # the padded convolution trusts the keys checked on the host and waits for nothing; the
    # exact ReLU reads its output size back, the padded one (of keys the convolution made)
    # nothing
    assert waits == {False: 1, True: 0}


def test_gpu_padded_convolutions_after_the_first_do_not_wait(gpu, rng, monkeypatch):
    monkeypatch.delenv(ts.checks.CHECK_EVERY_OP_ENV, raising=False)
    with tf.device(gpu):
        x, w = conv_case(rng)
        w2 = tf.Variable(rng.standard_normal((3, 3, 3, 4, 3)).astype(np.float32))

        # "capped": the first convolution's padded length is a user-given max_entries (its
        # exact count), below the bound; its overflow check waits for nothing either
        cap = int(ts.direct_conv(x, w, activation="relu").num_entries)

        def step(keys, values, dense_shape, mode):
            with tf.GradientTape() as tape:
                y = ts.direct_conv(ts.ChannelSparseTensor(keys, values, dense_shape), w, activation="relu",
                                   padded_output=bool(mode), max_entries=cap if mode == "capped" else None)
                y = ts.direct_conv(y, w2, selection="signed", k=20, activation="relu", padded_output=bool(mode))
                loss = tf.reduce_sum(ts.to_dense(y))
            return tape.gradient(loss, [w, w2])

        traced = tf.function(step)
        waits, deferred = {}, {}
        for mode in (False, True, "capped"):
            traced(x.keys, x.values, x.dense_shape, mode)[0].numpy()  # tracing outside the count
            _, waits[mode], deferred[mode] = counted_both(
                lambda: traced(x.keys, x.values, x.dense_shape, mode)[0].numpy())
        # exact: each convolution reads its output size back; padded: the user's keys are
        # checked on the host where they enter the graph (ChannelSparseValidate, no wait of the
        # library's), the first convolution trusts them and the second the keys the first
        # made; the statuses are reported beside to_dense, read back in a callback, and a capped
        # convolution's status by its own report as well
        assert waits == {False: 2, True: 0, "capped": 0}
        assert deferred == {False: 0, True: 1, "capped": 2}
