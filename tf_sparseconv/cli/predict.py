"""tf-sparseconv predict: label files with a saved model's most probable classes.

Point-cloud models read .off meshes (sampled to the model's points per cloud), .ply
(vertices x y z, with nx ny nz when the model uses normals), .npy [N, 3+] or [M, N, 3+]
and .npz with a `points` array; image models read .png, .npy [H, W] or [M, H, W] and .npz
with an `images` array. Clouds of another size than the model was trained with are
resampled to it (seeded). The model normalises each cloud into the unit sphere itself, so
clouds in any units and anywhere work (a cloud far from the origin, e.g. an object cut out
of a georeferenced scan, is centred in float64 as it is read); a model saved with
normalize='none' refuses points outside its bounds. Several models (the .keras files before
the first input) predict as an ensemble: the mean of their softmax outputs, as `evaluate`
scores one. With --vote, each cloud is predicted by the mean softmax over its mirror image
or its rotations about the up axis (z) as well, as `evaluate --vote` scores it (an
ensemble: each model's vote, then their mean).
"""
import json
import os
import sys

import numpy as np

from tf_sparseconv.cli.common import (Progress, UsageError, centres_clouds, check_model_file, load_ensemble,
                                      non_negative_int, one_line, positive_int)

DESCRIPTION = __doc__.split("\n", 2)[2].strip()
# Points per cloud when the model does not say how many it was trained with.
DEFAULT_POINTS = 1024


def add_arguments(parser):
    parser.add_argument("model", metavar="MODEL", help="the saved model (.keras), e.g. runs/<run>/model.keras; "
                        "more .keras files before the first FILE: their ensemble (the mean of their softmax "
                        "outputs), as evaluate scores it")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="point files (.off .ply .npy .npz) or, for an image model, images (.png .npy .npz)")
    parser.add_argument("--top-k", type=positive_int, default=3, metavar="K",
                        help="classes shown per example (default 3)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list (file, index, top classes with probabilities) instead of lines")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="examples per prediction batch (default 32)")
    parser.add_argument("--seed", type=non_negative_int, default=0, metavar="N",
                        help="seed of mesh sampling and resampling (default 0)")
    parser.add_argument("--vote", type=_vote, default="none", metavar="VOTE",
                        help="predict each cloud by the mean softmax over views of it: none (default), mirror (and "
                             "its x-mirrored copy) or rotations-N (N rotations about the up axis, z); as evaluate "
                             "--vote, for a model chosen with that vote")


def _vote(text):
    from tf_sparseconv.cli.evaluate import _vote as parse
    return parse(text)


def _check_files(files):
    from tf_sparseconv.data.point_files import IMAGE_SUFFIXES, POINT_SUFFIXES, check_readable

    for path in files:
        try:
            check_readable(path, tuple(dict.fromkeys(POINT_SUFFIXES + IMAGE_SUFFIXES)), "point or image file")
        except (OSError, ValueError) as e:
            raise UsageError(one_line(e)) from None


def _read_clouds(files, spec, seed, centre=False):
    """([(file, index or None)], clouds [M, N, columns]) at the model's points per cloud, and notes;
    centre: each cloud centred on its centroid as it is read (point_files.as_clouds)."""
    from tf_sparseconv.data.point_files import POINT_SUFFIXES, read_point_file, resample_points, suffix

    target = spec.get("points_per_cloud") or DEFAULT_POINTS
    columns = spec.get("columns", 3)
    names, clouds, resampled = [], [], 0
    for path in files:
        if suffix(path) not in POINT_SUFFIXES:
            raise UsageError(f"{path}: an image, but the model takes point clouds ({', '.join(POINT_SUFFIXES)})")
        try:
            read = read_point_file(path, num_points=target if suffix(path) == ".off" else None, seed=seed,
                                   centre=centre)
        except (OSError, ValueError) as e:
            raise UsageError(one_line(e)) from None
        if read.shape[-1] < columns:
            raise UsageError(f"{path}: the model uses normals (features {list(spec['features'])}), but the file "
                             "has x y z only")
        several = read.ndim == 3
        for index, cloud in enumerate(read if several else [read]):
            if len(cloud) != target:
                cloud = resample_points(cloud, target, np.random.default_rng([seed, len(clouds)]))
                resampled += 1
            names.append((path, index if several else None))
            clouds.append(cloud[:, :columns])
    notes = [f"{resampled} cloud(s) resampled to {target} points, the model's points per cloud"] if resampled else []
    clouds = np.stack(clouds)
    _check_bounds(clouds, names, spec)
    return names, clouds, notes


def _check_bounds(clouds, names, spec):
    """UsageError for a cloud outside the bounds of a model saved with normalize='none'."""
    if spec.get("normalize") != "none":
        return
    low, high = spec.get("bounds", (-1.0, 1.0))
    outside = ((clouds[..., :3] < low) | (clouds[..., :3] > high)).any(axis=(1, 2))
    if outside.any():
        path, index = names[int(np.flatnonzero(outside)[0])]
        where = path if index is None else f"{path}[{index}]"
        raise UsageError(f"{where}: points outside the model's bounds [{low:g}, {high:g}]; the model was saved "
                         "with normalize='none', so scale the cloud into them")


def _read_images(files, spec):
    from tf_sparseconv.data.point_files import IMAGE_SUFFIXES, read_image_file, suffix

    shape = tuple(spec.get("image_shape") or ())
    names, images = [], []
    for path in files:
        if suffix(path) not in IMAGE_SUFFIXES:
            raise UsageError(f"{path}: a point file, but the model takes images ({', '.join(IMAGE_SUFFIXES)})")
        try:
            read = read_image_file(path)
        except (OSError, ValueError) as e:
            raise UsageError(one_line(e)) from None
        several = read.ndim == 3
        size = tuple(read.shape[-2:])
        shape = shape or size
        if size != shape:
            raise UsageError(f"{path}: images of {size[0]}x{size[1]} pixels, the model takes {shape[0]}x{shape[1]}")
        for index, image in enumerate(read if several else [read]):
            names.append((path, index if several else None))
            images.append(image.astype(np.float32))
    return names, np.stack(images), []


def top_classes(logits, class_names, k):
    """Per example the k (class, probability) pairs of highest softmax probability."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return [[(class_names[c], float(p[c])) for c in row] for row, p in zip(order, probabilities)]


def split_models(model, files):
    """(model paths, input files): MODEL and the .keras files that follow it before the first input."""
    paths = [model]
    while files and files[0].lower().endswith(".keras"):
        paths.append(files.pop(0))
    if not files:
        raise UsageError("name the files to predict after the model(s)")
    if len(set(map(os.path.abspath, paths))) != len(paths):
        raise UsageError("a model is named twice; an ensemble takes each model once")
    return paths, files


# What the members of an ensemble must share: they read the same clouds or images.
SHARED_INPUT = ("kind", "points_per_cloud", "columns", "image_shape")


def run(args):
    from tf_sparseconv.cli.evaluate import check_vote, predict_logits
    from tf_sparseconv.training.voting import softmax, voted_probabilities

    paths, files = split_models(args.model, list(args.files))
    _check_files(files)
    for path in paths:
        check_model_file(path)
    members, model_names, num_outputs = load_ensemble(paths, SHARED_INPUT, "kind, points per cloud, columns or "
                                                      "image size", "an ensemble predicts from the same examples")
    spec = members[0][1]
    names = list(model_names) if model_names else [str(i) for i in range(num_outputs)]
    for _, member_spec in members:
        check_vote(args.vote, member_spec)
    if spec["kind"] == "images":
        sources, examples, notes = _read_images(files, spec)
    else:
        sources, examples, notes = _read_clouds(files, spec, args.seed, centres_clouds(members))
        for _, other in members[1:]:  # a member saved with normalize='none' checks its own bounds
            _check_bounds(examples, sources, other)
    if not model_names:
        notes.append("the model stores no class names; classes are shown by index")
    if len(members) > 1:
        notes.append(f"ensemble of {len(members)} models: the mean of their softmax outputs")
    if args.vote != "none":
        notes.append(f"voting over views of each cloud ({args.vote}): the mean of their softmax outputs")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    many = len(examples) > args.batch_size
    outputs = []
    for i, (model, _) in enumerate(members):
        what = f" (model {i + 1}/{len(members)})" if len(members) > 1 else ""
        if args.vote == "none":
            outputs.append(predict_logits(model, examples, args.batch_size,
                                          Progress(f"predicting{what}", len(examples)) if many else None))
        else:  # the vote's mean softmax, as log-probabilities (top_classes' softmax gives it back)
            voted = voted_probabilities(lambda view, what=what: predict_logits(
                model, view, args.batch_size, Progress(f"predicting{what}", len(view)) if many else None),
                examples, args.vote)
            outputs.append(np.log(np.maximum(voted, np.finfo(np.float64).tiny)))
    if len(outputs) > 1:  # log of the mean softmax as logits: top_classes' softmax gives the mean back
        mean = np.mean([softmax(o) for o in outputs], axis=0)  # float64
        outputs = [np.log(np.maximum(mean, np.finfo(np.float64).tiny))]
    ranked = top_classes(outputs[0], names, min(args.top_k, num_outputs))
    if args.json:
        print(json.dumps([{"file": path, "index": index,
                           "top_k": [{"class": c, "probability": p} for c, p in classes]}
                          for (path, index), classes in zip(sources, ranked)], indent=1))
        return 0
    width = max(len(_label(path, index)) for path, index in sources)
    for (path, index), classes in zip(sources, ranked):
        print(f"{_label(path, index):<{width}}  " + "  ".join(f"{c} {p:.3f}" for c, p in classes))
    return 0


def _label(path, index):
    return path if index is None else f"{path}[{index}]"
