"""Where a whole site-network call loses time on the host: the same forward call of
site_e2e_gpu.py's networks timed as built (`base`), with its weights frozen into constants
(`frozen`: no variable reads, the graph's other ops unchanged), without the convolution
layers' row checks (`nochecks`: the Shape/StridedSlice/Equal/Assert ops of
kernel_map.assert_rows_match), with int64 coordinates (`int64`: TensorFlow passes an
int32 argument of a tf.function in host memory, int64 stays on the GPU) and the tf.function
itself with int64 coordinates (`function`: what site_e2e_gpu.py times; the other variants
call ConcreteFunctions, which skip the tf.function's lookup of its traced function and its
captured variables); interleaved rounds, medians of synchronised calls. With --trace DIR
three calls each of `base` and `int64` are traced with TensorFlow's profiler and the XSpace
files kept there (the host threads' events beside the GPU's stream events;
docs/benchmarks.md reads them).

    python benchmarks/call_variants.py --networks resunet42_lidar_5cm_b1 unet5_lidar_5cm --dtype fp16
"""
import argparse
import os
import shutil
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import site_e2e_gpu as e2e  # noqa: E402
from gpu_trace import first_gpu_work, trace_file  # noqa: E402
from site_networks import conv_weights, network, scene  # noqa: E402
from site_scenes import LIDAR  # noqa: E402

VARIANTS = ("base", "frozen", "nochecks", "int64", "function")


def build(run, dtype, lidar, tiny, checks=True, int64=True):
    """(the concrete forward of int32 coordinates, its inputs, the site count, where int64 is
    true the concrete forward of int64 coordinates and its inputs, else None, None, and the
    tf.function whose traces those are)."""
    import importlib
    import tensorflow as tf
    kernel_map = importlib.import_module("tf_sparseconv.site.kernel_map")  # the module, not the function
    net, batch = e2e.RUNS[run]
    steps = network(net)
    coords, spatial, features = scene(net, batch, lidar, tiny=tiny)
    weights = conv_weights(net, steps)
    original = kernel_map.assert_rows_match
    if not checks:
        kernel_map.assert_rows_match = lambda *args: tf.no_op()
    try:
        model, convs, _, _ = e2e.build_model(steps, spatial, features.shape[1], dtype)
        for name, layer in convs.items():
            layer.kernel.assign(weights[name].astype(dtype))
        fwd, _ = e2e.functions(model, tf.constant(spatial), batch)
        c, f = tf.constant(coords), tf.constant(features.astype(dtype))
        concrete = fwd.get_concrete_function(c, f)
        if not int64:
            return concrete, (c, f), len(coords), None, None, fwd
        c64 = tf.constant(coords.astype(np.int64))
        wide = fwd.get_concrete_function(c64, f)
    finally:
        kernel_map.assert_rows_match = original
    return concrete, (c, f), len(coords), wide, (c64, f), fwd


def frozen(concrete):
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    return convert_variables_to_constants_v2(concrete)


def graph_ops(concrete):
    nodes = list(concrete.graph.as_graph_def().node)
    return sum(1 for n in nodes if n.op not in ("Const", "Placeholder", "NoOp"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--networks", nargs="+", choices=tuple(e2e.RUNS), default=["resunet42_lidar_5cm_b1"])
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp16")
    p.add_argument("--lidar", default=LIDAR)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                   help="the variants to time (base is always built: the others are checked against it)")
    p.add_argument("--trace", default=None, help="keep the profiler's XSpace of 3 traced base calls here")
    args = p.parse_args()
    import tensorflow as tf
    from timing import sync
    dtype = {"fp32": "float32", "fp16": "float16"}[args.dtype]
    device = "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"
    for run in args.networks:
        with tf.device(device):
            base, inputs, sites, wide, wide_inputs, function = build(run, dtype, args.lidar, args.tiny)
            fns = {"base": base}
            if "frozen" in args.variants:
                fns["frozen"] = frozen(base)
            if "nochecks" in args.variants:
                fns["nochecks"] = build(run, dtype, args.lidar, args.tiny, checks=False, int64=False)[0]
            if "int64" in args.variants:
                fns["int64"] = wide
            if "function" in args.variants:
                fns["function"] = function
        feeds = {name: wide_inputs if name in ("int64", "function") else inputs for name in fns}
        ref = fns["base"](*inputs)
        for name, fn in fns.items():
            out = fn(*feeds[name])
            out = out[0] if isinstance(out, (list, tuple)) else out
            out, want = np.asarray(out, np.float32), np.asarray(ref, np.float32)
            # The same network: the variants differ only in the order of half-precision sums.
            if np.abs(out - want).max() > 1e-2 * np.abs(want).max():
                raise AssertionError(f"{run}: {name} differs from base by {np.abs(out - want).max()}")
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                for _ in range(3):
                    fn(*feeds[name])
                sync()
                for _ in range(args.reps):
                    start = time.perf_counter()
                    fn(*feeds[name])
                    sync()
                    times[name].append(time.perf_counter() - start)
        print(f"{run} {args.dtype} fwd, {sites:,} sites, {device}:", flush=True)
        for name, fn in fns.items():
            print(f"  {name:9s} {statistics.median(times[name]) * 1e3:8.3f} ms  "
                  f"(ops in the graph before Grappler: "
                  f"{graph_ops(fn.get_concrete_function(*feeds[name]) if name == 'function' else fn)})", flush=True)
        if args.trace:
            os.makedirs(args.trace, exist_ok=True)
            for name in [n for n in ("base", "int64") if n in fns]:
                path = trace_file(lambda *a, fn=fns[name]: (fn(*a), sync()), feeds[name], 3)
                kept = os.path.join(args.trace, f"{run}_{args.dtype}_{name}.xplane.pb")
                shutil.copy(path, kept)
                waits = [w for w in first_gpu_work(kept, "fwd") if w is not None]
                start = (f"the GPU's first work {statistics.median(waits) / 1e9:.3f} ms after the call began "
                         f"(median of {len(waits)} traced calls)") if waits else "no GPU work traced"
                print(f"  {name}: {start}; trace -> {kept}", flush=True)


if __name__ == "__main__":
    main()
