"""An ensemble of serving models as one serving model: one file that evaluate, predict,
bound and Keras load like any other.

    ensemble = ensemble_classifier([keras.models.load_model(p) for p in paths])
    tf_sparseconv.models.save_model(ensemble, "ensemble.keras")

The members must take the same input (the same PointCloudToSparse or ImageToSparse
configuration: the ensemble voxelizes once and hands the grid to every member's core) and
name the same classes. The ensemble's outputs are logits whose softmax is the mean of the
members' softmax outputs (MeanSoftmax), so argmax, top-k and probabilities read as for one
model. The members' cores run inside one graph; the memory bound counts all of them alive
together (models.memory_bound).
"""
import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv.layer_config import FLOATS, dtype_policy
from tf_sparseconv.models.serving import ClassNames, _core_input, _entry_layer, class_names, core_model, input_spec
from tf_sparseconv.site.layers import SparseToSite


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class MeanSoftmax(keras.layers.Layer):
    """Several logits [B, K] -> logits [B, K] whose softmax is the mean of their softmax
    outputs: log(mean_i softmax(logits_i)), floored at the smallest normal float so a class
    every member rules out stays finite."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOATS)

    def call(self, logits):
        if not isinstance(logits, (list, tuple)) or len(logits) < 2:
            raise ValueError(f"{self.name}: takes the logits of two or more members, got {logits}")
        mean = tf.add_n([tf.nn.softmax(x, axis=-1) for x in logits]) / len(logits)
        return tf.math.log(tf.maximum(mean, np.finfo(mean.dtype.as_numpy_dtype).tiny))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])


def _member_parts(member, i):
    """(input spec, entry layer, core, its input kind) of a serving model; ValueError for another model."""
    try:
        spec = input_spec(member)
    except ValueError as e:
        raise ValueError(f"member {i} ({member.name!r}): {e}") from None
    core = core_model(member)
    if core is member:
        raise ValueError(f"member {i} ({member.name!r}) is not a serving model around one core "
                         "(models.point_cloud_classifier or image_classifier)")
    return spec, _entry_layer(member), core, _core_input(core)[0]


def ensemble_classifier(members, name="ensemble"):
    """keras.Model: the members' input -> logits whose softmax is the mean of the members'
    (see the module's doc). members: two or more serving models with the same input spec
    and class names."""
    members = list(members)
    if len(members) < 2:
        raise ValueError(f"an ensemble takes two or more models, got {len(members)}")
    if len({id(m) for m in members}) != len(members):
        raise ValueError("a model is given twice; an ensemble takes each model once")
    parts = [_member_parts(m, i) for i, m in enumerate(members)]
    spec, entry, _, _ = parts[0]
    names = class_names(members[0])
    outputs = int(members[0].outputs[0].shape[-1])
    for i, (member, (other_spec, _, _, _)) in enumerate(zip(members[1:], parts[1:]), 1):
        if other_spec != spec:
            raise ValueError(f"member {i} takes other inputs than member 0 ({other_spec} against {spec}); an "
                             "ensemble voxelizes once for all its members")
        if class_names(member) != names or int(member.outputs[0].shape[-1]) != outputs:
            raise ValueError(f"member {i} has other classes than member 0; an ensemble averages the same classes")
    shared_entry = type(entry).from_config(entry.get_config())
    inputs = keras.Input(tuple(members[0].inputs[0].shape[1:]), dtype=members[0].inputs[0].dtype,
                         name=members[0].inputs[0].name)
    grid = shared_entry(inputs)
    logits = []
    for i, (_, _, core, kind) in enumerate(parts):
        # each core under a name of its own (the members' cores are often named alike)
        member = keras.Model(core.input, core.output, name=f"member_{i}")
        logits.append(member(SparseToSite(name=f"member_{i}_sparse_to_site")(grid) if kind == "site" else grid))
    out = ClassNames(names, name="class_names")(MeanSoftmax(name="mean_softmax")(logits))
    model = keras.Model(inputs, out, name=name)
    model.compile(keras.optimizers.SGD(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])  # as a serving model: evaluate works on a loaded one
    return model
