"""Sparse batches of different sizes per replica in Keras' fit and evaluate.

Under a tf.distribute strategy Keras 3 builds a model's compiled state from the first
batch of a distributed dataset averaged over the replicas (`_maybe_symbolic_build`), which
fails when the replicas hold sparse batches of different sizes (keys [N1] beside keys [N2]:
"Inputs to operation AddN must have the same size and shape"; keras-team/keras#19246).
accept_per_replica_batches builds that state from one replica's element spec instead, so
nothing is averaged and no batch is drawn from the data before the first epoch.

Under MultiWorkerMirroredStrategy Keras 3 also averages each step's scalar logs over the
replicas along an axis 0 they do not have ("Invalid reduction dimension 0 for input with 0
dimensions"; tensorflow/tensorflow#72388); there each replica's step logs get that axis
(one element), which the average removes again. The epoch's logs are Keras' reading of the
metrics, whose totals and counts are summed over all replicas.

Keras 3 averages those step logs one by one, and under MultiWorkerMirroredStrategy each
average is a collective between the workers (two, with the replica axis: sum and count),
run one after the other in every step: with a loss, three metrics and the density of each
of OctNet3's nine convolutions, about 26 collectives a step besides the gradients' one.
There the step's one-element floating-point logs travel as one vector instead (two
collectives a step), unpacked into the same names and order afterwards (as float32).
"""
import tensorflow as tf


def _one_replica(spec):
    """The spec of one replica's value from a PerReplicaSpec (a spec as it is otherwise)."""
    components = getattr(spec, "_component_specs", None)
    if isinstance(spec, tf.TypeSpec) and not isinstance(spec, tf.TensorSpec) and components:
        return components[0]
    return spec


def accept_per_replica_batches(model):
    """Lets model.fit / model.evaluate take datasets made by
    strategy.distribute_datasets_from_function whose replicas hold sparse batches of
    different sizes; returns model. The models of tf_sparseconv.models call it themselves;
    call it on a model of your own built from the sparse layers."""
    build = model._maybe_symbolic_build

    def build_from_one_replica(iterator=None, data_batch=None):
        if iterator is not None and data_batch is None:
            dataset = iterator.data_adapter.get_tf_dataset()
            if isinstance(dataset, tf.distribute.DistributedDataset):
                data_batch = tf.nest.map_structure(_one_replica, dataset.element_spec)
                iterator = None
        return build(iterator=iterator, data_batch=data_batch)

    model._maybe_symbolic_build = build_from_one_replica
    model.train_step = _logs_with_a_replica_axis(model, model.train_step)
    model.test_step = _logs_with_a_replica_axis(model, model.test_step)
    model._make_function = _packed_step_logs(model, model._make_function)
    return model


def _packed_step_logs(model, make_function):
    """Keras' _make_function(step_function) -> function(iterator) -> logs, with the step's
    one-element floating-point logs averaged over the workers as one vector under
    MultiWorkerMirroredStrategy (module docstring); as Keras makes it otherwise."""
    def make_packed_function(step_function):
        if not isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return make_function(step_function)
        layout = {}  # filled when the step is traced: the logs' names, and which of them are packed

        def packed_step(data):
            logs = step_function(data)
            if not isinstance(logs, dict):
                layout.clear()
                return logs
            packed = [name for name, value in logs.items()
                      if tf.is_tensor(value) and value.dtype.is_floating and value.shape.num_elements() == 1]
            layout.update(order=list(logs), packed=packed)
            vector = tf.concat([tf.reshape(tf.cast(logs[name], tf.float32), [1]) for name in packed], 0) \
                if packed else tf.zeros([0])
            # [1, L]: the replica axis the average over the workers takes away
            return vector[None], {name: value for name, value in logs.items() if name not in packed}

        function = make_function(packed_step)

        def unpacked(iterator):
            outputs = function(iterator)
            if not layout:
                return outputs
            vector, rest = outputs
            count = len(layout["packed"])
            logs = dict(zip(layout["packed"], tf.unstack(tf.reshape(vector, [count]), num=count)), **rest)
            return {name: logs[name] for name in layout["order"]}
        return unpacked
    return make_packed_function


def _logs_with_a_replica_axis(model, step):
    """step, whose scalar logs get an axis of one element under MultiWorkerMirroredStrategy
    (module docstring)."""
    def step_with_axis(data):
        logs = step(data)
        if not isinstance(model.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            return logs
        return tf.nest.map_structure(lambda v: tf.reshape(v, [1]) if tf.is_tensor(v) and v.shape.rank == 0 else v,
                                     logs)
    return step_with_axis
