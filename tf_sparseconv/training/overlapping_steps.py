"""Training steps that overlap on the GPU: a train function for fit whose logs wait for nothing.

Keras' fit waits for each step's GPU work before it starts the next one: its train function
hands the step's logs back inside an Optional, and fit reads them on the host (the Optional's
`has_value`, then each log as a number), which TensorFlow queues behind all of the step's work.
`overlap_steps(model)` makes fit use a train function that returns, instead, the metrics'
results as they stood before the step, copied into variables on the host inside the step.
Nothing then waits for the step's own work, and the host queues the next step while the GPU
runs this one.

What changes for the user: a batch callback sees each batch's logs one step late (the first
batch of an epoch sees the metrics as just reset). An epoch's logs are exact, because Keras
recomputes them from the metrics at the epoch's end. The trained weights are the same.
"""
import tensorflow as tf


def overlap_steps(model):
    """Makes model.fit train with host_logs_train_function where it applies (one replica,
    one step per call, traced; `overlappable`), and with Keras' own train function elsewhere,
    also after compile() or FineTunePhase asks for a new one. Returns model."""
    keras_make = model.make_train_function

    def make_train_function(force=False):
        if model.train_function is not None and not force:
            return model.train_function
        keras_make(force=True)
        keras_function = model.train_function
        if not overlappable(model):
            return keras_function
        overlapped = host_logs_train_function(model)

        def train_function(iterator):
            # Compiled metrics are built by the first step that updates them; until then
            # there are no results to read before a step, and Keras' own step runs.
            if not all(getattr(metric, "built", True) for metric in model.metrics):
                return keras_function(iterator)
            return overlapped(iterator)

        train_function.overlaps_steps = True  # what tests and callers can tell it by
        model.train_function = train_function
        return train_function

    model.make_train_function = make_train_function
    return model


def overlappable(model):
    """Whether host_logs_train_function can stand in for Keras' train function: one replica
    on one host, one step per call and a traced step."""
    strategy = model.distribute_strategy
    return (strategy.num_replicas_in_sync == 1
            and not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and getattr(model, "steps_per_execution", 1) == 1 and not model.run_eagerly)


def host_logs_train_function(model):
    """fit's train function(iterator): one training step on the iterator's next batch,
    returning the metrics' results read before the step (the automatic control dependencies
    of a traced function order each read before the step's update of that metric). The
    traced step returns nothing: it copies the results into variables on the host, and the
    function returns those variables' values. A traced function's outputs would wait for all
    of its stateful ops (the automatic control dependencies gate them), so an output on the
    GPU would be copied to the host only after the whole step. The data's end surfaces as
    OutOfRangeError, which fit takes as the epoch's end."""
    host_logs = {}  # metric name -> a variable on the host, made at the first call

    @tf.function(reduce_retracing=True)
    def step(iterator):
        results = model.get_metrics_result()
        with tf.device("/cpu:0"):
            for name, value in results.items():
                host_logs[name].assign(tf.identity(value))
        model.distribute_strategy.run(model.train_step, args=(iterator.get_next(),))

    def train_function(iterator):
        if not host_logs:
            with tf.device("/cpu:0"):
                for name, value in model.get_metrics_result().items():
                    host_logs[name] = tf.Variable(tf.zeros(tf.shape(value), value.dtype), trainable=False,
                                                  name="host_log")
        step(iterator)
        return {name: variable.value() for name, variable in host_logs.items()}

    return train_function
