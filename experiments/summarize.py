"""Writes experiments/README.md: the measured results beside the paper's numbers.

    python experiments/summarize.py

Reads experiments/results/{modelnet40,mnist,pruning,selection}.json (whichever exist).
"""
import json
import os

from common import RESULTS

HERE = os.path.dirname(os.path.abspath(__file__))
# Hackel et al.: Table 2 (Titan Xp, s/epoch), Table 3 (MNIST), Fig. 6 (51% faster at lambda 0.3).
PAPER_SEC_PER_EPOCH = {16: 130, 32: 328, 64: 696}
PAPER_MNIST = {0.035: (0.954, 0.985), 0.05: (0.971, 0.990), 0.075: (0.976, 0.992)}
GOAL_ACCURACY = {16: 0.86, 32: 0.90}


def load(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def modelnet_section(rows):
    lines = ["## ModelNet40 (OctNet3, Table 4 bounds, 10% stratified validation split of the training set)", "",
             "| resolution | epochs | shapes | val. accuracy | goal | s/epoch (ours, 2 CPU cores) | s/epoch (paper, Titan Xp) "
             "| peak RSS | memory bound (forward, batch 32) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['resolution']}³ | {r['epochs']} | {r['examples']} | {r['val_accuracy']:.3f} | "
                     f"≥ {GOAL_ACCURACY.get(r['resolution'], '—')} | {r['sec_per_epoch']:.0f} | "
                     f"{PAPER_SEC_PER_EPOCH.get(r['resolution'], '—')} | {r['peak_bytes'] / 2**30:.2f} GiB | "
                     f"{r['memory_bound_bytes'] / 2**20:.0f} MiB |")
    return lines


def mnist_section(rows):
    lines = ["## Thresholded MNIST (v < 50 → 0; OctNet3, ρ22 = 2 ρ21)", "",
             "| ρ21 | epochs | images | val. accuracy | paper, 10 epochs | paper, 60 epochs |",
             "|---:|---:|---:|---:|---:|---:|"]
    last = {}
    for r in rows:
        last[r["rho"]] = r
    for rho, r in sorted(last.items()):
        ten, sixty = PAPER_MNIST.get(rho, ("—", "—"))
        lines.append(f"| {rho} | {r['epochs']} | {r['examples']} | {r['val_accuracy']:.3f} | {ten} | {sixty} |")
    return lines


def pruning_section(rows):
    lines = ["## Adaptive density regularisation and warning-shot pruning (Fig. 6)", "",
             "| λ | epochs | present weights (first → last epoch) | s/epoch (first → last) | val. accuracy (last) |",
             "|---:|---:|---|---|---:|"]
    for lam in sorted({r["lambda"] for r in rows}):
        mine = [r for r in rows if r["lambda"] == lam]
        first, last = mine[0], mine[-1]
        lines.append(f"| {lam} | {last['epoch']} | {first['present_weights']} → {last['present_weights']} | "
                     f"{first['sec_per_epoch']:.0f} → {last['sec_per_epoch']:.0f} | {last['val_accuracy']:.3f} |")
    base = [r for r in rows if r["lambda"] == 0.0]
    strongest = [r for r in rows if r["lambda"] == max(r2["lambda"] for r2 in rows)]
    if base and strongest and strongest[0]["lambda"] > 0:
        speedup = 1 - strongest[-1]["sec_per_epoch"] / base[-1]["sec_per_epoch"]
        lines += ["", f"Last epoch: λ = {strongest[0]['lambda']} takes {speedup:.0%} less time than λ = 0, at validation "
                      f"accuracy {strongest[-1]['val_accuracy']:.3f} against {base[-1]['val_accuracy']:.3f} (paper: 51% "
                      "faster at λ = 0.3 after 90 epochs at equal accuracy; goal: ≥ 60% at equal accuracy)."]
    return lines


def selection_section(rows):
    lines = ["## Signed vs absolute k-selection (Fig. 8)", "", "| mode | resolution | bounds | epochs | val. accuracy |",
             "|---|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['resolution']}³ | {r['rhos']} | {r['epochs']} | {r['val_accuracy']:.3f} |")
    return lines


def main():
    sections = [("modelnet40.json", modelnet_section), ("mnist.json", mnist_section),
                ("pruning.json", pruning_section), ("selection.json", selection_section)]
    lines = ["# Experiments", "",
             "Each script trains with `python -m tf_sparseconv.train` in its own process and writes JSON and a PNG to",
             "`experiments/results/`; this page is generated from those files by `python experiments/summarize.py`.",
             "Runs here use this machine's 2 CPU cores (the paper used a Titan Xp GPU), at the epochs and data sizes",
             "given in each table; where that is fewer than the paper's, the table says so by its numbers.", ""]
    for filename, render in sections:
        rows = load(filename)
        if rows:
            lines += render(rows) + ["", f"![{filename[:-5]}](results/{filename[:-5]}.png)", ""]
        else:
            lines += [f"## {filename[:-5]}", "", "Not run yet.", ""]
    with open(os.path.join(HERE, "README.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
