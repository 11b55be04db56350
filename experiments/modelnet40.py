"""ModelNet40 classification with OctNet3 (Hackel et al. §4.4, Table 4 bounds) at several
resolutions on ../shared/data/modelnet40_train.npz with a fixed stratified 10% validation
split. Writes experiments/results/modelnet40.json and modelnet40.png.

    python experiments/modelnet40.py --resolutions 16 32 --epochs 10

Each row of the results file is one recipe (resolution, optimiser, learning-rate schedule,
augmentation, device, examples); a rerun replaces only the row of its own recipe.

Runs too long for one sitting: give --backup-root DIR; each resolution keeps its checkpoint
and epoch log under DIR/modelnet40_<r>, and rerunning the same command (a larger --epochs
to go further) continues from the last finished epoch.
"""
import argparse
import json
import os
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import read_json, run_training, save_figure, write_json  # noqa: E402


def recipe(results):
    features = results.get("features") or ["occupancy"]
    return (f"{results['optimizer']} lr {results['lr']:g} {results['lr_schedule']}"
            + (f", augmented ({results['augment']})" if results["augment"] else "")
            + (f", features {'+'.join(features)}" if features != ["occupancy"] else "")
            + (f", weight decay {results['weight_decay']:g}" if results.get("weight_decay") else "")
            + (f", label smoothing {results['label_smoothing']:g}" if results.get("label_smoothing") else "")
            # Runs before train.py recorded its initialisation used Keras' Glorot default.
            + (", He init" if results.get("init") == "he_normal" else ""))


def result_row(res, batch_size):
    """A modelnet40.json row from a results.json of tf-sparseconv train."""
    seconds = res["sec_per_epoch"]
    row = {"resolution": res["resolution"], "epochs": res["epochs"], "val_accuracy": res["val_accuracy"],
           "sec_per_epoch": sum(seconds[1:]) / max(1, len(seconds) - 1) if len(seconds) > 1 else seconds[0],
           "peak_bytes": res["peak_rss_bytes"], "memory_bound_bytes": res["memory_bound_bytes"],
           "examples": res["examples"], "batch_size": batch_size, "rhos": res["rhos"],
           "peak_gpu_bytes": res.get("peak_gpu_bytes"), "device": res["device"],
           "recipe": recipe(res), "val_accuracy_per_epoch": res["history"]["val_accuracy"]}
    if res.get("val_accuracy_mirror_vote") is not None:
        row["val_accuracy_mirror_vote"] = res["val_accuracy_mirror_vote"]
    return row


def same_recipe(row):
    """Rows with the same key replace each other; runs of other lengths stay beside them."""
    return row["resolution"], row["recipe"], row["device"], row["examples"], row["epochs"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolutions", type=int, nargs="+", default=[16, 32])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-examples", type=int, default=0, help="stratified subset of the 9,843 shapes (0: all)")
    p.add_argument("--augment", nargs="?", const="rotate", choices=("rotate", "mirror", "scale"), default=None,
                   help="as tf-sparseconv train --augment")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--backup-root", default=None,
                   help="keep each resolution's checkpoint here and resume from it (default: no backup)")
    p.add_argument("--replace", action="store_true",
                   help="start modelnet40.json afresh (default: keep the rows of other recipes)")
    p.add_argument("--vote-mirror", action="store_true", help="as tf-sparseconv train --vote-mirror")
    p.add_argument("--weight-decay", type=float, default=0.0, help="as tf-sparseconv train --weight-decay")
    p.add_argument("--label-smoothing", type=float, default=0.0,
                   help="as tf-sparseconv train --label-smoothing")
    p.add_argument("--features", nargs="+", default=["occupancy"], help="as tf-sparseconv train --features")
    p.add_argument("--replot", action="store_true", help="only redraw modelnet40.png and print the rows, no training")
    p.add_argument("--add-results", nargs="+", metavar="RESULTS_JSON",
                   help="add the rows of runs made with tf-sparseconv train --dataset modelnet40 "
                        "(e.g. on a lent GPU), then redraw; no training")
    p.add_argument("--note", help="with --add-results: a note stored in the added rows (e.g. how they were timed)")
    args = p.parse_args()
    if args.replot:
        plot_and_print(read_json("modelnet40.json"))
        return
    if args.add_results:
        rows = read_json("modelnet40.json")
        for path in args.add_results:
            with open(path) as f:
                res = json.load(f)
            if res.get("dataset") != "modelnet40" or "examples" not in res:
                raise SystemExit(f"{path} is not the results.json of a ModelNet40 run of tf-sparseconv train "
                                 "(dataset and examples recorded)")
            row = result_row(res, res["batch_size"])
            if args.note:
                row["note"] = args.note
            rows = [k for k in rows if same_recipe(k) != same_recipe(row)] + [row]
        rows.sort(key=lambda row: row["resolution"])
        write_json("modelnet40.json", rows)
        plot_and_print(rows)
        return
    # Recipes run in different sessions share one results file: rows of other recipes are
    # kept, and the plot shows every row that carries its curve.
    kept = [] if args.replace else read_json("modelnet40.json")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for r in args.resolutions:
            train_args = ["--dataset", "modelnet40", "--resolution", r, "--epochs", args.epochs,
                          "--batch-size", args.batch_size, "--max-examples", args.max_examples]
            train_args += ["--lr", args.lr, "--lr-schedule", args.lr_schedule]
            train_args += ["--augment", args.augment] if args.augment else []
            train_args += ["--vote-mirror"] if args.vote_mirror else []
            train_args += ["--features", *args.features]
            train_args += ["--weight-decay", args.weight_decay, "--label-smoothing", args.label_smoothing]
            train_args += ["--data-dir", args.data_dir] if args.data_dir else []
            if args.backup_root:
                train_args += ["--backup-dir", os.path.join(os.path.abspath(args.backup_root), f"modelnet40_{r}")]
            res = run_training(f"modelnet40_{r}", train_args, work)
            row = result_row(res, args.batch_size)
            kept = [k for k in kept if same_recipe(k) != same_recipe(row)]
            rows.append(row)
            write_json("modelnet40.json", sorted(kept + rows, key=lambda row: row["resolution"]))
    plot_and_print(sorted(kept + rows, key=lambda row: row["resolution"]))


def plot_and_print(rows):
    figure, axis = plt.subplots(figsize=(6, 4))
    for row in rows:
        accuracy = row.get("val_accuracy_per_epoch")
        if accuracy:
            axis.plot(range(1, len(accuracy) + 1), accuracy, marker="o",
                      label=f"{row['resolution']}³, {row['recipe']}, {row['device']}")
    axis.set(xlabel="epoch", ylabel="validation accuracy", title="ModelNet40, sparse OctNet3")
    axis.legend(fontsize="small")
    save_figure(figure, "modelnet40.png")
    for row in rows:
        peak = f"{row['peak_bytes'] / 2**30:.2f} GiB" if row.get("peak_bytes") else "not recorded"
        print(f"{row['resolution']:>4}³ ({row['recipe']}, {row['device']}): val acc "
              f"{row['val_accuracy']:.4f} after {row['epochs']} epochs"
              + (f" (mirror vote {row['val_accuracy_mirror_vote']:.4f})" if "val_accuracy_mirror_vote" in row else "")
              + f", {row['sec_per_epoch']:.1f} s/epoch, peak {peak}")


if __name__ == "__main__":
    main()
