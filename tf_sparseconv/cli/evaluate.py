"""tf-sparseconv evaluate: score a saved model on labelled data.

Reads a test split (data.test_split: ModelNet OFF tree, point-cloud .npz, MNIST, ScanNet
scans) or, with --split val, exactly the validation examples of the run that saved the
model (from its split.json). The data's class names are matched to the model's by name,
so a test tree with fewer classes, or in another order, scores correctly; a class the
model does not know is refused. With --vote, each cloud is scored by the mean softmax over
its mirror image or its rotations about the up axis (z) as well. Several models are scored
as an ensemble: the mean of their softmax outputs (after each one's vote). Prints the overall and the
mean per-class accuracy and a per-class table; writes metrics.json and confusion_matrix.png
to a new folder.
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np

from tf_sparseconv.cli.common import (Progress, UsageError, centres_clouds, check_model_file, check_out_dir,
                                      load_ensemble, non_negative_int, one_line, positive_int)
from tf_sparseconv.host_memory import check_cloud_fits

DESCRIPTION = __doc__.split("\n", 2)[2].strip() + """

data (--data):
  <root>/<class>/{test,train}/*.off   ModelNet meshes, --points sampled per mesh
  FILE.npz with points, labels, classes   point clouds (uint8 points: quantised as modelnet40_train.npz)
  FILE.npz with images, labels, or a folder of MNIST idx files (t10k-images-idx3-ubyte, ...)
  <root>/scene*/                    ScanNet scans (objects cut out by their annotations)"""

SPLIT_FILE = "split.json"


def add_arguments(parser):
    parser.add_argument("model", metavar="MODEL", nargs="+",
                        help="the saved model (.keras), e.g. runs/<run>/model.keras; several: their ensemble, "
                             "scored by the mean of their softmax outputs (same classes; with --split val, trained "
                             "with the same validation examples)")
    parser.add_argument("--data", metavar="PATH",
                        help="labelled data: a ModelNet OFF tree, a point-cloud or MNIST .npz, MNIST idx files or "
                             "ScanNet scans (with --split val: default the training run's data)")
    parser.add_argument("--split", choices=("test", "train", "val", "all"),
                        help="test (default where the data has splits), train, all (every example; the default "
                             "for an .npz or ScanNet), or val: the training run's validation examples")
    parser.add_argument("--classes", nargs="+", metavar="NAME",
                        help="score only these classes; 'model' for those of the model's classes the data has "
                             "(default: every class of the data, each of which the model must know)")
    parser.add_argument("--points", type=positive_int, metavar="N",
                        help="points sampled per mesh or kept per ScanNet object (default: the model's points "
                             "per cloud, else 1024)")
    parser.add_argument("--vote", type=_vote, default="none", metavar="VOTE",
                        help="score each cloud by the mean softmax over views of it: none (default), mirror (and its "
                             "x-mirrored copy) or rotations-N (N rotations about the up axis, z, by multiples of "
                             "360/N degrees); as tf-sparseconv train --vote")
    parser.add_argument("--turn", type=float, default=0.0, metavar="DEGREES",
                        help="turn every cloud about the up axis (z) by DEGREES before scoring it (how much the "
                             "score leans on the data's exact orientation; default 0)")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="examples per prediction batch (default 32)")
    parser.add_argument("--seed", type=non_negative_int, metavar="N", help="seed of the point sampling (default 0)")
    parser.add_argument("--out", metavar="DIR",
                        help="folder for metrics.json and confusion_matrix.png (default: a new "
                             "eval-<data>-<split>-<time> folder beside the model)")
    parser.add_argument("--overwrite", action="store_true", help="allow writing into a non-empty --out")


def _vote(text):
    from tf_sparseconv.training.voting import parse_vote
    try:
        return parse_vote(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _default_out(model_path, data_path, split):
    name = os.path.splitext(os.path.basename(os.path.normpath(data_path)))[0] if data_path else "synthetic"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(os.path.dirname(os.path.abspath(model_path)), f"eval-{name}-{split}-{stamp}")
    out, n = base, 2
    while os.path.exists(out):
        out, n = f"{base}-{n}", n + 1
    return out


def _check_arguments(args):
    """(kind, split, data path, split record or None), refusing bad arguments before anything loads."""
    from tf_sparseconv.data import test_split

    for path in args.model:
        check_model_file(path)
    if not np.isfinite(args.turn):
        raise UsageError(f"--turn must be a finite number of degrees, got {args.turn}")
    if len(set(map(os.path.abspath, args.model))) != len(args.model):
        raise UsageError("a model is named twice; an ensemble takes each model once")
    record = None
    if args.split == "val":
        record = _same_validation_examples(args.model)
        data = args.data or record.get("data_path")
        if record.get("dataset") == "synthetic" and args.data:
            raise UsageError("--data does not apply: the model was trained on the built-in synthetic shapes, "
                             "which --split val regenerates")
        if record.get("dataset") != "synthetic" and not data:
            raise UsageError(f"{SPLIT_FILE} names no data path; give the training data with --data")
        if data and not os.path.exists(data):
            raise UsageError(f"{data}: no such file or folder (the training data, for --split val)")
        if args.points is not None or args.seed is not None:
            raise UsageError("--points and --seed do not apply to --split val, which samples as the training run did")
        if args.classes:
            raise UsageError("--classes does not apply to --split val, which scores the training run's own "
                             "validation examples")
        kind, split = record.get("dataset"), "val"
    else:
        if args.data is None:
            raise UsageError("--data is required (the labelled data to score), except with --split val")
        data = args.data
        try:
            kind, splits = test_split.detect_kind(data)
            split = test_split.resolve_split(kind, splits, args.split)
        except (OSError, ValueError) as e:
            raise UsageError(one_line(e)) from None
        if args.points is not None and kind not in ("modelnet-meshes", "scannet"):
            raise UsageError(f"--points applies to OFF meshes and ScanNet scans; {data} holds {kind} data")
    if args.classes and len(set(args.classes)) != len(args.classes):
        raise UsageError(f"--classes names a class twice: {args.classes}")
    if args.out is not None:
        check_out_dir(args.out, args.overwrite)
    return kind, split, data, record


def _same_validation_examples(model_paths):
    """The split record of the first model, after checking that every model's names the same
    validation examples of the same data."""
    records = [_read_split_record(path) for path in model_paths]
    keys = ("dataset", "num_examples", "labels_sha256", "val_indices")  # the same data, wherever it lies
    for path, record in zip(model_paths[1:], records[1:]):
        differs = [k for k in keys if record.get(k) != records[0].get(k)]
        if differs:
            raise UsageError(f"--split val: {path} was trained with other validation examples than "
                             f"{model_paths[0]} ({', '.join(differs)} differ); an ensemble is scored on examples "
                             "none of its models trained on (train them with the same --split-seed)")
    return records[0]


def _read_split_record(model_path):
    path = os.path.join(os.path.dirname(os.path.abspath(model_path)), SPLIT_FILE)
    if not os.path.isfile(path):
        raise UsageError(f"--split val needs {path}, written by tf-sparseconv train beside model.keras; it is "
                         "missing, so the validation examples are unknown (use --split test or all)")
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: unreadable ({one_line(e)})") from None
    if not isinstance(record, dict) or not {"val_indices", "dataset"} <= set(record):
        raise UsageError(f"{path}: not a split record of tf-sparseconv train (no val_indices)")
    return record


def _choose_classes(requested, available, model_names, num_outputs):
    """(classes to score, their indices among the model's outputs, notes)."""
    notes = []
    if requested == ["model"]:
        if model_names is None:
            raise UsageError("--classes model: this model stores no class names")
        chosen = tuple(c for c in model_names if c in available)
        absent = [c for c in model_names if c not in available]
        if not chosen:
            raise UsageError(f"the data has none of the model's classes ({_names(model_names)})")
        if absent:
            notes.append(f"the data lacks {len(absent)} of the model's classes: {_names(absent)}")
    elif requested:
        chosen = tuple(requested)
        missing = [c for c in chosen if c not in available]
        if missing:
            raise UsageError(f"--classes: {_names(missing)} not in the data, whose classes are {_names(available)}")
    else:
        chosen = tuple(available)
    if model_names is None:
        if len(chosen) != num_outputs:
            raise UsageError(f"the model stores no class names and has {num_outputs} outputs, the data "
                             f"{len(chosen)} classes; they cannot be matched")
        notes.append("the model stores no class names; the data's class order is taken as the model's")
        return chosen, np.arange(len(chosen)), notes
    unknown = [c for c in chosen if c not in model_names]
    if unknown:
        raise UsageError(f"the data's classes {_names(unknown)} are not among the model's {len(model_names)} "
                         f"classes ({_names(model_names)}); pass --classes with the classes to score "
                         "(--classes model: the model's own)")
    return chosen, np.array([model_names.index(c) for c in chosen], np.int64), notes


def _names(names, limit=12):
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _check_compatible(kind, spec, data, vote="none", turn=0.0):
    images = kind == "mnist"
    if images and spec["kind"] != "images":
        raise UsageError(f"{data} holds images, but the model takes point clouds")
    if not images and spec["kind"] == "images":
        raise UsageError(f"{data} holds point clouds, but the model takes images")
    check_vote(vote, spec)
    if turn and spec["kind"] == "images":
        raise UsageError(f"--turn {turn:g} applies to point clouds, not to images")
    if turn and spec.get("normalize") == "none":
        raise UsageError(f"--turn {turn:g} needs a model that normalises its clouds (normalize='unit_sphere'); "
                         "this one was saved with normalize='none'")


def check_vote(vote, spec):
    """UsageError where a model of input spec cannot vote (evaluate and predict --vote)."""
    if vote == "none":
        return
    if spec["kind"] == "images":
        raise UsageError(f"--vote {vote} applies to point clouds, not to images (mirroring or rotating changes a "
                         "digit)")
    if spec.get("normalize") == "none":
        # the views turn about the origin, which may carry points out of the model's fixed bounds
        raise UsageError(f"--vote {vote} needs a model that normalises its clouds (normalize='unit_sphere'); this "
                         "one was saved with normalize='none'")


def _load_validation_set(record, data):
    """The training run's validation examples, loaded as training loaded them; refuses other data."""
    from tf_sparseconv.data.test_split import LabelledSet
    from tf_sparseconv.training.train import labels_sha256, load_examples

    sizes = {"points": record.get("points", 1024), "synthetic_per_class": record.get("synthetic_per_class")}
    print(f"loading {data or 'the built-in shapes'} as the training run did", file=sys.stderr, flush=True)
    try:
        examples, labels, classes = load_examples(record["dataset"], data, sizes,
                                                  record.get("split_seed", record.get("seed", 0)),
                                                  normals=bool(record.get("normals")))
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"--split val: {one_line(e)}") from None
    if len(labels) != record.get("num_examples"):
        differs = f"has {len(labels)} examples, the training run's had {record.get('num_examples')}"
    elif labels_sha256(labels) != record.get("labels_sha256"):
        differs = "has other labels than the training run's (their sha256 differs)"
    elif list(classes) != list(record.get("classes", classes)):
        differs = f"names its classes {_names(classes)}, the training run's were {_names(record['classes'])}"
    else:
        differs = None
    if differs:
        raise UsageError(f"--split val: {data} is not the data the model was trained on: it {differs}; give the "
                         "training data with --data, or score other data with --split test or all")
    val = np.asarray(record["val_indices"], np.int64)
    if len(val) == 0:
        raise UsageError("--split val: the training run kept no validation examples")
    return LabelledSet(examples[val], labels[val], tuple(classes), record["dataset"],
                       f"{data or 'the built-in shapes'} (the training run's validation examples)")


def predict_logits(model, examples, batch_size, progress=None):
    """float32 [M, K]: the model's outputs, batch by batch; UsageError for data TensorFlow refuses."""
    import tensorflow as tf

    outputs = []
    for start in range(0, len(examples), batch_size):
        try:
            outputs.append(np.asarray(model.predict_on_batch(examples[start:start + batch_size])))
        except (tf.errors.InvalidArgumentError, ValueError) as e:
            raise UsageError(f"examples {start}..{min(len(examples), start + batch_size) - 1}: {one_line(e)}") \
                from None
        if progress:
            progress(min(len(examples), start + batch_size))
    return np.concatenate(outputs) if outputs else np.zeros([0, model.outputs[0].shape[-1]], np.float32)


def classification_metrics(true, predicted, classes, model_index, num_outputs):
    """Overall and per-class accuracy and the confusion matrix rows [len(classes), num_outputs]."""
    confusion = np.zeros([len(classes), num_outputs], np.int64)
    row_of = np.full(num_outputs, -1, np.int64)
    row_of[model_index] = np.arange(len(classes))
    np.add.at(confusion, (row_of[true], predicted), 1)
    per_class = {}
    for row, name in enumerate(classes):
        examples = int(confusion[row].sum())
        correct = int(confusion[row, model_index[row]])
        per_class[name] = {"examples": examples, "correct": correct,
                           "accuracy": correct / examples if examples else None}
    scored = [v["accuracy"] for v in per_class.values() if v["accuracy"] is not None]
    return {"examples": int(len(true)), "correct": int((true == predicted).sum()),
            "overall_accuracy": float((true == predicted).mean()) if len(true) else None,
            "mean_class_accuracy": float(np.mean(scored)) if scored else None,
            "per_class": per_class, "confusion_matrix": confusion.tolist()}


def save_confusion_png(path, confusion, row_names, column_names, title):
    """Rows: true classes; columns: predicted classes; colour: the fraction of the row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    confusion = np.asarray(confusion)
    fraction = confusion / np.maximum(confusion.sum(1, keepdims=True), 1)
    rows, columns = confusion.shape
    cell = 0.2 if max(rows, columns) > 20 else 0.35  # inches
    label_room = 0.07 * max(len(n) for n in [*row_names, *column_names]) + 0.8
    fig, ax = plt.subplots(figsize=(max(3.0, columns * cell) + label_room + 1.2,
                                    max(2.0, rows * cell) + label_room + 0.8))
    image = ax.imshow(fraction, cmap="Blues", vmin=0, vmax=1, aspect="equal")
    ax.set_xticks(range(len(column_names)), column_names, rotation=90, fontsize=7)
    ax.set_yticks(range(len(row_names)), row_names, fontsize=7)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(title, fontsize=9)
    if max(confusion.shape) <= 20:
        for (r, c), count in np.ndenumerate(confusion):
            if count:
                ax.text(c, r, str(count), ha="center", va="center", fontsize=6,
                        color="white" if fraction[r, c] > 0.5 else "black")
    fig.colorbar(image, ax=ax, shrink=min(1.0, max(0.3, rows / max(columns, 1))), pad=0.02,
                 label="fraction of the true class")
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _print_report(metrics, classes, source, vote="none"):
    print(f"{metrics['examples']} examples from {source}" + (f", voting over views ({vote})" if vote != "none" else ""))
    print(f"overall accuracy     {metrics['overall_accuracy']:.4f}  ({metrics['correct']}/{metrics['examples']})")
    present = sum(1 for c in classes if metrics["per_class"][c]["examples"])
    print(f"mean class accuracy  {metrics['mean_class_accuracy']:.4f}  (over {present} classes)")
    width = max(12, *(len(c) for c in classes)) + 2
    print(f"{'class':<{width}}{'examples':>9}{'correct':>9}{'accuracy':>10}")
    for name in classes:
        row = metrics["per_class"][name]
        accuracy = f"{row['accuracy']:.4f}" if row["accuracy"] is not None else "-"
        print(f"{name:<{width}}{row['examples']:>9}{row['correct']:>9}{accuracy:>10}")


def _load_examples(args, kind, split, data, record, spec, model_names, num_outputs, centre=False):
    """(LabelledSet, classes scored, their model output indices, notes, sampling seed); centre:
    point clouds of an .npz centred on their centroids as they are read (point_files.as_clouds)."""
    if record is not None:
        loaded = _load_validation_set(record, data)
        return (loaded, *_choose_classes(None, loaded.classes, model_names, num_outputs), record.get("seed", 0))
    from tf_sparseconv.data import test_split

    try:
        available = test_split.data_classes(data, kind, split)
    except (OSError, ValueError) as e:
        raise UsageError(one_line(e)) from None
    classes, model_index, notes = _choose_classes(args.classes, available, model_names, num_outputs)
    seed = args.seed or 0
    points = args.points or spec.get("points_per_cloud") or 1024
    given = " (--points)" if args.points else ""
    try:
        check_cloud_fits(points)
        loaded = test_split.load_test_split(data, kind, split, classes, num_points=points,
                                            normals=spec.get("columns") == 6, seed=seed,
                                            progress=Progress(f"loading {data}"), centre=centre)
    except (OSError, ValueError) as e:
        raise UsageError(one_line(e)) from None
    except MemoryError as e:
        raise UsageError(f"{data}: not enough memory for {points} points per cloud{given}: {one_line(e)}") from None
    return loaded, classes, model_index, notes, seed


def _load_ensemble(paths, kind, data, vote, turn):
    """[(model, input spec)], their class names and output count: the same for every model."""
    return load_ensemble(paths, ("kind", "points_per_cloud"), "kind or points per cloud",
                         "an ensemble scores every model on the same examples",
                         check=lambda spec: _check_compatible(kind, spec, data, vote, turn))


def _probabilities(model, examples, batch_size, vote, what):
    """[M, K]: softmax of the model's outputs, or its vote's mean softmax over the views."""
    from tf_sparseconv.training.voting import softmax, vote_views, voted_probabilities
    if vote == "none":
        return softmax(predict_logits(model, examples, batch_size, Progress(f"predicting{what}", len(examples))))
    views = sum(1 for _ in vote_views(examples[:1], vote))
    done = [0]

    def predict(view):
        done[0] += 1
        return predict_logits(model, view, batch_size,
                              Progress(f"predicting{what} view {done[0]}/{views} ({vote})", len(examples)))

    return voted_probabilities(predict, examples, vote)


def run(args):
    kind, split, data, record = _check_arguments(args)
    out = args.out or _default_out(args.model[0], data, split)
    ensemble, model_names, num_outputs = _load_ensemble(args.model, kind, data, args.vote, args.turn)
    # The examples are loaded once, with normals where any model uses them.
    spec = max((s for _, s in ensemble), key=lambda s: s.get("columns", 3))
    loaded, classes, model_index, notes, seed = _load_examples(args, kind, split, data, record, spec, model_names,
                                                               num_outputs, centres_clouds(ensemble))
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if len(loaded.examples) == 0:
        raise UsageError(f"{data}: no examples of the classes {_names(classes)}")
    scores = 0.0
    for i, (model, model_spec) in enumerate(ensemble):
        what = f" (model {i + 1}/{len(ensemble)})" if len(ensemble) > 1 else ""
        examples = _fit_to_model(loaded.examples, model_spec, data)
        if args.turn:
            from tf_sparseconv.data.pipeline import rotate_about_up
            examples = rotate_about_up(examples, np.radians(args.turn)).astype(examples.dtype)
        scores = scores + _probabilities(model, examples, args.batch_size, args.vote, what) / len(ensemble)
    true = model_index[loaded.labels]
    metrics = classification_metrics(true, scores.argmax(1), classes, model_index, num_outputs)
    if len(ensemble) > 1:
        print(f"ensemble of {len(ensemble)} models: the mean of their softmax outputs")
    if args.turn:
        print(f"every cloud turned by {args.turn:g} degrees about the up axis (z)")
    _print_report(metrics, classes, loaded.source, args.vote)

    output_names = list(model_names) if model_names else list(classes)
    summary = {"model": os.path.abspath(args.model[0]), "models": [os.path.abspath(m) for m in args.model],
               "data": os.path.abspath(data) if data else None,
               "kind": loaded.kind, "split": split, "classes": list(classes), "model_classes": output_names,
               "points_per_cloud": int(loaded.examples.shape[1]) if spec["kind"] == "points" else None, "seed": seed,
               "vote": args.vote, "turn_degrees": args.turn,
               **metrics}
    try:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "metrics.json"), "w") as f:
            json.dump(summary, f, indent=1)
    except OSError as e:  # what check_out_dir could not see (a read-only file system, say)
        raise UsageError(f"{out}: cannot write the results there ({e.strerror or one_line(e)})") from None
    run_name = os.path.basename(os.path.dirname(os.path.abspath(args.model[0])))
    if len(args.model) > 1:
        run_name += f" and {len(args.model) - 1} more (ensemble)"
    title = (f"{run_name} on {os.path.basename(data or 'synthetic')} ({split}"
             + (f", vote {args.vote}" if args.vote != "none" else "")
             + (f", turned {args.turn:g} degrees" if args.turn else "") + "): accuracy "
             f"{metrics['overall_accuracy']:.3f}, mean class {metrics['mean_class_accuracy']:.3f}")
    save_confusion_png(os.path.join(out, "confusion_matrix.png"), metrics["confusion_matrix"], list(classes),
                       output_names, title)
    print(f"metrics and confusion matrix written to {out}")
    return 0


def _fit_to_model(examples, spec, data):
    """The examples as the model takes them: clouds with the model's columns, images of its size."""
    if spec["kind"] == "images":
        shape = tuple(spec.get("image_shape") or examples.shape[1:])
        if tuple(examples.shape[1:]) != shape:
            raise UsageError(f"{data}: images are {examples.shape[1]}x{examples.shape[2]}, the model takes "
                             f"{shape[0]}x{shape[1]}")
        return examples
    columns = spec.get("columns", 3)
    if examples.shape[-1] < columns:
        raise UsageError(f"{data}: the model uses normals (features {list(spec['features'])}), but the data has "
                         "x y z only")
    examples = examples[..., :columns]
    if spec.get("normalize") == "none":
        low, high = spec.get("bounds", (-1.0, 1.0))
        outside = (examples[..., :3] < low) | (examples[..., :3] > high)
        if outside.any():
            first = int(np.flatnonzero(outside.any(axis=(1, 2)))[0])
            raise UsageError(f"{data}: example {first} has points outside the model's bounds [{low:g}, {high:g}]; "
                             "the model was saved with normalize='none', so clouds must lie inside them")
    return examples
