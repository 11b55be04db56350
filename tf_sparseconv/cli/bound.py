"""tf-sparseconv bound: a saved model's memory bound, beside the dense grid's.

The bound (tf_sparseconv.models.memory_bound) holds for any input: every density-bounded
sparse convolution keeps at most k entries per example and channel, whatever the cloud.
The dense figure is the same layers' activations stored as dense float tensors.
"""
from tf_sparseconv.cli.common import UsageError, check_model_file, load_model, one_line, positive_int

DESCRIPTION = __doc__.split("\n", 2)[2].strip()


def add_arguments(parser):
    parser.add_argument("model", metavar="MODEL", help="the saved model (.keras), e.g. runs/<run>/model.keras")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="examples per batch to bound (default 32)")
    parser.add_argument("--points-per-cloud", type=positive_int, metavar="N",
                        help="points per cloud, which caps the occupied voxels (default: the model's points "
                             "per cloud; for point-cloud models only)")


def run(args):
    from tf_sparseconv.models.memory_bound import memory_bound

    check_model_file(args.model)
    model, spec, _ = load_model(args.model, serving=False)
    kind = spec["kind"] if spec else "sparse tensors"
    points = args.points_per_cloud
    if points is not None and kind != "points":
        raise UsageError(f"--points-per-cloud applies to point-cloud models; this model takes {kind}")
    if points is None and kind == "points":
        points = spec.get("points_per_cloud")
    try:
        bound = memory_bound(model, args.batch_size, points_per_sample=points)
    except TypeError as e:  # a layer the bound does not cover (the site-sparse models)
        raise UsageError(f"{args.model}: no memory bound for this model ({one_line(e)})") from None
    cloud = f", {points} points per cloud" if points else ""
    print(f"{args.model}: memory bound of one forward pass at batch {args.batch_size}{cloud}")
    print(bound.table())
    return 0
