"""Adaptive density regularisation and warning-shot pruning (Hackel et al. §4.3, Fig. 6):
present weights, time per epoch and accuracy over epochs for several lambda. Writes
experiments/results/pruning.json and pruning.png.

    python experiments/pruning.py --resolution 16 --max-examples 3000 --epochs 8

Each lambda trains in its own process (lambda = 0: neither regularisation nor pruning, the
baseline of Fig. 6). The Eq. 4 penalty uses --reduction (default "filter": lambda times the
sum of (w + b)^2 over each output channel's filter, averaged over the layer's filters; see
DensityRegularizer for why the plain sum over the whole layer is not the default here).

Seconds per epoch come from the training log (wall time of each epoch, validation
included). On a shared machine those are disturbed by whatever else runs; and here, with
the CPU idle, a fit call now and then waits 5-20 s after on_train_end, or within a
multi-epoch fit at the next epoch's first step, ending ~41 s after the epoch began whatever
its work (apparently the teardown of the epoch's data iterator; the tf.data pipeline alone
shows no such wait). So afterwards the final model of every lambda is timed again
(--retime-repeats, default 4): one more epoch each, one fit call each so that the wait
falls outside the timed on_epoch_begin..on_epoch_end span, lambdas interleaved
round-robin. The least wall time of the repeats (`sec_per_epoch_retimed` in each lambda's
last row) is what the speed-up is computed from; the least process CPU time
(`cpu_sec_per_epoch_retimed`, both cores together), which idle waits do not inflate and
other processes much less, is kept beside it as a check. --retime-repeats 0 skips this.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import REPO, RESULTS, run_training, save_figure, write_json  # noqa: E402

if REPO not in sys.path:  # tf_sparseconv from this checkout, as the training processes use it
    sys.path.insert(0, REPO)


def split(args):
    """(examples, labels, train_idx, val_idx) exactly as `tf_sparseconv.train` makes them."""
    from tf_sparseconv import data as datasets
    from tf_sparseconv import train as trainer
    data_dir = args.data_dir or trainer.DEFAULT_DATA_DIR
    examples, labels, _ = trainer.load_examples("modelnet40", data_dir, {"points": 1024, "synthetic_per_class": 150},
                                                args.seed)
    if args.max_examples and args.max_examples < len(labels):
        keep, _ = datasets.stratified_split(labels, 1 - args.max_examples / len(labels), args.seed)
        examples, labels = examples[keep], labels[keep]
    train_idx, val_idx = datasets.stratified_split(labels, args.val_fraction, args.seed)
    return examples, labels, train_idx, val_idx


def training_data(args):
    """The training and validation batches exactly as `tf_sparseconv.train` builds them."""
    from tf_sparseconv import data as datasets
    from tf_sparseconv import train as trainer
    examples, labels, train_idx, val_idx = split(args)

    def make(idx, shuffle):
        return trainer.keras_batches(datasets.point_cloud_dataset(
            examples[idx], labels[idx], args.resolution, args.batch_size, shuffle=shuffle, seed=args.seed))
    return make(train_idx, True), make(val_idx, False)


def retime(model_paths, args):
    """{lambda: [(wall seconds, process CPU seconds) of one training epoch, validation
    included, of its final model]}, lambdas interleaved round-robin, args.retime_repeats
    rounds. An epoch runs from on_epoch_begin to on_epoch_end, as train.py's EpochTimer
    counts it; the data iterator's teardown after fit (idle waits of up to ~20 s seen here)
    falls outside."""
    import keras

    class EpochClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = (time.perf_counter(), time.process_time())

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = (time.perf_counter() - self.start[0], time.process_time() - self.start[1])

    train, val = training_data(args)
    models = {lam: keras.saving.load_model(path) for lam, path in model_paths.items()}
    for model in models.values():  # trace the train and test functions outside the timing
        model.fit(train.take(2), validation_data=val.take(1), epochs=1, verbose=0)
    seconds = {lam: [] for lam in models}
    for repeat in range(args.retime_repeats):
        for lam, model in models.items():
            clock = EpochClock()
            model.fit(train, validation_data=val, epochs=1, verbose=0, callbacks=[clock])
            seconds[lam].append(clock.seconds)
            print(f"=== re-timing round {repeat + 1}: lambda {lam}: {clock.seconds[0]:.1f} s wall, "
                  f"{clock.seconds[1]:.1f} s CPU", flush=True)
    return seconds


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    p.add_argument("--resolution", type=int, default=16)
    p.add_argument("--rho", type=float, nargs="+", default=None,
                   help="density bounds per sparse block (Eq. 4 needs bounds; default: Table 4's for the resolution, "
                        "or 0.12 0.24 at 16^3 where Table 4's are 1)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--reduction", choices=("sum", "mean", "filter"), default="filter",
                   help="Eq. 4 penalty per layer (DensityRegularizer reduction)")
    p.add_argument("--prune-eps", type=float, default=0.01)
    p.add_argument("--optimizer", choices=("adam", "adagrad"), default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-examples", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--retime-repeats", type=int, default=4,
                   help="interleaved re-timing rounds of the final models (0: off)")
    p.add_argument("--work-dir", default=None,
                   help="keep each lambda's results.json and model.keras here (default: a temporary folder)")
    p.add_argument("--retime-only", action="store_true",
                   help="only re-time the final models of an earlier run (its --work-dir and the same data options) "
                        "and update experiments/results/pruning.json")
    args = p.parse_args()
    rhos = args.rho or ([0.12, 0.24] if args.resolution == 16 else None)
    if args.retime_only:
        if not args.work_dir:
            p.error("--retime-only needs the --work-dir of an earlier run")
        with open(os.path.join(RESULTS, "pruning.json")) as f:
            rows = json.load(f)
        lambdas = sorted({row["lambda"] for row in rows})
        add_retiming(rows, {lam: model_path(args.work_dir, lam) for lam in lambdas}, args)
    elif args.work_dir:
        os.makedirs(args.work_dir, exist_ok=True)
        rows = train_all(args, rhos, args.work_dir)
    else:
        with tempfile.TemporaryDirectory() as work:
            rows = train_all(args, rhos, work)
    plot(rows)


def model_path(work, lam):
    return os.path.join(work, f"pruning_{lam}", "model.keras")


def train_all(args, rhos, work):
    _, _, train_idx, val_idx = split(args)
    rows = []
    for lam in args.lambdas:
        # lambda = 0 is the baseline: neither regularisation nor pruning (as in Fig. 6).
        train_args = ["--dataset", "modelnet40", "--resolution", args.resolution, "--epochs", args.epochs,
                      "--batch-size", args.batch_size, "--max-examples", args.max_examples,
                      "--val-fraction", args.val_fraction, "--seed", args.seed, "--optimizer", args.optimizer,
                      "--lr", args.lr, "--lam", lam, "--lam-reduction", args.reduction,
                      "--prune-eps", args.prune_eps if lam > 0 else 0]
        train_args += ["--rho", *rhos] if rhos else []
        train_args += ["--data-dir", args.data_dir] if args.data_dir else []
        res = run_training(f"pruning_{lam}", train_args, work)
        present = [entry["present_weights"] for entry in res["pruning"]] or [res["present_weights"]] * args.epochs
        for epoch in range(args.epochs):
            rows.append({"lambda": lam, "epoch": epoch + 1, "present_weights": present[epoch],
                         "sec_per_epoch": res["sec_per_epoch"][epoch],
                         "val_accuracy": res["history"]["val_accuracy"][epoch],
                         "resolution": res["resolution"], "rhos": res["rhos"], "reduction": args.reduction,
                         "prune_eps": res["prune_eps"], "optimizer": args.optimizer, "lr": args.lr,
                         "train_examples": len(train_idx), "val_examples": len(val_idx)})
        write_json("pruning.json", rows)
    if args.retime_repeats > 0:
        add_retiming(rows, {lam: model_path(work, lam) for lam in args.lambdas}, args)
    return rows


def add_retiming(rows, model_paths, args):
    seconds = retime(model_paths, args)
    for lam, runs in seconds.items():
        last = [row for row in rows if row["lambda"] == lam][-1]
        last["sec_per_epoch_retimed"] = min(wall for wall, _ in runs)
        last["cpu_sec_per_epoch_retimed"] = min(cpu for _, cpu in runs)
        last["sec_per_epoch_retimed_runs"] = [wall for wall, _ in runs]
        last["cpu_sec_per_epoch_retimed_runs"] = [cpu for _, cpu in runs]
    write_json("pruning.json", rows)


def plot(rows):
    lambdas = sorted({row["lambda"] for row in rows})
    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    for lam in lambdas:
        mine = [row for row in rows if row["lambda"] == lam]
        epochs = [row["epoch"] for row in mine]
        for axis, key in zip(axes, ("present_weights", "sec_per_epoch", "val_accuracy")):
            line, = axis.plot(epochs, [row[key] for row in mine], marker="o", label=f"λ = {lam}")
            axis.set(xlabel="epoch", ylabel=key.replace("_", " "))
        if "sec_per_epoch_retimed" in mine[-1]:
            axes[1].plot([epochs[-1] + 0.3], [mine[-1]["sec_per_epoch_retimed"]], marker="*", markersize=12,
                         color=line.get_color(), linestyle="none")
    axes[0].legend()
    axes[1].set_title("★ final model re-timed (least of interleaved repeats)", fontsize=9)
    first = rows[0]
    figure.suptitle(f"Regularisation ({first['reduction']} reduction) and pruning, ModelNet40 {first['resolution']}³, "
                    f"bounds {first['rhos']}, {first['train_examples']} training shapes")
    save_figure(figure, "pruning.png")


if __name__ == "__main__":
    main()
