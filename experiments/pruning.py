"""Adaptive density regularisation and warning-shot pruning (Hackel et al. §4.3, Fig. 6):
present weights, time per epoch and accuracy over epochs for several lambda. Writes
experiments/results/pruning.json and pruning.png.

    python experiments/pruning.py --lambdas 0 0.1 0.2 0.3 --resolution 32 --epochs 10
"""
import argparse
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import run_training, save_figure, write_json  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lambdas", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3])
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--rho", type=float, nargs="+", default=None,
                   help="density bounds per sparse block (Eq. 4 needs bounds; default: Table 4's for the resolution, "
                        "or 0.12 0.24 at 16^3 where Table 4's are 1)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--prune-eps", type=float, default=0.01)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-examples", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args()
    rhos = args.rho or ([0.12, 0.24] if args.resolution == 16 else None)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for lam in args.lambdas:
            # lambda = 0 is the baseline: neither regularisation nor pruning (as in Fig. 6).
            train_args = ["--dataset", "modelnet40", "--resolution", args.resolution, "--epochs", args.epochs,
                          "--batch-size", args.batch_size, "--max-examples", args.max_examples, "--lam", lam,
                          "--prune-eps", args.prune_eps if lam > 0 else 0]
            train_args += ["--rho", *rhos] if rhos else []
            train_args += ["--data-dir", args.data_dir] if args.data_dir else []
            res = run_training(f"pruning_{lam}", train_args, work)
            present = [entry["present_weights"] for entry in res["pruning"]] or [res["present_weights"]] * args.epochs
            for epoch in range(args.epochs):
                rows.append({"lambda": lam, "epoch": epoch + 1, "present_weights": present[epoch],
                             "sec_per_epoch": res["sec_per_epoch"][epoch],
                             "val_accuracy": res["history"]["val_accuracy"][epoch]})
            write_json("pruning.json", rows)
    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    for lam in args.lambdas:
        mine = [row for row in rows if row["lambda"] == lam]
        epochs = [row["epoch"] for row in mine]
        for axis, key in zip(axes, ("present_weights", "sec_per_epoch", "val_accuracy")):
            axis.plot(epochs, [row[key] for row in mine], marker="o", label=f"λ = {lam}")
            axis.set(xlabel="epoch", ylabel=key.replace("_", " "))
    axes[0].legend()
    figure.suptitle(f"Regularisation and pruning, ModelNet40 {args.resolution}³")
    save_figure(figure, "pruning.png")


if __name__ == "__main__":
    main()
