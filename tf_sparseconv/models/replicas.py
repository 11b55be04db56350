"""Sparse batches of different sizes per replica in Keras' fit and evaluate.

Under a tf.distribute strategy Keras 3 builds a model's compiled state from the first
batch of a distributed dataset averaged over the replicas (`_maybe_symbolic_build`), which
fails when the replicas hold sparse batches of different sizes (keys [N1] beside keys [N2]:
"Inputs to operation AddN must have the same size and shape"; keras-team/keras#19246).
accept_per_replica_batches builds that state from one replica's element spec instead, so
nothing is averaged and no batch is drawn from the data before the first epoch.
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
    return model
