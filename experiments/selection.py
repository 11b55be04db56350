"""Signed vs absolute k-selection (Hackel et al. Fig. 8) on ModelNet40. Writes
experiments/results/selection.json and selection.png.

    python experiments/selection.py --resolution 16 --rho 0.06 0.12 --epochs 10
"""
import argparse
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import refuse_to_overwrite, run_training, save_figure, write_json  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", type=int, default=16)
    p.add_argument("--rho", type=float, nargs="+", default=[0.06, 0.12], help="bounds that make the selection act")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-examples", type=int, default=0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--replace", action="store_true", help="overwrite experiments/results/selection.json")
    args = p.parse_args()
    refuse_to_overwrite(p, "selection.json", args.replace)
    rows, curves = [], {}
    with tempfile.TemporaryDirectory() as work:
        for mode in ("signed", "abs"):
            train_args = ["--dataset", "modelnet40", "--resolution", args.resolution, "--rho", *args.rho,
                          "--selection", mode, "--epochs", args.epochs, "--batch-size", args.batch_size,
                          "--max-examples", args.max_examples]
            train_args += ["--data-dir", args.data_dir] if args.data_dir else []
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
