"""Signed vs absolute k-selection (Hackel et al. Fig. 8) on ModelNet40. Writes
experiments/results/selection.json and selection.png.

    python experiments/selection.py --resolution 16 --rho 0.06 0.12 --epochs 10
"""
import argparse
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import (add_training_arguments, refuse_to_overwrite, run_training, save_figure,  # noqa: E402
                    training_flags, write_json)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", type=int, default=16)
    p.add_argument("--rho", type=float, nargs="+", default=[0.06, 0.12], help="bounds that make the selection act")
    add_training_arguments(p, "selection.json", epochs=10, batch_size=32)
    args = p.parse_args()
    refuse_to_overwrite(p, "selection.json", args.replace)
    rows, curves = [], {}
    with tempfile.TemporaryDirectory() as work:
        for mode in ("signed", "abs"):
            train_args = ["--dataset", "modelnet40", "--resolution", args.resolution, "--rho", *args.rho,
                          "--selection", mode, *training_flags(args)]
            res = run_training(f"selection_{mode}", train_args, work)
            curves[mode] = res["history"]["val_accuracy"]
            rows.append({"mode": mode, "val_accuracy": res["val_accuracy"], "epochs": args.epochs,
                         "resolution": args.resolution, "rhos": args.rho})
            write_json("selection.json", rows)
    figure, axis = plt.subplots(figsize=(6, 4))
    for mode, accuracy in curves.items():
        axis.plot(range(1, len(accuracy) + 1), accuracy, marker="o", label=mode)
    axis.set(xlabel="epoch", ylabel="validation accuracy", title=f"k-selection on ModelNet40 {args.resolution}³")
    axis.legend()
    save_figure(figure, "selection.png")


if __name__ == "__main__":
    main()
