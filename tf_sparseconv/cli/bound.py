"""tf-sparseconv bound: a saved model's memory bound, beside the dense grid's.

The bound (tf_sparseconv.models.memory_bound) holds for any input: every density-bounded
sparse convolution keeps at most k entries per example and channel, whatever the cloud.
The dense figure is the same layers' activations stored as dense float tensors. Several
models (an ensemble, as evaluate and predict run it: one model after another) are bounded
each, and the ensemble by the largest of them.
"""
import os

from tf_sparseconv.cli.common import UsageError, check_model_file, load_model, one_line, positive_int

DESCRIPTION = __doc__.split("\n", 2)[2].strip()


def add_arguments(parser):
    parser.add_argument("model", metavar="MODEL", nargs="+",
                        help="the saved model (.keras), e.g. runs/<run>/model.keras; several: an ensemble's members")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="examples per batch to bound (default 32)")
    parser.add_argument("--points-per-cloud", type=positive_int, metavar="N",
                        help="points per cloud, which caps the occupied voxels (default: the model's points "
                             "per cloud; for point-cloud models only)")


def bound_one(path, batch_size, points_per_cloud):
    """Prints the bound of one saved model; returns its total bytes."""
    from tf_sparseconv.models.memory_bound import memory_bound

    check_model_file(path)
    model, spec, _ = load_model(path, serving=False)
    kind = spec["kind"] if spec else "sparse tensors"
    points = points_per_cloud
    if points is not None and kind != "points":
        raise UsageError(f"--points-per-cloud applies to point-cloud models; this model takes {kind}")
    if points is None and kind == "points":
        points = spec.get("points_per_cloud")
    try:
        bound = memory_bound(model, batch_size, points_per_sample=points)
    except TypeError as e:  # a layer the bound does not cover (the site-sparse models)
        raise UsageError(f"{path}: no memory bound for this model ({one_line(e)})") from None
    cloud = f", {points} points per cloud" if points else ""
    print(f"{path}: memory bound of one forward pass at batch {batch_size}{cloud}")
    print(bound.table())
    return bound.total_bytes


def run(args):
    if len(set(map(os.path.abspath, args.model))) != len(args.model):
        raise UsageError("a model is named twice; an ensemble takes each model once")
    totals = []
    for i, path in enumerate(args.model):
        if i:
            print()
        totals.append(bound_one(path, args.batch_size, args.points_per_cloud))
    if len(totals) > 1:
        largest = max(range(len(totals)), key=totals.__getitem__)
        print(f"\nensemble of {len(totals)} models, run one after another (evaluate, predict): memory bound "
              f"{totals[largest] / 2 ** 20:.2f} MB, the largest member's ({args.model[largest]})")
    return 0
