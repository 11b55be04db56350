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
MODELNET40_SHAPES = 9843
FILTER_NOTE = (": λ · Σ (w + b)² over each output channel's filter, averaged over the layer's filters "
               "(with the plain sum over all of a layer's weights, λ ≥ 0.1 outweighed the data loss, pulled "
               "every weight to −b and left the network at chance, 0.091; the mean over them barely acted; "
               "see `DensityRegularizer`).")


def load(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def gpu_epoch_rows():
    """The latest training-epoch figure per resolution measured on the GPU, from the
    direct-conv GPU benchmark file (earlier rows stay in the file as history)."""
    path = os.path.join(os.path.dirname(HERE), "benchmarks", "results", "direct_conv_gpu.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        latest = {row["resolution"]: row for row in map(json.loads, filter(str.strip, f)) if row.get("kind") == "epoch"}
    return [latest[r] for r in sorted(latest)]


def peak(row):
    if row.get("peak_bytes") is None:
        return f"— ({row['peak_note']})" if row.get("peak_note") else "—"
    text = f"{row['peak_bytes'] / 2**30:.2f} GiB"
    if row.get("peak_gpu_bytes"):
        text += f" (GPU: {row['peak_gpu_bytes'] / 2**30:.2f} GiB)"
    return text


def modelnet_section(rows):
    lines = ["## ModelNet40 (OctNet3, Table 4 bounds, 10% stratified validation split of the training set)", "",
             "| resolution | recipe | device | epochs | shapes | val. accuracy | goal | s/epoch (ours) "
             "| s/epoch (paper, Titan Xp) | peak RSS (GPU peak) | memory bound (CPU forward pass, batch 32; grows with the threads) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    subset = False
    for r in rows:
        goal = GOAL_ACCURACY.get(r["resolution"])
        seconds = f"{r['sec_per_epoch']:.0f}" if r["sec_per_epoch"] >= 100 else f"{r['sec_per_epoch']:.1f}"
        if r["examples"] < MODELNET40_SHAPES:  # a subset: the whole-set epoch, scaled by the shapes
            seconds = f"≈ {r['sec_per_epoch'] * MODELNET40_SHAPES / r['examples']:.0f}*"
            subset = True
        lines.append(f"| {r['resolution']}³ | {r['recipe']} | {r['device']} | {r['epochs']} | "
                     f"{r['examples']} | {r['val_accuracy']:.3f} | "
                     f"{f'≥ {goal}' if goal else '—'} | {seconds} | "
                     f"{PAPER_SEC_PER_EPOCH.get(r['resolution'], '—')} | {peak(r)} | "
                     f"{r['memory_bound_bytes'] / 2**20:.0f} MiB |")
    for r in rows:
        if r.get("note"):
            lines += ["", f"{r['resolution']}³, {r['recipe']}, {r['device']}: {r['note']}."]
    gpu_epochs = gpu_epoch_rows()
    if gpu_epochs:
        lines += ["", "On the lent GPU (`benchmarks/train_step.py --epoch`, `benchmarks/results/direct_conv_gpu.jsonl`): "
                  + "; ".join(f"{r['resolution']}³ {r['sec_per_epoch']:.1f} s per epoch on an {r['device']} "
                              f"(paper {PAPER_SEC_PER_EPOCH.get(r['resolution'], '—')} s)" for r in gpu_epochs) + "."]
    if subset:
        lines += ["", "\\* A run on a stratified subset (the shapes column), reduced to fit a session: its seconds "
                  "per epoch scaled to all 9,843 shapes; its accuracy is that of the subset run and not comparable."]
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
    lines += ["", "Images: those of the training set used, of which a fixed stratified 10% is held out for "
              "validation (the accuracy column)."]
    return lines


def pruning_section(rows):
    first_row = rows[0]
    lines = ["## Adaptive density regularisation and warning-shot pruning (Fig. 6)", ""]
    if "reduction" in first_row:
        lines += [f"ModelNet40 {first_row['resolution']}³, OctNet3 with bounds ρ = {first_row['rhos']}, "
                  f"{first_row['train_examples']} training and {first_row['val_examples']} validation shapes "
                  f"(stratified subset), {first_row['optimizer']} lr {first_row['lr']}, pruning ε = "
                  f"{max(r['prune_eps'] for r in rows)} for λ > 0 (λ = 0: neither regularisation nor pruning). "
                  f"Eq. 4 penalty with reduction `{first_row['reduction']}`"
                  + (FILTER_NOTE if first_row["reduction"] == "filter" else "."),
                  ""]
    retimed = all("sec_per_epoch_retimed" in [r for r in rows if r["lambda"] == lam][-1]
                  for lam in {r["lambda"] for r in rows})
    cpu = retimed and all("cpu_sec_per_epoch_retimed" in [r for r in rows if r["lambda"] == lam][-1]
                          for lam in {r["lambda"] for r in rows})
    lines += ["| λ | epochs | present weights (first → last epoch) | s/epoch, training log (first → last) | "
              + ("s/epoch, final model re-timed | " if retimed else "")
              + ("CPU s/epoch, re-timed | " if cpu else "") + "val. accuracy (last) |",
              "|---:|---:|---|---|" + ("---:|" if retimed else "") + ("---:|" if cpu else "") + "---:|"]
    for lam in sorted({r["lambda"] for r in rows}):
        mine = [r for r in rows if r["lambda"] == lam]
        first, last = mine[0], mine[-1]
        lines.append(f"| {lam} | {last['epoch']} | {first['present_weights']} → {last['present_weights']} | "
                     f"{first['sec_per_epoch']:.0f} → {last['sec_per_epoch']:.0f} | "
                     + (f"{last['sec_per_epoch_retimed']:.1f} | " if retimed else "")
                     + (f"{last['cpu_sec_per_epoch_retimed']:.1f} | " if cpu else "") + f"{last['val_accuracy']:.3f} |")
    base = [r for r in rows if r["lambda"] == 0.0]
    strongest = [r for r in rows if r["lambda"] == max(r2["lambda"] for r2 in rows)]
    if base and strongest and strongest[0]["lambda"] > 0:
        lam = strongest[0]["lambda"]
        logged = 1 - strongest[-1]["sec_per_epoch"] / base[-1]["sec_per_epoch"]
        acc, acc0 = strongest[-1]["val_accuracy"], base[-1]["val_accuracy"]
        lines += [""]
        if retimed:
            speedup = 1 - strongest[-1]["sec_per_epoch_retimed"] / base[-1]["sec_per_epoch_retimed"]
            cpu_saving = (1 - strongest[-1]["cpu_sec_per_epoch_retimed"] / base[-1]["cpu_sec_per_epoch_retimed"]
                          if cpu else None)
            lines += [f"Last epoch: λ = {lam} takes {speedup:.0%} less time per epoch than λ = 0 with the final "
                      f"models re-timed (least wall time of {len(base[-1]['sec_per_epoch_retimed_runs'])} interleaved "
                      "epochs each" + (f"; {cpu_saving:.0%} less CPU time" if cpu else "")
                      + f"). The training log's last epochs give {logged:.0%}, but they are disturbed by other work "
                      "on the shared 2-core machine and by idle waits at epoch starts.", ""]
        else:
            speedup = logged
            lines += [f"Last epoch: λ = {lam} takes {speedup:.0%} less time than λ = 0 (training log).", ""]
        n = strongest[-1].get("val_examples")
        tail = min(3, len(base), len(strongest))
        mean, mean0 = (sum(r["val_accuracy"] for r in rs[-tail:]) / tail for rs in (strongest, base))
        below = sum(r["val_accuracy"] < r0["val_accuracy"] for r, r0 in zip(strongest[-tail:], base[-tail:]))
        text = (f"Validation accuracy {acc:.3f} against {acc0:.3f} for λ = 0 at the last epoch (difference "
                f"{acc - acc0:+.3f}); over the last {tail} epochs {mean:.3f} against {mean0:.3f} (difference "
                f"{mean - mean0:+.3f}; λ = {lam} below λ = 0 in {below} of them).")
        equal = False
        if n:
            # Unpaired binomial standard error: generous, the two models see the same shapes.
            se = ((acc * (1 - acc) + acc0 * (1 - acc0)) / n) ** 0.5
            equal = abs(acc - acc0) <= 2 * se and abs(mean - mean0) <= 2 * se
            if equal:
                verdict = "both differences are within two standard errors, i.e. not distinguishable here" + (
                    ", though consistently below" if below == tail else "")
            else:
                verdict = "the accuracies are **not** equal within two standard errors"
            text += f" With {n} validation shapes the standard error of such a difference is about {se:.3f}: {verdict}."
        lines += [text, ""]
        met = speedup >= 0.6 and equal
        lines += [f"Goal (≥ 60% faster at equal accuracy): **{'met' if met else 'not met'}**. Paper: 51% faster at "
                  "λ = 0.3 after 90 epochs at OctNet3-64³, at practically identical accuracy."]
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
             "Runs use this machine's 2 CPU cores unless a table names the lent GPU (the paper used a Titan Xp GPU), at",
             "the epochs and data sizes given in each table; where that is fewer than the paper's, the table says so",
             "by its numbers.", ""]
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
