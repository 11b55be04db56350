"""The markdown tables of docs/benchmarks.md's site-convolution section, from a merged
site_conv_gpu.jsonl (benchmarks/site_conv_gpu.py --phase merge): ours against spconv in the
same run, with the default dataflows (fp16 from a neighbour table where the layer has one,
as the layers under an indice_key; fp32 over the pairs).

    python benchmarks/site_conv_table.py [benchmarks/results/site_conv_gpu.jsonl]
"""
import argparse
import os
import json
import statistics

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "site_conv_gpu.jsonl")
SCENE_NAMES = {"lidar_5cm": "lidar 5cm", "lidar_10cm": "lidar 10cm", "synthetic_lidar_5cm_b1": "synth b1",
               "synthetic_lidar_5cm_b4": "synth b4", "indoor_2cm": "indoor 2cm"}
# The call figures: through the traced ConcreteFunction, the tf.function, and eagerly.
CALLS = (("ours_s", "whole call, `ConcreteFunction` (`ours_s`)"),
         ("ours_function_s", "whole call, `tf.function` (`ours_function_s`)"),
         ("ours_eager_s", "whole call, eager op (`ours_eager_s`)"))


def ms(value):
    return f"{value * 1e3:.3f}" if isinstance(value, (int, float)) else "—"


def ratio(num, den):
    return f"{num / den:.2f}" if isinstance(num, (int, float)) and isinstance(den, (int, float)) and den else "—"


def scene_name(scene):
    return SCENE_NAMES.get(scene, scene)


def is_default(row, dataflows):
    """Whether row is the default dataflow of its configuration: the table where the
    fp16 configuration has table rows, else the pairs."""
    if row["dtype"] == "fp16" and "table" in dataflows.get((row["scene"], row["layer"], row["dtype"]), ()):
        return row.get("dataflow") == "table"
    return row.get("dataflow", "pairs") == "pairs"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", default=DEFAULT)
    args = p.parse_args()
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    first = rows[0]
    overhead = {r["layer"]: r for r in rows if r.get("pass") == "overhead"}
    print(f"- Run `{first.get('run')}` of {first.get('date')} on {first.get('device')} (commit {first.get('commit')}).")
    if "sync_check" in overhead:
        check = overhead["sync_check"]
        print(f"- Waits with {check.get('sync')}: ten 4096² products {ms(check['ours_s'])} ms "
              f"(`sync_devices`: {ms(check.get('sync_devices_s'))} ms).")
    tiny = [f"{name} {ms(overhead[name]['ours_s'])} ms" for name in
            ("tf_function_call", "concrete_function_call", "eager_op_call") if name in overhead]
    if tiny:
        print("- A synchronised call of one tiny GPU op: " + ", ".join(tiny) + ".")

    dataflows = {}
    for r in rows:
        if r.get("pass") in ("fwd", "bwd", "fwd_bwd"):
            dataflows.setdefault((r["scene"], r["layer"], r["dtype"]), set()).add(r.get("dataflow", "pairs"))
    timed = [r for r in rows if r.get("pass") in ("fwd", "bwd", "fwd_bwd")]
    default = {(r["scene"], r["layer"], r["pass"], r["dtype"]): r for r in timed if is_default(r, dataflows)}
    pairs = {(r["scene"], r["layer"], r["pass"], r["dtype"]): r for r in timed if r.get("dataflow", "pairs") == "pairs"}
    scenes = list(dict.fromkeys(r["scene"] for r in timed))
    layers = list(dict.fromkeys(r["layer"] for r in timed if r["layer"] != "end_to_end"))

    print("\nPer layer, device time per call (ms); fp16 ours: the default (table) and the pairs; the ratio is "
          "spconv over our default, below 1 spconv is faster.\n")
    print("| scene | layer | pass | pairs | fp32 ours | fp32 spconv | fp16 ours | fp16 ours, pairs | fp16 spconv "
          "| fp16 spconv / ours | fp16 call ours / spconv |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scene in scenes:
        for layer in layers:
            for pass_name in ("fwd", "bwd"):
                f32 = default.get((scene, layer, pass_name, "fp32"), {})
                f16 = default.get((scene, layer, pass_name, "fp16"), {})
                f16_pairs = pairs.get((scene, layer, pass_name, "fp16"), {})
                if not (f32 or f16):
                    continue
                print(f"| {scene_name(scene)} | {layer} | {pass_name} | {f32.get('pairs') or f16.get('pairs') or ''} "
                      f"| {ms(f32.get('ours_gpu_s'))} | {ms(f32.get('spconv_gpu_s'))} | {ms(f16.get('ours_gpu_s'))} "
                      f"| {ms(f16_pairs.get('ours_gpu_s'))} | {ms(f16.get('spconv_gpu_s'))} "
                      f"| {ratio(f16.get('spconv_gpu_s'), f16.get('ours_gpu_s'))} "
                      f"| {ms(f16.get('ours_s'))} / {ms(f16.get('spconv_s'))} |")

    compared = [r for key, r in default.items() if key[1] != "end_to_end" and key[2] in ("fwd", "bwd")
                and r.get("spconv_gpu_s") is not None]
    groups = [(d, p) for d in ("fp16", "fp32") for p in ("fwd", "bwd")]
    print("\nPer-layer configurations where ours is as fast as spconv or faster, default dataflows:\n")
    print("| figure | " + " | ".join(f"{d} {p}" for d, p in groups) + " | all | median ours / spconv |")
    print("|---|" + "---:|" * (len(groups) + 2))
    for key, label in (("ours_gpu_s", "device time (`ours_gpu_s`)"), *CALLS):
        peer = "spconv_gpu_s" if key == "ours_gpu_s" else "spconv_s"
        cells = []
        for d, pass_name in groups:
            group = [r for r in compared if r["dtype"] == d and r["pass"] == pass_name]
            cells.append(f"{sum(r[key] <= r[peer] for r in group)}/{len(group)}")
        wins = sum(r[key] <= r[peer] for r in compared)
        median = statistics.median(r[key] / r[peer] for r in compared) if compared else float("nan")
        print(f"| {label} | " + " | ".join(cells) + f" | {wins}/{len(compared)} | {median:.2f} |")

    print("\nEnd to end (the chain of benchmarks/site_scenes.py's CHAIN), default dataflows, ms, ours / spconv:\n")
    print("| scene | pass | fp16 device | fp16 call (`ConcreteFunction`) | fp16 call, eager | fp32 device "
          "| fp32 call (`ConcreteFunction`) | fp32 call, eager |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for scene in scenes:
        for pass_name in ("fwd", "fwd_bwd"):
            cells = []
            for d in ("fp16", "fp32"):
                r = default.get((scene, "end_to_end", pass_name, d), {})
                cells += [f"{ms(r.get('ours_gpu_s'))} / {ms(r.get('spconv_gpu_s'))}",
                          f"{ms(r.get('ours_s'))} / {ms(r.get('spconv_s'))}",
                          f"{ms(r.get('ours_eager_s'))} / {ms(r.get('spconv_s'))}"]
            print(f"| {scene_name(scene)} | {pass_name} | " + " | ".join(cells) + " |")

    maps = [r for r in rows if r.get("pass") == "map"]
    if maps:
        print("\nKernel maps (hash / sort builder) and neighbour tables, synchronised call, ms:\n")
        geometries = list(dict.fromkeys(r["layer"] for r in maps if r.get("builder")))
        tables = list(dict.fromkeys(r["layer"] for r in maps if not r.get("builder")))
        print("| scene | sites | " + " | ".join(f"{g} (pairs)" for g in geometries) + " | table builds |")
        print("|---|---:|" + "---:|" * (len(geometries) + 1))
        for scene in dict.fromkeys(r["scene"] for r in maps):
            mine = [r for r in maps if r["scene"] == scene]
            cells = []
            for g in geometries:
                by = {r["builder"]: r for r in mine if r["layer"] == g}
                count = next(iter(by.values()))["pairs"]
                cells.append(f"{ms(by.get('hash', {}).get('ours_s'))} / {ms(by.get('sort', {}).get('ours_s'))} "
                             f"({count:,})")
            builds = [r["ours_s"] for r in mine if r["layer"] in tables]
            span = f"{ms(min(builds))}–{ms(max(builds))}" if builds else "—"
            print(f"| {scene_name(scene)} | {mine[0]['n_sites']:,} | " + " | ".join(cells) + f" | {span} |")


if __name__ == "__main__":
    main()
