"""Train a sparse OctNet3 classifier (or the site-sparse ResNet classifier).

    python -m tf_sparseconv.train --dataset synthetic --resolution 16 --epochs 8
    python -m tf_sparseconv.train --model site-resnet --dataset modelnet40 --resolution 32

Datasets: synthetic (built in, no download), modelnet40 / modelnet10 (the point-cloud .npz
or the official OFF layout under --data-dir), scannet (official scans under --data-dir),
mnist (.npz or idx files under --data-dir). Prints a progress bar per epoch and a summary:
validation accuracy, per-layer density, present weights, seconds per epoch and the
model's memory bound for the chosen batch size and resolution; writes it as JSON.

--model site-resnet trains models.site_resnet (submanifold residual blocks, strided
downsampling, global pooling) on the same batches converted to site-sparse tensors; the
density bounds, Eq. 4 regularisation, pruning and the memory bound of the channel-sparse
model do not apply to it (--site-k bounds its sites per example instead).
"""
import argparse
import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv import data as datasets
from tf_sparseconv.keras_layers import (DensityRegularizer, FineTunePhase, WarningShotPruning, as_keras_inputs,
                                        as_site_keras_inputs, present_weight_count, sparse_conv_layers)
from tf_sparseconv.keras_layers.density_regularizer import DENSITIES
from tf_sparseconv.losses import SmoothedSparseCrossentropy
from tf_sparseconv.memory_bound import memory_bound
from tf_sparseconv.models import DEFAULT_RHOS, octnet3, site_resnet
from tf_sparseconv.ops.site_conversions import from_channel_sparse

DATASETS = ("synthetic", "modelnet40", "modelnet10", "scannet", "mnist")
MODELS = ("octnet3", "site-resnet")
LAM_TERMS = ("weights+biases", "weights")
OPTIMIZERS = ("adam", "adagrad", "sgd")
SITE_MODEL_NOTE = ("memory bound: not computed for site-resnet; the bound covers the channel-sparse layers "
                   "(SparseConv, SparseMaxPool) only, and a site model's memory follows its active sites")
DEFAULT_DATA_DIR = os.environ.get(
    "TF_SPARSECONV_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data"))


def load_examples(dataset, data_dir, points_per_shape, seed):
    """(examples, labels, class names): point clouds [M, N, 3] or images [M, 28, 28]."""
    if dataset == "synthetic":
        return datasets.make_shapes(num_per_class=points_per_shape["synthetic_per_class"], seed=seed)
    if dataset in ("modelnet40", "modelnet10"):
        classes = datasets.MODELNET10_CLASSES if dataset == "modelnet10" else None
        npz = data_dir if data_dir.endswith(".npz") else os.path.join(data_dir, "modelnet40_train.npz")
        if os.path.isfile(npz):
            return datasets.load_modelnet_npz(npz, classes=classes)
        return datasets.load_modelnet_meshes(data_dir, "train", classes=classes,
                                             num_points=points_per_shape["points"], seed=seed)
    if dataset == "scannet":
        return datasets.load_scannet_objects(data_dir, num_points=points_per_shape["points"], seed=seed)
    if dataset == "mnist":
        npz = data_dir if data_dir.endswith(".npz") else os.path.join(data_dir, "mnist_train.npz")
        images, labels = datasets.load_mnist(npz if os.path.isfile(npz) else data_dir)
        return images, labels, tuple(str(i) for i in range(10))
    raise ValueError(f"--dataset must be one of {DATASETS}, got {dataset!r}")


def keras_batches(dataset):
    return dataset.map(lambda x, y: (as_keras_inputs(x), y))


def site_keras_batches(dataset):
    """The channel-sparse batches as site dicts: one site per occupied voxel (pixel)."""
    def convert(x, y):
        sites = from_channel_sparse(x)
        sites = sites.with_features(tf.ensure_shape(sites.features, [None, x.shape[-1]]))
        return as_site_keras_inputs(sites), y
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


# Arguments that may change when a backed-up run is resumed; any other change is refused,
# because the checkpoint would silently continue a different experiment (--vote-mirror only
# adds an evaluation at the end). A decaying learning rate spans the planned epochs, so
# under one --epochs may not change either.
RESUMABLE_CHANGES = ("epochs", "out", "backup_dir", "vote_mirror", "snapshot_epochs")
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
    if name == "adam":
        optimizer = keras.optimizers.Adam(learning_rate, **decay)
    elif name == "adagrad":
        optimizer = keras.optimizers.Adagrad(learning_rate, **decay)
    elif name == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate, momentum=0.9, nesterov=True, **decay)
    else:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    if decay:
        optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


def prepare_backup_dir(parser, args):
    os.makedirs(args.backup_dir, exist_ok=True)
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
    else:
        with open(path, "w") as f:
            json.dump(current, f, indent=1)


class EpochTimer(keras.callbacks.Callback):
    """Adds sec_per_epoch and peak_rss_bytes to every epoch's logs, so the history (and the
    epoch log of a resumed run) carries them."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["sec_per_epoch"] = time.perf_counter() - self._start
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
            self.model.save(snapshot_path(self.out, epoch + 1))


def snapshot_path(out, epoch):
    return os.path.join(out, f"model_epoch{epoch}.keras")


def mirror_vote_accuracy(model, make_dataset, clouds, labels):
    """Accuracy of the mean softmax over each cloud and its copy with x negated (normals
    too): test-time voting over the symmetry that --augment mirror trains for. make_dataset
    maps clouds [M, N, 3+] to the model's unshuffled batches, in order."""
    mirrored = np.array(clouds, np.float32, copy=True)
    mirrored[..., 0] *= -1
    if mirrored.shape[-1] >= 6:
        mirrored[..., 3] *= -1
    probabilities = 0.0
    for view in (clouds, mirrored):
        logits = model.predict(make_dataset(view), verbose=0)
        probabilities = probabilities + tf.nn.softmax(logits).numpy()
    return float(np.mean(np.argmax(probabilities, axis=-1) == np.asarray(labels)))


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="octnet3",
                   help="octnet3: channel-sparse OctNet3 (Table 4); site-resnet: site-sparse ResNet classifier")
    p.add_argument("--dataset", choices=DATASETS, default="synthetic")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    p.add_argument("--resolution", type=int, default=16, help="voxels per axis (MNIST: fixed 28)")
    p.add_argument("--rho", type=float, nargs="+", help="density bound per sparse block (default: Table 4)")
    p.add_argument("--selection", choices=("signed", "abs"), default="signed")
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
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0,
                   help="decoupled weight decay of kernels (biases excluded; with adam: AdamW); 0: off")
    p.add_argument("--label-smoothing", type=float, default=0.0,
                   help="smooth the training targets toward uniform by this much (0: plain cross-entropy)")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="cosine: from --lr down to 0 over all --epochs (a backed-up run then keeps its --epochs)")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--max-examples", type=int, default=0, help="use a stratified subset of this size (0: all)")
    p.add_argument("--synthetic-per-class", type=int, default=150)
    p.add_argument("--points", type=int, default=1024, help="points sampled per mesh / scan object")
    p.add_argument("--augment", nargs="?", const="rotate", choices=tuple(datasets.NAMED_AUGMENTATIONS), default=None,
                   help="point-cloud augmentation, each with random scale and jitter: rotate (about z; the "
                        "default when no mode is given), mirror (x negated at random, for aligned shapes), scale")
    p.add_argument("--features", nargs="+", choices=tuple(datasets.FEATURE_CHANNELS), default=["occupancy"],
                   help="voxel features of point clouds, in channel order: occupancy, count, normals (3), offset "
                        "(3: the mean point position within the voxel)")
    p.add_argument("--vote-mirror", action="store_true",
                   help="also report the validation accuracy of voting over each cloud and its x-mirrored copy")
    p.add_argument("--init", choices=("he_normal", "glorot_uniform"),
                   help="octnet3: initialisation of the ReLU layers' kernels (default he_normal; Keras' "
                        "glorot_uniform leaves the 64^3 net untrainable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--site-channels", type=int, nargs="+", default=[16, 32, 64],
                   help="site-resnet: channels per level (a stride-2 convolution starts each level after the first)")
    p.add_argument("--site-blocks", type=int, default=1, help="site-resnet: residual blocks per level")
    p.add_argument("--site-k", type=int, default=0,
                   help="site-resnet: keep at most this many sites per example after the stem (0: all)")
    p.add_argument("--out", default="train_results", help="folder for results.json and model.keras")
    p.add_argument("--snapshot-epochs", type=int, nargs="+", default=[],
                   help="also save the model after these epochs (from 1) as <out>/model_epoch<N>.keras")
    p.add_argument("--backup-dir", help="keep model, optimizer state and the epoch log here after every epoch; "
                   "rerunning with the same arguments (--epochs may grow) continues from the last finished epoch")
    return p


def _check_model_options(parser, args):
    if args.model == "site-resnet":
        octnet_only = [flag for flag, given in (("--rho", args.rho), ("--lam", args.lam > 0),
                                                ("--prune-eps", args.prune_eps > 0), ("--init", args.init)) if given]
        if octnet_only:
            parser.error(f"{', '.join(octnet_only)} apply to the channel-sparse octnet3 model, not site-resnet")
    if args.weight_decay < 0:
        parser.error(f"--weight-decay must be >= 0, got {args.weight_decay}")
    if not 0 <= args.label_smoothing < 1:
        parser.error(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    if args.vote_mirror and args.dataset == "mnist":
        parser.error("--vote-mirror applies to point clouds, not to MNIST digits (mirroring changes a digit)")
    if args.dataset == "mnist" and args.features != ["occupancy"]:
        parser.error("--features applies to point clouds; MNIST digits have one thresholded channel")
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


def parse_args(parser, argv=None):
    """The checked arguments, with the defaults that depend on other options filled in."""
    args = parser.parse_args(argv)
    _check_model_options(parser, args)
    return args


def main(argv=None):
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.backup_dir:
        prepare_backup_dir(parser, args)
    site = args.model == "site-resnet"
    keras.utils.set_random_seed(args.seed)
    print(f"[1/4] loading {args.dataset}", flush=True)
    examples, labels, classes = load_examples(
        args.dataset, args.data_dir, {"points": args.points, "synthetic_per_class": args.synthetic_per_class}, args.seed)
    if args.max_examples and args.max_examples < len(labels):
        keep, _ = datasets.stratified_split(labels, 1 - args.max_examples / len(labels), args.seed)
        examples, labels = examples[keep], labels[keep]
    train_idx, val_idx = datasets.stratified_split(labels, args.val_fraction, args.seed)
    image_data = args.dataset == "mnist"
    resolution = 28 if image_data else args.resolution
    if image_data:
        make = lambda idx, shuffle: datasets.image_dataset(examples[idx], labels[idx], args.batch_size,  # noqa: E731
                                                           shuffle=shuffle, seed=args.seed)
    else:
        augmentation = datasets.Augmentation.named(args.augment) if args.augment else None

        def cloud_batches(clouds, cloud_labels, shuffle):
            return datasets.point_cloud_dataset(
                clouds, cloud_labels, resolution, args.batch_size, features=tuple(args.features), shuffle=shuffle,
                seed=args.seed, augmentation=augmentation if shuffle else None)
        make = lambda idx, shuffle: cloud_batches(examples[idx], labels[idx], shuffle)  # noqa: E731
    to_keras = site_keras_batches if site else keras_batches
    train, val = to_keras(make(train_idx, True)), to_keras(make(val_idx, False))
    print(f"      {len(train_idx)} training and {len(val_idx)} validation examples, {len(classes)} classes, "
          f"resolution {resolution}", flush=True)

    if site:
        rhos = ()
        in_channels = int(train.element_spec[0]["features"].shape[-1])
        model = site_resnet(len(classes), resolution, spatial_dims=2 if image_data else 3, in_channels=in_channels,
                            channels=tuple(args.site_channels), blocks=args.site_blocks, select_k=args.site_k or None)
    else:
        rhos = tuple(args.rho) if args.rho else DEFAULT_RHOS[resolution]
        regularizer = DensityRegularizer(args.lam, reduction=args.lam_reduction, density=args.lam_density,
                                         include_bias=args.lam_terms == "weights+biases") if args.lam > 0 else None
        model = octnet3(resolution, len(classes), rhos, spatial_dims=2 if image_data else 3,
                        in_channels=1 if image_data else datasets.num_channels(args.features),
                        selection=args.selection, density_regularizer=regularizer,
                        kernel_initializer=args.init or "he_normal")
    learning_rate = args.lr
    if args.lr_schedule == "cosine":
        steps_per_epoch = -(-len(train_idx) // args.batch_size)
        learning_rate = keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=args.epochs * steps_per_epoch)
    optimizer = build_optimizer(args.optimizer, learning_rate, args.weight_decay)
    loss = (SmoothedSparseCrossentropy(args.label_smoothing) if args.label_smoothing > 0
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.compile(optimizer, loss, metrics=["accuracy"])
    bound = None if site else memory_bound(model, args.batch_size)
    callbacks = [EpochTimer()]
    pruning = WarningShotPruning(args.prune_eps) if args.prune_eps > 0 else None
    if pruning:
        callbacks.append(pruning)
    if args.finetune_epochs:  # before the snapshots and the epoch log, as pruning
        callbacks.append(FineTunePhase(args.epochs - args.finetune_epochs, pruning))
    if args.snapshot_epochs:  # after pruning, so a snapshot holds that epoch's masks
        callbacks.append(EpochSnapshots(args.out, args.snapshot_epochs))
    epoch_log = EpochLog(args.backup_dir) if args.backup_dir else None
    if epoch_log:
        callbacks += [epoch_log, keras.callbacks.BackupAndRestore(args.backup_dir, delete_checkpoint=False)]
        done = len(epoch_log.history().get("loss", []))
        if done:
            print(f"      resuming from {args.backup_dir}: {done} epoch(s) done", flush=True)
    described = (f"channels {tuple(args.site_channels)}, {args.site_blocks} residual block(s) per level"
                 + (f", at most {args.site_k} sites per example" if args.site_k else "")) if site \
        else f"sparse blocks rho = {rhos}"
    print(f"[2/4] training {model.name} ({described}) for {args.epochs} epochs", flush=True)
    history = model.fit(train, validation_data=val, epochs=args.epochs, callbacks=callbacks, shuffle=False,
                        verbose=1 if sys.stdout.isatty() else 2).history
    if epoch_log:
        history = epoch_log.history()  # every epoch of the run, not only this process's
    seconds = history["sec_per_epoch"]

    print("[3/4] evaluating", flush=True)
    val_metrics = model.evaluate(val, verbose=0, return_dict=True)
    vote = None
    if args.vote_mirror:
        vote = mirror_vote_accuracy(model, lambda clouds: to_keras(cloud_batches(clouds, labels[val_idx], False)),
                                    examples[val_idx], labels[val_idx])
    layers = [{"layer": layer.name, "rho_up": layer.rho_up, "density": float(history[f"{layer.name}_density"][-1]),
               "present_weights": layer.present_weights(), "weights": int(np.prod(layer.kernel_shape))}
              for layer in sparse_conv_layers(model)]
    results = {
        "model": args.model, "dataset": args.dataset, "examples": int(len(labels)),
        "resolution": resolution, "epochs": len(history.get("loss", [])),
        "batch_size": args.batch_size,
        "rhos": list(rhos), "lambda": args.lam, "lam_terms": args.lam_terms, "lam_density": args.lam_density,
        "prune_eps": args.prune_eps,
        "finetune_epochs": args.finetune_epochs,
        "selection": args.selection,
        "val_accuracy": float(val_metrics["accuracy"]), "val_loss": float(val_metrics["loss"]),
        "val_accuracy_mirror_vote": vote,
        "history": {k: [float(v) for v in vs] for k, vs in history.items()},
        "sec_per_epoch": seconds, "layers": layers, "present_weights": present_weight_count(model),
        "memory_bound_bytes": bound.total_bytes if bound else None,
        "memory_bound_layers": [vars(b) for b in bound.layers] if bound else [],
        "memory_bound_note": SITE_MODEL_NOTE if site else None,
        "pruning": pruning.history if pruning else [],
        "peak_rss_bytes": max([peak_rss_bytes(), *history.get("peak_rss_bytes", [])]),
        "peak_gpu_bytes": peak_gpu_bytes(), "device": device_description(),
        "lr": args.lr, "lr_schedule": args.lr_schedule, "optimizer": args.optimizer, "augment": args.augment,
        "weight_decay": args.weight_decay, "label_smoothing": args.label_smoothing,
        "init": None if site else args.init or "he_normal", "features": None if image_data else list(args.features),
    }
    if site:
        results.update(site_channels=list(args.site_channels), site_blocks=args.site_blocks, site_k=args.site_k,
                       parameters=int(model.count_params()))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    model.save(os.path.join(args.out, "model.keras"))

    print("[4/4] summary")
    print(f"validation accuracy {results['val_accuracy']:.4f} after {results['epochs']} epochs; "
          f"{np.mean(seconds):.1f} s per epoch (first {seconds[0]:.1f} s)")
    if vote is not None:
        print(f"validation accuracy voting over each cloud and its mirror image {vote:.4f}")
    if layers:
        print(f"{'sparse layer':<20}{'rho_up':>8}{'density':>10}{'present weights':>18}")
    for row in layers:
        print(f"{row['layer']:<20}{row['rho_up'] or 1.0:>8.3f}{row['density']:>10.4f}"
              f"{row['present_weights']:>10} / {row['weights']:<7}")
    print(bound.table() if bound else SITE_MODEL_NOTE)
    print(f"peak resident memory {results['peak_rss_bytes'] / 2 ** 20:.0f} MiB"
          + (f", GPU peak {results['peak_gpu_bytes'] / 2 ** 20:.0f} MiB" if results["peak_gpu_bytes"] else "")
          + f" ({results['device']})")
    print(f"results and model written to {os.path.abspath(args.out)}")
    return results


if __name__ == "__main__":
    main()
