"""Saved models that are not what was saved are refused, each with a message naming the
file or the layer: every layer registered by `import tf_sparseconv` alone, configs outside
a layer's valid range, truncated and damaged .keras files, weights changed after saving
(the checksum of models.save_model), and inputs an exported signature does not check."""
import hashlib
import importlib
import inspect
import io
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import textwrap
import zipfile

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv
from tf_sparseconv import cli
from tf_sparseconv import keras_layers as kl
from tf_sparseconv import models
from tf_sparseconv.models.saving import CHECKSUM_MEMBER, ModelFileError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1",
           PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
CLASSES = ("a", "b", "c")


def mixed_model():
    """Point clouds [B, N, 3] in [-1, 1] through both families, with named layers."""
    points = keras.Input((None, 3), name="points")
    h = kl.VoxelizePoints(8, name="voxelize_points")(points)
    h = kl.DirectSparseConv(4, 3, k=40, activation="relu", name="direct_conv")(h)
    h = kl.SparseMaxPool(2, name="max_pool")(h)
    channel = keras.layers.Flatten()(kl.SparseToDense(name="to_dense")(h))
    s = kl.SiteVoxelize(8, name="site_voxelize")(points)
    s = kl.SubMConv3D(4, 3, activation="relu", name="subm")(s)
    s = kl.SiteSelect(30, name="select")(s)
    s = kl.SparseConv3D(6, 2, strides=2, name="strided")(s)
    s = kl.SiteAveragePooling3D(2, name="avg_pool")(s)
    site = kl.SiteGlobalPool("max", name="global_pool")(s)
    logits = keras.layers.Dense(len(CLASSES), name="logits")(keras.layers.Concatenate()([channel, site]))
    return keras.Model(points, kl.ClassNames(CLASSES, name="class_names")(logits))


def small_clouds(rng, count=4, points=60):
    return rng.uniform(-1, 1, (count, points, 3)).astype(np.float32)


def small_images(rng, count=3):
    return (rng.random((count, 8, 8)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Saved models (with checksums) and what they predict: "mixed" (both families),
    "points" (point_cloud_classifier: PointCloudToSparse), "images" (image_classifier)."""
    root = tmp_path_factory.mktemp("saved")
    rng = np.random.default_rng(25)
    keras.utils.set_random_seed(25)
    clouds, images = small_clouds(rng), small_images(rng)
    points = models.point_cloud_classifier(models.octnet3(8, 3, rhos=(0.5, 0.5), fc_units=8), 8, class_names=CLASSES)
    digits = models.image_classifier(models.octnet3(8, 3, rhos=(0.5, 0.5), spatial_dims=2, fc_units=8))
    out = {"root": root, "clouds": clouds, "image_batch": images, "built": {}}
    for name, model, x in (("mixed", mixed_model(), clouds), ("points", points, clouds), ("images", digits, images)):
        out[name] = str(root / f"{name}.keras")
        models.save_model(model, out[name])
        out[name + "_logits"] = model.predict(x, verbose=0)
        out["built"][name] = model
        assert out[name + "_logits"].std() > 1e-4, f"{name}: vacuous comparisons, the logits are constant"
    return out


def rewrite(src, dst, edit):
    """Copies the .keras archive src to dst as a valid zip, each member's bytes passed
    through edit(name, data)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, edit(item.filename, zin.read(item.filename)))
    return str(dst)


def layer_config(config, name):
    """The config dict of the layer called `name`, anywhere in a model's config (nested
    models included)."""
    if isinstance(config, dict):
        if "class_name" in config and isinstance(config.get("config"), dict) \
                and config["config"].get("name") == name and "layers" not in config["config"]:
            return config["config"]
        children = config.values()
    elif isinstance(config, list):
        children = config
    else:
        return None
    for child in children:
        found = layer_config(child, name)
        if found is not None:
            return found
    return None


def with_config(src, dst, layer, **fields):
    def edit(name, data):
        if name != "config.json":
            return data
        config = json.loads(data)
        target = layer_config(config, layer)
        assert target is not None, layer
        target.update(fields)
        return json.dumps(config).encode()
    return rewrite(src, dst, edit)


def with_weights(src, dst, dataset, change):
    """src with the weights file's `dataset` replaced by change(values), inside a valid zip."""
    def edit(name, data):
        if name != "model.weights.h5":
            return data
        buffer = io.BytesIO(data)
        with h5py.File(buffer, "r+") as f:
            f[dataset][...] = change(f[dataset][...])
        return buffer.getvalue()
    return rewrite(src, dst, edit)


def logits_bias(path):
    """The h5 path of the classifier's bias in the saved weights file (Keras names the
    groups by class, not by layer name: the one Dense weight of len(CLASSES) values)."""
    with zipfile.ZipFile(path) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as f:
        names = []
        f.visititems(lambda n, obj: names.append(n) if isinstance(obj, h5py.Dataset) and obj.shape == (len(CLASSES),)
                     and "/dense" in n else None)
    assert len(names) == 1, names
    return names[0]


# ---- every layer registered by `import tf_sparseconv` alone -------------------------------------------------------

# Public classes that never appear in a saved config: the abstract bases (they have no
# call) and the constraint DirectSparseConv rebuilds from its mask (not in its config).
NOT_SAVED = {"CustomOpLayer", "SparseLayer", "SiteLayer", "KeepPrunedAtZero"}


def library_classes():
    classes = {}
    for module in pkgutil.walk_packages(tf_sparseconv.__path__, "tf_sparseconv."):
        if module.name.endswith("__main__") or module.name.rsplit(".", 1)[1].startswith("_tf_sparseconv"):
            continue
        for name, obj in vars(importlib.import_module(module.name)).items():
            if inspect.isclass(obj) and obj.__module__ == module.name and not name.startswith("_") and issubclass(
                    obj, (keras.layers.Layer, keras.losses.Loss, keras.regularizers.Regularizer,
                          keras.constraints.Constraint)):
                classes[name] = obj
    return classes


def test_import_alone_registers_every_keras_class_of_the_library_under_its_package():
    code = ("import json, keras, tf_sparseconv; print(json.dumps(sorted(name for name in "
            "keras.saving.get_custom_objects() if name.startswith('tf_sparseconv>'))))")
    result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    registered = set(json.loads(result.stdout.strip().splitlines()[-1]))
    classes = library_classes()
    assert {"DirectSparseConv", "VoxelizePoints", "SubMConv3D", "SiteGlobalPool", "ClassNames"} <= set(classes)
    expected = {f"tf_sparseconv>{name}" for name in set(classes) - NOT_SAVED} | {"tf_sparseconv>DensityRegularizer"}
    assert expected <= registered, sorted(expected - registered)
    for name in set(classes) - NOT_SAVED:
        assert keras.saving.get_registered_name(classes[name]) == f"tf_sparseconv>{name}"


LOAD_ONLY = textwrap.dedent("""
    import sys
    import numpy as np
    import tf_sparseconv, keras
    model = keras.models.load_model(sys.argv[1])
    np.save(sys.argv[3], model.predict(np.load(sys.argv[2]), verbose=0))
""")


def test_a_model_of_both_families_loads_after_import_tf_sparseconv_alone(saved, tmp_path):
    np.save(tmp_path / "clouds.npy", saved["clouds"])
    result = subprocess.run([sys.executable, "-c", LOAD_ONLY, saved["mixed"], str(tmp_path / "clouds.npy"),
                             str(tmp_path / "logits.npy")], env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # On a GPU another process may pick other kernels (TF32 products, atomics in another order).
    tolerance = dict(rtol=2e-3, atol=1e-3) if tf.config.list_physical_devices("GPU") else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), saved["mixed_logits"], **tolerance)


# ---- configs outside a layer's valid range are refused on load ------------------------------------------------------

INF = float("inf")
TAMPERED = [
    ("mixed", "voxelize_points", dict(bounds=[1, 1]),
     r"voxelize_points: bounds must be \(low, high\), two finite numbers with low < high, got \[1, 1\]"),
    ("mixed", "voxelize_points", dict(bounds=[-1, INF]), r"voxelize_points: bounds must be \(low, high\), two finite "
                                                        r"numbers with low < high, got \[-1, inf\]"),
    ("mixed", "voxelize_points", dict(resolution=0), r"voxelize_points: resolution must be a whole number in \[1, "
                                                     r"2147483647\], got 0"),
    ("mixed", "voxelize_points", dict(resolution=8.5), r"voxelize_points: resolution must be a whole number"),
    ("mixed", "voxelize_points", dict(resolution=2 ** 22), r"voxelize_points: resolution .* keys must stay below"),
    ("mixed", "voxelize_points", dict(dtype="float16"),
     r"voxelize_points: dtype must be a policy computing and storing variables in one of \('float32', 'float64'\), "
     r"got 'float16'"),
    ("mixed", "direct_conv", dict(kernel_size=0), r"direct_conv: kernel_size must be a whole number >= 1, got 0"),
    ("mixed", "direct_conv", dict(kernel_size=[3, 4, 3]), r"direct_conv: kernel_size entries must be odd"),
    ("mixed", "direct_conv", dict(filters=0), r"direct_conv: filters must be a whole number >= 1, got 0"),
    ("mixed", "direct_conv", dict(k=0), r"direct_conv: k must be a whole number >= 1, got 0"),
    ("mixed", "direct_conv", dict(k=None, rho_up=1.5), r"direct_conv: rho_up must be in \(0, 1\] \(a finite number\), "
                                                       r"got 1\.5"),
    ("mixed", "direct_conv", dict(selection="top"),
     r"direct_conv: selection must be one of \('none', 'signed', 'abs'\), got 'top'"),
    ("mixed", "direct_conv", dict(use_bias="false"), r"direct_conv: use_bias must be True or False, got 'false'"),
    ("mixed", "direct_conv", dict(dataflow="fast"), r"direct_conv: dataflow must be one of"),
    ("mixed", "direct_conv", dict(dtype="int32"), r"direct_conv: dtype must be a policy .* got 'int32'"),
    ("mixed", "max_pool", dict(pool_size=0), r"max_pool: pool_size must be a whole number >= 1, got 0"),
    ("mixed", "to_dense", dict(dtype="bfloat16"), r"to_dense: dtype must be a policy .* got 'bfloat16'"),
    ("mixed", "site_voxelize", dict(bounds=[[-1, -1, -1], [1, 1, -1]]), r"site_voxelize: bounds must be \(low, high\)"),
    ("mixed", "site_voxelize", dict(resolution=[8, 0, 8]), r"site_voxelize: resolution must be 1 to 4 entries in "),
    ("mixed", "site_voxelize", dict(reduction="median"), r"site_voxelize: reduction must be one of"),
    ("mixed", "site_voxelize", dict(clip="no"), r"site_voxelize: clip must be True or False"),
    ("mixed", "subm", dict(filters=0), r"subm: filters must be a whole number >= 1, got 0"),
    ("mixed", "subm", dict(kernel_size=2), r"subm: a submanifold convolution needs an odd kernel size"),
    ("mixed", "subm", dict(kernel_size=2.5), r"subm: kernel_size must be an int or a sequence of ints, got 2\.5"),
    ("mixed", "subm", dict(dilation_rate=0), r"subm: dilation_rate entries must be >= 1"),
    ("mixed", "subm", dict(dtype="int32"), r"subm: dtype must be a policy computing and storing variables in one of "
                                           r"\('float16', 'bfloat16', 'float32', 'float64'\), got 'int32'"),
    ("mixed", "select", dict(k=0), r"select: k must be a whole number >= 1, got 0"),
    ("mixed", "strided", dict(strides=0), r"strided: strides entries must be >= 1"),
    ("mixed", "strided", dict(padding=-1), r"strided: padding entries must be >= 0"),
    ("mixed", "avg_pool", dict(pool_size=0), r"avg_pool: pool_size entries must be >= 1"),
    ("mixed", "avg_pool", dict(strides=[2, 2, 0]), r"avg_pool: strides entries must be >= 1"),
    ("mixed", "global_pool", dict(mode="median"), r"global_pool: mode must be one of \('max', 'mean', 'sum'\)"),
    ("mixed", "class_names", dict(names=["a", "a", "b"]), r"class_names: class names must be distinct"),
    ("mixed", "class_names", dict(dtype="int32"), r"class_names: dtype must be a policy .* got 'int32'"),
    ("points", "point_cloud_to_sparse", dict(bounds=[1, 1]), r"point_cloud_to_sparse: bounds must be \(low, high\)"),
    ("points", "point_cloud_to_sparse", dict(bounds=[-0.5, 0.5]), r"point_cloud_to_sparse: normalize='unit_sphere' "
                                                                  r"puts points anywhere in \[-1, 1\]"),
    ("points", "point_cloud_to_sparse", dict(normalize="cube"), r"point_cloud_to_sparse: normalize must be one of"),
    ("points", "point_cloud_to_sparse", dict(features=["occupancy", "colour"]),
     r"point_cloud_to_sparse: features must be distinct names"),
    ("points", "point_cloud_to_sparse", dict(points_per_cloud=0), r"point_cloud_to_sparse: points_per_cloud must be "
                                                                  r"a whole number >= 1, got 0"),
    ("images", "image_to_sparse", dict(threshold=0), r"image_to_sparse: threshold must be in \(0, 255\]"),
    ("images", "image_to_sparse", dict(threshold=float("nan")), r"image_to_sparse: threshold must be in \(0, 255\]"),
]


@pytest.mark.parametrize("model,layer,fields,message", TAMPERED,
                         ids=[f"{layer}-{'-'.join(fields)}-{i}" for i, (_, layer, fields, _) in enumerate(TAMPERED)])
def test_a_config_changed_inside_the_archive_is_refused_naming_the_layer_and_range(saved, tmp_path, model, layer,
                                                                                    fields, message):
    path = with_config(saved[model], tmp_path / "tampered.keras", layer, **fields)
    # checksum=False: the layers themselves refuse the config, whatever the checksum says
    with pytest.raises(ModelFileError, match=message) as info:
        models.load_model(path, checksum=False)
    assert str(info.value).startswith(f"{path}: cannot be loaded as a Keras model: {layer}: ")


def test_keras_load_model_refuses_the_changed_config_too(saved, tmp_path):
    path = with_config(saved["mixed"], tmp_path / "tampered.keras", "voxelize_points", bounds=[-1, INF])
    with pytest.raises(Exception, match=r"voxelize_points: bounds must be \(low, high\), two finite numbers"):
        keras.models.load_model(path)
    # the untouched copy loads and predicts as saved (so the refusal is the config's)
    copy = with_config(saved["mixed"], tmp_path / "copy.keras", "voxelize_points")
    np.testing.assert_allclose(keras.models.load_model(copy).predict(saved["clouds"], verbose=0),
                               saved["mixed_logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make,message", [
    (lambda: kl.DirectSparseConv(4, 3, rho_up=0.5, density_regularizer={
        "module": "tf_sparseconv.training.density_regularizer", "class_name": "DensityRegularizer",
        "config": {"scale": float("inf")}, "registered_name": "tf_sparseconv>DensityRegularizer"}, name="conv"),
     r"conv: DensityRegularizer: scale must be >= 0 \(a finite number\), got inf"),
    (lambda: kl.DensityRegularizer(include_bias="yes"), r"DensityRegularizer: include_bias must be True or False"),
    (lambda: kl.SparseConvTranspose3D(0, 3, name="up"), r"up: filters must be a whole number >= 1, got 0"),
    (lambda: kl.SparseInverseConv3D(4, 2.5, indice_key="s", name="inv"), r"inv: kernel_size must be an int or a "),
    (lambda: kl.SiteMaxPooling2D(2, strides=0, name="pool"), r"pool: strides entries must be >= 1"),
    (lambda: kl.SiteConcat(validate="false", name="cat"), r"cat: validate must be True or False"),
    (lambda: kl.SiteToPoints(dtype="int32", name="gather"), r"gather: dtype must be a policy"),
    (lambda: kl.SparseToSite(dtype="float16", name="to_site"), r"to_site: dtype must be a policy"),
    (lambda: kl.DenseToSparse(dtype="float16", name="to_sparse"), r"to_sparse: dtype must be a policy"),
    (lambda: kl.SiteFeatures(keras.layers.Dense(3), dtype="int32", name="rows"), r"rows: dtype must be a policy"),
    (lambda: kl.ImageToSparse(dtype="mixed_float16", name="image"), r"image: dtype must be a policy .* \(compute "
                                                                    r"float16, variables float32\)"),
])
def test_layers_of_no_saved_model_above_check_their_configs_too(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_float64_and_half_policies_stay_accepted_where_the_ops_run_them():
    assert kl.DirectSparseConv(4, 3, dtype="float64").compute_dtype == "float64"
    assert kl.SubMConv3D(4, 3, dtype="mixed_float16").compute_dtype == "float16"
    assert kl.PointCloudToSparse(8, dtype="float64").compute_dtype == "float64"


# ---- truncated, damaged and changed files ---------------------------------------------------------------------------

def test_a_truncated_file_is_reported_as_truncated_not_as_missing(saved, tmp_path):
    data = open(saved["points"], "rb").read()
    path = tmp_path / "truncated.keras"
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match="File not found"):  # what Keras says
        keras.models.load_model(path)
    with pytest.raises(ModelFileError, match=rf"{path}: not a \.keras model file: not a complete zip archive "
                                             rf"\({len(data) // 2} bytes; the file is truncated or damaged"):
        models.load_model(path)
    with pytest.raises(ModelFileError, match=rf"{tmp_path / 'missing.keras'}: no such model file"):
        models.load_model(tmp_path / "missing.keras")


def test_a_damaged_member_is_reported_by_its_crc(saved, tmp_path):
    path = tmp_path / "damaged.keras"
    shutil.copy(saved["points"], path)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("model.weights.h5")
    data = bytearray(path.read_bytes())
    # the member's data follow its 30-byte local header, name and extra field (lengths at bytes 26 and 28)
    header = data[info.header_offset:info.header_offset + 30]
    start = info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
    data[start + info.compress_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=rf"{path}: damaged"):
        models.load_model(path)


def test_the_checksum_holds_the_sha256_of_every_member(saved):
    with zipfile.ZipFile(saved["mixed"]) as archive:
        record = json.loads(archive.read(CHECKSUM_MEMBER))
        members = {name: hashlib.sha256(archive.read(name)).hexdigest() for name in archive.namelist()
                   if name != CHECKSUM_MEMBER}
    assert record == {"algorithm": "sha256", "files": members}
    assert {"config.json", "metadata.json", "model.weights.h5"} <= set(members)


def test_weights_changed_after_saving_are_refused_and_would_change_predictions(saved, tmp_path):
    path = with_weights(saved["mixed"], tmp_path / "changed.keras", logits_bias(saved["mixed"]),
                        lambda w: w + [0.5, 0, 0])
    with pytest.raises(ModelFileError, match=rf"{path}: changed since it was saved: the SHA-256 of model\.weights\.h5 "
                                             r"is [0-9a-f]{16}\.\.\., the checksum saved with the model says "
                                             r"[0-9a-f]{16}\.\.\."):
        models.load_model(path)
    # what the check prevents: the file is a valid model that computes something else
    changed = models.load_model(path, checksum=False).predict(saved["clouds"], verbose=0)
    assert np.abs(changed - saved["mixed_logits"]).max() > 0.1
    changed = keras.models.load_model(path).predict(saved["clouds"], verbose=0)
    assert np.abs(changed - saved["mixed_logits"]).max() > 0.1


def test_a_checked_file_loads_and_predicts_as_saved_with_keras_too(saved):
    for load in (models.load_model, keras.models.load_model):
        np.testing.assert_allclose(load(saved["mixed"]).predict(saved["clouds"], verbose=0), saved["mixed_logits"],
                                   rtol=1e-5, atol=1e-6)


def test_members_added_or_removed_and_a_required_checksum_are_checked(saved, tmp_path):
    added = tmp_path / "added.keras"
    shutil.copy(saved["points"], added)
    with zipfile.ZipFile(added, "a") as archive:
        archive.writestr("assets/extra.txt", "x")
    with pytest.raises(ModelFileError, match="changed since it was saved: assets/extra.txt was added"):
        models.load_model(added)
    removed = tmp_path / "removed.keras"
    with zipfile.ZipFile(saved["points"]) as zin, zipfile.ZipFile(removed, "w") as zout:
        for item in zin.infolist():
            if item.filename != "metadata.json":
                zout.writestr(item, zin.read(item.filename))
    with pytest.raises(ModelFileError, match="changed since it was saved: metadata.json is missing from the archive"):
        models.load_model(removed)
    plain = tmp_path / "plain.keras"
    saved["built"]["points"].save(plain)
    assert models.load_model(plain).name == saved["built"]["points"].name  # no checksum: nothing to verify
    with pytest.raises(ModelFileError, match=rf"{plain}: has no checksum \({CHECKSUM_MEMBER}\); it was saved without "
                                             r"tf_sparseconv\.models\.save_model"):
        models.load_model(plain, checksum=True)
    unchecked = tmp_path / "unchecked.keras"
    models.save_model(saved["built"]["points"], unchecked, checksum=False)
    assert CHECKSUM_MEMBER not in zipfile.ZipFile(unchecked).namelist()


def test_the_cli_refuses_a_changed_model_in_one_line(saved, tmp_path, capsys):
    path = with_weights(saved["points"], tmp_path / "changed.keras", logits_bias(saved["points"]), lambda w: w + 1)
    np.save(tmp_path / "cloud.npy", saved["clouds"][0])
    assert cli.main(["predict", path, str(tmp_path / "cloud.npy")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"tf-sparseconv predict: error: {path}: changed since it was saved: the SHA-256 of "
                            "model.weights.h5 is "), error
    assert cli.main(["predict", saved["points"], str(tmp_path / "cloud.npy")]) == 0


# ---- the exported serving signature checks what it is fed -----------------------------------------------------------

def invalid_argument(fn, message):
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        fn()
    assert message in str(info.value), str(info.value)[:3000]


def test_the_exported_point_signature_checks_rank_columns_and_batch(saved, tmp_path):
    saved["built"]["points"].export(str(tmp_path / "exported"), verbose=False)
    signature = tf.saved_model.load(str(tmp_path / "exported")).signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    assert signature.structured_input_signature[1][name].shape.as_list() == [None, None, 3]

    def serve(x):
        return list(signature(**{name: tf.constant(x)}).values())[0].numpy()

    np.testing.assert_allclose(serve(saved["clouds"]), saved["points_logits"], rtol=1e-5, atol=1e-6)
    # the signature's declared shape is not checked when it is called: the graph checks it
    invalid_argument(lambda: serve(saved["clouds"][0]),
                     "point_cloud_to_sparse: expected points [B, N, 3] (x, y, z), got shape [60 3]")
    invalid_argument(lambda: serve(np.concatenate([saved["clouds"], saved["clouds"][..., :1]], -1)),
                     "point_cloud_to_sparse: expected points [B, N, 3] (x, y, z), got shape [4 60 4]")
    invalid_argument(lambda: serve(saved["clouds"][None]),
                     "point_cloud_to_sparse: expected points [B, N, 3] (x, y, z), got shape [1 4 60 3]")
    invalid_argument(lambda: serve(saved["clouds"][:0]), "point_cloud_to_sparse: empty batch (0 point clouds)")


def test_the_exported_image_signature_checks_rank_size_and_batch(saved, tmp_path):
    saved["built"]["images"].export(str(tmp_path / "exported"), verbose=False)
    signature = tf.saved_model.load(str(tmp_path / "exported")).signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]

    def serve(x):
        return list(signature(**{name: tf.constant(x, tf.float32)}).values())[0].numpy()

    np.testing.assert_allclose(serve(saved["image_batch"]), saved["images_logits"], rtol=1e-5, atol=1e-6)
    invalid_argument(lambda: serve(np.zeros((2, 8, 9))), "image_to_sparse: expected images [B, 8, 8], got shape "
                                                         "[2 8 9]")
    invalid_argument(lambda: serve(np.zeros((8, 8))), "image_to_sparse: expected images [B, 8, 8], got shape [8 8]")
    invalid_argument(lambda: serve(np.zeros((0, 8, 8))), "image_to_sparse: empty batch (0 images)")


def test_the_layer_refuses_extra_columns_before_tracing():
    with pytest.raises(ValueError, match=r"point_cloud: expected points \[B, N, 3\] \(x, y, z\), got shape "
                                         r"\(2, 5, 4\)"):
        kl.PointCloudToSparse(8, name="point_cloud")(np.zeros((2, 5, 4), np.float32))
