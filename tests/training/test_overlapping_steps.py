"""tf_sparseconv.training.overlap_steps: fit through the train function whose logs are the
metrics before each step, on the host, trains the same weights as Keras' own, gives the same
epoch logs, hands batch callbacks each batch's logs one step late, and stands aside where it
does not apply."""
import json

import keras
import numpy as np
import pytest

from tf_sparseconv import data as datasets
from tf_sparseconv.models import octnet3
from tf_sparseconv.training.overlapping_steps import overlap_steps
from tf_sparseconv.training.train import keras_batches
from tests.device import run_in_own_process


class BatchLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.logs = []

    def on_train_batch_end(self, batch, logs=None):
        self.logs.append(dict(logs))


def fit(overlap, epochs=2, steps_per_execution=1):
    points, labels, classes = datasets.make_shapes(2, num_points=256, seed=0)
    keras.utils.set_random_seed(0)
    model = octnet3(16, len(classes), (1.0, 1.0, 1.0))
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    if overlap:
        overlap_steps(model)
    batch_logs = BatchLogs()
    batches = keras_batches(datasets.point_cloud_dataset(points, labels, 16, 8, shuffle=False))
    history = model.fit(batches, epochs=epochs, verbose=0, shuffle=False, callbacks=[batch_logs]).history
    return model, history, batch_logs.logs


@pytest.fixture(scope="module")
def keras_run():
    return fit(False)


@pytest.fixture(scope="module")
def overlapped_run():
    return fit(True)


def test_the_weights_and_the_epoch_logs_are_keras_own(keras_run, overlapped_run):
    (keras_model, keras_history, _), (model, history, _) = keras_run, overlapped_run
    for a, b in zip(keras_model.trainable_weights, model.trainable_weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert set(history) == set(keras_history) and len(history["loss"]) == 2
    for name in history:
        np.testing.assert_allclose(history[name], keras_history[name], rtol=1e-6, err_msg=name)


def test_a_batch_callback_sees_each_batch_one_step_late(keras_run, overlapped_run):
    keras_logs, logs = keras_run[2], overlapped_run[2]
    assert len(logs) == len(keras_logs) == 4  # two batches in each of two epochs
    # The very first step is Keras' own (it builds the compiled metrics); each later batch
    # sees the metrics as they stood before it: the batch before's, and at an epoch's start
    # the metrics just reset.
    assert logs[0]["loss"] == pytest.approx(keras_logs[0]["loss"], rel=1e-6)
    assert logs[1]["loss"] == pytest.approx(keras_logs[0]["loss"], rel=1e-6)
    assert logs[2]["loss"] == 0.0 and logs[2]["accuracy"] == 0.0
    assert logs[3]["loss"] == pytest.approx(keras_logs[2]["loss"], rel=1e-6)
    assert logs[1]["loss"] != pytest.approx(keras_logs[1]["loss"], rel=1e-3)  # not the step's own


def test_the_logs_come_back_on_the_host(overlapped_run):
    model, history = overlapped_run[:2]
    assert getattr(model.train_function, "overlaps_steps", False)
    points, labels, _ = datasets.make_shapes(2, num_points=256, seed=0)
    iterator = iter(keras_batches(datasets.point_cloud_dataset(points, labels, 16, 8, shuffle=False)))
    logs = model.train_function(iterator)
    assert set(logs) == set(history)  # loss, accuracy and the layers' density metrics
    assert all("CPU" in value.device for value in logs.values())


def test_fine_tuning_asks_for_a_new_function_and_gets_one_that_overlaps(overlapped_run):
    model = overlapped_run[0]
    before = model.train_function
    model.make_train_function(force=True)
    assert model.train_function is not before and model.train_function.overlaps_steps
    assert model.make_train_function() is model.train_function  # kept until forced again


def test_it_stands_aside_for_several_steps_per_call():
    model, history, _ = fit(True, epochs=1, steps_per_execution=2)
    assert not getattr(model.train_function, "overlaps_steps", False)  # Keras' own
    assert len(history["loss"]) == 1


def test_under_a_one_replica_mirrored_strategy_the_logs_stay_on_the_host():
    """MirroredStrategy on one device (what a one-GPU user may write): the weights live on the
    strategy's device, here a second logical CPU, but the variables that carry the logs stay
    plain variables on the host's CPU:0, so the step still overlaps."""
    out = run_in_own_process("""
        import gc, json
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras, numpy as np
        from tf_sparseconv.training.overlapping_steps import overlap_steps
        with tf.distribute.MirroredStrategy(["/cpu:1"]).scope():
            model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2)])
            model.compile("sgd", "mse", metrics=["mae"])
        overlap_steps(model)
        rng = np.random.default_rng(0)
        model.fit(rng.random((64, 3), "float32"), rng.random((64, 2), "float32"), batch_size=16, verbose=0)
        logs = [v for v in gc.get_objects() if isinstance(v, tf.Variable) and v.name.startswith("host_log")]
        print(json.dumps({"overlaps": getattr(model.train_function, "overlaps_steps", False),
                          "weights": str(model.trainable_variables[0].value.device),
                          "logs": [[type(v).__name__, v.device] for v in logs]}))
    """)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["overlaps"]
    assert seen["weights"].endswith("CPU:1")
    assert len(seen["logs"]) == 2  # loss and mae
    assert all(kind == "ResourceVariable" and device.endswith("CPU:0") for kind, device in seen["logs"])
