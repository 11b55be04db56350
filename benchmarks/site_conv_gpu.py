"""Site-sparse convolution on the GPU: ours against spconv 2.3.8 on identical inputs and
weights, per layer and end to end, forward and backward, and kernel-map builds.

Three phases, one command on the lent GPU (TensorFlow and PyTorch in separate processes):
  python benchmarks/site_conv_gpu.py --phase ours    # ours; saves inputs/reference rows
  python benchmarks/site_conv_spconv.py               # spconv; checks its outputs vs ours
  python benchmarks/site_conv_spconv.py --tf32        # spconv with its TF32 switch on
  python benchmarks/site_conv_gpu.py --phase merge --run NAME  # JSON lines with both and the floor
  python benchmarks/site_conv_table.py                # the markdown tables of docs/benchmarks.md

Timing: `*_s` is the whole layer call, median of synchronised calls after warm-up, both
waited for with cudaDeviceSynchronize (timing.sync; spconv: torch.cuda.synchronize). Ours
is inside tf.function: `ours_s` calls the function's traced ConcreteFunction (what the
tf.function dispatches to, and what a SavedModel signature is), `ours_function_s` the
tf.function itself (its Python argument matching on top), `ours_eager_s` the same Python
function run eagerly, op by op. `*_gpu_s` is the device time per call (ours: calls queued
back to back from Python and synchronised once, timing.queued_s_per_call; spconv: CUDA
events). Maps are built once and cached, as with spconv's indice_key. The floor of a layer is
max(FLOPs / matrix rate, minimal bytes / bandwidth) with FLOPs = 2 * pairs * Cin * Cout
and the rates measured on the same GPU in the same command (benchmarks/site_conv_spconv.py measures them with cuBLAS and a copy).
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from site_scenes import CHAIN, LAYERS, layer_weights, level_features, scenes  # noqa: E402
from results_file import add_replace_argument, refuse_to_replace  # noqa: E402
from run_info import checkout_commit  # noqa: E402
from timing import check_sync, interleaved_medians, median_time, queued_s_per_call, sync_method  # noqa: E402

from tf_sparseconv._op_library import ops as _ops  # noqa: E402
from tf_sparseconv.site import kernel_map  # noqa: E402
from tf_sparseconv.site.tensor import make_site_sparse  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "site_conv_gpu.jsonl")
# fp32: float32 with TF32 off (full float32 products); tf32: float32 with TensorFlow's TF32
# on (its default on sm_80+), which SiteSparseConv follows.
DTYPES = {"fp32": tf.float32, "tf32": tf.float32, "fp16": tf.float16}


def use_dtype(name):
    tf.config.experimental.enable_tensor_float_32_execution(name == "tf32")
    return DTYPES[name]
CHECK_ROWS = 2000


def device_int32(t):
    """An int32 tensor as float32 bit patterns, for entering a tf.function. Captured by or
    passed to a tf.function, an int32 tensor is placed in host memory and copied to the
    GPU at every call (TensorFlow's placement of int32 function inputs); int32_of inside
    the function turns the bits back on the GPU at no cost."""
    return tf.bitcast(t, tf.float32)


def int32_of(bits):
    return tf.bitcast(bits, tf.int32)


def levels_of(coords, spatial, batch):
    """Sites of levels 0..2 and every map of LAYERS, built with our op (hash builder)."""
    x0 = make_site_sparse(coords, np.zeros((len(coords), 1), np.float32), spatial, batch)
    maps, sites = {}, {0: x0}
    maps["subm0"] = kernel_map(x0, 3, mode="submanifold")
    maps["down1"] = kernel_map(x0, 2, 2, mode="strided")
    x1 = make_site_sparse(maps["down1"].out_coords, tf.zeros([tf.shape(maps["down1"].out_coords)[0], 1]),
                          maps["down1"].out_spatial_shape, batch)
    maps["subm1"] = kernel_map(x1, 3, mode="submanifold")
    maps["down2"] = kernel_map(x1, 2, 2, mode="strided")
    x2 = make_site_sparse(maps["down2"].out_coords, tf.zeros([tf.shape(maps["down2"].out_coords)[0], 1]),
                          maps["down2"].out_spatial_shape, batch)
    maps["subm2"] = kernel_map(x2, 3, mode="submanifold")
    sites[1], sites[2] = x1, x2
    return sites, maps


def layer_rows(kind, level, key, maps, sites):
    """(in_rows, out_rows, splits, num_in, num_out, out level) of one layer."""
    m = maps[key]
    if kind == "inv":
        return m.out_rows, m.in_rows, m.offset_splits, sites[level].num_sites, sites[level - 1].num_sites, level - 1
    out_level = level + 1 if kind == "down" else level
    return m.in_rows, m.out_rows, m.offset_splits, sites[level].num_sites, sites[out_level].num_sites, out_level


def build_map_timing(coords, spatial, batch, warmup, reps):
    """Each map's build from the level-0 sites, the coordinates already on the GPU (as
    float32 bit patterns, device_int32): a captured or passed int32 tensor would add its
    copy from the host to every call."""
    rows = []
    bits = device_int32(tf.constant(coords, tf.int32))
    builders = ["hash", "sort"] if "builder" in kernel_map.__code__.co_varnames else [None]
    for geometry, args in (("subm_k3", dict(kernel_size=3, mode="submanifold")),
                           ("down_k2s2", dict(kernel_size=2, strides=2, mode="strided"))):
        for builder in builders:
            extra = {} if builder is None else {"builder": builder}

            @tf.function
            def build(b):
                c = int32_of(b)
                x = make_site_sparse(c, tf.zeros([tf.shape(c)[0], 1]), spatial, batch, non_finite="allow")
                m = kernel_map(x, **args, **extra)
                return m.in_rows, m.out_rows, m.offset_splits
            t = median_time(build, warmup, reps, (bits,))
            pairs = int(build(bits)[0].shape[0])
            rows.append({"layer": f"map_{geometry}", "builder": builder or "hash", "ours_s": t, "pairs": pairs})
    return rows


# Whether the ops are told that the maps are SiteKernelMap's own (map_is_trusted); run_ours
# sets it from --untrusted-maps.
trusted = True


def dataflows_for(dtype_name, args):
    """The forward dataflows to time: pairs everywhere; outputs (its neighbour table built
    per call) where the tensor-core kernels apply (fp16, tf32); table (the default dataflow
    given a SiteNeighbourTable built once per map, as the layers do under an indice_key) for
    fp16, the only type whose default dataflow reads it. fp32 with TF32 off has one
    dataflow."""
    wanted = {"pairs": True, "outputs": dtype_name != "fp32", "table": dtype_name == "fp16"}
    return [d for d in args.dataflows if wanted[d]]


NO_TABLE = tf.zeros([0], tf.int32)
NO_TABLE_BITS = tf.zeros([0], tf.float32)


def neighbour_table(in_rows, out_rows, splits, num_in, num_out):
    """SiteNeighbourTable of one layer's pairs, built once like the map itself."""
    return _ops.site_neighbour_table(in_rows, out_rows, splits, num_in, num_out, map_is_trusted=True)


def uses_table(dataflow):
    return dataflow == "table"


def op_dataflow(dataflow):
    """SiteSparseConv's dataflow attr for a timed dataflow: 'table' is the default ('auto')
    given a neighbour table; 'pairs' and 'outputs' are forced."""
    return "auto" if uses_table(dataflow) else dataflow


def call_times(fn, fargs, args):
    """Synchronised whole-call medians of the tf.function fn on fargs: through its traced
    ConcreteFunction (ours_s), through the tf.function (ours_function_s) and eagerly, op by
    op (ours_eager_s), interleaved so that drift of the machine lands on all three alike."""
    concrete = fn.get_concrete_function(*fargs)
    return interleaved_medians((concrete, fn, fn.python_function), fargs, args.warmup, args.reps)


def run_ours(args):
    os.makedirs(args.exchange, exist_ok=True)
    device = tf.config.list_logical_devices("GPU")
    device_name = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
        "device_name", "GPU") if device else "CPU"
    results = []
    global trusted
    trusted = not args.untrusted_maps
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    # The framework's share of every `*_s` (wall) figure: a tf.function call of one tiny
    # GPU op, synchronised the same way. spconv's calls pay PyTorch's (much smaller) share.
    tiny = tf.zeros([8])
    if device:
        by_tf, by_sync = check_sync()
        results.append({"scene": "-", "layer": "sync_check", "pass": "overhead", "dtype": None, "ours_s": by_sync,
                        "sync_devices_s": by_tf, "sync": sync_method()})
        print(f"[ours] waits with {sync_method()}; ten 4096^2 products: {by_sync * 1e3:.3f} ms "
              f"(sync_devices: {by_tf * 1e3:.3f} ms)", flush=True)
    plus_one = tf.function(lambda v: v + 1.0)
    for layer, fn in (("tf_function_call", plus_one), ("concrete_function_call", plus_one.get_concrete_function(tiny)),
                      ("eager_op_call", plus_one.python_function)):
        overhead = median_time(fn, args.warmup, args.reps, (tiny,))
        results.append({"scene": "-", "layer": layer, "pass": "overhead", "dtype": None, "ours_s": overhead,
                        "sync": sync_method()})
        print(f"[ours] {layer} of one tiny op, synchronised: {overhead * 1e3:.3f} ms", flush=True)
    all_scenes = scenes(args.scenes)
    for scene, (coords, spatial, batch) in all_scenes.items():
        print(f"[ours] {scene}: {len(coords):,} sites, spatial {spatial.tolist()}, batch {batch}", flush=True)
        sites, maps = levels_of(coords, spatial, batch)
        level_coords = {lv: sites[lv].coords.numpy() for lv in sites}
        np.savez(os.path.join(args.exchange, f"{scene}_levels.npz"), spatial=spatial, batch=batch,
                 **{f"coords{lv}": c for lv, c in level_coords.items()})
        for row in build_map_timing(coords, spatial, batch, args.warmup, args.reps):
            results.append({"scene": scene, "pass": "map", "n_sites": len(coords), "cin": None, "cout": None,
                            "dtype": None, **row})
        reference = {}
        for li, (name, kind, level, cin, cout, k, stride, key) in enumerate(LAYERS):
            in_rows, out_rows, splits, num_in, num_out, out_level = layer_rows(kind, level, key, maps, sites)
            pairs = int(in_rows.shape[0])
            has_table = k ** 3 <= 32

            def build_table(in_rows=in_rows, out_rows=out_rows, splits=splits, num_in=num_in, num_out=num_out):
                return neighbour_table(in_rows, out_rows, splits, num_in, num_out)
            table = None  # built once per layer
            feats32 = level_features(len(level_coords[level]), cin, seed=1000 + li)
            w32 = layer_weights(cin, cout, k, seed=2000 + li)
            for dtype_name in args.dtypes:
                dt = use_dtype(dtype_name)
                feats = tf.constant(feats32, dt)
                w = tf.constant(w32.reshape(k ** 3, cin, cout), dt)
                g = tf.constant(np.random.default_rng(3000 + li).standard_normal((int(num_out), cout)), dt)

                in_bits, out_bits = device_int32(in_rows), device_int32(out_rows)
                # Read by bwd from this iteration's scope, like the rows: as a defaulted
                # Python argument of bwd it slowed every call of bwd's ConcreteFunction.
                submanifold = kind == "subm"

                def layer_functions(flow):
                    """The layer's forward and backward with the op's dataflow attr `flow`."""
                    @tf.function
                    def fwd(f, w, nb_bits):
                        return _ops.site_sparse_conv(f, w, int32_of(in_bits), int32_of(out_bits), splits, num_out,
                                                     int32_of(nb_bits), map_is_trusted=trusted, dataflow=flow)

                    @tf.function
                    def bwd(f, w, g, nb_bits):
                        # As the op's gradient runs them: a trusted submanifold layer's input
                        # gradient over its own pairs (and table) with mirrored filters, the
                        # others over the reversed pairs, in the forward's dataflow.
                        in_rows, out_rows, nb = int32_of(in_bits), int32_of(out_bits), int32_of(nb_bits)
                        if submanifold and trusted:
                            df = _ops.site_sparse_conv(g, tf.reverse(tf.transpose(w, [0, 2, 1]), [0]), in_rows,
                                                       out_rows, splits, num_in, nb, map_is_trusted=trusted,
                                                       map_is_submanifold=True, dataflow=flow)
                        else:
                            df = _ops.site_sparse_conv(g, tf.transpose(w, [0, 2, 1]), out_rows, in_rows, splits,
                                                       num_in, NO_TABLE, map_is_trusted=trusted, dataflow=flow)
                        dw = _ops.site_sparse_conv_filter_grad(f, g, in_rows, out_rows, splits,
                                                               map_is_trusted=trusted)
                        return df, dw
                    return fwd, bwd

                y = layer_functions("auto")[0](feats, w, NO_TABLE_BITS)
                if dtype_name == "fp32":
                    pick = np.random.default_rng(li).choice(int(num_out), min(CHECK_ROWS, int(num_out)), replace=False)
                    reference[name] = (level_coords[out_level][pick], y.numpy()[pick])
                # The table path: the table is built once per map, like the map, and
                # enters both figures built (as float32 bit patterns, see device_int32);
                # its build time is the "map" row table_<layer>.
                for dataflow in dataflows_for(dtype_name, args):
                    if uses_table(dataflow) and not has_table:
                        continue
                    if uses_table(dataflow) and table is None:
                        table = build_table()
                        # The table's build: what the end-to-end chain leaves out.
                        # (the pairs enter as float32 bit patterns: no copy from the host per call)

                        @tf.function
                        def table_of(a, b):
                            return neighbour_table(int32_of(a), int32_of(b), splits, num_in, num_out)
                        t_table = median_time(table_of, args.warmup, args.reps,
                                              (device_int32(in_rows), device_int32(out_rows)))
                        results.append({"scene": scene, "layer": f"table_{name}", "pass": "map",
                                        "n_sites": len(coords), "cin": None, "cout": None, "dtype": None,
                                        "ours_s": t_table, "pairs": pairs})
                        print(f"  {name:<18} neighbour table build: {t_table * 1e3:8.3f} ms", flush=True)
                    table_bits = device_int32(table) if table is not None else NO_TABLE_BITS
                    fwd, bwd = layer_functions(op_dataflow(dataflow))
                    # Every dataflow gives the default's values within fp16 before it is timed.
                    y_flow = fwd(feats, w, table_bits if uses_table(dataflow) else NO_TABLE_BITS)
                    y_flow = y_flow.numpy().astype(np.float32)
                    check = np.abs(y_flow - y.numpy().astype(np.float32))
                    assert check.max() <= 2e-2 * max(1.0, np.abs(y.numpy().astype(np.float32)).max()), \
                        (dataflow, check.max())
                    if uses_table(dataflow):
                        passes = (("fwd", fwd, (feats, w, table_bits), fwd.python_function),
                                  ("bwd", bwd, (feats, w, g, table_bits), bwd.python_function))
                    else:
                        passes = (("fwd", fwd, (feats, w, NO_TABLE_BITS), fwd),
                                  ("bwd", bwd, (feats, w, g, NO_TABLE_BITS), bwd))
                    for pass_name, fn, fargs, loop_fn in passes:
                        t, t_function, t_eager = call_times(fn, fargs, args)
                        tg = queued_s_per_call(loop_fn, args.loop_calls, fargs) if device else None
                        results.append({"scene": scene, "layer": name, "pass": pass_name, "n_sites": int(num_in),
                                        "n_out": int(num_out), "pairs": pairs, "cin": cin, "cout": cout,
                                        "dtype": dtype_name, "dataflow": dataflow, "ours_s": t,
                                        "ours_function_s": t_function, "ours_eager_s": t_eager, "ours_gpu_s": tg,
                                        "sync": sync_method(), "deterministic": args.deterministic})
                        print(f"  {name:<18} {dtype_name} {dataflow:<7} {pass_name}: {t * 1e3:8.3f} ms "
                              f"(tf.function {t_function * 1e3:8.3f}, eager {t_eager * 1e3:8.3f}, "
                              f"device {tg * 1e3 if tg else float('nan'):8.3f} ms), {pairs:,} pairs", flush=True)
        np.savez(os.path.join(args.exchange, f"{scene}_reference.npz"),
                 **{f"{n}_coords": c for n, (c, _) in reference.items()},
                 **{f"{n}_out": o for n, (_, o) in reference.items()})
        results += run_chain(scene, coords, sites, maps, level_coords, args, device)
        with open(os.path.join(args.exchange, "ours.json"), "w") as f:  # after every scene: partial runs count
            json.dump({"device": device_name, "rows": results}, f)
    print(f"[ours] {len(results)} timings -> {args.exchange}/ours.json")


def run_chain(scene, coords, sites, maps, level_coords, args, device):
    """End to end: CHAIN's layers in sequence, forward and forward + backward."""
    spec = {name: (kind, level, cin, cout, k, key, li) for li, (name, kind, level, cin, cout, k, _, key)
            in enumerate(LAYERS)}
    rows = []
    for dtype_name in args.dtypes:
        dt = use_dtype(dtype_name)
        first = spec[CHAIN[0]]
        feats = tf.constant(level_features(len(level_coords[first[1]]), first[2], seed=1000 + first[6]), dt)
        weights = [tf.constant(layer_weights(spec[n][2], spec[n][3], spec[n][4], seed=2000 + spec[n][6]).reshape(
            spec[n][4] ** 3, spec[n][2], spec[n][3]), dt) for n in CHAIN]
        plan = [layer_rows(spec[n][0], spec[n][1], spec[n][5], maps, sites) for n in CHAIN]
        # The tables are built once per map before the timing, like the maps themselves
        # (plan) and like spconv's, whose chain reuses the indice data (pairs, masks and
        # their sorted order) its tensors already hold; their build times are the "map"
        # rows' "table_*" entries. Tables and rows enter the functions as float32 bit
        # patterns (device_int32).
        built_tables = []

        def tables():
            if not built_tables:
                built_tables.extend(device_int32(neighbour_table(*rows[:5])) for rows in plan)
            return built_tables

        plan_bits = [(device_int32(rows[0]), device_int32(rows[1])) for rows in plan]

        def forward(f, ws, use_tables, flow):
            nbs = [int32_of(t) for t in tables()] if use_tables else [NO_TABLE] * len(plan)
            for (_, _, splits, _, num_out, _), (in_bits, out_bits), w, nb, name in zip(plan, plan_bits, ws, nbs,
                                                                                      CHAIN):
                in_rows, out_rows = int32_of(in_bits), int32_of(out_bits)
                f = _ops.site_sparse_conv(f, w, in_rows, out_rows, splits, num_out, nb, map_is_trusted=trusted,
                                          map_is_submanifold=spec[name][0] == "subm" and trusted, dataflow=flow)
            return f

        def functions(dataflow):
            use_tables, flow = uses_table(dataflow), op_dataflow(dataflow)
            fwd = tf.function(lambda f, *ws: forward(f, ws, use_tables, flow))

            @tf.function
            def fwd_bwd(f, *ws):
                with tf.GradientTape() as tape:
                    tape.watch([f, *ws])
                    loss = tf.reduce_sum(tf.cast(forward(f, ws, use_tables, flow), tf.float32))
                return tape.gradient(loss, [f, *ws])  # the gradients run the forward's dataflow
            return fwd, fwd_bwd

        for dataflow in dataflows_for(dtype_name, args):
            if uses_table(dataflow):
                tables()  # eagerly, outside the functions' graphs
            fwd, fwd_bwd = functions(dataflow)
            for pass_name, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
                t, t_function, t_eager = call_times(fn, (feats, *weights), args)
                tg = queued_s_per_call(fn, max(1, args.loop_calls // 4), (feats, *weights), op_by_op=False) \
                    if device else None
                rows.append({"scene": scene, "layer": "end_to_end", "pass": pass_name, "n_sites": len(coords),
                             "cin": spec[CHAIN[0]][2], "cout": spec[CHAIN[-1]][3], "dtype": dtype_name,
                             "dataflow": dataflow, "ours_s": t, "ours_function_s": t_function,
                             "ours_eager_s": t_eager, "ours_gpu_s": tg, "sync": sync_method(),
                             "deterministic": args.deterministic})
                print(f"  end_to_end {dtype_name} {dataflow} {pass_name}: {t * 1e3:.3f} ms "
                      f"(tf.function {t_function * 1e3:.3f}, eager {t_eager * 1e3:.3f} ms)", flush=True)
    return rows


def merge(args):
    stamp = {"commit": checkout_commit(), "run": args.run, "date": datetime.date.today().isoformat()}
    with open(os.path.join(args.exchange, "ours.json")) as f:
        ours = json.load(f)
    peer_path = os.path.join(args.exchange, "spconv.json")
    peer = json.load(open(peer_path)) if os.path.exists(peer_path) else {"rows": [], "rates": None}
    tf32_path = os.path.join(args.exchange, "spconv_tf32.json")  # spconv's --tf32 run, if any
    if os.path.exists(tf32_path):
        extra = json.load(open(tf32_path))
        peer["rows"] += extra["rows"]
        peer["all_algos"] = peer.get("all_algos", []) + extra.get("all_algos", [])
        peer["rates"] = {**(peer.get("rates") or {}), **extra["rates"]}
    key_of = lambda r: (r["scene"], r["layer"], r["pass"], r.get("dtype"))  # noqa: E731
    by_key = {key_of(r): r for r in peer["rows"]}
    algos_timed = {}  # spconv's algorithms that ran for a configuration (a cut-short run may lack one)
    for r in peer.get("all_algos", []):
        algos_timed.setdefault(key_of(r), []).append(r["algo"])
    rates = peer.get("rates")
    lines = []
    for row in ours["rows"]:
        other = by_key.get(key_of(row), {})
        floor = None
        if rates and f"matmul_{row['dtype']}_flops" in rates and row["pass"] in ("fwd", "bwd") \
                and row["layer"] != "end_to_end":
            value_bytes = 2 if row["dtype"] == "fp16" else 4
            flops = 2.0 * row["pairs"] * row["cin"] * row["cout"] * (2 if row["pass"] == "bwd" else 1)
            moved = value_bytes * (row["n_sites"] * row["cin"] + row["n_out"] * row["cout"] +
                                   27 * row["cin"] * row["cout"]) * (2 if row["pass"] == "bwd" else 1)
            floor = max(flops / rates[f"matmul_{row['dtype']}_flops"], moved / rates["copy_bytes_per_s"])
        lines.append({**row, "device": ours["device"], "spconv_s": other.get("spconv_s"),
                      "spconv_gpu_s": other.get("spconv_gpu_s"), "spconv_algo": other.get("algo"),
                      "spconv_algos_timed": algos_timed.get(key_of(row), []), "max_rel_err": other.get("max_rel_err"),
                      "floor_s": floor,
                      "ours_over_floor": row["ours_s"] / floor if floor else None, **stamp})
    with open(args.out, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    print(f"{'scene':<24}{'layer':<18}{'pass':<16}{'dtype':<6}{'ours ms':>10}{'spconv ms':>11}{'ratio':>8}"
          f"{'floor ms':>10}")
    for r in lines:
        ratio = r["spconv_s"] / r["ours_s"] if r["spconv_s"] else float("nan")
        print(f"{r['scene']:<24}{r['layer']:<18}{r['pass']:<16}{str(r['dtype']):<6}{r['ours_s'] * 1e3:>10.3f}"
              f"{(r['spconv_s'] or float('nan')) * 1e3:>11.3f}{ratio:>8.2f}"
              f"{(r['floor_s'] or float('nan')) * 1e3:>10.3f}")
    print(f"{len(lines)} rows -> {args.out}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=("ours", "merge"), required=True)
    p.add_argument("--exchange", default="/tmp/site_bench")
    p.add_argument("--scenes", nargs="*", default=None)
    p.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--loop-calls", type=int, default=40)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--run", default=None, help="--phase merge: a name for this run, kept in every row with the "
                                                "date and the checkout's commit")
    p.add_argument("--dataflows", nargs="*", default=["pairs", "table"], choices=("pairs", "outputs", "table"),
                   help="forward dataflows on the GPU: pairs or outputs (forced), table (the default dataflow "
                        "given a neighbour table built once per map, as the layers under an indice_key)")
    p.add_argument("--deterministic", action="store_true",
                   help="tf.config.experimental.enable_op_determinism() first: the ops' deterministic paths")
    p.add_argument("--untrusted-maps", action="store_true",
                   help="call the ops with map_is_trusted=False (row checks and a host round trip per call), "
                        "as before that attr; by default the maps, all from SiteKernelMap, are passed as trusted")
    add_replace_argument(p)
    args = p.parse_args()
    refuse_to_replace(p, args.out, args.replace)  # before the ours phase too: its rows go to --out at the merge
    run_ours(args) if args.phase == "ours" else merge(args)


if __name__ == "__main__":
    main()
