"""Adaptive density regularisation and warning-shot pruning (Hackel et al. §4.3, Fig. 6):
present weights, time per epoch and accuracy over epochs for several lambda. Writes
experiments/results/<--results-name>.json (default pruning) and its .png figure.

    python experiments/pruning.py --resolution 16 --max-examples 3000 --epochs 8

The results file holds one row per run and epoch, tagged with --seed; the last epoch's row
of each run also carries its sparse convolutions after training (`layers`: present weights
and output density against the bound). A study repeated with another --seed adds its rows to
the same file (one figure, a row of panels per seed); rows of the same seed are replaced only
with --replace.

Each lambda trains in its own process (lambda = 0: neither regularisation nor pruning, the
baseline of Fig. 6). The Eq. 4 penalty uses --reduction (default "filter": lambda times the
sum of (w + b)^2 over each output channel's filter, averaged over the layer's filters; see
DensityRegularizer for why the plain sum over the whole layer is not the default here).

Seconds per epoch come from the training log (wall time of each epoch, validation
included). On a shared machine those are disturbed by whatever else runs (with --parallel,
by the other lambdas); and here, with the CPU idle, a fit call now and then waits 5-20 s
after on_train_end, or within a multi-epoch fit at the next epoch's first step, ending
~41 s after the epoch began whatever its work (apparently the teardown of the epoch's data
iterator; the tf.data pipeline alone shows no such wait). So afterwards the saved models
are timed again (--retime-repeats, default 4; --retime-epochs picks which epochs' models,
kept by --snapshot-epochs): one more epoch each, one fit call each so that the wait falls
outside the timed on_epoch_begin..on_epoch_end span, models interleaved round-robin. The
least wall time of the repeats (`sec_per_epoch` of the row's `retimed` entry for the
machine) is what the speed-up is computed from; the least process CPU time
(`cpu_sec_per_epoch`, all cores together), which idle waits do not inflate and other
processes much less, is kept beside it as a check. --retime-repeats 0 skips this; with
--retime-only the models of an earlier --work-dir are re-timed, e.g. on another machine
than the one that trained them:

    python experiments/pruning.py --epochs 30 --lr-schedule cosine --parallel \
        --snapshot-epochs 1 5 10 20 --work-dir W --retime-repeats 0          # on the lent GPU
    python experiments/pruning.py --retime-only --work-dir W --retime-epochs 1 5 10 20 30 \
        --retime-max-examples 3000 --retime-repeats 2                         # on the CPU
"""
import argparse
import os
import sys
import tempfile
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import (REPO, read_json, refuse_to_overwrite, replace_rows, run_training,  # noqa: E402
                    run_trainings_at_once, save_figure)

if REPO not in sys.path:  # tf_sparseconv from this checkout, as the training processes use it
    sys.path.insert(0, REPO)


def split(args, max_examples=None):
    """(examples, labels, train_idx, val_idx) exactly as `tf-sparseconv train` makes them
    (with --max-examples, or max_examples where given)."""
    from tf_sparseconv import data as datasets
    from tf_sparseconv.training import train as trainer
    data_dir = args.data_dir or trainer.DEFAULT_DATA_DIR
    examples, labels, _ = trainer.load_examples("modelnet40", data_dir, {"points": 1024, "synthetic_per_class": 150},
                                                args.seed)
    max_examples = args.max_examples if max_examples is None else max_examples
    if max_examples and max_examples < len(labels):
        keep, _ = datasets.stratified_split(labels, 1 - max_examples / len(labels), args.seed)
        examples, labels = examples[keep], labels[keep]
    train_idx, val_idx = datasets.stratified_split(labels, args.val_fraction, args.seed)
    return examples, labels, train_idx, val_idx


def training_data(args, max_examples=None):
    """The training and validation batches exactly as `tf-sparseconv train` builds them, and
    the number of training shapes."""
    from tf_sparseconv import data as datasets
    from tf_sparseconv.training import train as trainer
    examples, labels, train_idx, val_idx = split(args, max_examples)

    def make(idx, shuffle):
        return trainer.keras_batches(datasets.point_cloud_dataset(
            examples[idx], labels[idx], args.resolution, args.batch_size, shuffle=shuffle, seed=args.seed))
    return make(train_idx, True), make(val_idx, False), len(train_idx)


def retime(model_paths, args):
    """({key: [(wall seconds, process CPU seconds) of one training epoch, validation
    included]}, training shapes per epoch) for the models of model_paths ({key: path}),
    interleaved round-robin, args.retime_repeats rounds, on --retime-max-examples shapes
    (default: the training run's). An epoch runs from on_epoch_begin to on_epoch_end, as train.py's EpochTimer
    counts it; the data iterator's teardown after fit (idle waits of up to ~20 s seen here)
    falls outside. Each model is loaded once and its timed epochs train it further (its
    masks stay as saved: no pruning callback runs here; after a cosine schedule its
    learning rate is 0, so its weights stay as saved too)."""
    import keras

    from tf_sparseconv.models import core_model

    class EpochClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = (time.perf_counter(), time.process_time())

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = (time.perf_counter() - self.start[0], time.process_time() - self.start[1])

    train, val, train_examples = training_data(args, args.retime_max_examples)
    models = {key: keras.saving.load_model(path) for key, path in model_paths.items()}
    for key, model in models.items():
        if not model.compiled or core_model(model) is not model:
            raise SystemExit(f"{model_paths[key]} is not a trained sparse core (a point-cloud model.keras?); "
                             "re-time epoch snapshots (train with --snapshot-epochs)")
    for model in models.values():  # trace the train and test functions outside the timing
        model.fit(train.take(2), validation_data=val.take(1), epochs=1, verbose=0)
    seconds = {key: [] for key in models}
    for repeat in range(args.retime_repeats):
        for key, model in models.items():
            clock = EpochClock()
            model.fit(train, validation_data=val, epochs=1, verbose=0, callbacks=[clock])
            seconds[key].append(clock.seconds)
            print(f"=== re-timing round {repeat + 1}/{args.retime_repeats}: {key[0]}, epoch {key[1]}: "
                  f"{clock.seconds[0]:.1f} s wall, {clock.seconds[1]:.1f} s CPU", flush=True)
    return seconds, train_examples


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
    p.add_argument("--prune-eps", type=float, nargs="+", default=[0.01],
                   help="pruning thresholds; each lambda > 0 trains once per threshold")
    p.add_argument("--lam-terms", nargs="+", choices=("weights+biases", "weights"), default=["weights+biases"],
                   help="what Eq. 4 pulls towards -b (train.py --lam-terms); each lambda > 0 trains once per choice")
    p.add_argument("--lam-density", choices=("layer", "channel"), default="layer",
                   help="train.py --lam-density for every lambda > 0: Eq. 4's rho over the layer or per channel")
    p.add_argument("--finetune-epochs", type=int, nargs="+", default=[0],
                   help="train.py --finetune-epochs for every lambda > 0 (the last N epochs without Eq. 4 and "
                        "pruning); each lambda > 0 trains once per value")
    p.add_argument("--optimizer", choices=("adam", "adagrad", "sgd"), default="adam")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-examples", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0,
                   help="data split, initialisation and shuffling; the file keeps each seed's rows")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--parallel", action="store_true",
                   help="train the lambdas as concurrent processes (on a GPU they share it; their training-log "
                        "seconds then include the sharing)")
    p.add_argument("--snapshot-epochs", type=int, nargs="+", default=[],
                   help="keep each lambda's model after these epochs too (for --retime-epochs)")
    p.add_argument("--retime-repeats", type=int, default=4,
                   help="interleaved re-timing rounds of the saved models (0: off)")
    p.add_argument("--retime-epochs", type=int, nargs="+", default=None,
                   help="re-time the models of these epochs (snapshots, or the last epoch; default: the last)")
    p.add_argument("--retime-max-examples", type=int, default=None,
                   help="re-time on a stratified subset of this many shapes (default: the training run's)")
    p.add_argument("--work-dir", default=None,
                   help="keep each lambda's results.json and models here (default: a temporary folder)")
    p.add_argument("--results-name", default="pruning",
                   help="write experiments/results/<name>.json and .png (a second study beside the main one)")
    p.add_argument("--replace", action="store_true",
                   help="overwrite the rows of this --seed where the results file already holds some")
    p.add_argument("--retime-only", action="store_true",
                   help="only re-time the models of an earlier run (its --work-dir, --seed and the same data "
                        "options) and update its rows of experiments/results/<--results-name>.json")
    args = p.parse_args()
    rhos = args.rho or ([0.12, 0.24] if args.resolution == 16 else None)
    filename = f"{args.results_name}.json"
    if args.retime_only:
        if not args.work_dir:
            p.error("--retime-only needs the --work-dir of an earlier run")
        rows = seeds_of(read_json(filename)).get(args.seed)
        if not rows:
            p.error(f"experiments/results/{filename} holds no rows of seed {args.seed}")
        for row in rows:  # files written before runs were named: one run per lambda
            row.setdefault("run", f"pruning_{row['lambda']}")
        add_retiming(rows, args.work_dir, args)
    else:
        refuse_to_overwrite(p, filename, args.replace, lambda row: row.get("seed", 0) == args.seed)
        if args.work_dir:
            os.makedirs(args.work_dir, exist_ok=True)
            train_all(args, rhos, args.work_dir)
        else:
            with tempfile.TemporaryDirectory() as work:
                train_all(args, rhos, work)
    rows = read_json(filename)
    plot(rows, args.results_name)
    summary(rows)


def save_rows(rows, args):
    """Puts rows (of args.seed) into the results file in place of that seed's rows, keeping the other seeds."""
    return replace_rows(f"{args.results_name}.json", rows, lambda row: row.get("seed", 0) == args.seed,
                        order=lambda row: row.get("seed", 0))


def model_path(work, run, epoch, last=False):
    """A run's sparse core after the given epoch: its snapshot (train.py's naming), or for
    the last epoch of a run trained before train.py saved a point-cloud model as
    model.keras and kept no snapshot of that epoch, model.keras (then the core itself)."""
    from tf_sparseconv.training.train import snapshot_path
    out = os.path.join(work, run)
    path = snapshot_path(out, epoch)
    return os.path.join(out, "model.keras") if last and not os.path.exists(path) else path


def configurations(args):
    """{run name: (lambda, pruning threshold, Eq. 4 terms, fine-tuning epochs)}: lambda = 0
    is the baseline, neither regularisation nor pruning (as in Fig. 6); every lambda > 0 once
    per threshold, choice of terms and fine-tuning length. Names carry those only where the
    study varies them."""
    runs = {}
    for lam in args.lambdas:
        if lam == 0:
            runs[f"pruning_{lam}"] = (lam, 0.0, None, 0)
            continue
        for eps in args.prune_eps:
            for terms in args.lam_terms:
                for finetune in args.finetune_epochs:
                    name = f"pruning_{lam}" + (f"_eps{eps}" if len(args.prune_eps) > 1 else "") \
                        + (f"_{terms}" if len(args.lam_terms) > 1 else "") \
                        + (f"_ft{finetune}" if len(args.finetune_epochs) > 1 else "")
                    runs[name] = (lam, eps, terms, finetune)
    return runs


def runs_of(rows):
    """The runs of a results file in (seed, lambda, threshold, terms, fine-tuning) order, each [its rows by epoch]."""
    def run(row):
        return row.get("seed", 0), row["run"]
    names = sorted({run(row) for row in rows}, key=lambda n: next(
        (n[0], r["lambda"], r["prune_eps"], r.get("lam_terms") or "", r.get("finetune_epochs") or 0)
        for r in rows if run(r) == n))
    return [[row for row in rows if run(row) == name] for name in names]


def seeds_of(rows):
    """{seed: its rows} of a results file, seeds in order (rows that name none: seed 0)."""
    seeds = {}
    for row in rows:
        seeds.setdefault(row.get("seed", 0), []).append(row)
    return dict(sorted(seeds.items()))


def variant_note(row):
    """What a run did beyond the plain Eq. 4 and pruning: its rho per channel, and its last N
    epochs trained without Eq. 4 and pruning."""
    return ((", ρ per channel" if row.get("lam_density") == "channel" else "")
            + (f", last {row['finetune_epochs']} epochs fine-tuned" if row.get("finetune_epochs") else ""))


def label(row):
    if row["lambda"] == 0:
        return "λ = 0"
    terms = ", weights only" if row.get("lam_terms") == "weights" else ""
    return f"λ = {row['lambda']}, ε = {row['prune_eps']}{terms}{variant_note(row)}"


def train_all(args, rhos, work):
    _, _, train_idx, val_idx = split(args)
    runs = {}
    for name, (lam, eps, terms, finetune) in configurations(args).items():
        train_args = ["--dataset", "modelnet40", "--resolution", args.resolution, "--epochs", args.epochs,
                      "--batch-size", args.batch_size, "--max-examples", args.max_examples,
                      "--val-fraction", args.val_fraction, "--seed", args.seed, "--optimizer", args.optimizer,
                      "--lr", args.lr, "--lr-schedule", args.lr_schedule, "--lam", lam, "--prune-eps", eps]
        train_args += ["--lam-reduction", args.reduction, "--lam-density", args.lam_density] if lam > 0 else []
        train_args += ["--lam-terms", terms] if terms else []
        train_args += ["--finetune-epochs", finetune] if finetune else []
        train_args += ["--rho", *rhos] if rhos else []
        train_args += ["--data-dir", args.data_dir] if args.data_dir else []
        # the last epoch's snapshot too: model.keras takes point clouds, the re-timing the sparse core
        train_args += ["--snapshot-epochs", *sorted(set(args.snapshot_epochs) | {args.epochs})]
        runs[name] = train_args
    if args.parallel:
        results = run_trainings_at_once(runs, work)
    else:
        results = {name: run_training(name, a, work) for name, a in runs.items()}
    rows = []
    for name, res in results.items():
        present = [entry["present_weights"] for entry in res["pruning"]] or [res["present_weights"]] * args.epochs
        for epoch in range(args.epochs):
            rows.append({"run": name, "seed": args.seed, "lambda": res["lambda"],
                         "lam_terms": res.get("lam_terms") if res["lambda"] > 0 else None,
                         "finetune_epochs": res.get("finetune_epochs", 0),
                         "lam_density": res.get("lam_density") if res["lambda"] > 0 else None,
                         "epoch": epoch + 1, "present_weights": present[epoch],
                         "sec_per_epoch": res["sec_per_epoch"][epoch],
                         "val_accuracy": res["history"]["val_accuracy"][epoch],
                         "train_accuracy": res["history"]["accuracy"][epoch],
                         "resolution": res["resolution"], "rhos": res["rhos"], "reduction": args.reduction,
                         "prune_eps": res["prune_eps"], "optimizer": args.optimizer, "lr": args.lr,
                         "lr_schedule": args.lr_schedule, "device": res["device"], "parallel": args.parallel,
                         "train_examples": len(train_idx), "val_examples": len(val_idx),
                         "snapshot": epoch + 1 in args.snapshot_epochs or epoch + 1 == args.epochs})
        rows[-1]["layers"] = res["layers"]  # each sparse convolution after the last epoch
    save_rows(rows, args)
    if args.retime_repeats > 0:
        add_retiming(rows, work, args)
    return rows


def add_retiming(rows, work, args):
    """Re-times the models of --retime-epochs (default: the last) of every run on this
    machine and adds the figures to those rows' "retimed" lists (one entry per device and
    shape count; a later run on the same replaces it)."""
    from tf_sparseconv.training.train import device_description
    last = max(row["epoch"] for row in rows)
    epochs = args.retime_epochs or [last]
    paths = {}
    for run in runs_of(rows):
        for epoch in epochs:
            path = model_path(work, run[0]["run"], epoch, last=epoch == last)
            if not os.path.exists(path):
                raise SystemExit(f"no model of {run[0]['run']} after epoch {epoch} at {path} "
                                 "(train with --snapshot-epochs to keep one)")
            paths[(run[0]["run"], epoch)] = path
    seconds, train_examples = retime(paths, args)
    device = device_description()
    for (name, epoch), runs in seconds.items():
        row = next(r for r in rows if r["run"] == name and r["epoch"] == epoch)
        entry = {"device": device, "train_examples": train_examples,
                 "sec_per_epoch": min(wall for wall, _ in runs), "sec_runs": [wall for wall, _ in runs],
                 "cpu_sec_per_epoch": min(cpu for _, cpu in runs), "cpu_sec_runs": [cpu for _, cpu in runs]}
        row["retimed"] = [e for e in row.get("retimed", [])
                          if (e["device"], e["train_examples"]) != (device, train_examples)] + [entry]
    save_rows(rows, args)


def retimed_devices(rows):
    """The devices the rows were re-timed on, CPUs first."""
    return sorted({e["device"] for r in rows for e in r.get("retimed", [])}, key=lambda d: (not d.startswith("CPU"), d))


def retimed_series(run, device):
    """[(epoch, retimed entry)] of one run's rows on one device."""
    return [(r["epoch"], e) for r in run for e in r.get("retimed", []) if e["device"] == device]


def plot(rows, name="pruning"):
    """The figure of a results file: present weights, seconds and accuracy per epoch, one row
    of panels per seed."""
    seeds = seeds_of(rows)
    figure, grid = plt.subplots(len(seeds), 3, figsize=(13, 4 * len(seeds)), squeeze=False)
    for axes, (seed, seed_rows) in zip(grid, seeds.items()):
        plot_seed(axes, seed_rows)
        if len(seeds) > 1:
            axes[0].set_title(f"seed {seed}")
    first = rows[0]
    figure.suptitle(f"Regularisation ({first['reduction']} reduction) and pruning, ModelNet40 {first['resolution']}³, "
                    f"bounds {first['rhos']}, {first['train_examples']} training shapes, trained on "
                    f"{first.get('device', 'CPU')}")
    save_figure(figure, f"{name}.png")


def plot_seed(axes, rows):
    devices = retimed_devices(rows)
    for run in runs_of(rows):
        epochs = [row["epoch"] for row in run]
        for axis, key in zip(axes, ("present_weights", "sec_per_epoch", "val_accuracy")):
            line, = axis.plot(epochs, [row[key] for row in run], marker="o", markersize=3, label=label(run[0]))
        if devices:
            series = retimed_series(run, devices[0])
            axes[1].plot([e for e, _ in series], [entry["sec_per_epoch"] for _, entry in series], marker="*",
                         markersize=10, linestyle="--", color=line.get_color())
    for axis, key in zip(axes, ("present weights", "s per epoch (training log)", "validation accuracy")):
        axis.set(xlabel="epoch", ylabel=key)
    axes[0].legend(fontsize=8)
    if devices:
        shapes = next(e["train_examples"] for r in rows for e in r.get("retimed", []) if e["device"] == devices[0])
        axes[1].set_title(f"★ models re-timed on {devices[0]}, {shapes} training shapes (least of interleaved repeats)",
                          fontsize=8)


def summary(rows):
    devices = retimed_devices(rows)
    several = len(seeds_of(rows)) > 1
    print(f"{'run':<26}{'present weights':>16}{'val. accuracy':>15}  re-timed s/epoch at epochs")
    for run in runs_of(rows):
        last = run[-1]
        name = (f"seed {last.get('seed', 0)}: " if several else "") + label(last)
        print(f"{name:<26}{last['present_weights']:>16}{last['val_accuracy']:>15.3f}  " + "; ".join(
            f"{device}: " + ", ".join(f"{e}: {entry['sec_per_epoch']:.1f}" for e, entry in retimed_series(run, device))
            for device in devices))


if __name__ == "__main__":
    main()
