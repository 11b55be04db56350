"""Train a sparse OctNet3 classifier (or the site-sparse ResNet classifier): `tf-sparseconv train`.

    tf-sparseconv train                      # the main job: OctNet3 at 32^3, Table 4 bounds, built-in shapes
    tf-sparseconv train --dataset modelnet40 --data-dir ../shared/data --epochs 20
    tf-sparseconv train --model site-resnet --dataset modelnet40 --resolution 32

Datasets: synthetic (built in, no download), modelnet40 / modelnet10 (the point-cloud .npz
or the official OFF layout under --data-dir), scannet (official scans under --data-dir),
mnist (.npz or idx files under --data-dir). Every argument and the data path are checked
before anything loads; a bad one ends the run with a one-line error (exit code 2) and
nothing written.

Writes into --out (default: a new folder runs/<dataset>-<model>-<date>-<time>; an existing
non-empty folder only with --overwrite): model.keras, the trained model with its
preprocessing (point clouds [B, N, 3] -> logits, or images [B, 28, 28] for MNIST; load it
with keras.models.load_model after `import tf_sparseconv`, or with tf_sparseconv.models.load_model,
which also verifies the weights' checksum saved with it), results.json, split.json (which
examples were held out for validation, for `tf-sparseconv evaluate --split val`; --val-split
chooses them: a stratified fraction, a count per class, ModelNet40's test proportions, or
none, for a final model on every example once the recipe is chosen),
training_curve.png and tensorboard/. Point clouds are normalised into the unit sphere
before training, the same way the saved model normalises what it is given. Progress is
Keras' bar on a terminal and one short line per epoch otherwise, with the validation
accuracy, the mean per-class accuracy and, on ModelNet, the accuracy at the official test's
class balance; the summary gives these (and, with --vote, those of voting over mirrored or
rotated views), each sparse layer's density and present weights, and the memory bound for
the batch size against the dense grid's.

--strategy mirrored trains on every GPU of this host, --strategy multi-worker on every host
of the cluster in TF_CONFIG (run the same command on each); --batch-size is then the global
batch, cut into one sparse batch per replica (training.distribute), and only the chief
writes --out.

--model site-resnet trains models.site_resnet (submanifold residual blocks, strided
downsampling, global pooling) on the same batches converted to site-sparse tensors; the
density bounds, Eq. 4 regularisation, pruning and the memory bound of the channel-sparse
model do not apply to it (--site-k bounds its sites per example instead).
"""
import argparse
import glob
import hashlib
import json
import os
import shlex
import shutil
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv import data as datasets
from tf_sparseconv.data.mnist import IDX_FILES, THRESHOLD
from tf_sparseconv.data.modelnet import MESH_LAYOUT
from tf_sparseconv.data.point_files import npz_headers
from tf_sparseconv.data.scannet import SCAN_LAYOUT
from tf_sparseconv.channel.keras_io import as_keras_inputs
from tf_sparseconv.cli.common import folder_problem
from tf_sparseconv.host_memory import check_cloud_fits
from tf_sparseconv.layer_config import MAX_EXTENT, MAX_KEYS
from tf_sparseconv.models import (DEFAULT_RHOS, image_classifier, normalize_point_clouds, octnet3,
                                  point_cloud_classifier, save_model, site_resnet)
from tf_sparseconv.models.memory_bound import memory_bound
from tf_sparseconv.models.point_normals import MAX_NEIGHBOURS, MIN_NEIGHBOURS, check_neighbours, with_estimated_normals
from tf_sparseconv.models.octnet3 import BLOCK_CHANNELS, _default_dense_blocks
from tf_sparseconv.site.conversions import from_channel_sparse
from tf_sparseconv.site.keras_io import as_site_keras_inputs
from tf_sparseconv.training.density_regularizer import DENSITIES, DensityRegularizer
from tf_sparseconv.training.distribute import (COLLECTIVES, GRADIENT_ALL_REDUCES, STRATEGIES, ClusterFailure,
                                               check_gradient_all_reduce, cluster_failures_named,
                                               cluster_from_tf_config, collective_of, expected_replicas, is_chief,
                                               make_strategy, per_replica_dataset, replica_values, steps_per_epoch)
from tf_sparseconv.training.fine_tune import FineTunePhase
from tf_sparseconv.training.losses import SmoothedSparseCrossentropy
from tf_sparseconv.training.metrics import MeanClassAccuracy, class_accuracies
from tf_sparseconv.training.optimizers import FusedAdam
from tf_sparseconv.training.overlapping_steps import overlap_steps
from tf_sparseconv.training.pruning import WarningShotPruning, present_weight_count, sparse_conv_layers
from tf_sparseconv.training.report import (EpochProgress, PresentWeights, TensorBoardScalars, plot_training_curve,
                                           summary_lines)
from tf_sparseconv.training.voting import VOTE_HELP, parse_vote, voted_probabilities

PROG = "tf-sparseconv train"
DATASETS = ("synthetic", "modelnet40", "modelnet10", "scannet", "mnist")
MODELS = ("octnet3", "site-resnet")
LAM_TERMS = ("weights+biases", "weights")
OPTIMIZERS = ("adam", "adagrad", "sgd")
# How the validation examples are chosen: --val-fraction of each class (stratified), up to
# --val-per-class of each (balanced), or in the official ModelNet40 test's proportions
# (modelnet40-test: --val-per-class for a class with 100 test shapes); the last two hold out
# at most --val-max-fraction of any class. none trains on every example (a final model, once
# the recipe and its epochs are chosen on a split).
VAL_SPLITS = ("stratified", "balanced", "modelnet40-test", "none")
VAL_DEFAULTS = {"val_fraction": 0.1, "val_per_class": 50, "val_max_fraction": 0.25}
DEFAULT_DATA_DIR = os.environ.get(
    "TF_SPARSECONV_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "data"))
MNIST_RESOLUTION = 28
DEFAULT_RESOLUTION = 32
# The main job, `tf-sparseconv train` alone: OctNet3 at 32^3 with Table 4's bounds (0.14,
# 0.33, 0.66), so k-selection runs, on 800 built-in shapes, sized to train in about 4
# minutes on 2 CPU cores (~0.74 validation accuracy; chance 0.125). Small batches and a
# cosine schedule learn the most from those few epochs (batch 32 at a constant rate: ~0.47);
# the other datasets keep batch 32 and a constant rate unless told otherwise.
DEFAULT_SYNTHETIC_PER_CLASS = 100
RECIPES = {"synthetic": {"epochs": 6, "batch_size": 8, "lr_schedule": "cosine"},
           "other": {"epochs": 8, "batch_size": 32, "lr_schedule": "constant"}}
# Resolutions with Table 4 bounds for point clouds (28 is MNIST's 2-D net).
TABLE4_RESOLUTIONS = tuple(sorted(r for r in DEFAULT_RHOS if r != MNIST_RESOLUTION))
RUNS_DIR = "runs"
# What a run writes into --out; --overwrite removes these (and the epoch snapshots) first.
OUTPUTS = ("model.keras", "results.json", "split.json", "training_curve.png", "tensorboard")
NPZ_FILES = {"modelnet40": "modelnet40_train.npz", "modelnet10": "modelnet40_train.npz", "mnist": "mnist_train.npz"}
# The arrays each .npz must hold: (element type, dimensions); the first dimension, M, is shared.
NPZ_ARRAYS = {
    "modelnet40": {"points": ("uint8", 3), "labels": ("integer", 1), "classes": ("string", 1)},
    "mnist": {"images": ("uint8", 3), "labels": ("integer", 1)},
}
NPZ_FORMS = {"modelnet40": "points uint8 [M, N, 3], labels [M] and classes [C] (strings)",
             "mnist": "images uint8 [M, 28, 28] and labels [M]"}


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (`tf-sparseconv train: error: ...`,
    exit code 2), without the usage block."""

    def error(self, message):
        message = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {message}\n")


def one_line(error):
    """An exception's message on one line, without the quotes KeyError adds."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else error
    return " ".join(str(text).split())


def data_source(dataset, data_dir):
    """(kind, path) of what load_examples reads: ("synthetic", None), ("npz", file),
    ("meshes", folder), ("idx", folder) or ("scans", folder); the path is as given, and
    may be missing (check_data says so)."""
    if dataset == "synthetic":
        return "synthetic", None
    folder_kind = {"modelnet40": "meshes", "modelnet10": "meshes", "mnist": "idx", "scannet": "scans"}[dataset]
    if dataset in NPZ_FILES:
        if data_dir.endswith(".npz"):
            return "npz", data_dir
        npz = os.path.join(data_dir, NPZ_FILES[dataset])
        if os.path.isfile(npz):
            return "npz", npz
    return folder_kind, data_dir


def _expected_data(dataset):
    """What --data-dir must hold for dataset, in words."""
    if dataset in ("modelnet40", "modelnet10"):
        return f"{NPZ_FILES[dataset]} (or the .npz file itself) or the ModelNet layout {MESH_LAYOUT}"
    if dataset == "mnist":
        return (f"{NPZ_FILES['mnist']} (or the .npz file itself) or the idx files {IDX_FILES['train'][0]} and "
                f"{IDX_FILES['train'][1]} (optionally .gz)")
    return f"the ScanNet scans {SCAN_LAYOUT}"


def check_npz(path, form):
    """Raises ValueError with one line unless the .npz at path holds the arrays of
    NPZ_ARRAYS[form] with consistent shapes, none of them Python objects (read from the .npy
    headers alone: nothing is unpickled or loaded)."""
    headers = npz_headers(path)
    expected = NPZ_ARRAYS[form]
    missing = sorted(set(expected) - set(headers))
    if missing:
        raise ValueError(f"{path} lacks the arrays {missing} (it holds {sorted(headers) or 'none'}); expected "
                         f"{NPZ_FORMS[form]}")
    for name, (kind, ndim) in expected.items():
        shape, dtype = headers[name]
        wanted = {"uint8": dtype == np.uint8, "integer": dtype.kind in "iu", "string": dtype.kind in "US"}[kind]
        if len(shape) != ndim or not wanted:
            raise ValueError(f"{path}: array {name!r} is {dtype} {list(shape)}; expected {NPZ_FORMS[form]}")
    first = next(iter(expected))
    count = headers[first][0][0]
    if headers["labels"][0][0] != count:
        raise ValueError(f"{path}: {count} {first} but {headers['labels'][0][0]} labels; expected "
                         f"{NPZ_FORMS[form]}")
    if form == "modelnet40" and headers["points"][0][2] != 3:
        raise ValueError(f"{path}: points have {headers['points'][0][2]} columns; expected {NPZ_FORMS[form]}")
    if form == "mnist" and headers["images"][0][1:] != (MNIST_RESOLUTION, MNIST_RESOLUTION):
        raise ValueError(f"{path}: images are {'x'.join(map(str, headers['images'][0][1:]))}; the MNIST model "
                         f"takes {MNIST_RESOLUTION}x{MNIST_RESOLUTION}")


def check_data(dataset, data_dir, features=("occupancy",), normals_estimated=False):
    """Raises ValueError (one line, naming the path and what belongs there) unless the data
    of dataset can be found under data_dir; reads only directory listings and .npz headers.
    normals_estimated: the normals feature comes from --estimate-normals, not from the data."""
    kind, path = data_source(dataset, data_dir)
    if kind == "synthetic":
        return
    if kind == "npz":
        if not os.path.isfile(path):
            raise ValueError(f"--data-dir {path} does not exist; expected {_expected_data(dataset)}")
        check_npz(path, "mnist" if dataset == "mnist" else "modelnet40")
        if "normals" in features and not normals_estimated:
            raise ValueError(f"--features normals needs surface normals, which {path} does not hold (points only); "
                             f"use the ModelNet meshes ({MESH_LAYOUT}), --estimate-normals K or other features")
        return
    if not os.path.isdir(path):
        raise ValueError(f"--data-dir {path} does not exist; expected a folder with {_expected_data(dataset)}")
    if kind == "meshes":
        classes = datasets.MODELNET10_CLASSES if dataset == "modelnet10" else sorted(os.listdir(path))
        present = [c for c in classes if glob.glob(os.path.join(glob.escape(path), c, "train", "*.[oO][fF][fF]"))]
        if not present or (dataset == "modelnet10" and len(present) < len(classes)):
            lacking = f" (no {', '.join(sorted(set(classes) - set(present)))})" if present else ""
            raise ValueError(f"--data-dir {path} holds neither {NPZ_FILES[dataset]} nor the ModelNet layout "
                             f"{MESH_LAYOUT}{lacking}")
    elif kind == "idx":
        for name in IDX_FILES["train"]:
            if not any(os.path.isfile(os.path.join(path, name + ext)) for ext in ("", ".gz")):
                raise ValueError(f"--data-dir {path} holds neither {NPZ_FILES['mnist']} nor {name}[.gz]; expected "
                                 f"{_expected_data(dataset)}")
    elif not any(name.startswith("scene") and os.path.isdir(os.path.join(path, name)) for name in os.listdir(path)):
        raise ValueError(f"--data-dir {path} holds no scene* folders; expected {_expected_data(dataset)}")


def load_examples(dataset, data_dir, points_per_shape, seed, normals=False):
    """(examples, labels, class names): point clouds [M, N, 3] ([M, N, 6] with normals) in
    the unit sphere, as models.normalize_point_clouds puts them (the saved model does the
    same to what it is given), or images [M, 28, 28]."""
    kind, path = data_source(dataset, data_dir)
    if dataset == "mnist":
        images, labels = datasets.load_mnist(path)
        return images, labels, tuple(str(i) for i in range(10))
    if dataset == "synthetic":
        clouds, labels, classes = datasets.make_shapes(num_per_class=points_per_shape["synthetic_per_class"],
                                                       seed=seed, normals=normals)
    elif dataset in ("modelnet40", "modelnet10"):
        classes = datasets.MODELNET10_CLASSES if dataset == "modelnet10" else None
        if kind == "npz":
            clouds, labels, classes = datasets.load_modelnet_npz(path, classes=classes)
        else:
            clouds, labels, classes = datasets.load_modelnet_meshes(path, "train", classes=classes,
                                                                    num_points=points_per_shape["points"], seed=seed,
                                                                    normals=normals)
    elif dataset == "scannet":
        clouds, labels, classes = datasets.load_scannet_objects(path, num_points=points_per_shape["points"],
                                                                seed=seed, normals=normals)
    else:
        raise ValueError(f"--dataset must be one of {DATASETS}, got {dataset!r}")
    return normalize_point_clouds(clouds), labels, classes


def labels_sha256(labels):
    """The sha256 of labels as little-endian int64: split.json's fingerprint of a data set."""
    return hashlib.sha256(np.ascontiguousarray(labels, "<i8").tobytes()).hexdigest()


def keras_batches(dataset):
    """The channel-sparse batches as the dicts Keras takes (labels and any sample weights kept)."""
    return dataset.map(lambda x, *rest: (as_keras_inputs(x), *rest))


def site_keras_batches(dataset):
    """The channel-sparse batches as site dicts: one site per occupied voxel (pixel)."""
    def convert(x, *rest):
        sites = from_channel_sparse(x)
        sites = sites.with_features(tf.ensure_shape(sites.features, [None, x.shape[-1]]))
        return as_site_keras_inputs(sites), *rest
    return dataset.map(convert)


def peak_rss_bytes():
    """The process's peak resident memory so far (Linux; 0 where /proc is absent)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def peak_gpu_bytes():
    """TensorFlow's peak allocation on the first GPU in this process, or None without one."""
    if not tf.config.list_logical_devices("GPU"):
        return None
    return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])


def device_description():
    """What trained: the first GPU's name, or the CPU cores this process may use."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return "GPU: " + tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU ({cores} cores)"


class EpochLog(keras.callbacks.Callback):
    """Appends every finished epoch's logs to <backup_dir>/epochs.jsonl, so a run resumed by
    BackupAndRestore reports the history of all its epochs, not only of the last process.
    Placed before BackupAndRestore: an epoch logged but not yet backed up is rerun on resume,
    and history() keeps the last line per epoch."""

    def __init__(self, backup_dir):
        super().__init__()
        self.path = os.path.join(backup_dir, "epochs.jsonl")

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": epoch, **{k: float(v) for k, v in (logs or {}).items()}}) + "\n")

    def history(self):
        by_epoch = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                for line in f:
                    row = json.loads(line)
                    by_epoch[row.pop("epoch")] = row
        rows = [by_epoch[e] for e in sorted(by_epoch)]
        return {key: [row[key] for row in rows] for key in (rows[0] if rows else {})}


def backed_up_epochs(backup_dir):
    """The epochs keras.callbacks.BackupAndRestore has saved in backup_dir (0 for none)."""
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f).get("epoch", 0))


# Arguments that may change when a backed-up run is resumed; any other change is refused,
# because the checkpoint would silently continue a different experiment (--vote only adds
# an evaluation at the end). A decaying learning rate spans the planned epochs, so under
# one --epochs may not change either.
RESUMABLE_CHANGES = ("epochs", "out", "overwrite", "backup_dir", "vote_mirror", "vote", "snapshot_epochs",
                     "collective", "gradient_all_reduce", "steps_per_execution")
# Options whose parser default is None (given only with --lam > 0), as main() resolves them.
RESOLVED_DEFAULTS = {"lam_reduction": "sum", "lam_terms": LAM_TERMS[0], "lam_density": DENSITIES[0]}


def build_optimizer(name, learning_rate, weight_decay=0.0):
    """Adam, Adagrad or SGD with Nesterov momentum 0.9; weight_decay > 0 shrinks every kernel
    by lr * weight_decay per step apart from the gradient step (decoupled, as AdamW), biases
    excluded. Under SGD an L2 penalty such as Eq. 4 pulls each weight in proportion to its
    distance from the target; Adam and Adagrad divide that pull by the weight's running
    gradient scale, so a weight the data hardly moves is pulled at about the learning rate
    per step whatever lambda is."""
    decay = dict(weight_decay=weight_decay) if weight_decay > 0 else {}
    if name == "adam":  # Keras' Adam, each variable's step one kernel (training/optimizers.py)
        optimizer = FusedAdam(learning_rate, **decay)
    elif name == "adagrad":
        optimizer = keras.optimizers.Adagrad(learning_rate, **decay)
    elif name == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate, momentum=0.9, nesterov=True, **decay)
    else:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    if decay:
        optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


def prepare_backup_dir(parser, args, write=True):
    """Refuses (parser.error) a --backup-dir that holds a run with other arguments; with
    write, creates it and records this run's arguments there unless recorded already."""
    if os.path.exists(args.backup_dir) and not os.path.isdir(args.backup_dir):
        parser.error(f"--backup-dir {args.backup_dir} is a file; give a folder")
    problem = folder_problem(args.backup_dir)
    if problem:
        parser.error(f"--backup-dir {args.backup_dir} cannot be written: {problem}")
    path = os.path.join(args.backup_dir, "run_args.json")
    resumable = tuple(k for k in RESUMABLE_CHANGES if args.lr_schedule == "constant" or k != "epochs")
    current = {k: v for k, v in vars(args).items() if k not in resumable}
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        # an argument added after the run was saved had its default then; --augment was a flag;
        # before --lam-terms, Eq. 4 pulled the weights only
        before = {"lam_terms": "weights"} if "lam_terms" not in saved and saved.get("lam", 0) > 0 else {}
        saved = {**{k: RESOLVED_DEFAULTS.get(k, parser.get_default(k)) for k in current if k not in saved},
                 **before, **saved}
        if isinstance(saved.get("augment"), bool):
            saved["augment"] = "rotate" if saved["augment"] else None
        changed = sorted(k for k in (set(saved) | set(current)) - set(resumable) if saved.get(k) != current.get(k))
        if changed:
            parser.error(f"--backup-dir {args.backup_dir} holds a run with different arguments "
                         f"({', '.join(f'{k}: {saved.get(k)!r} there, {current.get(k)!r} now' for k in changed)}); "
                         "use a new folder or the same arguments")
    elif write:
        os.makedirs(args.backup_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump(current, f, indent=1)


class EpochTimer(keras.callbacks.Callback):
    """Adds sec_per_epoch (wall time), cpu_sec_per_epoch (the process's CPU time, all cores
    together: what other processes on a shared machine hardly change) and peak_rss_bytes to
    every epoch's logs, so the history (and the epoch log of a resumed run) carries them."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = (time.perf_counter(), time.process_time())

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["sec_per_epoch"] = time.perf_counter() - self._start[0]
            logs["cpu_sec_per_epoch"] = time.process_time() - self._start[1]
            logs["peak_rss_bytes"] = peak_rss_bytes()  # a resumed run's peak is the max over its processes


class EpochSnapshots(keras.callbacks.Callback):
    """Saves the model as <out>/model_epoch<N>.keras at the end of the chosen epochs
    (counted from 1), masks of pruned weights included, so that a run's models at several
    points of training can be compared later (experiments/pruning.py re-times them)."""

    def __init__(self, out, epochs):
        super().__init__()
        self.out, self.epochs = out, set(epochs)

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 in self.epochs:
            os.makedirs(self.out, exist_ok=True)
            save_model(self.model, snapshot_path(self.out, epoch + 1))


def snapshot_path(out, epoch):
    return os.path.join(out, f"model_epoch{epoch}.keras")


def validation_scores(model, make_dataset, examples, labels, num_classes, vote="none", steps=None,
                      test_weights=None):
    """metrics.class_accuracies of the model on the validation examples ("per_class" as a
    list, None for a class without examples), each example scored by the mean softmax over
    vote's views of it (training.voting; "none": the example alone); with test_weights
    (examples per class of a test split), also "weighted": the overall accuracy at the test's
    class balance, and its standard error. make_dataset maps examples [M, ...] to the
    model's unshuffled batches, in order (per replica under a strategy, with steps: the
    rows after the M examples' are fillers)."""
    def predict(view):
        return model.predict(make_dataset(view), verbose=0, **({"steps": steps} if steps else {}))[:len(labels)]

    probabilities = (voted_probabilities(predict, examples, vote) if vote != "none"
                     else tf.nn.softmax(predict(examples)).numpy())
    scores = class_accuracies(labels, np.argmax(probabilities, axis=-1), num_classes, test_weights)
    scores["per_class"] = [None if np.isnan(a) else float(a) for a in scores["per_class"]]
    return scores


def test_class_weights(classes):
    """The official ModelNet40 test split's examples per class for classes, or None where a
    class is not one of ModelNet40's."""
    if not all(c in datasets.MODELNET40_TEST_COUNTS for c in classes):
        return None
    return datasets.modelnet40_test_counts(classes)


def validation_split(args, labels, classes):
    """(train_idx, val_idx) of the loaded examples, as --val-split chooses them."""
    if args.val_split == "none":
        return np.arange(len(labels), dtype=np.int64), np.zeros([0], np.int64)
    if args.val_split == "stratified":
        return datasets.stratified_split(labels, args.val_fraction, args.split_seed)
    per_class = (datasets.modelnet40_test_counts(classes, args.val_per_class) if args.val_split == "modelnet40-test"
                 else args.val_per_class)
    return datasets.balanced_split(labels, per_class, args.val_max_fraction, args.split_seed)


def build_parser():
    p = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="octnet3",
                   help="octnet3: channel-sparse OctNet3 (Table 4); site-resnet: site-sparse ResNet classifier")
    p.add_argument("--dataset", choices=DATASETS, default="synthetic",
                   help="synthetic: the built-in shapes of 8 classes, no download (default)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                   help="the folder (or .npz file) of the dataset: modelnet40_train.npz or <class>/train/*.off for "
                        "modelnet40/10, mnist_train.npz or the idx files for mnist, scene* folders for scannet "
                        "(default: $TF_SPARSECONV_DATA or ../shared/data beside the repository)")
    p.add_argument("--resolution", type=int, default=None,
                   help=f"voxels per axis (default {DEFAULT_RESOLUTION}; MNIST: fixed {MNIST_RESOLUTION}); "
                        f"octnet3 without --rho: one of {', '.join(map(str, TABLE4_RESOLUTIONS))} (Table 4's bounds)")
    p.add_argument("--rho", type=float, nargs="+",
                   help="density bound per sparse block, each in (0, 1]: every layer of the block keeps at most "
                        "rho of its grid per channel (k-selection); 1.0 means no bound (default: Table 4's for the "
                        f"resolution, e.g. {' '.join(map(str, DEFAULT_RHOS[32]))} at 32)")
    p.add_argument("--selection", choices=("signed", "abs"), default="signed")
    p.add_argument("--exact-convs", action="store_true",
                   help="octnet3: the sparse convolutions write exact outputs (each waits for the GPU to learn its "
                        "size) instead of padded ones in the traced steps (the default: DirectSparseConv's "
                        "padded_output='auto')")
    p.add_argument("--exact-pools", action="store_true",
                   help="octnet3: the sparse poolings write exact outputs (each waits for the GPU) instead of padded "
                        "ones in the traced steps (the default: SparseMaxPool's padded_output='auto')")
    p.add_argument("--lam", type=float, default=0.0, help="adaptive density regularisation scale (Eq. 4)")
    p.add_argument("--lam-reduction", choices=("sum", "mean", "filter"), default=None,
                   help="Eq. 4 penalty per layer: lambda * sum of (w + b)^2 over present weights, or lambda * their "
                        "mean (default: sum; needs --lam > 0)")
    p.add_argument("--lam-terms", choices=LAM_TERMS, default=None,
                   help="what Eq. 4 pulls towards -b: the filter weights and the layers' biases (the paper, §3.5: "
                        "'lowering the values of filter weights and biases'; the default), or the weights only "
                        "(needs --lam > 0)")
    p.add_argument("--lam-density", choices=DENSITIES, default=None,
                   help="the density Eq. 4 compares with rho_up: the layer's over all its channels (default), or "
                        "each output channel's own, one b per filter (needs --lam > 0)")
    p.add_argument("--prune-eps", type=float, default=0.0, help="warning-shot pruning threshold (0: off)")
    p.add_argument("--finetune-epochs", type=int, default=0,
                   help="the last N epochs fine-tune: Eq. 4 off and pruning stopped, so the pruned structure is "
                        "fixed and the remaining weights train on the data loss alone (needs --lam or --prune-eps)")
    main, other = RECIPES["synthetic"], RECIPES["other"]
    p.add_argument("--epochs", type=int, default=None,
                   help=f"default: {main['epochs']} on the built-in shapes, {other['epochs']} on the other datasets")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"the global batch (default: {main['batch_size']} on the built-in shapes, {other['batch_size']} "
                        "on the other datasets); under --strategy mirrored / multi-worker each replica trains on "
                        "batch-size / replicas examples, and the memory bound is given for that")
    p.add_argument("--strategy", choices=STRATEGIES, default="default",
                   help="default: one device; mirrored: every GPU of this host (tf.distribute.MirroredStrategy); "
                        "multi-worker: every host of the cluster in the TF_CONFIG environment variable "
                        "(tf.distribute.MultiWorkerMirroredStrategy; run the same command on each host, the chief "
                        "writes --out)")
    p.add_argument("--collective", choices=COLLECTIVES, default=None,
                   help="how the replicas all-reduce their gradients. --strategy multi-worker: nccl (between GPUs, "
                        "the default where the host has GPUs) or ring (TensorFlow's ring over gRPC, the default "
                        "without GPUs); --strategy mirrored: nccl (the default on GPUs), hierarchical-copy "
                        "(copies between the GPUs) or one-device (sums on one device and copies back, the default "
                        "over logical CPUs)")
    p.add_argument("--gradient-all-reduce", choices=GRADIENT_ALL_REDUCES, default=None,
                   help="with --collective nccl, hierarchical-copy or ring: packed (TensorFlow's default: one "
                        "all-reduce of every gradient, after the whole backward pass) or per-gradient (each "
                        "gradient all-reduced as soon as the backward pass has made it, overlapping the rest; "
                        "slower for this library's models on two H200s, docs/training.md)")
    p.add_argument("--steps-per-execution", type=int, default=1, metavar="N",
                   help="training steps per call of the traced train function (Keras' steps_per_execution): the "
                        "host queues N steps without waiting for each one's end; the same training")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (> 0)")
    p.add_argument("--weight-decay", type=float, default=0.0,
                   help="decoupled weight decay of kernels (biases excluded; with adam: AdamW); 0: off")
    p.add_argument("--label-smoothing", type=float, default=0.0,
                   help="smooth the training targets toward uniform by this much (0: plain cross-entropy)")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default=None,
                   help="cosine: from --lr down to 0 over all --epochs (a backed-up run then keeps its --epochs); "
                        f"default: {main['lr_schedule']} on the built-in shapes, {other['lr_schedule']} on the other "
                        "datasets")
    p.add_argument("--val-split", choices=VAL_SPLITS, default="stratified",
                   help="how the validation examples are held out of the training data (listed in "
                        "<out>/split.json): stratified, --val-fraction of each class (the default); balanced, "
                        "--val-per-class of each class; modelnet40-test, in the class proportions of the official "
                        "ModelNet40 test split (--val-per-class for its classes of 100 test shapes, 86, 50 and 20 "
                        "scaled alike), so the validation accuracies estimate the test's; balanced and "
                        "modelnet40-test hold out at most --val-max-fraction of any class; none, no validation: a "
                        "final model trained on every example once the recipe and its epochs are chosen on a split")
    p.add_argument("--val-fraction", type=float, default=None,
                   help=f"--val-split stratified: fraction of each class held out, in (0, 1) (default "
                        f"{VAL_DEFAULTS['val_fraction']})")
    p.add_argument("--val-per-class", type=int, default=None,
                   help=f"--val-split balanced: examples held out per class; modelnet40-test: per class of 100 test "
                        f"shapes (default {VAL_DEFAULTS['val_per_class']}: 50, 43, 25 or 10 per ModelNet40 class)")
    p.add_argument("--val-max-fraction", type=float, default=None,
                   help=f"--val-split balanced or modelnet40-test: at most this fraction of a class is held out, in "
                        f"(0, 1) (default {VAL_DEFAULTS['val_max_fraction']}), so small classes keep their training "
                        "shapes")
    p.add_argument("--max-examples", type=int, default=0, help="use a stratified subset of this size (0: all)")
    p.add_argument("--synthetic-per-class", type=int, default=DEFAULT_SYNTHETIC_PER_CLASS,
                   help="shapes per class of the synthetic dataset")
    p.add_argument("--points", type=int, default=1024, help="points sampled per mesh / scan object")
    p.add_argument("--augment", nargs="?", const="rotate", choices=tuple(datasets.NAMED_AUGMENTATIONS), default=None,
                   help="point-cloud augmentation, each with random scale and jitter: rotate (about z; the "
                        "default when no mode is given), rotate12 (by multiples of 30 degrees), mirror (x negated at "
                        "random, for aligned shapes), scale, aniso (each axis scaled by its own factor in [0.8, 1]), "
                        "turn10 (about z by at most 10 degrees either way, for aligned shapes)")
    p.add_argument("--features", nargs="+", choices=tuple(datasets.FEATURE_CHANNELS), default=["occupancy"],
                   help="voxel features of point clouds, in channel order: occupancy, count, normals (3), offset "
                        "(3: the mean point position within the voxel)")
    p.add_argument("--estimate-normals", type=int, metavar="K", default=None,
                   help="with --features normals: estimate each point's normal from its K nearest neighbours "
                        f"({MIN_NEIGHBOURS}..{MAX_NEIGHBOURS}; principal components, turned away from the centroid) "
                        "instead of reading normals from the data; the saved model estimates them itself from "
                        "x, y, z")
    p.add_argument("--vote", type=vote_argument, default="none",
                   help=f"also score the validation examples by voting over views of each cloud: {VOTE_HELP}; the "
                        "mean softmax over the views decides (rotations-12 suits --augment rotate12, mirror "
                        "--augment mirror; default none)")
    p.add_argument("--vote-mirror", action="store_true", help="the same as --vote mirror")
    p.add_argument("--init", choices=("he_normal", "glorot_uniform"),
                   help="octnet3: initialisation of the ReLU layers' kernels (default he_normal; Keras' "
                        "glorot_uniform leaves the 64^3 net untrainable)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initialisation, the shuffling and the augmentation (and, without --split-seed, "
                        "of the data: the validation split, the --max-examples subset, the points sampled per mesh)")
    p.add_argument("--split-seed", type=int, metavar="N",
                   help="seed of the data alone (default: --seed): runs with other --seed and the same --split-seed "
                        "hold out the same validation examples, so tf-sparseconv evaluate --split val can score "
                        "them as an ensemble")
    p.add_argument("--site-channels", type=int, nargs="+", default=[16, 32, 64],
                   help="site-resnet: channels per level (a stride-2 convolution starts each level after the first)")
    p.add_argument("--site-blocks", type=int, default=1, help="site-resnet: residual blocks per level")
    p.add_argument("--site-k", type=int, default=0,
                   help="site-resnet: keep at most this many sites per example after the stem (0: all)")
    p.add_argument("--site-batch-norm", choices=("synchronized", "per-replica"), default=None,
                   help="site-resnet on several replicas: batch statistics over all replicas' sites (the default: a "
                        "step then trains as on one device; two all-reduces per layer, each a wait for every "
                        "replica) or over each replica's own sites (no wait; a replica's batch must be large enough "
                        "for them)")
    p.add_argument("--out", default=None,
                   help=f"folder for the results (default: a new {RUNS_DIR}/<dataset>-<model>-<YYYYmmdd-HHMMSS>); "
                        "an existing non-empty folder is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an existing non-empty --out, replacing the results of a run there")
    p.add_argument("--snapshot-epochs", type=int, nargs="+", default=[],
                   help="also save the model after these epochs (from 1) as <out>/model_epoch<N>.keras (the sparse "
                        "core: it takes voxelized batches, not point clouds)")
    p.add_argument("--backup-dir", help="keep model, optimizer state and the epoch log here after every epoch; "
                   "rerunning with the same arguments (--epochs may grow) continues from the last finished epoch "
                   "(give a new --out, or --overwrite)")
    return p


def vote_argument(text):
    try:
        return parse_vote(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def default_out(dataset, model):
    """A folder under runs/ that does not exist yet, named after the run and the time."""
    base = os.path.join(RUNS_DIR, f"{dataset}-{model}-{time.strftime('%Y%m%d-%H%M%S')}")
    out, n = base, 1
    while os.path.exists(out):
        n += 1
        out = f"{base}-{n}"
    return out


def _check_out(parser, args):
    """--out: never a file; an existing non-empty folder only with --overwrite. A worker
    of a multi-worker cluster other than the chief writes nothing there."""
    if not _writes_results(args):
        args.out = args.out or default_out(args.dataset, args.model)
        return
    if args.out is None:
        args.out = default_out(args.dataset, args.model)
        return
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out {args.out} is a file; give a folder for the results")
    problem = folder_problem(args.out)
    if problem:
        parser.error(f"--out {args.out} cannot be written: {problem}")
    if os.path.isdir(args.out) and os.listdir(args.out) and not args.overwrite:
        parser.error(f"--out {args.out} exists and is not empty; give a new folder (or leave --out out for a new "
                     f"one under {RUNS_DIR}/), or add --overwrite to replace the results there")


def _writes_results(args):
    """False for the tasks of a multi-worker cluster (TF_CONFIG) other than the chief; a
    malformed TF_CONFIG is reported by _check_strategy."""
    if args.strategy != "multi-worker":
        return True
    try:
        return cluster_from_tf_config()[2]
    except ValueError:
        return True


def _check_strategy(parser, args):
    """--strategy: TF_CONFIG for multi-worker, devices the op library has kernels for, and
    a global --batch-size the replicas divide. A worker other than the chief keeps its
    backup in <--backup-dir>/worker<task>, beside the chief's."""
    try:
        replicas = expected_replicas(args.strategy)
        args.collective = collective_of(args.strategy, args.collective)  # resolved once (None: default strategy)
        args.gradient_all_reduce = check_gradient_all_reduce(args.strategy, args.collective, args.gradient_all_reduce)
    except ValueError as e:
        parser.error(one_line(e))
    if args.batch_size % replicas:
        below = args.batch_size // replicas * replicas
        parser.error(f"--batch-size {args.batch_size} is the global batch and must be divisible by the {replicas} "
                     f"replicas of --strategy {args.strategy} (each trains on batch-size / {replicas} examples); use "
                     f"{below or replicas} or {below + replicas}")
    if args.strategy == "multi-worker" and args.backup_dir:
        _, task, chief = cluster_from_tf_config()
        if not chief:
            args.backup_dir = os.path.join(args.backup_dir, f"worker{task}")
    return replicas


def _check_values(parser, args):
    """Numbers that no run can use."""
    for flag, value, least in (("--epochs", args.epochs, 1), ("--batch-size", args.batch_size, 1),
                               ("--max-examples", args.max_examples, 0), ("--points", args.points, 1),
                               ("--synthetic-per-class", args.synthetic_per_class, 1),
                               ("--finetune-epochs", args.finetune_epochs, 0), ("--site-blocks", args.site_blocks, 1),
                               ("--site-k", args.site_k, 0), ("--steps-per-execution", args.steps_per_execution, 1)):
        if value < least:
            parser.error(f"{flag} must be >= {least}, got {value}")
    # Where one cloud exceeds the memory free now, an overcommitting host would kill the run
    # once it touched the pages.
    try:
        check_cloud_fits(args.points)
    except MemoryError as e:
        parser.error(f"--points {args.points}: {e}")
    if not 0 <= args.seed < 2 ** 32:  # keras.utils.set_random_seed takes 0..2^32 - 1
        parser.error(f"--seed must be a whole number from 0 to {2 ** 32 - 1}, got {args.seed}")
    if args.split_seed < 0:
        parser.error(f"--split-seed must be >= 0, got {args.split_seed}")
    if not 0 < args.lr < np.inf:
        parser.error(f"--lr must be > 0 (a finite number), got {args.lr}")
    for flag, value in (("--lam", args.lam), ("--prune-eps", args.prune_eps), ("--weight-decay", args.weight_decay)):
        if not 0 <= value < np.inf:  # NaN, which compares false, would silently turn the option off
            parser.error(f"{flag} must be >= 0 (a finite number), got {value}")
    if any(c < 1 for c in args.site_channels):
        parser.error(f"--site-channels must be >= 1, got {args.site_channels}")


def _check_resolution(parser, args):
    """Resolves --resolution (MNIST: 28) and refuses one the model cannot be built at."""
    if args.dataset == "mnist":
        if args.resolution not in (None, MNIST_RESOLUTION):
            parser.error(f"--resolution {args.resolution} does not apply to MNIST: its images are "
                         f"{MNIST_RESOLUTION}x{MNIST_RESOLUTION}")
        args.resolution = MNIST_RESOLUTION
    elif args.resolution is None:
        args.resolution = DEFAULT_RESOLUTION
    r = args.resolution
    if r < 1:
        parser.error(f"--resolution must be >= 1 voxel per axis, got {r}")
    if args.rho is not None:
        bad = [rho for rho in args.rho if not 0 < rho <= 1]
        if bad:
            parser.error(f"--rho values must be in (0, 1] (1.0: no bound), got {bad}")
        if len(args.rho) > len(BLOCK_CHANNELS):
            parser.error(f"--rho gives {len(args.rho)} sparse blocks; OctNet3 has at most {len(BLOCK_CHANNELS)}")
    in_channels = 1 if args.dataset == "mnist" else datasets.num_channels(args.features)
    if args.model == "site-resnet":
        levels = len(args.site_channels)
        if r < 2 ** (levels - 1):
            parser.error(f"--resolution {r} is too small for {levels} site-resnet levels (--site-channels): "
                         f"need >= {2 ** (levels - 1)}")
        _check_key_space(parser, args, in_channels)
        return
    if args.rho is None:
        if args.dataset != "mnist" and r not in TABLE4_RESOLUTIONS:
            parser.error(f"--resolution {r} has no Table 4 bounds: use one of "
                         f"{', '.join(map(str, TABLE4_RESOLUTIONS))}, or give --rho (one value per sparse block)")
        blocks = len(DEFAULT_RHOS[r])
    else:
        blocks = len(args.rho)
    step = 2 ** (blocks - 1)
    if r % step:
        parser.error(f"--resolution {r} is not divisible by {step}, which {blocks} sparse blocks (one --rho each) "
                     "pool it by")
    if blocks >= 3 and r // step < 4:
        parser.error(f"--resolution {r} is too small for {blocks} sparse blocks: the last block's grid is "
                     f"{r // step}, OctNet3 needs >= 4 (use >= {4 * step} or fewer --rho values)")
    _check_key_space(parser, args, max(BLOCK_CHANNELS[blocks - 1], in_channels))
    dense = _default_dense_blocks(r, blocks)
    if blocks + dense > len(BLOCK_CHANNELS):
        parser.error(f"--resolution {r} is too large for {blocks} sparse blocks: pooling their last grid, "
                     f"{r // step}, down to 4 takes {dense} dense blocks, and OctNet3 has {len(BLOCK_CHANNELS)} "
                     "blocks in all (use a lower --resolution or more --rho values)")


def _check_key_space(parser, args, channels):
    """Refuses a resolution whose batches the sparse tensors cannot index: a key per
    (example, voxel, channel) below 2^63, and per axis at most MAX_EXTENT voxels."""
    dims = 2 if args.dataset == "mnist" else 3
    r = args.resolution
    if r > MAX_EXTENT or args.batch_size * r ** dims * channels >= MAX_KEYS:
        parser.error(f"--resolution {r} is too large: a batch of {args.batch_size} grids of {r}^{dims} voxels with "
                     f"{channels} channel{'s' * (channels > 1)} has more entries than the sparse tensors' 2^63 keys "
                     "can index")


def _check_model_options(parser, args):
    if args.model == "site-resnet":
        octnet_only = [flag for flag, given in (("--rho", args.rho), ("--lam", args.lam > 0),
                                                ("--prune-eps", args.prune_eps > 0), ("--init", args.init)) if given]
        if octnet_only:
            parser.error(f"{', '.join(octnet_only)} apply to the channel-sparse octnet3 model, not site-resnet")
    elif args.site_batch_norm is not None:
        parser.error("--site-batch-norm applies to --model site-resnet (octnet3 has no batch norm)")
    if not 0 <= args.label_smoothing < 1:
        parser.error(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    if args.vote_mirror:
        if args.vote not in ("none", "mirror"):
            parser.error(f"--vote-mirror is --vote mirror; it cannot be combined with --vote {args.vote}")
        args.vote = "mirror"
    if args.vote != "none" and args.dataset == "mnist":
        parser.error(f"--vote {args.vote} applies to point clouds, not to MNIST digits (mirroring or rotating "
                     "changes a digit)")
    if args.dataset == "mnist" and args.features != ["occupancy"]:
        parser.error("--features applies to point clouds; MNIST digits have one thresholded channel")
    if args.dataset == "mnist" and args.augment:
        parser.error("--augment applies to point clouds, not to MNIST digits")
    if args.estimate_normals is not None:
        if "normals" not in args.features:
            parser.error(f"--estimate-normals {args.estimate_normals} estimates the normals feature; add normals to "
                         "--features")
        try:
            check_neighbours(args.estimate_normals, "--estimate-normals")
        except ValueError as e:
            parser.error(str(e))
    if args.model == "octnet3" and args.lam > 0 and all(rho >= 1 for rho in args.rho or DEFAULT_RHOS[args.resolution]):
        parser.error(f"--lam pulls layers towards their density bound, and at {args.resolution} every block is "
                     "unbounded (rho 1.0); give --rho values below 1")
    if len(set(args.features)) != len(args.features):
        parser.error(f"--features names a feature twice: {args.features}")
    if any(e < 1 or e > args.epochs for e in args.snapshot_epochs):
        parser.error(f"--snapshot-epochs must lie in 1..{args.epochs} (--epochs): {args.snapshot_epochs}")
    if args.lam <= 0 and (args.lam_reduction or args.lam_terms or args.lam_density):
        parser.error("--lam-reduction, --lam-terms and --lam-density shape the Eq. 4 penalty; they need --lam > 0")
    for key, value in RESOLVED_DEFAULTS.items():
        setattr(args, key, getattr(args, key) or value)
    if args.finetune_epochs:
        if not (args.lam > 0 or args.prune_eps > 0):
            parser.error("--finetune-epochs ends regularisation and pruning; it needs --lam > 0 or --prune-eps > 0")
        if not 0 < args.finetune_epochs < args.epochs:
            parser.error(f"--finetune-epochs must lie in 1..{args.epochs - 1} (fewer than --epochs), "
                         f"got {args.finetune_epochs}")
    if args.backup_dir and args.prune_eps > 0:
        # The callback's flags from the previous epoch end live in the process, not in the checkpoint.
        parser.error("--backup-dir cannot resume warning-shot pruning (--prune-eps); run it in one process")


def _check_validation(parser, args):
    """--val-split and the options of its kind; the others' defaults filled in."""
    given = {key: getattr(args, key) for key in VAL_DEFAULTS if getattr(args, key) is not None}
    used = {"stratified": ("val_fraction",), "none": ()}.get(args.val_split, ("val_per_class", "val_max_fraction"))
    stray = sorted(set(given) - set(used))
    if stray:
        uses = (f"which uses {' and '.join('--' + key.replace('_', '-') for key in used)}" if used else
                "which holds out no examples")
        parser.error(f"{', '.join('--' + key.replace('_', '-') for key in stray)} does not apply to --val-split "
                     f"{args.val_split}, {uses}")
    if args.val_split == "none" and args.vote != "none":
        parser.error(f"--vote {args.vote} scores the validation examples and --val-split none holds out none; "
                     "vote on a test split with tf-sparseconv evaluate --vote")
    for key in used:
        setattr(args, key, given.get(key, VAL_DEFAULTS[key]))
    if args.val_split == "stratified" and not 0 < args.val_fraction < 1:
        parser.error(f"--val-fraction must be in (0, 1) (the fraction of each class held out), got {args.val_fraction}")
    if args.val_split in ("balanced", "modelnet40-test"):
        if args.val_per_class < 1:
            parser.error(f"--val-per-class must be >= 1, got {args.val_per_class}")
        if not 0 < args.val_max_fraction < 1:
            parser.error(f"--val-max-fraction must be in (0, 1) (the most of a class held out), got "
                         f"{args.val_max_fraction}")
    if args.val_split == "modelnet40-test" and args.dataset not in ("modelnet40", "modelnet10"):
        parser.error(f"--val-split modelnet40-test follows the official ModelNet40 test split's classes; use it "
                     f"with --dataset modelnet40 or modelnet10, not {args.dataset} (balanced: the same count per "
                     "class)")


def parse_args(parser, argv=None):
    """The checked arguments, with the defaults that depend on other options filled in.
    --out is checked first; then every value, the model's options, the data path (listings
    and .npz headers only) and a --backup-dir's recorded run. Nothing is written."""
    args = parser.parse_args(argv)
    if args.split_seed is None:
        args.split_seed = args.seed
    _check_out(parser, args)
    for key, value in RECIPES["synthetic" if args.dataset == "synthetic" else "other"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _check_values(parser, args)
    _check_validation(parser, args)
    _check_resolution(parser, args)
    _check_model_options(parser, args)
    _check_strategy(parser, args)
    try:
        check_data(args.dataset, args.data_dir, tuple(args.features), args.estimate_normals is not None)
    except (OSError, ValueError) as e:
        parser.error(one_line(e))
    if args.backup_dir:
        prepare_backup_dir(parser, args, write=False)
    return args


def prepare_out(out, overwrite):
    """Creates --out; with overwrite, first removes the outputs of a run there (OUTPUTS and
    the epoch snapshots), leaving anything else in the folder alone."""
    if overwrite and os.path.isdir(out):
        for name in OUTPUTS + tuple(os.path.basename(p) for p in glob.glob(snapshot_path(glob.escape(out), "*"))):
            path = os.path.join(out, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
    os.makedirs(out, exist_ok=True)


def split_record(args, data_path, labels, keep, train_idx, val_idx, classes):
    """split.json: which examples of the loaded data set trained and which were held out,
    with what identifies the data (its path, example count and a sha256 of its labels), so
    `tf-sparseconv evaluate --split val` re-scores exactly the validation examples."""
    record = {"dataset": args.dataset, "data_path": os.path.abspath(data_path) if data_path else None,
              "seed": args.seed, "split_seed": args.split_seed, "val_split": args.val_split,
              "val_fraction": args.val_fraction,
              "val_per_class": args.val_per_class, "val_max_fraction": args.val_max_fraction,
              "max_examples": args.max_examples,
              "num_examples": int(len(labels)), "labels_sha256": labels_sha256(labels), "classes": list(classes),
              "val_indices": keep[val_idx].tolist(), "train_indices": keep[train_idx].tolist()}
    if args.dataset == "synthetic":
        record["synthetic_per_class"] = args.synthetic_per_class
    if args.dataset in ("modelnet40", "modelnet10", "scannet") and not (data_path or "").endswith(".npz"):
        record["points"] = args.points
    if "normals" in args.features and args.dataset != "mnist" and args.estimate_normals is None:
        record["normals"] = True  # read from the data (estimated ones, the saved model makes itself)
    return record


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1, default=str)


def estimated_normals(clouds, neighbours):
    """[M, N, 3] -> [M, N, 6]: the clouds with the normals the saved model would estimate
    from them (models.point_normals), with a progress line."""
    started = time.perf_counter()

    def progress(done, total):
        print(f"\r      estimating normals ({neighbours} neighbours per point): {done}/{total} clouds", end="",
              flush=True)
    out = with_estimated_normals(clouds, neighbours, progress=progress)
    print(f" in {time.perf_counter() - started:.0f} s", flush=True)
    return out


def serving_model(core, args, classes, points_per_cloud):
    """The model to save: raw points (images for MNIST) -> logits, with the preprocessing
    and the class names inside; compiled for evaluate (cross-entropy and accuracy), without
    the training optimizer's state (the epoch snapshots and --backup-dir keep that)."""
    if args.dataset == "mnist":
        return image_classifier(core, threshold=THRESHOLD, class_names=classes)
    return point_cloud_classifier(core, args.resolution, features=tuple(args.features), normalize="unit_sphere",
                                  class_names=classes, points_per_cloud=points_per_cloud,
                                  estimate_normals=args.estimate_normals)


def bound_sites_per_sample(args):
    """The sites per sample the run's memory bound assumes (memory_bound's points_per_sample):
    a site model holds a row per active site, and a point cloud of --points points makes at
    most that many (one per occupied voxel); an image at most its pixels (None: the whole
    grid), and OctNet3's density bounds cap it on any input (None)."""
    return args.points if args.model == "site-resnet" and args.dataset != "mnist" else None


def build_model(args, num_classes, in_channels, steps, synchronized_bn=False):
    """(model, rhos, optimizer, loss) of the run: the site ResNet (its batch norm
    synchronized over the replicas with synchronized_bn) or OctNet3 with the density
    bounds rhos; steps: optimizer steps per epoch, for a cosine schedule."""
    spatial_dims = 2 if args.dataset == "mnist" else 3
    if args.model == "site-resnet":
        rhos = ()
        model = site_resnet(num_classes, args.resolution, spatial_dims=spatial_dims, in_channels=in_channels,
                            channels=tuple(args.site_channels), blocks=args.site_blocks, select_k=args.site_k or None,
                            synchronized_bn=synchronized_bn)
    else:
        rhos = tuple(args.rho) if args.rho else DEFAULT_RHOS[args.resolution]
        regularizer = DensityRegularizer(args.lam, reduction=args.lam_reduction, density=args.lam_density,
                                         include_bias=args.lam_terms == "weights+biases") if args.lam > 0 else None
        model = octnet3(args.resolution, num_classes, rhos, spatial_dims=spatial_dims, in_channels=in_channels,
                        selection=args.selection, density_regularizer=regularizer,
                        kernel_initializer=args.init or "he_normal",
                        padded_convs=False if args.exact_convs else "auto",
                        padded_pools=False if args.exact_pools else "auto")
    learning_rate = args.lr
    if args.lr_schedule == "cosine":
        learning_rate = keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=args.epochs * steps)
    optimizer = build_optimizer(args.optimizer, learning_rate, args.weight_decay)
    loss = (SmoothedSparseCrossentropy(args.label_smoothing) if args.label_smoothing > 0
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, rhos, optimizer, loss


def main(argv=None):
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = build_parser()
    args = parse_args(parser, argv)
    # First: MultiWorkerMirroredStrategy must configure TensorFlow before anything runs.
    if args.strategy == "multi-worker":
        print(f"[0/4] waiting for the {cluster_from_tf_config()[0]} workers of TF_CONFIG to connect (Ctrl-C stops)",
              flush=True)
    # its arguments were checked by parse_args
    strategy = make_strategy(args.strategy, args.collective, args.gradient_all_reduce)
    try:
        with cluster_failures_named(strategy):
            return run_training(parser, args, argv, strategy)
    except ClusterFailure as e:
        print(f"tf-sparseconv train: error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def run_training(parser, args, argv, strategy):
    """main() after the strategy is made: load, train, evaluate, save; the results (dict)."""
    replicas, expected = strategy.num_replicas_in_sync, expected_replicas(args.strategy)
    if replicas != expected:
        parser.error(f"--strategy {args.strategy} made {replicas} replicas, not the {expected} that this host's devices "
                     "and TF_CONFIG promise (every host of a cluster needs the same number of GPUs)")
    distributed = args.strategy != "default"
    chief = is_chief(strategy)
    site = args.model == "site-resnet"
    image_data = args.dataset == "mnist"
    resolution = args.resolution
    keras.utils.set_random_seed(args.seed)
    print(f"[1/4] loading {args.dataset}", flush=True)
    data_path = data_source(args.dataset, args.data_dir)[1]
    try:
        examples, labels, classes = load_examples(
            args.dataset, args.data_dir, {"points": args.points, "synthetic_per_class": args.synthetic_per_class},
            args.split_seed, normals="normals" in args.features and args.estimate_normals is None)
    except (OSError, ValueError) as e:
        parser.error(one_line(e))
    all_labels, keep = labels, np.arange(len(labels))
    if args.max_examples and args.max_examples < len(labels):
        keep, _ = datasets.stratified_split(labels, 1 - args.max_examples / len(labels), args.split_seed)
        if not len(keep):
            parser.error(f"--max-examples {args.max_examples} keeps no example: the subset keeps its share of each "
                         f"of the {len(classes)} classes of {len(labels)} examples, which rounds to none; give more")
        examples, labels = examples[keep], labels[keep]
    present = np.unique(labels)
    if len(present) < 2:
        where = data_path or args.dataset
        held = (f"examples of one class only ({classes[present[0]]})" if len(present) else "no examples")
        parser.error(f"{where}: {held}{' after --max-examples' if len(keep) < len(all_labels) else ''}; a "
                     "classifier trains on examples of two classes or more")
    if args.estimate_normals is not None:
        examples = estimated_normals(examples, args.estimate_normals)
    train_idx, val_idx = validation_split(args, labels, classes)
    validating = args.val_split != "none"
    if not len(train_idx) or (validating and not len(val_idx)):
        held = (f"--val-fraction {args.val_fraction}" if args.val_split == "stratified" else
                f"--val-split {args.val_split} (--val-per-class {args.val_per_class}, --val-max-fraction "
                f"{args.val_max_fraction})")
        parser.error(f"{held} of {len(labels)} examples in {len(classes)} classes leaves {len(train_idx)} for "
                     f"training and {len(val_idx)} for validation; both need some (use more examples or hold out "
                     "more)")
    to_keras = site_keras_batches if site else keras_batches
    augmentation = datasets.Augmentation.named(args.augment) if args.augment and not image_data else None

    def cloud_batches(clouds, cloud_labels, shuffle, split=None, drop_remainder=False):
        """Keras batches of clouds (images); with split, one input pipeline's replica batches."""
        if image_data:
            return to_keras(datasets.image_dataset(clouds, cloud_labels, args.batch_size, shuffle=shuffle,
                                                   seed=args.seed, split=split, drop_remainder=drop_remainder))
        return to_keras(datasets.point_cloud_dataset(
            clouds, cloud_labels, resolution, args.batch_size, features=tuple(args.features), shuffle=shuffle,
            seed=args.seed, augmentation=augmentation if shuffle else None, split=split, drop_remainder=drop_remainder))

    fit_steps, val_steps = {}, None
    if distributed:
        # Each replica builds its own sparse batch; the last incomplete global batch of an
        # epoch is left out of training (the replicas' parts would differ in size), kept for
        # validation (a replica without an example of it gets a filler of weight 0).
        train_steps, val_steps = (steps_per_epoch(len(train_idx), args.batch_size, True),
                                  steps_per_epoch(len(val_idx), args.batch_size, False) if validating else None)
        if not train_steps:
            parser.error(f"--batch-size {args.batch_size} is more than the {len(train_idx)} training examples; with "
                         f"--strategy {args.strategy} an epoch trains on whole global batches only")
        train = per_replica_dataset(strategy, lambda split: cloud_batches(examples[train_idx], labels[train_idx], True,
                                                                          split, drop_remainder=True))
        val = per_replica_dataset(strategy, lambda split: cloud_batches(examples[val_idx], labels[val_idx], False,
                                                                        split)) if validating else None
        fit_steps = dict(steps_per_epoch=train_steps, **(dict(validation_steps=val_steps) if validating else {}))
        trained_per_epoch = train_steps * args.batch_size
    else:
        train = cloud_batches(examples[train_idx], labels[train_idx], True)
        val = cloud_batches(examples[val_idx], labels[val_idx], False) if validating else None
        trained_per_epoch = len(train_idx)
    held_out = f"{len(val_idx)} validation examples" if validating else "none held out (--val-split none)"
    print(f"      {len(train_idx)} training examples, {held_out}, {len(classes)} classes, resolution {resolution}",
          flush=True)

    in_channels = 1 if image_data else datasets.num_channels(args.features)
    # ModelNet's validation accuracy also at the official test's class balance (training.metrics)
    test_weights = test_class_weights(classes) if args.dataset in ("modelnet40", "modelnet10") else None
    synchronized_bn = replicas > 1 and args.site_batch_norm in (None, "synchronized")
    with strategy.scope():
        steps = fit_steps.get("steps_per_epoch", -(-len(train_idx) // args.batch_size))
        try:
            model, rhos, optimizer, loss = build_model(args, len(classes), in_channels, steps,
                                                       synchronized_bn=synchronized_bn)
        except (MemoryError, tf.errors.ResourceExhaustedError):
            fewer = ("more --rho values (each halves the grid its classifier reads)" if not site else
                     "fewer --site-channels")
            parser.error(f"--resolution {resolution}: the {args.model} model does not fit in this machine's memory; "
                         f"use a lower --resolution or {fewer}")
        metrics = ["accuracy", MeanClassAccuracy(len(classes))]
        if test_weights is not None:
            metrics.append(MeanClassAccuracy(len(classes), test_weights, name="test_weighted_accuracy"))
        model.compile(optimizer, loss, metrics=metrics, steps_per_execution=args.steps_per_execution)
        # One replica, one step per call: fit queues the next step without waiting for this one's.
        overlap_steps(model)
    replica_batch = args.batch_size // replicas
    sites_per_sample = bound_sites_per_sample(args)
    bound = memory_bound(model, replica_batch, points_per_sample=sites_per_sample)
    # What the density bounds buy: the same net without them may hold every cell of its grid.
    unbounded = None if site or all(rho >= 1 for rho in rhos) else memory_bound(
        octnet3(resolution, len(classes), (1.0,) * len(rhos), spatial_dims=2 if image_data else 3,
                in_channels=in_channels), replica_batch)

    if args.backup_dir and args.strategy == "multi-worker":
        # Each worker resumes from its own backup; they must hold the same epoch.
        backed_up = replica_values(strategy, backed_up_epochs(args.backup_dir))
        if len(set(backed_up)) > 1:
            parser.error(f"the workers' backups (--backup-dir, <dir>/worker<task> beside the chief's) end after "
                         f"different epochs ({backed_up}, by replica); restore them from one epoch or start anew")
    if args.backup_dir:
        prepare_backup_dir(parser, args)
    if chief:
        try:
            prepare_out(args.out, args.overwrite)
        except OSError as e:  # what the checks before loading could not see (a read-only file system, say)
            parser.error(f"--out {args.out} cannot be written: {e.strerror or one_line(e)}")
        write_json(os.path.join(args.out, "split.json"),
                   split_record(args, data_path, all_labels, keep, train_idx, val_idx, classes))
    callbacks = [EpochTimer()]
    pruning = WarningShotPruning(args.prune_eps) if args.prune_eps > 0 else None
    if pruning:
        callbacks.append(pruning)
    if args.finetune_epochs:  # before the snapshots and the epoch log, as pruning
        callbacks.append(FineTunePhase(args.epochs - args.finetune_epochs, pruning))
    if args.snapshot_epochs and chief:  # after pruning, so a snapshot holds that epoch's masks
        callbacks.append(EpochSnapshots(args.out, args.snapshot_epochs))
    if not site:
        callbacks.append(PresentWeights())  # after pruning: this epoch's count
    terminal = sys.stdout.isatty()
    if not terminal:
        callbacks.append(EpochProgress(args.epochs))
    if chief:
        callbacks.append(TensorBoardScalars(os.path.join(args.out, "tensorboard")))
    epoch_log = EpochLog(args.backup_dir) if args.backup_dir else None
    if epoch_log:
        callbacks += [epoch_log, keras.callbacks.BackupAndRestore(args.backup_dir, delete_checkpoint=False)]
        done = len(epoch_log.history().get("loss", []))
        if done:
            print(f"      resuming from {args.backup_dir}: {done} epoch(s) done", flush=True)
    described = (f"channels {tuple(args.site_channels)}, {args.site_blocks} residual block(s) per level"
                 + (f", at most {args.site_k} sites per example" if args.site_k else "")) if site \
        else f"sparse blocks rho = {rhos}"
    on = f" on {replicas} replicas ({replica_batch} examples each)" if distributed else ""
    print(f"[2/4] training {model.name} ({described}) for {args.epochs} epochs, batch {args.batch_size}{on}; "
          f"writing to {args.out if chief else 'nothing (the chief writes the results)'}", flush=True)
    history = model.fit(train, validation_data=val, epochs=args.epochs, callbacks=callbacks, shuffle=False,
                        verbose=1 if terminal else 0, **fit_steps).history
    if epoch_log:
        history = epoch_log.history()  # every epoch of the run, not only this process's
    seconds = history["sec_per_epoch"]

    print("[3/4] evaluating" if validating else "[3/4] no validation examples to score (--val-split none)",
          flush=True)
    val_metrics = model.evaluate(val, steps=val_steps, verbose=0, return_dict=True) if validating else {}
    if distributed:
        make_views = lambda clouds: per_replica_dataset(  # noqa: E731
            strategy, lambda split: cloud_batches(clouds, labels[val_idx], False, split))
    else:
        make_views = lambda clouds: cloud_batches(clouds, labels[val_idx], False)  # noqa: E731
    score = lambda vote: validation_scores(model, make_views, examples[val_idx], labels[val_idx],  # noqa: E731
                                           len(classes), vote, steps=val_steps, test_weights=test_weights)
    no_scores = {"overall": None, "mean_class": None, "per_class": [None] * len(classes)}
    scores = score("none") if validating else no_scores
    voted = None if args.vote == "none" else score(args.vote)
    layers = [{"layer": layer.name, "rho_up": layer.rho_up, "density": float(history[f"{layer.name}_density"][-1]),
               "present_weights": layer.present_weights(), "weights": int(np.prod(layer.kernel_shape))}
              for layer in sparse_conv_layers(model)]
    results = {
        "model": args.model, "dataset": args.dataset, "examples": int(len(labels)),
        "num_classes": len(classes), "classes": list(classes),
        "resolution": resolution, "epochs": len(history.get("loss", [])),
        "batch_size": args.batch_size, "strategy": args.strategy, "replicas": replicas,
        "collective": args.collective, "gradient_all_reduce": args.gradient_all_reduce,
        "steps_per_execution": args.steps_per_execution,
        "batch_size_per_replica": replica_batch,
        "shapes_per_s": trained_per_epoch / float(np.mean(seconds[1:] or seconds)),
        "rhos": list(rhos), "lambda": args.lam, "lam_terms": args.lam_terms, "lam_density": args.lam_density,
        "prune_eps": args.prune_eps,
        "finetune_epochs": args.finetune_epochs,
        "selection": args.selection,
        "val_accuracy": float(val_metrics["accuracy"]) if validating else None,
        "val_loss": float(val_metrics["loss"]) if validating else None,
        "val_split": args.val_split, "val_fraction": args.val_fraction, "val_per_class": args.val_per_class,
        "val_max_fraction": args.val_max_fraction, "val_examples": int(len(val_idx)),
        "val_class_examples": np.bincount(labels[val_idx], minlength=len(classes)).tolist() if validating else None,
        "val_overall": scores["overall"], "val_mean_class": scores["mean_class"],
        "val_overall_test_weighted": scores.get("weighted"), "val_overall_test_weighted_se": scores.get("weighted_se"),
        "val_class_accuracy": dict(zip(classes, scores["per_class"])),
        "vote": args.vote, "val_overall_vote": voted and voted["overall"],
        "val_mean_class_vote": voted and voted["mean_class"],
        "val_overall_test_weighted_vote": voted and voted.get("weighted"),
        "val_overall_test_weighted_se_vote": voted and voted.get("weighted_se"),
        "val_class_accuracy_vote": voted and dict(zip(classes, voted["per_class"])),
        "val_accuracy_mirror_vote": voted["overall"] if args.vote == "mirror" else None,
        "history": {k: [float(v) for v in vs] for k, vs in history.items()},
        "sec_per_epoch": seconds, "layers": layers, "present_weights": present_weight_count(model),
        "memory_bound_bytes": bound.total_bytes if bound else None,
        "memory_bound_activation_bytes": bound.activation_bytes if bound else None,
        "memory_dense_bytes": bound.dense_bytes if bound else None,
        "memory_unbounded_bytes": unbounded.total_bytes if unbounded else None,
        "memory_bound_layers": [vars(b) for b in bound.layers] if bound else [],
        "memory_bound_sites_per_sample": sites_per_sample,
        "pruning": pruning.history if pruning else [],
        "peak_rss_bytes": max([peak_rss_bytes(), *history.get("peak_rss_bytes", [])]),
        "peak_gpu_bytes": peak_gpu_bytes(), "device": device_description(),
        "lr": args.lr, "lr_schedule": args.lr_schedule, "optimizer": args.optimizer, "augment": args.augment,
        "weight_decay": args.weight_decay, "label_smoothing": args.label_smoothing,
        "init": None if site else args.init or "he_normal", "features": None if image_data else list(args.features),
        "estimate_normals": args.estimate_normals,
        "out": os.path.abspath(args.out),
        "command": "tf-sparseconv train " + shlex.join(argv),
    }
    if site:
        results.update(site_channels=list(args.site_channels), site_blocks=args.site_blocks, site_k=args.site_k,
                       parameters=int(model.count_params()), synchronized_bn=synchronized_bn)
    if not chief:
        print(f"[4/4] done: this worker trained {replicas // cluster_from_tf_config()[0]} of the {replicas} replicas; "
              "the chief writes the results", flush=True)
        return results
    write_json(os.path.join(args.out, "results.json"), results)
    plot_training_curve(history, os.path.join(args.out, "training_curve.png"),
                        bounds={row["layer"]: row["rho_up"] for row in layers},
                        title=f"{args.model} on {args.dataset} at {resolution}" + ("²" if image_data else "³"))
    model_path = os.path.join(args.out, "model.keras")
    # The serving model keeps the trained weights only; the core's optimizer state (twice the
    # weights under Adam) stays in the snapshots and --backup-dir, where training resumes.
    model.optimizer, model.compiled = None, False
    save_model(serving_model(model, args, classes, None if image_data else int(examples.shape[1])), model_path)

    print("[4/4] summary")
    inputs = (f"images [B, {MNIST_RESOLUTION}, {MNIST_RESOLUTION}]" if image_data
              else f"point clouds [B, N, {6 if 'normals' in args.features and args.estimate_normals is None else 3}]")
    written = {"model.keras": f"the trained model: {inputs} -> logits over {len(classes)} classes",
               "results.json": "accuracy, per-epoch history, sparse layers, memory bound",
               "split.json": "the training and validation examples",
               "training_curve.png": "loss, accuracy, densities and present weights per epoch",
               "tensorboard/": "the same per epoch, for TensorBoard"}
    if args.snapshot_epochs:
        written[os.path.basename(snapshot_path(args.out, "<N>"))] = (
            f"the sparse core after epochs {', '.join(map(str, sorted(set(args.snapshot_epochs))))}, with its "
            "optimizer (takes voxelized batches)")
    scored_on = ("--split val" if validating else
                 "--data TEST   # TEST: labelled data kept out of training (this run held out none)")
    next_commands = [f"tf-sparseconv evaluate {model_path} {scored_on}",
                     f"tf-sparseconv predict {model_path} FILE"
                     + ("   # FILE: images as .png, .npy or .npz" if image_data
                        else "   # FILE: points as .off, .ply, .npy or .npz"),
                     f"tensorboard --logdir {os.path.join(args.out, 'tensorboard')}   # after pip install tensorboard"]
    print("\n".join(summary_lines(results, written, next_commands)), flush=True)
    return results


if __name__ == "__main__":
    main()
