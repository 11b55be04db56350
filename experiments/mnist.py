"""Thresholded MNIST with OctNet3 over the paper's density-bound grid rho_21 (Hackel et
al. §4.2, Table 3; rho_22 = 2 rho_21). Writes experiments/results/mnist.json and mnist.png.

    python experiments/mnist.py --rhos 0.035 0.05 0.075 --epochs 10
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
    p.add_argument("--rhos", type=float, nargs="+", default=[0.035, 0.05, 0.075])
    add_training_arguments(p, "mnist.json", epochs=10, batch_size=50,
                           max_examples_help="stratified subset of the 60,000 images (0: all)")
    args = p.parse_args()
    refuse_to_overwrite(p, "mnist.json", args.replace)
    rows, curves = [], {}
    with tempfile.TemporaryDirectory() as work:
        for rho in args.rhos:
            train_args = ["--dataset", "mnist", "--rho", rho, 2 * rho, *training_flags(args)]
            res = run_training(f"mnist_{rho}", train_args, work)
            curves[rho] = res["history"]["val_accuracy"]
            for epoch, accuracy in enumerate(curves[rho], start=1):
                rows.append({"rho": rho, "epochs": epoch, "val_accuracy": accuracy,
                             "sec_per_epoch": res["sec_per_epoch"][epoch - 1],
                             "examples": args.max_examples or 60000})
            write_json("mnist.json", rows)
    figure, axis = plt.subplots(figsize=(6, 4))
    for rho, accuracy in curves.items():
        axis.plot(range(1, len(accuracy) + 1), accuracy, marker="o", label=f"ρ21 = {rho}")
    axis.set(xlabel="epoch", ylabel="validation accuracy", title="Thresholded MNIST (v < 50 → 0)")
    axis.legend()
    save_figure(figure, "mnist.png")


if __name__ == "__main__":
    main()
