"""The tf-sparseconv command: help, one-line refusals of bad arguments (exit code 2, nothing
written), and evaluate / predict / bound end to end on small generated files of each format,
checked against the saved model's own predictions."""
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from tf_sparseconv import cli
from tf_sparseconv.data import SCANNET_CLASSES, load_modelnet_meshes, load_scannet_objects, make_shapes
from tf_sparseconv.models import image_classifier, octnet3, point_cloud_classifier
from tf_sparseconv.models.memory_bound import memory_bound
from tf_sparseconv.models.saving import CHECKSUM_MEMBER
from tf_sparseconv.training import train

from tests.data.test_mnist import write_idx_folder
from tests.data.test_modelnet import CUBE_QUADS, CUBE_VERTICES, off_text, write
from tests.data.test_scannet import grid_mesh, write_ply

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POINTS = 128
TETRAHEDRON = ([(0, 0, 0), (2, 0, 0), (0, 2, 0), (0, 0, 2)], [(0, 2, 1), (0, 1, 3), (0, 3, 2), (1, 2, 3)])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Saved serving models: a point model trained briefly on the synthetic shapes (so its
    predictions differ between shapes), the same core with normalize='none', an untrained
    image model, an untrained model over the ScanNet classes, and the point model's core
    alone (it takes sparse tensors)."""
    root = tmp_path_factory.mktemp("models")
    keras.utils.set_random_seed(0)
    clouds, labels, classes = make_shapes(num_per_class=12, num_points=POINTS, seed=0)
    core = octnet3(8, len(classes), rhos=(0.5, 1.0), fc_units=32)
    points = point_cloud_classifier(core, 8, class_names=classes, points_per_cloud=POINTS)
    points.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    points.fit(clouds, labels, epochs=8, batch_size=16, verbose=0)
    unnormalized = point_cloud_classifier(core, 8, normalize="none", class_names=classes, points_per_cloud=POINTS)
    images = image_classifier(octnet3(28, 10, rhos=(1.0, 1.0), spatial_dims=2, fc_units=16),
                              class_names=[str(d) for d in range(10)])
    scannet = point_cloud_classifier(octnet3(8, len(SCANNET_CLASSES), rhos=(1.0,), fc_units=16), 8,
                                     class_names=SCANNET_CLASSES, points_per_cloud=POINTS)
    paths = {}
    for name, model in (("points", points), ("none", unnormalized), ("images", images), ("scannet", scannet),
                        ("core", core)):
        (root / name).mkdir()
        paths[name] = str(root / name / "model.keras")
        model.save(paths[name])
    return {"paths": paths, "points": points, "images": images, "scannet": scannet, "classes": classes}


def run(capsys, *argv):
    """(exit code, stdout, stderr) of the command."""
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def softmax(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def quantised_npz(path, clouds, labels, classes):
    """The modelnet40_train.npz form: uint8 points, xyz = q / 255 * 2 - 1."""
    q = np.clip(np.round((clouds[..., :3] + 1) / 2 * 255), 0, 255).astype(np.uint8)
    np.savez(path, points=q, labels=np.asarray(labels, np.uint8), classes=np.array(classes))
    return q.astype(np.float32) * np.float32(2 / 255) - np.float32(1)


def mesh_tree(root):
    """<root>/{cube,tetrahedron}/test/*.off: cubes and tetrahedra of several sizes and places."""
    for i in range(3):
        write(root / "cube" / "test" / f"cube_{i}.off",
              off_text([(x * (1 + i) + i, y * (2 - 0.4 * i), z) for x, y, z in CUBE_VERTICES], CUBE_QUADS))
        write(root / "tetrahedron" / "test" / f"tetrahedron_{i}.off",
              off_text([(x * (1 + i), y, z + 3 * i) for x, y, z in TETRAHEDRON[0]], TETRAHEDRON[1]))
        write(root / "cube" / "train" / f"cube_{i}.off", off_text(CUBE_VERTICES, CUBE_QUADS))
    return root


# --- help ---------------------------------------------------------------------------------

def test_help_lists_every_command_on_one_line(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for name, summary in cli.COMMANDS.items():
        assert any(line.split() == [name, *summary.split()] for line in out.splitlines()), (name, out)
    for name in ("evaluate", "predict", "bound"):
        code, out, _ = run(capsys, name, "--help")
        assert code == 0 and out.startswith(f"usage: tf-sparseconv {name}")


def test_python_dash_m_runs_the_same_command():
    done = subprocess.run([sys.executable, "-m", "tf_sparseconv", "bound", "missing.keras"], cwd=REPO,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == ("tf-sparseconv bound: error: missing.keras: no such model file "
                                                    "(tf-sparseconv train writes <out>/model.keras)")


# --- bad arguments: exit code 2, one line, nothing written ----------------------------------

@pytest.fixture
def bad_inputs(tmp_path, models):
    """Files of every kind of wrong input, and the paths of the saved models."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "text.keras").write_text("not a zip")
    with zipfile.ZipFile(tmp_path / "empty.keras", "w") as archive:
        archive.writestr("readme.txt", "no model here")
    with zipfile.ZipFile(tmp_path / "foreign.keras", "w") as archive:
        archive.writestr("config.json", json.dumps({"class_name": "NoSuchModel", "config": {}}))
        archive.writestr("metadata.json", json.dumps({"keras_version": keras.__version__}))
    with open(tmp_path / "pickled.npz", "wb") as f:
        pickle.dump({"points": np.zeros(3)}, f)
    np.savez(tmp_path / "objects.npz", points=np.array([None], dtype=object), labels=[0], classes=["cube"])
    np.save(tmp_path / "objects.npy", np.array([{"x": 1}], dtype=object))
    clouds, labels, _ = make_shapes(num_per_class=2, num_points=POINTS, classes=("cube", "cone"), seed=3)
    quantised_npz(tmp_path / "shapes.npz", clouds, labels, ["cube", "cone"])
    quantised_npz(tmp_path / "fruit.npz", clouds, labels, ["cube", "banana"])
    np.savez(tmp_path / "digits.npz", images=np.zeros((2, 28, 28), np.uint8), labels=[1, 2])
    np.save(tmp_path / "flat.npy", np.zeros((10, 2)))
    np.save(tmp_path / "far.npy", np.random.default_rng(0).normal(size=(POINTS, 3)) * 5)
    np.save(tmp_path / "small.npy", np.zeros((1, 20, 20), np.uint8))
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "digit.png")
    write(tmp_path / "cube.off", off_text(CUBE_VERTICES, CUBE_QUADS))
    write(tmp_path / "huge_index.off", "OFF\n3 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 99999999999999999999\n")
    np.save(tmp_path / "none.npy", np.zeros((0, POINTS, 3), np.float32))
    np.save(tmp_path / "point.npy", np.array([[0.5, 0.25, 0.0]]))
    np.save(tmp_path / "utm.npy", np.random.default_rng(1).normal(size=(POINTS, 3)) + [4.5e8, 5.4e8, 0])
    np.save(tmp_path / "spans.npy", np.ones((POINTS, 3), "timedelta64[s]"))
    np.save(tmp_path / "beyond.npy", np.array([[0, 0, 0], [0, 1, 0], [1e300, 0, 0]]))
    quantised_npz(tmp_path / "same.npz", np.zeros((2, POINTS, 3)), [0, 1], ["cube", "cone"])
    np.savez(tmp_path / "twice.npz", points=np.load(tmp_path / "shapes.npz")["points"],
             labels=np.load(tmp_path / "shapes.npz")["labels"], classes=np.array(["cube", "cube"]))
    np.savez(tmp_path / "scalar.npz", points=np.load(tmp_path / "shapes.npz")["points"],
             labels=np.zeros(len(labels), np.uint8), classes=np.array("cube"))
    mesh_tree(tmp_path / "meshes")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("results of another run")
    return tmp_path


def _files(*roots):
    """Every folder and file (with its size) under roots."""
    return sorted((os.path.join(path, name), os.path.getsize(os.path.join(path, name)))
                  for root in roots for path, folders, files in os.walk(root) for name in folders + files)


SHAPES = ["evaluate", "{points}", "--data", "{t}/shapes.npz"]
BAD_ARGUMENTS = [
    (["evaluate", "{t}/missing.keras", "--data", "{t}/shapes.npz"], r"missing.keras: no such model file"),
    (["evaluate", "{t}/folder", "--data", "{t}/shapes.npz"], r"folder: is a folder, expected a \.keras model file"),
    (["evaluate", "{t}/notes.txt", "--data", "{t}/shapes.npz"], r"notes.txt: expected a \.keras model file"),
    (["evaluate", "{t}/text.keras", "--data", "{t}/shapes.npz"], r"text.keras: not a Keras model file \(not a zip"),
    (["evaluate", "{t}/empty.keras", "--data", "{t}/shapes.npz"], r"empty.keras: not a Keras model file"),
    (["evaluate", "{t}/foreign.keras", "--data", "{t}/shapes.npz"], r"foreign.keras: cannot be loaded as a "),
    (["evaluate", "{points}"], r"--data is required"),
    (["evaluate", "{points}", "--data", "{t}/nothing.npz"], r"nothing.npz: no such file or folder"),
    (["evaluate", "{points}", "--data", "{t}/folder"], r"folder: a folder in none of the known layouts"),
    (["evaluate", "{points}", "--data", "{t}/notes.txt"], r"unsupported file type '\.txt'; expected one of \.npz"),
    (["evaluate", "{points}", "--data", "{t}/pickled.npz"], r"pickled.npz: not a NumPy \.npz archive"),
    (["evaluate", "{points}", "--data", "{t}/objects.npz"], r"objects.npz\[points\]: holds Python objects"),
    ([*SHAPES, "--batch-size", "0"],
     r"argument --batch-size: must be at least 1, got 0"),
    ([*SHAPES, "--points", "-3"], r"argument --points: must be at least 1"),
    ([*SHAPES, "--points", "64"], r"--points applies to OFF meshes"),
    ([*SHAPES, "--split", "test"], r"no 'test' split; use --split all"),
    ([*SHAPES, "--split", "val"], r"--split val needs .*split.json"),
    ([*SHAPES, "--out", "{t}/notes.txt"], r"--out .*notes.txt: is a file"),
    ([*SHAPES, "--out", "{t}/full"], r"exists and is not empty; .*--overwrite"),
    ([*SHAPES, "--classes", "cube", "cube"], r"names a class twice"),
    ([*SHAPES, "--classes", "torus"], r"--classes: torus not in the data"),
    ([*SHAPES, "--out", "{t}/notes.txt/run"], r"--out .*notes.txt/run: cannot be written: .*notes.txt is a file, not "),
    (["evaluate", "{points}", "--data", "{t}/meshes", "--seed", "-1"], r"argument --seed: must be at least 0, got -1"),
    (["evaluate", "{points}", "--data", "{t}/meshes", "--points", "1000000000000"],
     r"meshes: not enough memory for 1000000000000 points per cloud \(--points\): one cloud's coordinates "
     r"alone take 22,351.7 GiB, "),
    (["evaluate", "{points}", "--data", "{t}/twice.npz"], r"twice.npz: classes names 'cube' more than once; each "),
    (["evaluate", "{points}", "--data", "{t}/scalar.npz"],
     r"scalar.npz: classes must be the class names \[C\], one per label value, got an array of shape \[\]"),
    (["evaluate", "{points}", "--data", "{t}/same.npz"],
     r"same.npz\[0\]: 128 points all at one position, a cloud without a shape to classify"),
    (["evaluate", "{points}", "--data", "{t}/fruit.npz"],
     r"the data's classes banana are not among the model's 8 classes .*--classes model"),
    (["evaluate", "{points}", "--data", "{t}/digits.npz"], r"digits.npz holds images, but the model takes point "),
    (["evaluate", "{images}", "--data", "{t}/shapes.npz"], r"shapes.npz holds point clouds, but the model takes im"),
    ([*SHAPES, "--frobnicate"], r"unrecognized arguments: --frobnicate"),
    ([*SHAPES, "--vote", "rotations-1"], r"argument --vote: the vote must be none, mirror or rotations-N"),
    (["evaluate", "{images}", "--data", "{t}/digits.npz", "--vote", "mirror"],
     r"--vote mirror applies to point clouds, not to images"),
    (["evaluate", "{none}", "--data", "{t}/shapes.npz", "--vote", "rotations-4"],
     r"--vote rotations-4 needs a model that normalises its clouds \(normalize='unit_sphere'\)"),
    (["predict", "{points}", "{t}/missing.npy"], r"missing.npy: no such point or image file"),
    (["predict", "{points}", "{t}/notes.txt"], r"notes.txt: unsupported file type '\.txt'"),
    (["predict", "{points}", "{t}/folder"], r"folder: is a folder"),
    (["predict", "{points}", "{t}/cube.off", "--top-k", "0"], r"argument --top-k: must be at least 1, got 0"),
    (["predict", "{points}"], r"the following arguments are required: FILE"),
    (["evaluate", "{points}", "--split", "val", "--seed", "3"], r"--split val needs .*split.json"),
    (["predict", "{points}", "{t}/objects.npy"], r"objects.npy: holds Python objects"),
    (["predict", "{points}", "{t}/pickled.npz"], r"pickled.npz: not a NumPy \.npz archive"),
    (["predict", "{points}", "{t}/flat.npy"], r"flat.npy: expected points \[N, 3\+\]"),
    (["predict", "{points}", "{t}/none.npy"], r"none.npy: expected points \[N, 3\+\].*got shape \[0, 128, 3\]"),
    (["predict", "{points}", "{t}/point.npy"], r"point.npy: a single point, a cloud without a shape to classify"),
    # a model that centres each cloud itself reads utm.npy centred (test_predict_centres_clouds_far_from_the_origin)
    (["predict", "{none}", "{t}/utm.npy"],
     r"utm.npy: coordinates up to 5.4e\+08 for a cloud .* across: float32, which the model computes in, moves its "
     r"points by up to .*more than 1/32"),
    (["predict", "{points}", "{t}/spans.npy"], r"spans.npy: points must be numbers, got dtype timedelta64\[s\]"),
    (["predict", "{points}", "{t}/beyond.npy"], r"beyond.npy: point 2 contains NaN or infinite values, or values "
                                                r"beyond float32's range"),
    (["predict", "{points}", "{t}/huge_index.off"],
     r"huge_index.off: the face on line 6 indexes vertex 99999999999999999999, outside 0\.\.2"),
    (["predict", "{points}", "{t}/cube.off", "--seed", "-1"], r"argument --seed: must be at least 0, got -1"),
    (["predict", "{points}", "{t}/digit.png"], r"digit.png: an image, but the model takes point clouds"),
    (["predict", "{images}", "{t}/cube.off"], r"cube.off: a point file, but the model takes images"),
    (["predict", "{images}", "{t}/small.npy"], r"small.npy: images of 20x20 pixels, the model takes 28x28"),
    (["predict", "{none}", "{t}/far.npy"], r"far.npy: points outside the model's bounds \[-1, 1\].*normalize='none'"),
    (["predict", "{points}", "{t}/cube.off", "--vote", "rotations-1"], r"argument --vote: the vote must be none, "),
    (["predict", "{images}", "{t}/digit.png", "--vote", "mirror"], r"--vote mirror applies to point clouds, not to "),
    (["predict", "{none}", "{t}/cube.off", "--vote", "rotations-4"],
     r"--vote rotations-4 needs a model that normalises its clouds \(normalize='unit_sphere'\)"),
    (["bound", "{points}", "--batch-size", "0"], r"argument --batch-size: must be at least 1"),
    (["bound", "{points}", "--points-per-cloud", "x"], r"argument --points-per-cloud: expected a whole number"),
    (["bound", "{images}", "--points-per-cloud", "100"], r"--points-per-cloud applies to point-cloud models"),
    (["bound", "{t}/text.keras"], r"not a Keras model file"),
    (["predict", "{core}", "{t}/cube.off"], r"core/model.keras: model 'octnet3_8' takes sparse inputs, not point "),
    (["bound", "{core}", "--points-per-cloud", "100"], r"--points-per-cloud applies to point-cloud models; this model "
                                                       r"takes sparse tensors"),
    (["train", "--epochs", "0"], r"tf-sparseconv train: error: --epochs must be >= 1, got 0"),
    (["train", "--points", "1000000000000"], r"tf-sparseconv train: error: --points 1000000000000: one cloud's "
                                             r"coordinates alone take 22,351.7 GiB, "),
    ([], r"tf-sparseconv: error: name a command: train, evaluate, predict, bound"),
    (["frobnicate"], r"invalid choice: 'frobnicate'"),
]


@pytest.mark.parametrize("argv, message", BAD_ARGUMENTS, ids=[" ".join(a[:1] + [m[:30]]) for a, m in BAD_ARGUMENTS])
def test_bad_argument_is_one_line_exit_2_and_writes_nothing(capsys, bad_inputs, models, argv, message):
    paths = dict(models["paths"], t=str(bad_inputs))
    model_dirs = [os.path.dirname(p) for p in models["paths"].values()]
    before = _files(bad_inputs, *model_dirs)
    code, out, err = run(capsys, *[a.format(**paths) for a in argv])
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tf-sparseconv"), err
    assert __import__("re").search(message, lines[0]), lines[0]
    assert "allow_pickle" not in err and "Traceback" not in err
    assert _files(bad_inputs, *model_dirs) == before


# --- evaluate --------------------------------------------------------------------------------

def test_evaluate_mesh_tree_matches_the_models_own_predictions(capsys, tmp_path, models):
    tree = mesh_tree(tmp_path / "ModelNet")
    code, out, err = run(capsys, "evaluate", models["paths"]["points"], "--data", tree, "--out", tmp_path / "eval")
    assert code == 0, err
    clouds, labels, data_classes = load_modelnet_meshes(tree, "test", num_points=POINTS, seed=0)
    predicted = models["points"].predict(clouds, verbose=0).argmax(1)
    true = np.array([models["classes"].index(data_classes[label]) for label in labels])
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["classes"] == ["cube", "tetrahedron"] and metrics["split"] == "test"
    assert metrics["examples"] == 6 and metrics["points_per_cloud"] == POINTS
    assert metrics["overall_accuracy"] == pytest.approx(np.mean(predicted == true))
    per_class = [np.mean(predicted[true == models["classes"].index(c)] == models["classes"].index(c))
                 for c in data_classes]
    assert metrics["mean_class_accuracy"] == pytest.approx(np.mean(per_class))
    confusion = np.zeros((2, len(models["classes"])), int)
    for t, p in zip(labels, predicted):
        confusion[t, p] += 1
    np.testing.assert_array_equal(metrics["confusion_matrix"], confusion)
    assert f"overall accuracy     {np.mean(predicted == true):.4f}" in out
    assert (tmp_path / "eval" / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"loading {tree}: 2/2 class folders, 6 shapes (test/tetrahedron)" in err


def test_evaluate_npz_matches_classes_by_name(capsys, tmp_path, models):
    # The file's classes in another order than the model's, and fewer of them.
    names = ["torus", "sphere", "cone"]
    clouds, labels, _ = make_shapes(num_per_class=5, num_points=POINTS, classes=names, seed=11)
    dequantised = quantised_npz(tmp_path / "test.npz", clouds, labels, names)
    predicted = models["points"].predict(dequantised, verbose=0).argmax(1)
    true = np.array([models["classes"].index(names[label]) for label in labels])
    code, out, err = run(capsys, "evaluate", models["paths"]["points"], "--data", tmp_path / "test.npz",
                         "--out", tmp_path / "all", "--batch-size", "4")
    assert code == 0, err
    metrics = json.loads((tmp_path / "all" / "metrics.json").read_text())
    assert metrics["split"] == "all" and metrics["classes"] == names
    assert metrics["overall_accuracy"] == pytest.approx(np.mean(predicted == true))
    for name in names:
        index = models["classes"].index(name)
        row = metrics["per_class"][name]
        assert row == {"examples": 5, "correct": int(np.sum(predicted[true == index] == index)),
                       "accuracy": pytest.approx(np.mean(predicted[true == index] == index))}
        assert f"\n{name} " in out
    # Two of the classes only; 'model' keeps those of the model's classes the file has, in the model's order.
    code, _, err = run(capsys, "evaluate", models["paths"]["points"], "--data", tmp_path / "test.npz",
                       "--out", tmp_path / "two", "--classes", "cone", "torus")
    assert code == 0, err
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    keep = np.isin(labels, [0, 2])
    assert two["examples"] == 10 and two["overall_accuracy"] == pytest.approx(np.mean(predicted[keep] == true[keep]))
    code, _, err = run(capsys, "evaluate", models["paths"]["points"], "--data", tmp_path / "test.npz",
                       "--out", tmp_path / "model", "--classes", "model")
    assert code == 0 and "note: the data lacks 5 of the model's classes" in err
    assert json.loads((tmp_path / "model" / "metrics.json").read_text())["classes"] == ["sphere", "cone", "torus"]


def test_evaluate_mnist_npz_on_an_image_model(capsys, tmp_path, models):
    rng = np.random.default_rng(5)
    images = (rng.random((12, 28, 28)) < 0.2).astype(np.uint8) * rng.integers(40, 256, (12, 28, 28), dtype=np.uint8)
    labels = np.arange(12) % 10
    np.savez(tmp_path / "digits.npz", images=images, labels=labels)
    code, out, err = run(capsys, "evaluate", models["paths"]["images"], "--data", tmp_path / "digits.npz",
                         "--out", tmp_path / "eval")
    assert code == 0, err
    predicted = models["images"].predict(images, verbose=0).argmax(1)
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["kind"] == "mnist" and metrics["examples"] == 12
    assert metrics["correct"] == int(np.sum(predicted == labels))
    assert np.sum(metrics["confusion_matrix"]) == 12
    # The idx files: the t10k pair is the test split.
    write_idx_folder(tmp_path / "idx", images[:7], labels[:7].astype(np.uint8), prefix="t10k")
    write_idx_folder(tmp_path / "idx", images[7:], labels[7:].astype(np.uint8), prefix="train")
    code, out, err = run(capsys, "evaluate", models["paths"]["images"], "--data", tmp_path / "idx",
                         "--out", tmp_path / "idx_eval")
    assert code == 0, err
    metrics = json.loads((tmp_path / "idx_eval" / "metrics.json").read_text())
    assert metrics["split"] == "test" and metrics["examples"] == 7
    assert metrics["correct"] == int(np.sum(predicted[:7] == labels[:7]))


def scannet_scan(root, name, labels):
    """One scan in the official layout: per label a 10 x 10 vertex patch (one segment each)."""
    folder = root / name
    folder.mkdir(parents=True)
    vertices, faces, segments, groups = [], [], [], []
    for object_id, label in enumerate(labels):
        patch, patch_faces = grid_mesh(offset=[object_id * 2.0, 0, 0], n=10, seed=object_id)
        faces += [[len(vertices) + i for i in face] for face in patch_faces]
        vertices += list(patch)
        segments += [object_id] * len(patch)
        groups.append({"id": object_id, "objectId": object_id, "segments": [object_id], "label": label})
    write_ply(folder / f"{name}_vh_clean_2.ply", vertices, faces, "binary_little_endian")
    (folder / f"{name}.aggregation.json").write_text(json.dumps({"sceneId": name, "segGroups": groups}))
    (folder / f"{name}_vh_clean_2.0.010000.segs.json").write_text(json.dumps({"segIndices": segments}))


def test_evaluate_scannet_scans(capsys, tmp_path, models):
    scannet_scan(tmp_path / "scans", "scene0000_00", ["chair", "couch", "lamp", "table"])
    scannet_scan(tmp_path / "scans", "scene0001_00", ["bed", "office chair"])
    code, out, err = run(capsys, "evaluate", models["paths"]["scannet"], "--data", tmp_path / "scans",
                         "--out", tmp_path / "eval")
    assert code == 0, err
    clouds, labels, _ = load_scannet_objects(tmp_path / "scans", num_points=POINTS)
    np.testing.assert_array_equal(labels, [SCANNET_CLASSES.index(c) for c in ("chair", "sofa", "table", "bed",
                                                                                "chair")])
    predicted = models["scannet"].predict(clouds, verbose=0).argmax(1)
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["kind"] == "scannet" and metrics["examples"] == 5
    assert metrics["correct"] == int(np.sum(predicted == labels))
    assert metrics["per_class"]["chair"]["examples"] == 2 and metrics["per_class"]["wall"]["examples"] == 0
    assert f"loading {tmp_path / 'scans'}: 2/2 scans, 5 objects" in err


def test_evaluate_writes_a_new_folder_beside_the_model_each_time(capsys, tmp_path, models):
    (tmp_path / "run").mkdir()
    model = shutil.copy(models["paths"]["points"], tmp_path / "run" / "model.keras")
    tree = mesh_tree(tmp_path / "ModelNet")
    for _ in range(2):
        code, out, err = run(capsys, "evaluate", model, "--data", tree, "--split", "train")
        assert code == 0, err
    folders = sorted(p.name for p in (tmp_path / "run").iterdir() if p.is_dir())
    assert len(folders) == 2 and all(f.startswith("eval-ModelNet-train-") for f in folders)
    for folder in folders:
        assert json.loads((tmp_path / "run" / folder / "metrics.json").read_text())["examples"] == 3


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A short run of tf-sparseconv train on a small point-cloud .npz (30 epochs of batch 4: one epoch
    leaves a model that predicts one class for every shape): model.keras, results.json, split.json."""
    root = tmp_path_factory.mktemp("run")
    clouds, labels, names = make_shapes(num_per_class=10, num_points=POINTS, classes=("cube", "cone", "torus"), seed=1)
    quantised_npz(root / "train.npz", clouds, labels, names)
    quantised_npz(root / "shuffled.npz", clouds, labels[::-1], names)
    assert cli.main(["train", "--dataset", "modelnet40", "--data-dir", str(root / "train.npz"), "--resolution", "8",
                     "--rho", "0.5", "1.0", "--epochs", "30", "--batch-size", "4", "--val-fraction", "0.3",
                     "--out", str(root / "run")]) == 0
    return root


def test_evaluate_split_val_rescores_the_training_runs_validation_examples(capsys, trained_run):
    run_dir = trained_run / "run"
    split = json.loads((run_dir / "split.json").read_text())
    with zipfile.ZipFile(run_dir / "model.keras") as archive:  # train saves the checksum evaluate verifies
        assert CHECKSUM_MEMBER in archive.namelist()
    code, out, err = run(capsys, "evaluate", run_dir / "model.keras", "--split", "val", "--out", trained_run / "val")
    assert code == 0, err
    metrics = json.loads((trained_run / "val" / "metrics.json").read_text())
    assert metrics["split"] == "val" and metrics["examples"] == len(split["val_indices"]) == 9
    examples, labels, _ = train.load_examples("modelnet40", str(trained_run / "train.npz"), {}, 0)
    model = keras.models.load_model(run_dir / "model.keras")
    predicted = model.predict(examples[split["val_indices"]], verbose=0).argmax(1)
    assert len(set(predicted.tolist())) > 1  # so the count depends on which examples are scored
    assert metrics["correct"] == int(np.sum(predicted == labels[split["val_indices"]]))
    results = json.loads((run_dir / "results.json").read_text())
    assert metrics["overall_accuracy"] == pytest.approx(results["val_accuracy"])
    # Other data under the same name is refused, and nothing is written.
    before = _files(trained_run)
    code, out, err = run(capsys, "evaluate", run_dir / "model.keras", "--split", "val",
                         "--data", trained_run / "shuffled.npz")
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith(
        f"tf-sparseconv evaluate: error: --split val: {trained_run / 'shuffled.npz'} is not the data the model was "
        "trained on: it has other labels than the training run's")
    assert _files(trained_run) == before


def test_evaluate_results_that_cannot_be_written_end_in_one_line(capsys, tmp_path, bad_inputs, models, monkeypatch):
    def read_only(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "makedirs", read_only)  # what no check beforehand sees: a read-only file system, say
    code, out, err = run(capsys, "evaluate", models["paths"]["points"], "--data", bad_inputs / "shapes.npz", "--out",
                         tmp_path / "results")
    assert code == 2 and "overall accuracy" in out
    assert err.strip().splitlines()[-1] == (f"tf-sparseconv evaluate: error: {tmp_path / 'results'}: cannot write the "
                                            "results there (Permission denied)")


def test_tensorflow_errors_on_user_data_become_one_line(models):
    from tf_sparseconv.cli.evaluate import predict_logits

    model = keras.models.load_model(models["paths"]["none"])
    far = np.random.default_rng(0).normal(size=(3, POINTS, 3)).astype(np.float32) * 5
    with pytest.raises(cli.UsageError) as error:
        predict_logits(model, far, batch_size=2)
    message = str(error.value)
    assert message.startswith("examples 0..1: point_cloud_to_sparse: point cloud 0 of the batch has coordinates from")
    assert "\n" not in message and "\\" not in message
    assert "outside the bounds [-1, 1]; use normalize='unit_sphere'" in message


# --- predict ---------------------------------------------------------------------------------

def test_predict_files_of_each_format(capsys, tmp_path, models):
    clouds, _, _ = make_shapes(num_per_class=1, num_points=POINTS, classes=("cube", "torus", "cone"), seed=4)
    write(tmp_path / "cube.off", off_text(CUBE_VERTICES, CUBE_QUADS))
    write(tmp_path / "tetra.off", off_text(*TETRAHEDRON))
    vertices, faces = grid_mesh(offset=[1, 2, 3], n=6)
    write_ply(tmp_path / "ascii.ply", vertices, faces, "ascii")
    write_ply(tmp_path / "binary.ply", vertices, faces, "binary_little_endian", with_normals=False)
    np.save(tmp_path / "one.npy", clouds[0] * 40 + 7)  # any units: the model normalises
    np.savez(tmp_path / "three.npz", points=clouds)
    files = ["cube.off", "tetra.off", "ascii.ply", "binary.ply", "one.npy", "three.npz"]
    code, out, err = run(capsys, "predict", models["paths"]["points"], *[tmp_path / f for f in files],
                         "--top-k", "2", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert [(os.path.basename(r["file"]), r["index"]) for r in rows] == [
        ("cube.off", None), ("tetra.off", None), ("ascii.ply", None), ("binary.ply", None), ("one.npy", None),
        ("three.npz", 0), ("three.npz", 1), ("three.npz", 2)]
    # The 36-vertex PLY files are resampled to the model's 128 points; said once.
    assert err.count("note: 2 cloud(s) resampled to 128 points") == 1
    expected = softmax(models["points"].predict(clouds, verbose=0))
    for row, probabilities in zip(rows[5:], expected):
        top = np.argsort(-probabilities)[:2]
        assert [c["class"] for c in row["top_k"]] == [models["classes"][i] for i in top]
        np.testing.assert_allclose([c["probability"] for c in row["top_k"]], probabilities[top], rtol=1e-5)
    scaled = [c["probability"] for c in rows[4]["top_k"]]
    assert [c["class"] for c in rows[4]["top_k"]] == [c["class"] for c in rows[5]["top_k"]]
    np.testing.assert_allclose(scaled, [c["probability"] for c in rows[5]["top_k"]], rtol=1e-4)

    code, out, err = run(capsys, "predict", models["paths"]["points"], tmp_path / "three.npz", tmp_path / "cube.off",
                         "--top-k", "2")
    assert code == 0 and err == ""
    lines = out.strip().splitlines()
    labels = [f"{tmp_path / 'three.npz'}[{i}]" for i in range(3)] + [str(tmp_path / "cube.off")]
    for line, label, row in zip(lines, labels, rows[5:] + rows[:1], strict=True):
        assert line.split() == [label] + [t for c in row["top_k"] for t in (c["class"], f"{c['probability']:.3f}")]


def test_predict_centres_clouds_far_from_the_origin(capsys, tmp_path, models):
    """A float64 cloud 5e8 from the origin (an object cut out of a georeferenced scan), for a
    model that centres every cloud on its centroid: the classes of the same cloud at the origin,
    where float32 alone would move its points by up to 32 units."""
    clouds, _, _ = make_shapes(num_per_class=1, num_points=POINTS, classes=("cube", "torus"), seed=5)
    offset = np.array([4.5e8, 5.4e8, -3.0e8])
    np.save(tmp_path / "near.npy", clouds[1].astype(np.float64))
    np.save(tmp_path / "utm.npy", clouds[1].astype(np.float64) + offset)
    np.savez(tmp_path / "utm.npz", points=clouds.astype(np.float64) + offset)
    code, out, err = run(capsys, "predict", models["paths"]["points"], tmp_path / "near.npy", tmp_path / "utm.npy",
                         tmp_path / "utm.npz", "--top-k", "3", "--json")
    assert code == 0, err
    near, far, *several = json.loads(out)
    assert [c["class"] for c in far["top_k"]] == [c["class"] for c in near["top_k"]]
    np.testing.assert_allclose([c["probability"] for c in far["top_k"]], [c["probability"] for c in near["top_k"]],
                               rtol=1e-4)
    expected = softmax(models["points"].predict(clouds, verbose=0))
    for row, probabilities in zip(several, expected, strict=True):
        top = np.argsort(-probabilities)[:3]
        assert [c["class"] for c in row["top_k"]] == [models["classes"][i] for i in top]
        np.testing.assert_allclose([c["probability"] for c in row["top_k"]], probabilities[top], rtol=1e-4)


def test_evaluate_centres_npz_clouds_far_from_the_origin(capsys, tmp_path, models):
    """evaluate of a float64 .npz test set far from the origin scores what the same set at the
    origin scores, with a model that centres its clouds; one saved with normalize='none' is refused."""
    clouds, labels, _ = make_shapes(num_per_class=3, num_points=POINTS, classes=("cube", "cone"), seed=6)
    np.savez(tmp_path / "near.npz", points=clouds.astype(np.float64), labels=labels, classes=["cube", "cone"])
    np.savez(tmp_path / "far.npz", points=clouds.astype(np.float64) + [2e8, -7e8, 1e8], labels=labels,
             classes=["cube", "cone"])
    scores = []
    for name in ("near", "far"):
        code, out, err = run(capsys, "evaluate", models["paths"]["points"], "--data", tmp_path / f"{name}.npz",
                             "--classes", "model", "--out", tmp_path / f"eval-{name}")
        assert code == 0, err
        with open(tmp_path / f"eval-{name}" / "metrics.json") as f:
            scores.append(json.load(f))
    assert scores[1]["confusion_matrix"] == scores[0]["confusion_matrix"]
    assert scores[1]["overall_accuracy"] == scores[0]["overall_accuracy"]
    code, out, err = run(capsys, "evaluate", models["paths"]["none"], "--data", tmp_path / "far.npz",
                         "--classes", "model")
    assert code == 2 and "far.npz[0]: coordinates up to 7e+08" in err


@pytest.mark.parametrize("vote", ["mirror", "rotations-3"])
def test_predict_with_a_vote_gives_the_mean_softmax_over_the_views(capsys, tmp_path, models, vote):
    from tf_sparseconv.training.voting import vote_views

    clouds, _, _ = make_shapes(num_per_class=1, num_points=POINTS, classes=("cube", "torus", "cone"), seed=5)
    np.savez(tmp_path / "three.npz", points=clouds)
    code, out, err = run(capsys, "predict", models["paths"]["points"], tmp_path / "three.npz", "--top-k", "3",
                         "--json", "--vote", vote)
    assert code == 0, err
    assert f"voting over views of each cloud ({vote})" in err
    expected = np.mean([softmax(models["points"].predict(view, verbose=0)) for view in vote_views(clouds, vote)],
                       axis=0)
    assert len(list(vote_views(clouds, vote))) == (2 if vote == "mirror" else 3)
    for row, probabilities in zip(json.loads(out), expected, strict=True):
        top = np.argsort(-probabilities)[:3]
        assert [c["class"] for c in row["top_k"]] == [models["classes"][i] for i in top]
        np.testing.assert_allclose([c["probability"] for c in row["top_k"]], probabilities[top], rtol=1e-4)
    # an ensemble: each model's vote, then the mean over the models (the same model twice: its own vote)
    copy = tmp_path / "copy.keras"
    copy.write_bytes(open(models["paths"]["points"], "rb").read())
    code, out, err = run(capsys, "predict", models["paths"]["points"], copy, tmp_path / "three.npz", "--top-k", "3",
                         "--json", "--vote", vote)
    assert code == 0, err
    for row, probabilities in zip(json.loads(out), expected, strict=True):
        np.testing.assert_allclose(sorted(c["probability"] for c in row["top_k"]), sorted(probabilities)[-3:],
                                   rtol=1e-4)


def test_predict_images(capsys, tmp_path, models):
    rng = np.random.default_rng(2)
    digits = (rng.random((3, 28, 28)) < 0.3).astype(np.uint8) * 200
    Image.fromarray(digits[0]).save(tmp_path / "digit.png")
    np.savez(tmp_path / "digits.npz", images=digits)
    code, out, err = run(capsys, "predict", models["paths"]["images"], tmp_path / "digit.png",
                         tmp_path / "digits.npz", "--top-k", "1", "--json")
    assert code == 0, err
    rows = json.loads(out)
    expected = softmax(models["images"].predict(digits.astype(np.float32), verbose=0))
    assert [r["top_k"][0]["class"] for r in rows] == [str(i) for i in expected[[0, 0, 1, 2]].argmax(1)]
    np.testing.assert_allclose([r["top_k"][0]["probability"] for r in rows], expected[[0, 0, 1, 2]].max(1),
                               rtol=1e-5)


# --- bound -----------------------------------------------------------------------------------

def test_bound_prints_the_models_bound_and_the_dense_grids(capsys, models):
    code, out, err = run(capsys, "bound", models["paths"]["points"], "--batch-size", "4")
    assert code == 0, err
    expected = memory_bound(models["points"], 4, points_per_sample=POINTS)
    assert out.splitlines()[0].endswith(f"memory bound of one forward pass at batch 4, {POINTS} points per cloud")
    assert expected.table() in out
    assert f"= {expected.total_bytes / 2 ** 20:.2f} MB" in out and "vs dense grid" in out
    code, out, _ = run(capsys, "bound", models["paths"]["images"])
    assert code == 0 and "image_to_sparse" in out
    # A bare core (train's epoch snapshots) is bounded from its sparse input.
    code, out, _ = run(capsys, "bound", models["paths"]["core"], "--batch-size", "4")
    assert code == 0 and memory_bound(keras.models.load_model(models["paths"]["core"]), 4).table() in out


def test_bound_of_several_models_is_the_largest_members(capsys, models):
    paths = models["paths"]
    code, out, err = run(capsys, "bound", paths["points"], paths["scannet"], "--batch-size", "4")
    assert code == 0, err
    bounds = [memory_bound(models[name], 4, points_per_sample=POINTS) for name in ("points", "scannet")]
    for bound in bounds:
        assert bound.table() in out
    largest = max(b.total_bytes for b in bounds)
    assert out.splitlines()[-1].startswith(f"ensemble of 2 models, run one after another (evaluate, predict): "
                                           f"memory bound {largest / 2 ** 20:.2f} MB, the largest member's")
    code, _, err = run(capsys, "bound", paths["points"], paths["points"])
    assert code != 0 and "a model is named twice" in err


def test_evaluate_several_models_scores_their_ensemble(capsys, tmp_path, models):
    names = list(models["classes"])
    clouds, labels, _ = make_shapes(num_per_class=4, num_points=POINTS, classes=names, seed=12)
    dequantised = quantised_npz(tmp_path / "test.npz", clouds, labels, names)
    paths = models["paths"]
    unnormalized = keras.models.load_model(paths["none"])
    mean = (softmax(models["points"].predict(dequantised, verbose=0))
            + softmax(unnormalized.predict(dequantised, verbose=0))) / 2
    code, out, err = run(capsys, "evaluate", paths["points"], paths["none"], "--data", tmp_path / "test.npz",
                         "--out", tmp_path / "ensemble")
    assert code == 0, err
    metrics = json.loads((tmp_path / "ensemble" / "metrics.json").read_text())
    assert metrics["models"] == [os.path.abspath(paths["points"]), os.path.abspath(paths["none"])]
    assert metrics["correct"] == int(np.sum(mean.argmax(1) == labels))
    assert "ensemble of 2 models" in out
    # The same model twice, or models of other classes, are refused.
    code, _, err = run(capsys, "evaluate", paths["points"], paths["points"], "--data", tmp_path / "test.npz")
    assert code == 2 and "a model is named twice" in err
    code, _, err = run(capsys, "evaluate", paths["points"], paths["scannet"], "--data", tmp_path / "test.npz",
                       "--classes", "model")
    assert code == 2 and "has other classes than" in err


def test_split_seed_keeps_the_validation_examples_and_evaluate_scores_the_ensemble(capsys, trained_run):
    runs = {}
    for name, seeds in (("seed1", ["--seed", "1", "--split-seed", "0"]), ("seed2", ["--seed", "2"])):
        assert cli.main(["train", "--dataset", "modelnet40", "--data-dir", str(trained_run / "train.npz"),
                         "--resolution", "8", "--rho", "0.5", "1.0", "--epochs", "30", "--batch-size", "4",
                         "--val-fraction", "0.3", *seeds, "--out", str(trained_run / name)]) == 0
        runs[name] = json.loads((trained_run / name / "split.json").read_text())
    first = json.loads((trained_run / "run" / "split.json").read_text())
    assert runs["seed1"]["val_indices"] == first["val_indices"] and runs["seed1"]["split_seed"] == 0
    assert runs["seed2"]["val_indices"] != first["val_indices"] and runs["seed2"]["split_seed"] == 2
    paths = [trained_run / "run" / "model.keras", trained_run / "seed1" / "model.keras"]
    code, out, err = run(capsys, "evaluate", *paths, "--split", "val", "--out", trained_run / "ensemble-val")
    assert code == 0, err
    examples, labels, _ = train.load_examples("modelnet40", str(trained_run / "train.npz"), {}, 0)
    val = first["val_indices"]
    members = [softmax(keras.models.load_model(p).predict(examples[val], verbose=0)) for p in paths]
    mean = sum(members) / 2
    confusions = [np.zeros((3, 3), int) for _ in range(3)]
    for confusion, probabilities in zip(confusions, [*members, mean]):
        np.add.at(confusion, (labels[val], probabilities.argmax(1)), 1)
    # the ensemble's confusion matrix is neither member's: scoring one member alone would show
    assert not np.array_equal(confusions[2], confusions[0]) and not np.array_equal(confusions[2], confusions[1])
    metrics = json.loads((trained_run / "ensemble-val" / "metrics.json").read_text())
    assert metrics["correct"] == int(np.sum(mean.argmax(1) == labels[val]))
    np.testing.assert_array_equal(metrics["confusion_matrix"], confusions[2])
    # Runs that held out other examples do not make an ensemble on --split val.
    code, out, err = run(capsys, "evaluate", paths[0], trained_run / "seed2" / "model.keras", "--split", "val")
    assert code == 2 and out == "" and "was trained with other validation examples" in err


def test_evaluate_turn_scores_the_clouds_turned_about_z(capsys, tmp_path, models):
    from tf_sparseconv.data.pipeline import rotate_about_up
    names = list(models["classes"])
    clouds, labels, _ = make_shapes(num_per_class=4, num_points=POINTS, classes=names, seed=13)
    dequantised = quantised_npz(tmp_path / "test.npz", clouds, labels, names)
    turned = rotate_about_up(dequantised, np.radians(35.0)).astype(np.float32)
    expected = models["points"].predict(turned, verbose=0).argmax(1)
    code, out, err = run(capsys, "evaluate", models["paths"]["points"], "--data", tmp_path / "test.npz",
                         "--turn", "35", "--out", tmp_path / "turned")
    assert code == 0, err
    metrics = json.loads((tmp_path / "turned" / "metrics.json").read_text())
    assert metrics["turn_degrees"] == 35 and metrics["correct"] == int(np.sum(expected == labels))
    assert "turned by 35 degrees" in out
    code, _, err = run(capsys, "evaluate", models["paths"]["none"], "--data", tmp_path / "test.npz", "--turn", "5")
    assert code == 2 and "--turn 5 needs a model that normalises its clouds" in err
    code, _, err = run(capsys, "evaluate", models["paths"]["points"], "--data", tmp_path / "test.npz", "--turn", "nan")
    assert code == 2 and "--turn must be a finite number of degrees" in err


def test_predict_with_several_models_gives_their_mean_softmax(capsys, tmp_path, models):
    clouds, _, _ = make_shapes(num_per_class=1, num_points=POINTS, classes=("cube", "torus", "cone"), seed=5)
    np.savez(tmp_path / "three.npz", points=clouds)
    paths = models["paths"]
    code, out, err = run(capsys, "predict", paths["points"], paths["none"], tmp_path / "three.npz", "--top-k", "3",
                         "--json")
    assert code == 0, err
    assert "ensemble of 2 models: the mean of their softmax outputs" in err
    unnormalized = keras.models.load_model(paths["none"])
    expected = (softmax(models["points"].predict(clouds, verbose=0)) + softmax(unnormalized.predict(clouds,
                                                                                                    verbose=0))) / 2
    # the two members disagree somewhere, so the mean is not either one's
    assert not np.allclose(expected, softmax(models["points"].predict(clouds, verbose=0)), atol=1e-3)
    for row, probabilities in zip(json.loads(out), expected):
        top = np.argsort(-probabilities)[:3]
        assert [c["class"] for c in row["top_k"]] == [models["classes"][i] for i in top]
        np.testing.assert_allclose([c["probability"] for c in row["top_k"]], probabilities[top], rtol=1e-5)
    for argv, message in (([paths["points"], paths["points"], tmp_path / "three.npz"], "a model is named twice"),
                          ([paths["points"], paths["scannet"], tmp_path / "three.npz"], "has other classes than"),
                          ([paths["points"], paths["images"], tmp_path / "three.npz"], "has other classes than"),
                          ([paths["points"], paths["none"]], "name the files to predict after the model")):
        code, _, err = run(capsys, "predict", *argv)
        assert code != 0 and message in err, (argv, err)
