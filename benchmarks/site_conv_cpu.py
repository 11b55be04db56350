"""Site-sparse convolution on the CPU: our SiteSparseConv against the gather-GEMM-scatter a
TensorFlow user would write from stock ops (tf.gather, one tf.matmul per kernel offset,
tf.math.unsorted_segment_sum), on the same kernel maps, in the same run.

    python benchmarks/site_conv_cpu.py [--scenes lidar_10cm] [--reps 7]
    python benchmarks/site_conv_cpu.py --table     # docs/benchmarks.md's table of the results file

Both run inside tf.function; medians of `reps` calls after `warmup`; forward, and forward
plus the gradients with respect to features and weights. Outputs are compared first.
Writes JSON lines to benchmarks/results/site_conv_cpu.jsonl.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from results_file import add_replace_argument, refuse_to_replace  # noqa: E402
from site_conv_gpu import layer_rows, levels_of  # noqa: E402
from site_scenes import LAYERS, layer_weights, level_features, scenes  # noqa: E402

from tf_sparseconv._op_library import ops as _ops  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "site_conv_cpu.jsonl")
# The CPU layers timed: C <= 128 keeps one scene's run within minutes on 2 cores.
CPU_LAYERS = ("subm_l0_32", "subm_l0_64", "down_l0_64_128", "subm_l1_128", "inv_l1_128_64")


def median_s(fn, args, warmup, reps):
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn(*args)
        [t.numpy() for t in tf.nest.flatten(out)]  # the values exist
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stock_conv(f, w, in_rows, out_rows, sizes, num_out):
    """Gather-GEMM-scatter from stock TensorFlow ops: per offset, gather its input rows and
    multiply by its filter; sum the products onto the output rows."""
    gathered = tf.split(tf.gather(f, in_rows), sizes)
    products = [tf.matmul(g, w[q]) for q, g in enumerate(gathered)]
    return tf.math.unsorted_segment_sum(tf.concat(products, 0), out_rows, num_out)


def markdown_table(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    print("| layer | pass | pairs | Cin→Cout | ours ms | stock TF ms | stock / ours |")
    print("|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layer']} | {r['pass']} | {r['pairs']} | {r['cin']}→{r['cout']} | {r['ours_s'] * 1e3:.1f} "
              f"| {r['stock_tf_s'] * 1e3:.1f} | {r['speedup']:.2f} |")
    speedups = [r["speedup"] for r in rows]
    print(f"\n{rows[0]['scene']}, {rows[0]['n_sites']:,} sites, {rows[0]['machine']}: median speed-up "
          f"{statistics.median(speedups):.2f}× ({min(speedups):.2f}–{max(speedups):.2f}×)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenes", nargs="*", default=["lidar_10cm"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")
    add_replace_argument(p)
    args = p.parse_args()
    if args.table:
        markdown_table(args.out)
        return
    refuse_to_replace(p, args.out, args.replace)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    rows = []
    with tf.device("/CPU:0"):
        for scene, (coords, spatial, batch) in scenes(args.scenes).items():
            print(f"[cpu] {scene}: {len(coords):,} sites", flush=True)
            sites, maps = levels_of(coords, spatial, batch)
            for li, (name, kind, level, cin, cout, k, _, key) in enumerate(LAYERS):
                if name not in CPU_LAYERS:
                    continue
                in_rows, out_rows, splits, num_in, num_out, _ = layer_rows(kind, level, key, maps, sites)
                sizes = np.diff(splits.numpy()).tolist()
                f = tf.constant(level_features(int(num_in), cin, seed=1000 + li))
                w = tf.constant(layer_weights(cin, cout, k, seed=2000 + li).reshape(k ** 3, cin, cout))

                @tf.function
                def ours(f, w):
                    return _ops.site_sparse_conv(f, w, in_rows, out_rows, splits, num_out, tf.zeros([0], tf.int32),
                                                 map_is_trusted=True)

                @tf.function
                def stock(f, w):
                    return stock_conv(f, w, in_rows, out_rows, sizes, num_out)

                def with_gradients(conv):
                    @tf.function
                    def run(f, w):
                        with tf.GradientTape() as tape:
                            tape.watch([f, w])
                            y = conv(f, w)
                        # Dense gradients on both sides (tf.gather's is IndexedSlices).
                        return [tf.convert_to_tensor(g)
                                for g in tape.gradient(y, [f, w], output_gradients=tf.ones_like(y))]
                    return run

                a, b = ours(f, w).numpy(), stock(f, w).numpy()
                err = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
                if err > 1e-4:
                    raise RuntimeError(f"{scene} {name}: ours and the stock composite differ by {err}")
                for pass_name, mine, theirs in (("fwd", ours, stock),
                                                ("fwd_bwd", with_gradients(ours), with_gradients(stock))):
                    t_ours = median_s(mine, (f, w), args.warmup, args.reps)
                    t_stock = median_s(theirs, (f, w), args.warmup, args.reps)
                    rows.append({"scene": scene, "layer": name, "pass": pass_name, "n_sites": int(num_in),
                                 "pairs": int(in_rows.shape[0]), "cin": cin, "cout": cout, "ours_s": t_ours,
                                 "stock_tf_s": t_stock, "speedup": t_stock / t_ours, "max_rel_err": err,
                                 "machine": machine, "threads": tf.config.threading.get_intra_op_parallelism_threads()})
                    print(f"  {name:<16} {pass_name:<8} ours {t_ours * 1e3:8.1f} ms   stock TF {t_stock * 1e3:8.1f} ms"
                          f"   {t_stock / t_ours:5.2f}x", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    speedups = [r["speedup"] for r in rows]
    print(f"{len(rows)} rows -> {args.out}; ours / stock TensorFlow: median speed-up {statistics.median(speedups):.2f}x "
          f"(min {min(speedups):.2f}x, max {max(speedups):.2f}x)")


if __name__ == "__main__":
    main()
