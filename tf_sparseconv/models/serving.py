"""Serving models: a trained core network wrapped so that it takes what users have.

A core (OctNet3: channel-sparse dict input; site_resnet: site dict input) learns from
batches voxelized by NumPy. point_cloud_classifier and image_classifier put the same
preprocessing in front of it as Keras layers (PointCloudToSparse / ImageToSparse, and
SparseToSite for a site core) and ClassNames (identity on the logits that keeps the class
names in the saved model) behind it, so the saved model takes point
clouds [B, N, 3 or 6] or images [B, H, W] and returns logits [B, num_classes]:

    model = point_cloud_classifier(core, 32, class_names=classes, points_per_cloud=1024)
    tf_sparseconv.models.save_model(model, "model.keras")   # model.save, plus a weights checksum
    # elsewhere:
    import tf_sparseconv, keras
    model = keras.models.load_model("model.keras")   # or tf_sparseconv.models.load_model: checks the file
    logits = model.predict(clouds)            # numpy [M, N, 3] or a tf.data.Dataset

Training data must be normalised by normalize_point_clouds (the layer's own TensorFlow
code) before NumPy voxelizes it, so training and serving see identical voxel keys.
"""
import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv.channel.keras_io import FIELDS as SPARSE_FIELDS
from tf_sparseconv.data.voxelize import num_channels
from tf_sparseconv.layer_config import FLOATS, dtype_policy
from tf_sparseconv.models.preprocessing import ImageToSparse, PointCloudToSparse, check_features, normalize_unit_sphere
from tf_sparseconv.site.keras_io import FIELDS as SITE_FIELDS
from tf_sparseconv.site.layers import SparseToSite

# Clouds normalised per TensorFlow call: bounds the memory of normalize_point_clouds.
_CHUNK = 256


@tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
def _normalize(points):
    return normalize_unit_sphere(points)


def normalize_point_clouds(points):
    """Clouds [M, N, 3+] (or one cloud [N, 3+]) -> float32 of the same shape, xyz
    normalised exactly as PointCloudToSparse(normalize="unit_sphere") does (the same
    TensorFlow function on the same float32 values); further columns (normals) unchanged.

    Each cloud is centred on its centroid and scaled so its farthest point has radius 1;
    the result does not depend on which other clouds are in the array.
    """
    points = np.asarray(points)
    single = points.ndim == 2
    if single:
        points = points[None]
    if points.ndim != 3 or points.shape[-1] < 3:
        raise ValueError(f"point clouds must have shape [M, N, 3+] (x, y, z, ...), got {np.shape(points)}")
    if points.shape[1] == 0 and len(points):
        raise ValueError("point clouds have no points (N = 0)")
    points = points.astype(np.float32)
    finite = np.isfinite(points[..., :3]).all(axis=(1, 2))
    if not finite.all():
        raise ValueError(f"point cloud {int(np.argmin(finite))} contains NaN or infinite coordinates")
    if not len(points):
        return points[0] if single else points
    out = np.concatenate([_normalize(tf.constant(points[start:start + _CHUNK])).numpy()
                          for start in range(0, len(points), _CHUNK)])
    return out[0] if single else out


def _core_input(core):
    """('channel' or 'site', spatial shape tuple, channels) of a core's input."""
    if not isinstance(core, keras.Model):
        raise TypeError(f"core must be a keras.Model (e.g. models.octnet3 or models.site_resnet), "
                        f"got {type(core).__name__}")
    try:
        structure = core.input
    except (AttributeError, ValueError):  # a model never called on inputs has none
        structure = None
    if isinstance(structure, dict) and set(structure) == set(SPARSE_FIELDS):
        token = tuple(structure["shape_token"].shape)
        return "channel", token[1:-1], token[-1]
    if isinstance(structure, dict) and set(SITE_FIELDS) <= set(structure):
        return "site", tuple(structure["shape_token"].shape[1:]), structure["features"].shape[-1]
    raise TypeError(f"core {core.name!r} must take the channel-sparse dict (sparse_input, e.g. models.octnet3) or "
                    "the site dict (site_input, e.g. models.site_resnet with points=False)")


def _logit_classes(core, class_names):
    shape = tuple(core.output.shape) if not isinstance(core.output, (list, tuple, dict)) else ()
    if len(shape) != 2:
        raise TypeError(f"core {core.name!r} must output logits [B, num_classes], got {core.output}")
    if class_names is not None and shape[-1] != len(tuple(class_names)):
        raise ValueError(f"{len(tuple(class_names))} class names for a core with {shape[-1]} outputs")


def _wrap(inputs, x, kind, core, class_names, name):
    if kind == "site":
        x = SparseToSite(name="sparse_to_site")(x)
    outputs = ClassNames(class_names, name="class_names")(core(x))
    model = keras.Model(inputs, outputs, name=name)
    # Compiled, so model.evaluate(points, labels) works on a loaded model; recompile to train.
    # Plain SGD keeps no per-weight state: nothing to save, nothing to warn about on loading.
    model.compile(keras.optimizers.SGD(), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def point_cloud_classifier(core, resolution, features=("occupancy",), normalize="unit_sphere", class_names=None,
                           points_per_cloud=None, estimate_normals=None, name=None):
    """keras.Model: point clouds [B, N, 3] ([B, N, 6] with normals) -> logits [B, num_classes].

    core: a model on the channel-sparse dict of [B, r, r, r, C] (models.octnet3) or on the
    site dict of that grid (models.site_resnet; SparseToSite is inserted), with
    C = data.num_channels(features). resolution, features: those the core was trained
    with; normalize: PointCloudToSparse's ("unit_sphere" or "none"); class_names: stored
    in the model (ClassNames); points_per_cloud: the N of training, stored for tools that
    resample clouds; estimate_normals: with the "normals" feature, the neighbours per point
    from which the model estimates the normals itself (clouds [B, N, 3]; PointCloudToSparse).
    The model is compiled with sparse categorical cross-entropy on logits and accuracy, for
    evaluate.
    """
    features = check_features(features)
    kind, spatial, channels = _core_input(core)
    if spatial != (int(resolution),) * 3 or channels != num_channels(features):
        raise ValueError(f"core {core.name!r} takes a grid {spatial} with {channels} channel(s); resolution "
                         f"{resolution} with features {features} makes {(int(resolution),) * 3} with "
                         f"{num_channels(features)}")
    _logit_classes(core, class_names)
    to_sparse = PointCloudToSparse(resolution, features, normalize, points_per_cloud=points_per_cloud,
                                   estimate_normals=estimate_normals, name="point_cloud_to_sparse")
    inputs = keras.Input((None, to_sparse.columns), name="points")
    return _wrap(inputs, to_sparse(inputs), kind, core, class_names, name or f"{core.name}_points")


def image_classifier(core, threshold=50, class_names=None, name=None):
    """keras.Model: images [B, H, W] (values 0..255) -> logits [B, num_classes].

    core: a model on the channel-sparse dict of [B, H, W, 1] (models.octnet3 with
    spatial_dims=2) or on its site dict (models.site_resnet with spatial_dims=2);
    threshold: ImageToSparse's (pixels below it are dropped, as in data.image_arrays).
    Compiled as point_cloud_classifier's model.
    """
    kind, spatial, channels = _core_input(core)
    if len(spatial) != 2 or channels != 1:
        raise ValueError(f"core {core.name!r} takes a grid {spatial} with {channels} channel(s); images need a "
                         "2-D grid with 1 channel")
    _logit_classes(core, class_names)
    inputs = keras.Input(spatial, name="images")
    x = ImageToSparse(threshold, name="image_to_sparse")(inputs)
    return _wrap(inputs, x, kind, core, class_names, name or f"{core.name}_images")


def _entry_layer(model):
    return next((layer for layer in model.layers if isinstance(layer, (PointCloudToSparse, ImageToSparse))), None)


def core_model(model):
    """The inner sparse-input model of a serving model; a model without one is returned as is."""
    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    return nested[0] if len(nested) == 1 and _entry_layer(model) is not None else model


def class_names(model):
    """The class names a model stores (its ClassNames layer), as a tuple, or None."""
    layer = next((layer for layer in model.layers if isinstance(layer, ClassNames)), None)
    return None if layer is None or layer.names is None else tuple(layer.names)


def input_spec(model):
    """What the model takes: {"kind": "points", "resolution", "features", "normalize",
    "points_per_cloud", "columns", "bounds", "estimate_normals"} or {"kind": "images", "threshold",
    "image_shape"}. ValueError for a model on sparse inputs (no preprocessing layer)."""
    layer = _entry_layer(model)
    if isinstance(layer, PointCloudToSparse):
        return {"kind": "points", "resolution": layer.resolution, "features": tuple(layer.features),
                "normalize": layer.normalize, "points_per_cloud": layer.points_per_cloud, "columns": layer.columns,
                "bounds": tuple(layer.bounds), "estimate_normals": layer.estimate_normals}
    if isinstance(layer, ImageToSparse):
        return {"kind": "images", "threshold": layer.threshold, "image_shape": tuple(model.input.shape[1:])}
    raise ValueError(f"model {model.name!r} takes sparse inputs, not point clouds or images; wrap its core with "
                     "tf_sparseconv.models.point_cloud_classifier or image_classifier")


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class ClassNames(keras.layers.Layer):
    """Identity on logits [B, num_classes] that stores the class names (None: unnamed) in
    the model's config, so a saved model reports what its outputs mean."""

    def __init__(self, names=None, **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOATS)  # an integer dtype would round the logits
        if names is not None:
            names = tuple(str(n) for n in names)
            if not names or len(set(names)) != len(names):
                raise ValueError(f"{self.name}: class names must be distinct and at least one, got {names}")
        self.names = names

    def build(self, input_shape):
        classes = input_shape[-1]
        if self.names is not None and classes is not None and classes != len(self.names):
            raise ValueError(f"{self.name}: {len(self.names)} class names for logits of {classes} classes")

    def call(self, logits):
        return tf.identity(logits)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "names": None if self.names is None else list(self.names)}
