"""ModelNet40 classification (issue 27): OctNet3 and the site ResNet trained on
../shared/data/modelnet40_train.npz, chosen on a validation split that mirrors the official
test split's class balance. Writes experiments/results/modelnet40.json and modelnet40.png.

    python experiments/modelnet40.py --list                      # the recipes and their commands
    python experiments/modelnet40.py --run octnet3-32 --backup-root /tmp/mn40_backup
    python experiments/modelnet40.py --add-results octnet3-32 runs/<run>/results.json  # a run made elsewhere
    python experiments/modelnet40.py --add-test octnet3-32 <eval folder>/metrics.json     # once, at the end
    python experiments/modelnet40.py --final octnet3-32          # the chosen recipe on every training shape

The protocol: every recipe holds out `--val-split modelnet40-test` (from the training
shapes only: 50 of a class with 100 test shapes, 43, 25 or 10 of the others, at most a
quarter of a class), and reports each epoch the overall accuracy, the mean per-class
accuracy and the overall accuracy reweighted to the test's class balance (with its standard
error at the end). Recipes, epochs and votes are chosen by those numbers alone; the
official test split is scored once per chosen model (`tf-sparseconv evaluate MODEL --data
<ModelNet40 test>`) and added with --add-test, never used to choose. --final trains a chosen
recipe once more on every training shape (--val-split none, its epochs as chosen): a row
RECIPE-final without validation scores, which the test split alone scores.

A run keeps its model under --out-root/<recipe>/model.keras (for `tf-sparseconv evaluate`)
and, with --backup-root, its checkpoint under --backup-root/<recipe>: the same command again
continues from the last finished epoch (across device calls on a lent GPU:
dev/device_modelnet40.sh). Each row of the results file is one run; a rerun of a recipe on
the same device replaces its row. Rows of the earlier protocol (a 10% stratified split)
stay in the file with "val_split": "stratified 0.1".
"""
import argparse
import json
import os
import shlex
import shutil
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from common import REPO, read_json, replace_rows, run_training, save_figure  # noqa: E402

RESULTS_FILE = "modelnet40.json"
# Every recipe: ModelNet40's training shapes, a validation split in the official test's
# class proportions, Adam with a cosine decay over the run, batch 32.
TRAINING = ["--batch-size", "32", "--lr", "0.001", "--lr-schedule", "cosine", "--seed", "0"]
PROTOCOL = ["--dataset", "modelnet40", "--val-split", "modelnet40-test", "--val-per-class", "50", *TRAINING]
# A final model (--final): the recipe on every training shape.
FINAL_PROTOCOL = ["--dataset", "modelnet40", "--val-split", "none", *TRAINING]
# The best 32^3 recipe of the earlier protocol (experiments/README.md: occupancy and offset
# features, decoupled weight decay 0.5, label smoothing 0.1) is the starting point of each.
REGULARISED = ["--features", "occupancy", "offset", "--weight-decay", "0.5", "--label-smoothing", "0.1"]
# Epochs: what one 30-minute lease of two GPUs holds with five runs side by side (a 32^3
# OctNet3 epoch took 22-28 s beside another run on one GPU, a 64^3 one 47 s); the earlier
# protocol's 32^3 runs had 40, and its best epochs came from 14 on.
RECIPES = {
    "octnet3-32": ("OctNet3 at 32^3 (Table 4 bounds), the earlier protocol's best recipe",
                   ["--model", "octnet3", "--resolution", "32", "--epochs", "30", *REGULARISED]),
    "octnet3-32-rotate12": ("as octnet3-32, trained on the 12 rotations about z and voting over them (VRN/MVCNN)",
                            ["--model", "octnet3", "--resolution", "32", "--epochs", "60", *REGULARISED,
                             "--augment", "rotate12", "--vote", "rotations-12"]),
    "octnet3-32-long": ("octnet3-32 trained twice as long (60 epochs, the cosine decay stretched over them)",
                        ["--model", "octnet3", "--resolution", "32", "--epochs", "60", *REGULARISED]),
    "site-resnet-32": ("the site-sparse ResNet at 32^3: channels 32, 64, 128, two residual blocks per level",
                       ["--model", "site-resnet", "--resolution", "32", "--epochs", "30", *REGULARISED,
                        "--site-channels", "32", "64", "128", "--site-blocks", "2"]),
    "site-resnet-32-wide": ("site-resnet-32 with twice the channels (64, 128, 256)",
                            ["--model", "site-resnet", "--resolution", "32", "--epochs", "30", *REGULARISED,
                             "--site-channels", "64", "128", "256", "--site-blocks", "2"]),
    "site-resnet-32-deep": ("site-resnet-32 with a fourth level (32, 64, 128, 256: down to 4^3)",
                            ["--model", "site-resnet", "--resolution", "32", "--epochs", "30", *REGULARISED,
                             "--site-channels", "32", "64", "128", "256", "--site-blocks", "2"]),
    "site-resnet-32-mirror": ("site-resnet-32 trained on mirror images (x negated at random), voting over each "
                              "shape and its mirror image",
                              ["--model", "site-resnet", "--resolution", "32", "--epochs", "30", *REGULARISED,
                               "--site-channels", "32", "64", "128", "--site-blocks", "2", "--augment", "mirror",
                               "--vote", "mirror"]),
    "site-resnet-32-wide-mirror": ("site-resnet-32-wide trained on mirror images and voting over each shape and its "
                                   "mirror image (the two changes that each helped site-resnet-32, together)",
                                   ["--model", "site-resnet", "--resolution", "32", "--epochs", "30", *REGULARISED,
                                    "--site-channels", "64", "128", "256", "--site-blocks", "2", "--augment",
                                    "mirror", "--vote", "mirror"]),
    "octnet3-32-aniso": ("octnet3-32 trained on shapes scaled by a factor per axis (--augment aniso: proportions "
                         "vary as between CAD models of one class)",
                         ["--model", "octnet3", "--resolution", "32", "--epochs", "30", *REGULARISED,
                          "--augment", "aniso"]),
    "site-resnet-32-wide-aniso": ("site-resnet-32-wide with --augment aniso (the site nets learn the training "
                                  "shapes completely without augmentation)",
                                  ["--model", "site-resnet", "--resolution", "32", "--epochs", "30", *REGULARISED,
                                   "--site-channels", "64", "128", "256", "--site-blocks", "2", "--augment", "aniso"]),
    "octnet3-32-turn10": ("octnet3-32 trained on shapes turned about z by up to 10 degrees either way (--augment "
                          "turn10): the validated octnet3-32 loses 1.4 to 3.6 points on its validation shapes turned "
                          "by 5 or 10 degrees, so it leans on the voxel grid's exact alignment",
                          ["--model", "octnet3", "--resolution", "32", "--epochs", "30", *REGULARISED,
                           "--augment", "turn10"]),
    "octnet3-32-normals": ("octnet3-32 with the surface normals as three more voxel features, estimated from "
                           "each point's 16 nearest neighbours (--estimate-normals 16; the saved model estimates "
                           "them itself from x, y, z)",
                           ["--model", "octnet3", "--resolution", "32", "--epochs", "30", "--features", "occupancy",
                            "normals", "offset", "--estimate-normals", "16", "--weight-decay", "0.5",
                            "--label-smoothing", "0.1"]),
    # Members of an ensemble with octnet3-32: other initialisations and shuffling (--seed), the
    # same validation examples (--split-seed 0), scored together by tf-sparseconv evaluate.
    **{f"octnet3-32-seed{seed}": (f"octnet3-32 with --seed {seed} and the validation split of seed 0 (--split-seed "
                                  "0): a member of an ensemble with octnet3-32",
                                  ["--model", "octnet3", "--resolution", "32", "--epochs", "30", *REGULARISED,
                                   "--seed", str(seed), "--split-seed", "0"]) for seed in (1, 2)},
    # turn10, the best single member, with other seeds: members of a larger ensemble
    **{f"octnet3-32-turn10-seed{seed}": (f"octnet3-32-turn10 with --seed {seed} and the validation split of seed 0 "
                                         "(--split-seed 0): a member of an ensemble with octnet3-32",
                                         ["--model", "octnet3", "--resolution", "32", "--epochs", "30", *REGULARISED,
                                          "--augment", "turn10", "--seed", str(seed), "--split-seed", "0"])
       for seed in (1, 2)},
    # the wider mirrored site ResNet with other seeds: members of an ensemble with octnet3-32-long
    **{f"site-resnet-32-wide-mirror-seed{seed}": (f"site-resnet-32-wide-mirror with --seed {seed} and the validation "
                                                  "split of seed 0 (--split-seed 0)",
                                                  ["--model", "site-resnet", "--resolution", "32", "--epochs", "30",
                                                   *REGULARISED, "--site-channels", "64", "128", "256",
                                                   "--site-blocks", "2", "--augment", "mirror", "--vote", "mirror",
                                                   "--seed", str(seed), "--split-seed", "0"])
       for seed in (1, 2)},
    "octnet3-64": ("OctNet3 at 64^3 (Table 4 bounds), the recipe of octnet3-32",
                   ["--model", "octnet3", "--resolution", "64", "--epochs", "20", *REGULARISED]),
    "site-resnet-64": ("the site-sparse ResNet at 64^3: channels 32, 64, 128, 256, two residual blocks per level",
                       ["--model", "site-resnet", "--resolution", "64", "--epochs", "20", *REGULARISED,
                        "--site-channels", "32", "64", "128", "256", "--site-blocks", "2"]),
    "octnet3-64-mirror": ("octnet3-64 trained on mirror images and voting over each shape and its mirror image",
                          ["--model", "octnet3", "--resolution", "64", "--epochs", "20", *REGULARISED,
                           "--augment", "mirror", "--vote", "mirror"]),
    # octnet3-64-mirror still gained 2 points in its last 6 epochs: twice as long, two seeds
    # (members of a 64^3 ensemble; trained across two leases with --backup-dir).
    **{"octnet3-64-mirror-long" + (f"-seed{seed}" if seed else ""): (
        "octnet3-64-mirror trained twice as long (40 epochs)" + (f", with --seed {seed} and the validation split "
                                                                 "of seed 0" if seed else ""),
        ["--model", "octnet3", "--resolution", "64", "--epochs", "40", *REGULARISED, "--augment", "mirror",
         "--vote", "mirror", *(["--seed", str(seed), "--split-seed", "0"] if seed else [])])
       for seed in (0, 1)},
    # What made the best 32^3 site net (twice the channels, mirror images), at 64^3, with
    # three seeds: members of an ensemble at 64^3.
    **{"site-resnet-64-wide-mirror" + (f"-seed{seed}" if seed else ""): (
        "site-resnet-64 with twice the channels (64, 128, 256, 512), trained on mirror images and voting over each "
        "shape and its mirror image" + (f", with --seed {seed} and the validation split of seed 0" if seed else ""),
        ["--model", "site-resnet", "--resolution", "64", "--epochs", "30", *REGULARISED,
         "--site-channels", "64", "128", "256", "512", "--site-blocks", "2", "--augment", "mirror", "--vote", "mirror",
         *(["--seed", str(seed), "--split-seed", "0"] if seed else [])])
       for seed in (0, 1, 2, 3)},
    "site-resnet-64-wide-rotate12": ("site-resnet-64 with twice the channels (64, 128, 256, 512), trained on the 12 "
                                     "rotations about z and voting over them (VRN/MVCNN)",
                                     ["--model", "site-resnet", "--resolution", "64", "--epochs", "30", *REGULARISED,
                                      "--site-channels", "64", "128", "256", "512", "--site-blocks", "2",
                                      "--augment", "rotate12", "--vote", "rotations-12"]),
}
# Ensembles of recipes trained with the same validation examples: scored on the validation
# split by `tf-sparseconv evaluate MEMBER ... --split val` (the mean of the members' softmax
# outputs) and added with --add-ensemble; their final models are the members' finals.
# Each: what it is, its members, the vote every member scores under (tf-sparseconv evaluate --vote).
ENSEMBLES = {
    "octnet3-32-ensemble4": ("the mean softmax of octnet3-32, octnet3-32-seed1, octnet3-32-seed2 and "
                             "octnet3-32-turn10 (the validated runs of one recipe's three seeds, and its turn10 "
                             "variant)", ["octnet3-32", "octnet3-32-seed1", "octnet3-32-seed2", "octnet3-32-turn10"],
                             "none"),
    # Ensembles of both families (2026-11-29): the 60-epoch OctNet3, the wider mirrored site
    # ResNet and the rotation-trained OctNet3, each scored with its mirror image.
    "mixed-32-ensemble2": ("the mean softmax of octnet3-32-long and site-resnet-32-wide-mirror, each shape and "
                           "its mirror image", ["octnet3-32-long", "site-resnet-32-wide-mirror"], "mirror"),
    "mixed-32-ensemble3": ("mixed-32-ensemble2 and octnet3-32-rotate12, each shape and its mirror image",
                           ["octnet3-32-long", "site-resnet-32-wide-mirror", "octnet3-32-rotate12"], "mirror"),
    "mixed-32-ensemble5": ("mixed-32-ensemble3 and site-resnet-32-wide-mirror's seeds 1 and 2, each shape and its "
                           "mirror image", ["octnet3-32-long", "site-resnet-32-wide-mirror", "octnet3-32-rotate12",
                                            "site-resnet-32-wide-mirror-seed1", "site-resnet-32-wide-mirror-seed2"],
                           "mirror"),
    # 64^3 (2026-11-29): the wider mirrored site ResNet's seeds, and with the mirrored OctNet3.
    **{f"site-resnet-64-wide-mirror-ensemble{n}": (
        f"the mean softmax of site-resnet-64-wide-mirror and its seeds 1 to {n - 1}, each shape and its mirror image",
        ["site-resnet-64-wide-mirror", *[f"site-resnet-64-wide-mirror-seed{seed}" for seed in range(1, n)]], "mirror")
       for n in (3, 4)},
    "mixed-64-ensemble4": ("the mean softmax of octnet3-64-mirror and site-resnet-64-wide-mirror-ensemble3's three "
                           "members, each shape and its mirror image",
                           ["octnet3-64-mirror", "site-resnet-64-wide-mirror", "site-resnet-64-wide-mirror-seed1",
                            "site-resnet-64-wide-mirror-seed2"], "mirror"),
    "mixed-64-ensemble6": ("mixed-64-ensemble4 and site-resnet-64-wide-mirror-seed3 and site-resnet-64-wide-rotate12, "
                           "each shape and its mirror image",
                           ["octnet3-64-mirror", "site-resnet-64-wide-mirror", "site-resnet-64-wide-mirror-seed1",
                            "site-resnet-64-wide-mirror-seed2", "site-resnet-64-wide-mirror-seed3",
                            "site-resnet-64-wide-rotate12"], "mirror"),
    "octnet3-64-mirror-ensemble3": ("the mean softmax of octnet3-64-mirror and the 40-epoch octnet3-64-mirror-long "
                                    "and its seed 1, each shape and its mirror image",
                                    ["octnet3-64-mirror", "octnet3-64-mirror-long", "octnet3-64-mirror-long-seed1"],
                                    "mirror"),
    "site-resnet-32-wide-mirror-ensemble3": ("the mean softmax of site-resnet-32-wide-mirror and its seeds 1 and 2, "
                                             "each shape and its mirror image",
                                             ["site-resnet-32-wide-mirror", "site-resnet-32-wide-mirror-seed1",
                                              "site-resnet-32-wide-mirror-seed2"], "mirror"),
}
# Options of this script that override a recipe's (for smoke runs); a recorded command
# carries them after the recipe's flags.
OVERRIDES = ("--epochs", "--max-examples", "--resolution")
# What a row keeps of a run's results.json (the schema first, then what explains it).
ROW_KEYS = ("model", "resolution", "epochs", "val_overall", "val_mean_class", "vote", "memory_bound_bytes",
            "train_s_per_epoch", "device", "command")


def train_args(name, overrides, data_dir=None, out_root=None, backup_root=None, final=False):
    """The flags of tf-sparseconv train for recipe name: the protocol, the recipe, then
    overrides (flag -> value, later flags win in argparse), the data and the folders. final:
    the recipe on every training shape (--val-split none), without its vote (which scores
    validation shapes; evaluate --vote does it on a test split)."""
    recipe = RECIPES[name][1]
    args = FINAL_PROTOCOL + without_vote(recipe) if final else PROTOCOL + recipe
    for flag, value in overrides.items():
        args += [flag, str(value)]
    args += ["--data-dir", data_dir] if data_dir else []
    args += ["--backup-dir", os.path.join(os.path.abspath(backup_root), name + ("-final" if final else ""))] \
        if backup_root else []
    return [str(a) for a in args]


def without_vote(flags):
    """flags with --vote and its value left out."""
    if "--vote" not in flags:
        return list(flags)
    at = flags.index("--vote")
    return flags[:at] + flags[at + 2:]


# Flags of a recorded command that say where, not what: left out when a run is matched to its recipe.
PLACE_FLAGS = {"--data-dir": 1, "--out": 1, "--backup-dir": 1, "--overwrite": 0}


def reproducing_command(command):
    """`python experiments/modelnet40.py --run ...` that repeats the training of a recorded
    `tf-sparseconv train` command (the same flags apart from the folders), or None."""
    words = shlex.split(command)[2:]
    what = []
    while words:
        word = words.pop(0)
        if word in PLACE_FLAGS:
            del words[:PLACE_FLAGS[word]]
        else:
            what.append(word)
    for name, final in [(name, final) for name in RECIPES for final in (False, True)]:
        recipe = train_args(name, {}, final=final)
        if what[:len(recipe)] != recipe:
            continue
        rest, overrides = what[len(recipe):], []
        while len(rest) >= 2 and rest[0] in OVERRIDES:
            overrides += rest[:2]
            rest = rest[2:]
        if not rest:
            return shlex.join(["python", "experiments/modelnet40.py", "--final" if final else "--run", name,
                               *overrides])
    return None


def split_name(res):
    if res.get("val_split") == "none":
        return "none (every training shape)"
    if res.get("val_split", "stratified") == "stratified":
        return f"stratified {res.get('val_fraction') or 0.1:g}"
    return f"{res['val_split']} {res['val_per_class']} (at most {res['val_max_fraction']:g} of a class)"


def mean_after_first(seconds):
    return sum(seconds[1:]) / (len(seconds) - 1) if len(seconds) > 1 else seconds[0]


def result_row(name, res, model_file=None):
    """A modelnet40.json row from a results.json of tf-sparseconv train: the scores under
    the run's vote (val_overall, val_mean_class, val_overall_test_weighted), the unvoted ones
    beside them where it voted, the per-epoch curves (unvoted) and what the run cost."""
    history, voted = res["history"], res.get("vote", "none") != "none"
    suffix = "_vote" if voted else ""
    row = {"run": name, "model": res["model"], "resolution": res["resolution"], "epochs": res["epochs"],
           "val_split": split_name(res), "val_examples": res["val_examples"],
           "val_overall": res["val_overall" + suffix], "val_mean_class": res["val_mean_class" + suffix],
           "val_overall_test_weighted": res["val_overall_test_weighted" + suffix],
           "val_overall_test_weighted_se": res["val_overall_test_weighted_se" + suffix],
           "vote": res.get("vote", "none"),
           "memory_bound_bytes": res["memory_bound_bytes"],
           "train_s_per_epoch": mean_after_first(res["sec_per_epoch"]), "device": res["device"],
           "command": res["command"],
           "reproduce": reproducing_command(res["command"]),
           "examples": res["examples"], "batch_size": res["batch_size"], "features": res["features"],
           "augment": res["augment"], "peak_rss_bytes": res["peak_rss_bytes"],
           "peak_gpu_bytes": res.get("peak_gpu_bytes"), "model_file": model_file,
           "val_overall_per_epoch": history["val_accuracy"],
           "val_mean_class_per_epoch": history.get("val_mean_class_accuracy"),
           "val_test_weighted_per_epoch": history.get("val_test_weighted_accuracy")}
    if voted:
        row.update(val_overall_unvoted=res["val_overall"], val_mean_class_unvoted=res["val_mean_class"],
                   val_overall_test_weighted_unvoted=res["val_overall_test_weighted"])
    if res.get("memory_bound_sites_per_sample"):
        row["memory_bound_sites_per_sample"] = res["memory_bound_sites_per_sample"]
    elif res["model"] == "site-resnet":
        row["memory_bound_note"] = res.get("memory_bound_note")
    return row


def training_bound(command, device, threads, num_classes=40):
    """(bytes, sites per sample) of the memory bound tf-sparseconv train reports for a recorded
    ModelNet40 `tf-sparseconv train` command run on device ("gpu" or "cpu": the kernels'
    temporaries differ): its model built as train builds it, bounded at the command's batch
    (one replica), a site model with at most --points sites per sample; threads: the
    training host's cores (a little CPU-side scratch per thread)."""
    from tf_sparseconv.data import num_channels
    from tf_sparseconv.models.memory_bound import memory_bound
    from tf_sparseconv.training import train

    args = train.build_parser().parse_args(shlex.split(command)[2:])
    model = train.build_model(args, num_classes, num_channels(args.features), steps=1)[0]
    sites = train.bound_sites_per_sample(args)
    bound = memory_bound(model, args.batch_size, points_per_sample=sites, device=device, threads=threads)
    return bound.total_bytes, sites


# The lent two-GPU host's cores, where the 32^3 runs of this protocol trained (its bounds
# reproduce train's to the byte there: octnet3-32-long 600,685,352).
BOUND_THREADS = 32


def filled_bounds(rows, threads=BOUND_THREADS):
    """rows with the memory bound of each validated or final run that has none (site runs
    before train bounded them, runs added from evaluate) computed from its command; ensembles
    after them, from their members' rows."""
    rows = [dict(row) for row in rows]
    for row in rows:
        command = row.get("command") or ""
        if row.get("memory_bound_bytes") is None and command.startswith("tf-sparseconv train"):
            # a row without its device (added from evaluate) ran on the lent GPU, as every 32^3 run since
            device = "cpu" if (row.get("device") or "GPU").startswith("CPU") else "gpu"
            row["memory_bound_bytes"], sites = training_bound(command, device, threads)
            if sites:
                row["memory_bound_sites_per_sample"] = sites
            row.pop("memory_bound_note", None)
            row["memory_bound_from"] = (f"experiments/modelnet40.py --fill-bounds ({device} kernels, {threads} "
                                        "host threads)")
    for row in rows:
        if row.get("members") and row.get("memory_bound_bytes") is None:
            found = [[r for r in rows if r.get("run") == member and r.get("val_overall") is not None]
                     for member in row["members"]]
            bounds = [f[-1].get("memory_bound_bytes") if f else None for f in found]
            if None not in bounds:
                row["memory_bound_bytes"] = max(bounds)
    return rows


def final_row(name, res, model_file=None):
    """A modelnet40.json row of recipe name trained on every shape (--val-split none): no
    validation scores; the test split, scored once, says how it does."""
    return {"run": f"{name}-final", "final_of": name, "model": res["model"], "resolution": res["resolution"],
            "epochs": res["epochs"], "val_split": split_name(res), "val_examples": 0, "val_overall": None,
            "val_mean_class": None, "val_overall_test_weighted": None, "val_overall_test_weighted_se": None,
            "vote": "none", "memory_bound_bytes": res["memory_bound_bytes"],
            "train_s_per_epoch": mean_after_first(res["sec_per_epoch"]), "device": res["device"],
            "command": res["command"], "reproduce": reproducing_command(res["command"]),
            "examples": res["examples"], "batch_size": res["batch_size"], "features": res["features"],
            "augment": res["augment"], "peak_rss_bytes": res["peak_rss_bytes"],
            "peak_gpu_bytes": res.get("peak_gpu_bytes"), "model_file": model_file}


def ensemble_row(name, metrics, rows):
    """A modelnet40.json row of ensemble name from tf-sparseconv evaluate's metrics.json on
    the validation split, with what its members' rows say (the newest validated row of each,
    and the model file of its final where kept). The members run one after another, so the
    ensemble's memory bound is the largest member's; its training time is theirs added."""
    what, members, vote = ENSEMBLES[name]
    if metrics.get("split") != "val" or len(metrics.get("models") or []) != len(members):
        raise SystemExit(f"the metrics.json of an ensemble of {name} is tf-sparseconv evaluate's on the validation "
                         f"split (--split val) of its {len(members)} members: {', '.join(members)}")
    if metrics.get("vote", "none") != vote:
        raise SystemExit(f"{name} is scored with --vote {vote}, its metrics.json with --vote {metrics.get('vote')}")
    validated, finals = [], []
    for member in members:
        found = [row for row in rows if row.get("run") == member and row.get("val_overall") is not None]
        final = [row for row in rows if row.get("run") == f"{member}-final"]
        if not found:
            raise SystemExit(f"no validated row of {member} in experiments/results/{RESULTS_FILE}")
        validated.append(found[-1])
        finals.append(final[-1].get("model_file") if final else None)
    first = validated[0]
    kinds = " + ".join(dict.fromkeys(row["model"] for row in validated))
    bounds = [row["memory_bound_bytes"] for row in validated]
    seconds = [row["train_s_per_epoch"] for row in validated]
    weighted = test_weighted_scores(metrics) if metrics.get("confusion_matrix") else {}
    return {"run": name, "model": f"{kinds} ensemble of {len(members)}", "members": members,
            "resolution": first["resolution"], "epochs": first["epochs"], "val_split": first["val_split"],
            "val_examples": metrics["examples"], "val_overall": metrics["overall_accuracy"],
            "val_mean_class": metrics["mean_class_accuracy"],
            "val_overall_test_weighted": weighted.get("weighted"),
            "val_overall_test_weighted_se": weighted.get("weighted_se"),
            "vote": metrics.get("vote", "none"),
            # None where a member has none (a site model's is not computed)
            "memory_bound_bytes": None if None in bounds else max(bounds),
            "train_s_per_epoch": None if None in seconds else sum(seconds),
            "device": first["device"], "command": None, "what": what,
            "reproduce": shlex.join(["tf-sparseconv", "evaluate",
                                     *[f"runs/modelnet40/{m}/model.keras" for m in members], "--split", "val",
                                     *(["--vote", vote] if vote != "none" else [])]),
            "examples": first["examples"], "batch_size": first["batch_size"], "features": first["features"],
            "augment": None, "member_val_overall": [row["val_overall"] for row in validated],
            **member_models(finals, validated)}


def member_models(finals, validated):
    """An ensemble row's model_file: its members' kept finals where every one is kept, else
    the validated models themselves where every one is kept in the repository (trained
    without the validation shapes), else None; member_models says which."""
    if all(finals):
        return {"model_file": finals, "member_models": "final"}
    kept = [row.get("model_file") for row in validated]
    if all(path and not os.path.isabs(path) and os.path.exists(os.path.join(REPO, path)) for path in kept):
        return {"model_file": kept, "member_models": "validated"}
    return {"model_file": None, "member_models": None}


def evaluated_row(name, split, scores, model_file=None):
    """A modelnet40.json row of recipe name whose results.json was not kept, from tf-sparseconv
    evaluate's metrics.json of its model on its validation split (--split val), one per vote:
    the recipe's vote and, where it votes, none. The run's split.json gives the split; the
    recipe gives the rest. What only training knew (its time per epoch, its curves, the
    training model's memory bound) stays None."""
    from tf_sparseconv.training import train

    flags = train_args(name, {})
    recipe = train.build_parser().parse_args(flags)  # the recipe as train reads it
    vote = recipe.vote
    by_vote = {m.get("vote", "none"): m for m in scores}
    if any(m.get("split") != "val" for m in scores) or vote not in by_vote:
        raise SystemExit(f"--add-evaluated {name}: give tf-sparseconv evaluate's metrics.json of its model on the "
                         f"validation split (--split val) with --vote {vote}")
    if any(m["examples"] != len(split["val_indices"]) for m in scores):
        raise SystemExit(f"--add-evaluated {name}: the metrics are not of the split.json given (examples differ)")
    chosen = by_vote[vote]
    weighted = test_weighted_scores(chosen)
    row = {"run": name, "model": recipe.model, "resolution": recipe.resolution, "epochs": recipe.epochs,
           "val_split": split_name(split), "val_examples": chosen["examples"],
           "val_overall": chosen["overall_accuracy"], "val_mean_class": chosen["mean_class_accuracy"],
           "val_overall_test_weighted": weighted["weighted"],
           "val_overall_test_weighted_se": weighted["weighted_se"], "vote": vote,
           "memory_bound_bytes": None, "train_s_per_epoch": None, "device": None,
           "command": shlex.join(["tf-sparseconv", "train", *flags]),
           "reproduce": f"python experiments/modelnet40.py --run {name}",
           "examples": split["num_examples"], "batch_size": recipe.batch_size, "features": list(recipe.features),
           "augment": recipe.augment, "model_file": model_file,
           "scored_by": "tf-sparseconv evaluate --split val of the saved model (the run's results.json was not kept)"}
    if vote != "none" and "none" in by_vote:
        row.update(val_overall_unvoted=by_vote["none"]["overall_accuracy"],
                   val_mean_class_unvoted=by_vote["none"]["mean_class_accuracy"],
                   val_overall_test_weighted_unvoted=test_weighted_scores(by_vote["none"])["weighted"])
    return row


def test_weighted_scores(metrics):
    """The overall accuracy reweighted to the official test's class balance, and its standard
    error, from the confusion matrix of tf-sparseconv evaluate's metrics.json (as training
    reports val_test_w)."""
    from tf_sparseconv.training.metrics import class_accuracies
    from tf_sparseconv.training.train import test_class_weights

    matrix = np.asarray(metrics["confusion_matrix"], np.int64)
    labels = np.repeat(np.arange(len(matrix)), matrix.sum(axis=1))
    predicted = np.concatenate([np.repeat(np.arange(len(matrix)), row) for row in matrix])
    return class_accuracies(labels, predicted, len(matrix), test_class_weights(metrics["classes"]))


def build_ensemble(name, rows, keep_dir):
    """Saves ensemble name as one model (its members' finals, models.ensemble_classifier) in
    keep_dir/name with the first member's split.json; returns its row, pointing at it."""
    from tf_sparseconv.models import ensemble_classifier, load_model, save_model
    from tf_sparseconv.models.memory_bound import memory_bound

    row = next((r for r in reversed(rows) if r.get("run") == name), None)
    if row is None or not isinstance(row.get("model_file"), list):
        raise SystemExit(f"--build-ensemble {name}: add its row first (--add-ensemble), with every member's final "
                         "kept (--add-results ... --keep-models)")
    members = [os.path.join(REPO, path) if not os.path.isabs(path) else path for path in row["model_file"]]
    target = os.path.join(keep_dir, name)
    os.makedirs(target, exist_ok=True)
    ensemble = ensemble_classifier([load_model(path, compile=False) for path in members], name=name.replace("-", "_"))
    save_model(ensemble, os.path.join(target, "model.keras"))
    shutil.copy2(os.path.join(os.path.dirname(members[0]), "split.json"), os.path.join(target, "split.json"))
    points = ensemble.layers[1].points_per_cloud
    bound = memory_bound(ensemble, row["batch_size"], points_per_sample=points, device="gpu")
    return dict(row, model_file=repo_path(os.path.join(target, "model.keras")), member_files=row["model_file"],
                memory_bound_bytes=bound.total_bytes,
                memory_bound_note=f"the one-file ensemble at batch {row['batch_size']}, {points} points per cloud, "
                                  "GPU kernels' temporaries, every member alive at once (one graph)")


def migrated_row(row):
    """A row of the earlier schema (one per recipe, a 10% stratified validation split,
    OctNet3 only) in this one; what it did not record stays None."""
    if "val_overall" in row:
        return row
    old = dict(row)
    new = {"run": None, "model": "octnet3", "resolution": old.pop("resolution"), "epochs": old.pop("epochs"),
           "val_split": "stratified 0.1", "val_examples": None, "val_overall": old.pop("val_accuracy"),
           "val_mean_class": None, "val_overall_test_weighted": None, "vote": "none",
           "memory_bound_bytes": old.pop("memory_bound_bytes"), "train_s_per_epoch": old.pop("sec_per_epoch"),
           "device": old.pop("device"), "command": None}
    if "val_accuracy_per_epoch" in old:
        new["val_overall_per_epoch"] = old.pop("val_accuracy_per_epoch")
    if "val_accuracy_mirror_vote" in old:
        new["val_overall_mirror_vote"] = old.pop("val_accuracy_mirror_vote")
    new.update(old)  # examples, batch_size, rhos, peak_bytes, peak_gpu_bytes, recipe, note, ...
    return new


def same_run(row):
    """Rows with the same key replace each other."""
    return row.get("run"), row["device"], row["examples"], row.get("recipe")


def add_row(row):
    """Writes row into the results file in place of an earlier row of the same run."""
    key = same_run(row)
    return replace_rows(RESULTS_FILE, [row], lambda r: same_run(r) == key, order=order)


def order(row):
    """Rows of this protocol first, by resolution and recipe; the earlier ones after them as they were."""
    earlier = row.get("val_split", "stratified 0.1") == "stratified 0.1"
    return (earlier, 0 if earlier else row["resolution"], "" if earlier else row.get("run") or "")


def migrate():
    """Rewrites rows of the earlier schema in this one (once; later calls change nothing)."""
    rows = read_json(RESULTS_FILE)
    if any("val_overall" not in row for row in rows):
        replace_rows(RESULTS_FILE, [migrated_row(row) for row in rows], lambda row: True, order=order)


def repo_path(path):
    """path relative to the repository where it lies inside it, else absolute."""
    path = os.path.abspath(path)
    return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


def keep_model(out, keep_dir, name):
    """Copies a run's model.keras and split.json into keep_dir/name; returns the model's path
    (relative to the repository where it lies inside it)."""
    target = os.path.join(keep_dir, name)
    os.makedirs(target, exist_ok=True)
    for filename in ("model.keras", "split.json", "results.json"):
        if filename != "results.json" or os.path.exists(os.path.join(out, filename)):
            shutil.copy2(os.path.join(out, filename), os.path.join(target, filename))
    return repo_path(os.path.join(target, "model.keras"))


def read_json_file(path):
    with open(path) as f:
        return json.load(f)


def test_scores(metrics):
    """The held-out test scores of tf-sparseconv evaluate's metrics.json."""
    return {"test_overall": metrics["overall_accuracy"], "test_mean_class": metrics["mean_class_accuracy"],
            "test_examples": metrics["examples"], "test_vote": metrics.get("vote", "none"),
            "test_data": os.path.basename(os.path.normpath(metrics["data"] or ""))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", nargs="+", choices=tuple(RECIPES), metavar="RECIPE",
                   help=f"train these recipes, one after the other ({', '.join(RECIPES)})")
    p.add_argument("--final", nargs="+", choices=tuple(RECIPES), metavar="RECIPE",
                   help="train these recipes once more on every training shape (--val-split none), as the final "
                        "models of recipes chosen on the validation split; their rows are RECIPE-final")
    p.add_argument("--list", action="store_true", help="print the recipes and their training commands")
    p.add_argument("--data-dir", default=None, help="as tf-sparseconv train --data-dir")
    p.add_argument("--out-root", default=os.path.join("runs", "modelnet40"),
                   help="each run writes its model and results to OUT_ROOT/<recipe> (replaced by a rerun)")
    p.add_argument("--backup-root", default=None,
                   help="keep each run's checkpoint in BACKUP_ROOT/<recipe>; the same command again resumes")
    p.add_argument("--keep-models", metavar="DIR",
                   help="also copy each run's model.keras and split.json to DIR/<recipe>, recorded in its row")
    p.add_argument("--epochs", type=int, help="override the recipe's epochs (smoke runs)")
    p.add_argument("--max-examples", type=int, help="override: a stratified subset of the shapes (smoke runs)")
    p.add_argument("--resolution", type=int, help="override the recipe's resolution (smoke runs)")
    p.add_argument("--no-record", action="store_true", help=f"leave experiments/results/{RESULTS_FILE} alone")
    p.add_argument("--add-results", nargs=2, action="append", metavar=("RECIPE", "RESULTS_JSON"),
                   help="add the row of a finished run of tf-sparseconv train (e.g. on a lent GPU); no training")
    p.add_argument("--add-evaluated", nargs="+", action="append", metavar="RECIPE RUN_DIR METRICS_JSON",
                   help="add the row of a run whose results.json was not kept: RUN_DIR holds its model.keras and "
                        "split.json, each METRICS_JSON is tf-sparseconv evaluate's of that model on its validation "
                        "split (--split val), under the recipe's vote and, where it votes, without")
    p.add_argument("--add-ensemble", nargs=2, action="append", metavar=("ENSEMBLE", "METRICS_JSON"),
                   help=f"add the row of an ensemble ({', '.join(ENSEMBLES)}) from tf-sparseconv evaluate's "
                        "metrics.json of its members on the validation split")
    p.add_argument("--build-ensemble", metavar="ENSEMBLE",
                   help="build ENSEMBLE's one-file model (models.ensemble_classifier) from its members' kept finals "
                        "into --keep-models DIR/ENSEMBLE and point its row at it")
    p.add_argument("--add-test", nargs=2, action="append", metavar=("RECIPE", "METRICS_JSON"),
                   help="attach the official test split's scores (tf-sparseconv evaluate's metrics.json) to the "
                        "newest row of RECIPE on the validation protocol")
    p.add_argument("--note", help="with --add-results or --run: a note stored in the rows (e.g. how they were timed)")
    p.add_argument("--fill-bounds", action="store_true",
                   help="compute the memory bound of rows recorded without one from their training command")
    p.add_argument("--replot", action="store_true", help="only redraw modelnet40.png and print the rows")
    args = p.parse_args(argv)
    overrides = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in OVERRIDES
                 if getattr(args, flag[2:].replace("-", "_")) is not None}
    if args.list:
        for name, (what, _) in RECIPES.items():
            command = shlex.join(["tf-sparseconv", "train", *train_args(name, overrides, args.data_dir)])
            print(f"{name}: {what}\n  {command}")
        return
    if not args.no_record:
        migrate()
    if args.replot:
        plot_and_print(read_json(RESULTS_FILE))
        return
    if args.fill_bounds:
        replace_rows(RESULTS_FILE, filled_bounds(read_json(RESULTS_FILE)), lambda row: True)
    if args.add_results:
        for name, path in args.add_results:
            with open(path) as f:
                res = json.load(f)
            final = res.get("val_split") == "none"
            if res.get("dataset") != "modelnet40" or ("val_overall" not in res and not final):
                raise SystemExit(f"{path} is not the results.json of a ModelNet40 run of tf-sparseconv train with "
                                 "per-class validation scores (val_overall)")
            model = os.path.join(os.path.dirname(path), "model.keras")
            kept = (keep_model(os.path.dirname(path), args.keep_models, f"{name}-final" if final else name)
                    if args.keep_models and os.path.exists(model) else None)
            row = (final_row if final else result_row)(name, res, kept)
            if args.note:
                row["note"] = args.note
            add_row(row)
    for name, run_dir, *paths in args.add_evaluated or []:
        if name not in RECIPES or not paths:
            raise SystemExit("--add-evaluated takes RECIPE RUN_DIR METRICS_JSON [METRICS_JSON]")
        scores = [read_json_file(path) for path in paths]
        kept = keep_model(run_dir, args.keep_models, name) if args.keep_models else None
        row = evaluated_row(name, read_json_file(os.path.join(run_dir, "split.json")), scores, kept)
        if args.note:
            row["note"] = args.note
        add_row(row)
    for name, path in args.add_ensemble or []:
        if name not in ENSEMBLES:
            raise SystemExit(f"--add-ensemble {name}: not an ensemble ({', '.join(ENSEMBLES)})")
        with open(path) as f:
            row = ensemble_row(name, json.load(f), read_json(RESULTS_FILE))
        if args.note:
            row["note"] = args.note
        add_row(row)
    if args.build_ensemble:
        if args.build_ensemble not in ENSEMBLES or not args.keep_models:
            raise SystemExit(f"--build-ensemble takes an ensemble ({', '.join(ENSEMBLES)}) and --keep-models DIR")
        row = build_ensemble(args.build_ensemble, read_json(RESULTS_FILE), args.keep_models)
        if not args.no_record:
            add_row(row)
    if args.add_test:
        rows = read_json(RESULTS_FILE)
        for name, path in args.add_test:
            with open(path) as f:
                scores = test_scores(json.load(f))
            ours = [i for i, row in enumerate(rows) if row.get("run") == name]
            if not ours:
                raise SystemExit(f"no row of recipe {name} in experiments/results/{RESULTS_FILE}")
            rows[ours[-1]].update(scores)
        replace_rows(RESULTS_FILE, rows, lambda row: True)
    for name, final in [(name, False) for name in args.run or []] + [(name, True) for name in args.final or []]:
        run = f"{name}-final" if final else name
        out = os.path.abspath(os.path.join(args.out_root, run))
        flags = train_args(name, overrides, args.data_dir, backup_root=args.backup_root, final=final)
        res = run_training(run, flags + ["--overwrite"], os.path.dirname(out))
        if args.no_record:
            continue
        row = (final_row if final else result_row)(name, res, keep_model(out, args.keep_models, run)
                                                   if args.keep_models else repo_path(os.path.join(out, "model.keras")))
        if args.note:
            row["note"] = args.note
        add_row(row)
    if not args.no_record:
        plot_and_print(read_json(RESULTS_FILE))


def plot_and_print(rows):
    figure, (current, earlier) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for row in rows:
        if not row.get("val_overall_per_epoch"):
            continue
        epochs = range(1, len(row["val_overall_per_epoch"]) + 1)
        if row["val_split"] == "stratified 0.1":
            earlier.plot(epochs, row["val_overall_per_epoch"], marker=".",
                         label=f"{row['resolution']}³, {row['recipe']}, {row['device']}")
            continue
        line, = current.plot(epochs, row["val_overall_per_epoch"], label=f"{row['run']} overall ({row['device']})")
        if row.get("val_mean_class_per_epoch"):
            current.plot(epochs, row["val_mean_class_per_epoch"], linestyle="--", color=line.get_color(),
                         label=f"{row['run']} mean per class")
    current.set(xlabel="epoch", ylabel="validation accuracy (unvoted)",
                title="validation in the test's class proportions")
    earlier.set(xlabel="epoch", title="earlier: 10% stratified validation (OctNet3)")
    for axis in (current, earlier):
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="x-small")
        else:
            axis.text(0.5, 0.5, "not run yet", ha="center", va="center", transform=axis.transAxes)
    save_figure(figure, "modelnet40.png")
    for row in rows:
        test = (f", test {row['test_overall']:.4f} / {row['test_mean_class']:.4f}" if row.get("test_overall")
                is not None else "")
        mean_class = f" / {row['val_mean_class']:.4f}" if row.get("val_mean_class") is not None else ""
        val = f"val {row['val_overall']:.4f}" if row.get("val_overall") is not None else "no validation"
        print(f"{row.get('run') or row.get('recipe')} ({row['model']}, {row['resolution']}³, {row['device']}, "
              f"{row['val_split']}): {val}{mean_class} after {row['epochs']} epochs, vote "
              f"{row['vote']}{test}"
              + (f", {row['train_s_per_epoch']:.1f} s/epoch" if row.get("train_s_per_epoch") is not None else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
