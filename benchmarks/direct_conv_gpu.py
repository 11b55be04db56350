"""Direct sparse convolution on the GPU against cuDNN's dense conv3d (Hackel et al., Fig. 4
and Table 1).

Inputs: r^3 grids, r in {32, 64, 128, 256, 512}, density rho = 1/r (r^2 random entries per
(batch, channel) segment, keys drawn in numpy), a 3x3x3 filter with a random mask of exactly
rho_f of its weights, rho_f in {0.1, 0.5, 1.0}, Cin = 1 -> Cout = 8, with k-selection ('signed',
rho_up = 1/r) and without ('none'); each configuration's inputs from a generator of its own
(--seed, batch, r, rho_f), the same whichever configurations run.

  time:    batch 1; medians of synchronised runs after warm-up, ours and tf.nn.conv3d on the
           dense equivalent (masked filter) in the same process; ratio = dense_s / ours_s.
           Also the device time per call (*_gpu_s): --loop-calls calls in one graph loop,
           synchronised once, so TensorFlow's per-call dispatch from Python is not in
           it; ratio_gpu = dense_gpu_s / ours_gpu_s. Ours keeps its own host round trip
           (the output size) in that figure.
           As the library runs inside a network (issue 24): the input checked once
           (ts.validate) and every convolution with padded_output, so no call waits for
           the device. *_unrolled_gpu_s: per call, (T(U) - T(1)) / (U - 1), where T(U) is
           the median synchronised time of one tf.function of U convolutions (U =
           --loop-calls, each with its own filter scale, so that no two are the same op)
           on that input, and the dense baseline the same way with tf.nn.conv3d;
           ratio_unrolled_gpu = dense_unrolled_gpu_s / ours_unrolled_gpu_s.
           ours_busy_s / ours_launches: the GPU's busy time and its kernels, copies and
           memsets per convolution in a profiler trace of the U-call function (with --trace).
  memory:  batch 32, Cout 8 (Table 1): peak GPU memory of one call above what its inputs
           hold (tf.config.experimental.get_memory_info after reset_memory_stats); the
           inputs' bytes are recorded separately.

           Each memory row also splits the peak as Table 1 does: out_bytes, the output tensor
           (8-byte keys, 4-byte values: the paper's "Sparse 64bit" row), and temp_bytes, the
           rest of the peak (the paper's "Sparse Temp" row).
  --memory-only --temp-limit-mb L: only the memory rows, our op given temp_limit_bytes = L MiB
           (the forward in groups of examples whose sort buffers fit L MiB), recorded as
           temp_limit_mb and appended to --out.

A run that does not fit (ResourceExhaustedError) is recorded with null figures. Results go
to benchmarks/results/direct_conv_gpu.jsonl (--out), one JSON object per line.

    python benchmarks/direct_conv_gpu.py [--quick] [--out PATH]
    python benchmarks/direct_conv_gpu.py --memory-only --temp-limit-mb 128 [--resolutions 256 512]
    python benchmarks/direct_conv_gpu.py --table [--out PATH]   # docs/benchmarks.md's tables (no GPU needed)
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_sparseconv as ts  # noqa: E402
from gpu_trace import rank_events, traced_events  # noqa: E402
from results_file import add_replace_argument, refuse_to_replace  # noqa: E402
from run_info import checkout_commit  # noqa: E402
from timing import device_s_per_call, median_time, sync  # noqa: E402

RESOLUTIONS = [32, 64, 128, 256, 512]
FILTER_DENSITIES = [0.1, 0.5, 1.0]
SELECTIONS = ["none", "signed"]
KERNEL = (3, 3, 3)
CIN, COUT = 1, 8
TIME_BATCH, MEMORY_BATCH = 1, 32
MEMORY_FILTER_DENSITIES = [0.1, 1.0]
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "direct_conv_gpu.jsonl")



def random_keys(rng, batch, r):
    """Sorted keys of r^2 distinct random positions in every (b, c) segment of [batch, r, r, r, 1]."""
    volume, per_segment = r ** 3, r ** 2
    keys = []
    for b in range(batch):
        positions = np.unique(rng.integers(0, volume, size=int(per_segment * 1.1) + 16))
        while len(positions) < per_segment:
            positions = np.unique(np.concatenate([positions, rng.integers(0, volume, size=per_segment)]))
        positions = np.sort(rng.choice(positions, per_segment, replace=False))
        keys.append(b * volume + positions)  # Cin = 1: segment b
    return np.concatenate(keys).astype(np.int64)


def config_rng(seed, *config):
    """A generator of a configuration's own (seed and the configuration's values, floats to
    thousandths), so that its inputs do not depend on which configurations ran before it."""
    return np.random.default_rng([seed] + [int(round(v * 1000)) if isinstance(v, float) else int(v) for v in config])


def filter_mask(rng, shape, rho_f):
    """A filter mask with exactly round(rho_f * size) present weights at random places: the
    filter density of Fig. 4. (A draw per weight gave the 3^3 x 1 x 8 filter at rho_f 0.1 between
    14 and 30 present weights of 216, as the order of the configurations moved the generator,
    and the 256^3 call's time with it.)"""
    size = int(np.prod(shape))
    flat = np.zeros(size, bool)
    flat[rng.choice(size, int(round(rho_f * size)), replace=False)] = True
    return flat.reshape(shape)


def make_inputs(rng, batch, r, rho_f):
    keys = random_keys(rng, batch, r)
    with tf.device("/GPU:0"):
        x = ts.ChannelSparseTensor(tf.constant(keys), tf.constant(rng.standard_normal(len(keys)).astype(np.float32)),
                                   tf.constant([batch, r, r, r, CIN], tf.int64))
        w = tf.constant(rng.standard_normal((*KERNEL, CIN, COUT)).astype(np.float32))
        mask = tf.constant(filter_mask(rng, (*KERNEL, CIN, COUT), rho_f))
        bias = tf.constant(rng.standard_normal(COUT).astype(np.float32))
    return x, w, mask, bias


def sparse_conv_fn(selection, r, temp_limit_mb=None, dataflow="auto"):
    kwargs = {} if selection == "none" else dict(selection=selection, rho_up=1.0 / r)
    kwargs["dataflow"] = dataflow
    if temp_limit_mb:
        kwargs["temp_limit_bytes"] = temp_limit_mb << 20

    @tf.function
    def conv(keys, values, dense_shape, w, mask, bias):
        y = ts.direct_conv(ts.ChannelSparseTensor(keys, values, dense_shape), w, bias, mask, **kwargs)
        return y.keys, y.values
    return lambda x, w, mask, bias: conv(x.keys, x.values, x.dense_shape, w, mask, bias)


def unrolled_fns(conv_once, calls):
    """tf.functions of 1 and of `calls` calls conv_once(prepared, scale) on the same
    prepared input, each with its own scale (1 + i / 1024), so that no two calls are the
    same op; one element of every output feeds the returned sum, so pruning keeps them all."""
    def make(n):
        @tf.function
        def run(prepare_args):
            prepared = prepare_args()
            total = tf.constant(0.0)
            for i in range(n):
                for t in tf.nest.flatten(conv_once(prepared, 1.0 + i / 1024.0)):
                    total += tf.reduce_sum(tf.cast(tf.reshape(t, [-1])[:1], tf.float32))
            return total
        return run
    return make(1), make(calls)


def unrolled_s_per_call(conv_once, prepare_args, calls, warmup, repeats):
    """Device seconds per call as (T(calls) - T(1)) / (calls - 1) of unrolled_fns."""
    one, many = unrolled_fns(conv_once, calls)
    t_one = median_time(lambda: one(prepare_args), warmup, repeats)
    t_many = median_time(lambda: many(prepare_args), warmup, repeats)
    return max(t_many - t_one, 0.0) / (calls - 1)


def padded_sparse_fns(x, w, mask, bias, selection, r, dataflow="auto"):
    """(conv_once, prepare_args) for unrolled_s_per_call: x checked once by ts.validate in
    the traced function, then padded convolutions that trust it, as inside a network."""
    kwargs = {} if selection == "none" else dict(selection=selection, rho_up=1.0 / r)
    kwargs["dataflow"] = dataflow

    def prepare():  # graph tensors (an eager dense_shape would not count as the checked one)
        return ts.validate(ts.ChannelSparseTensor(tf.identity(x.keys), tf.identity(x.values),
                                                  tf.identity(x.dense_shape)))

    def conv_once(checked, scale):
        y = ts.direct_conv(checked, w * scale, bias, mask, padded_output=True, **kwargs)
        return y.keys, y.values
    return conv_once, prepare


def dense_fns(dense, w_masked):
    def conv_once(prepared, scale):
        return tf.nn.conv3d(prepared, w_masked * scale, strides=[1] * 5, padding="SAME")
    return conv_once, lambda: dense


@tf.function
def dense_conv(dense, w_masked):
    return tf.nn.conv3d(dense, w_masked, strides=[1] * 5, padding="SAME")


def peak_bytes(fn):
    """Peak GPU memory of one call of fn above what was allocated before it."""
    fn()  # warm-up: autotuning and kernel loading are not part of the figure
    sync()
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    tf.config.experimental.reset_memory_stats("GPU:0")
    out = fn()
    sync()
    peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
    del out
    return peak - before


def attempt(fn):
    """fn()'s result, or None if the GPU ran out of memory."""
    try:
        return fn()
    except (tf.errors.ResourceExhaustedError, tf.errors.InternalError) as e:
        print(f"    does not fit: {str(e).splitlines()[0][:160]}", flush=True)
        return None


def run_config(mode, batch, r, rho_f, device_name, args):
    x, w, mask, bias = make_inputs(config_rng(args.seed, batch, r, rho_f), batch, r, rho_f)
    input_bytes = int(x.keys.shape[0]) * (8 + 4)
    dense_input_bytes = batch * r ** 3 * CIN * 4
    w_masked = w * tf.cast(mask, w.dtype)
    records = []
    dense_result = None
    for selection in SELECTIONS:
        conv = sparse_conv_fn(selection, r, args.temp_limit_mb, args.dataflow)
        call = lambda: conv(x, w, mask, bias)  # noqa: E731
        # Keys as in the CPU file (benchmarks/direct_conv.py), plus the selection's name.
        record = dict(kind=mode, r=r, rho=1.0 / r, rho_f=rho_f, batch=batch, cin=CIN, cout=COUT,
                      k_selection=selection != "none", selection=selection,
                      rho_up=None if selection == "none" else 1.0 / r,
                      entries=int(x.keys.shape[0]), ours_input_bytes=input_bytes,
                      dense_input_bytes=dense_input_bytes, device=device_name,
                      date=time.strftime("%Y-%m-%d"), commit=checkout_commit())
        if args.dataflow != "auto":
            record["dataflow"] = args.dataflow
        if mode == "time":
            record["ours_s"] = attempt(lambda: median_time(call, args.warmup, args.repeats, budget_s=args.budget))
            record["ours_gpu_s"] = attempt(lambda: device_s_per_call(call, args.loop_calls))
            conv_once, prepare = padded_sparse_fns(x, w, mask, bias, selection, r, args.dataflow)
            record["ours_unrolled_gpu_s"] = attempt(lambda: unrolled_s_per_call(
                conv_once, prepare, args.loop_calls, args.warmup, args.repeats))
            if args.trace:
                events = attempt(lambda: traced_events(unrolled_fns(conv_once, args.loop_calls)[1], (prepare,), 1))
                if events is not None:
                    busy_ms, ranked = rank_events(events, args.loop_calls, 1000, 1e9)
                    record["ours_busy_s"] = busy_ms / 1e3
                    record["ours_launches"] = len(events) / args.loop_calls
                    record["ours_kernels"] = [[name, ms / 1e3, n] for name, ms, n in ranked[:12]]
                    print(f"    traced: GPU busy {busy_ms * 1e3:.1f} us and {len(events) / args.loop_calls:.1f} "
                          f"launches per call", flush=True)
            record["ours_peak_bytes"] = None
        else:
            # --memory-only also times the call (grouped or not), as the cost of the limit.
            record["ours_s"] = (attempt(lambda: median_time(call, 1, 3, budget_s=args.budget)) if args.memory_only
                                else None)
            record["ours_peak_bytes"] = attempt(lambda: peak_bytes(call))
            record["temp_limit_mb"] = args.temp_limit_mb
        out_entries = attempt(lambda: int(call()[0].shape[0]))
        record["out_entries"] = out_entries
        if mode == "memory" and out_entries is not None and record["ours_peak_bytes"] is not None:
            record["out_bytes"] = out_entries * (8 + 4)
            record["temp_bytes"] = record["ours_peak_bytes"] - record["out_bytes"]
        if dense_result is None and not args.memory_only:
            # The dense equivalent, built on the GPU; skipped (null) where it does not fit.
            def dense_figures():
                dense = ts.to_dense(x)
                if mode == "time":
                    unrolled = unrolled_s_per_call(*dense_fns(dense, w_masked), args.loop_calls, args.warmup,
                                                   args.repeats)
                    return (median_time(lambda: dense_conv(dense, w_masked), args.warmup, args.repeats, budget_s=args.budget),
                            device_s_per_call(lambda: dense_conv(dense, w_masked), args.loop_calls), None, unrolled)
                return None, None, peak_bytes(lambda: dense_conv(dense, w_masked))
            dense_result = attempt(dense_figures) or (None, None, None)
        record["dense_s"], record["dense_gpu_s"], record["dense_peak_bytes"] = (dense_result or (None,) * 3)[:3]
        if mode == "time":
            record["dense_unrolled_gpu_s"] = dense_result[3] if dense_result and len(dense_result) > 3 else None
            record["ratio_unrolled_gpu"] = (record["dense_unrolled_gpu_s"] / record["ours_unrolled_gpu_s"]
                                            if record["dense_unrolled_gpu_s"] and record["ours_unrolled_gpu_s"]
                                            else None)
        record["ratio"] = (record["dense_s"] / record["ours_s"]
                           if record["dense_s"] and record["ours_s"] else None)
        if mode == "time":
            record["ratio_gpu"] = (record["dense_gpu_s"] / record["ours_gpu_s"]
                                   if record["dense_gpu_s"] and record["ours_gpu_s"] else None)
        records.append(record)
        print(f"  {mode:6s} r={r:3d} rho_f={rho_f:.1f} batch={batch:2d} {selection:6s} "
              f"entries={record['entries']:>9d} out={out_entries if out_entries is not None else '-':>10} "
              f"ours={fmt_s(record['ours_s'])} dense={fmt_s(record['dense_s'])} "
              f"ratio={fmt_ratio(record['ratio'])} ours_peak={fmt_bytes(record['ours_peak_bytes'])} "
              f"dense_peak={fmt_bytes(record['dense_peak_bytes'])}", flush=True)
    del x, w, mask, bias, w_masked
    return records


def fmt_s(s):
    return "       -" if s is None else f"{s * 1e3:7.2f}ms"


def fmt_ratio(ratio):
    return "    -" if ratio is None else f"{ratio:5.2f}"


def fmt_bytes(b):
    return "      -" if b is None else f"{b / 2 ** 30:6.3f}G"


def summary(records):
    print("\nTime (batch 1): median seconds per synchronised call, and device seconds per call in a graph "
          "loop; ratio = dense / ours (> 1: ours faster)")
    print(f"{'r':>4} {'rho_f':>5} {'selection':>9} {'ours':>10} {'dense':>10} {'ratio':>6} {'ours dev':>10} "
          f"{'dense dev':>10} {'ratio':>6}")
    for rec in records:
        if rec["kind"] == "time":
            print(f"{rec['r']:>4} {rec['rho_f']:>5.1f} {rec['selection']:>9} {fmt_s(rec['ours_s']):>10} "
                  f"{fmt_s(rec['dense_s']):>10} {fmt_ratio(rec['ratio']):>6} {fmt_s(rec.get('ours_gpu_s')):>10} "
                  f"{fmt_s(rec.get('dense_gpu_s')):>10} {fmt_ratio(rec.get('ratio_gpu')):>6}")
    print("\nMemory (batch 32, Cout 8): peak GiB above the inputs (of it: output tensor + the rest); inputs in "
          "parentheses")
    print(f"{'r':>4} {'rho_f':>5} {'selection':>9} {'limit':>6} {'ours':>8} {'output':>8} {'temp':>8} {'(input)':>9} "
          f"{'dense':>8} {'(input)':>9}")
    for rec in records:
        if rec["kind"] == "memory":
            limit = rec.get("temp_limit_mb")
            print(f"{rec['r']:>4} {rec['rho_f']:>5.1f} {rec['selection']:>9} {limit if limit else '-':>6} "
                  f"{fmt_bytes(rec['ours_peak_bytes']):>8} {fmt_bytes(rec.get('out_bytes')):>8} "
                  f"{fmt_bytes(rec.get('temp_bytes')):>8} ({fmt_bytes(rec['ours_input_bytes']).strip():>7}) "
                  f"{fmt_bytes(rec['dense_peak_bytes']):>8} ({fmt_bytes(rec['dense_input_bytes']).strip():>7})")


def gib(b):
    return "does not fit" if b is None else f"{b / 2 ** 30:.3f}"


def markdown_tables(path):
    """The markdown tables of a results file: time (synchronised call and device time per
    call), peak memory above the inputs, the capped runs' peaks split as Table 1 does, and
    the epoch rows of benchmarks/train_step.py."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    ms = lambda s: "-" if s is None else f"{s * 1e3:.2f}"  # noqa: E731
    ratio = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    us = lambda s: "-" if s is None else f"{s * 1e6:.0f}"  # noqa: E731
    print("| r³ | ρ_f | k-selection | ours call [ms] | cuDNN call [ms] | dense/ours | ours device [ms] "
          "| cuDNN device [ms] | dense/ours (device) | ours in a network [µs] | cuDNN [µs] | dense/ours "
          "| GPU busy [µs] | launches |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r.get("kind") == "time":
            launches = r.get("ours_launches")
            print(f"| {r['r']}³ | {r['rho_f']} | {r['selection']} | {ms(r['ours_s'])} | {ms(r['dense_s'])} "
                  f"| {ratio(r['ratio'])} | {ms(r.get('ours_gpu_s'))} | {ms(r.get('dense_gpu_s'))} "
                  f"| {ratio(r.get('ratio_gpu'))} | {us(r.get('ours_unrolled_gpu_s'))} "
                  f"| {us(r.get('dense_unrolled_gpu_s'))} | {ratio(r.get('ratio_unrolled_gpu'))} "
                  f"| {us(r.get('ours_busy_s'))} | {'-' if launches is None else f'{launches:.1f}'} |")
    print()
    print("| r³ (batch 32) | ρ_f | k-selection | ours peak [GiB] | dense peak [GiB] |")
    print("|---|---:|---|---:|---:|")
    for r in rows:
        if r.get("kind") == "memory" and "temp_limit_mb" not in r:
            print(f"| {r['r']}³ | {r['rho_f']} | {r['selection']} | {gib(r['ours_peak_bytes'])} "
                  f"| {gib(r['dense_peak_bytes'])} |")
    limited = [r for r in rows if r.get("kind") == "memory" and "temp_limit_mb" in r]
    if limited:
        print()
        print("| r³ (batch 32) | ρ_f | k-selection | temp limit [MiB] | ours call [ms] | peak [GiB] "
              "| of it output [GiB] | of it temporary [GiB] |")
        print("|---|---:|---|---:|---:|---:|---:|---:|")
        for r in limited:
            print(f"| {r['r']}³ | {r['rho_f']} | {r['selection']} | {r['temp_limit_mb'] or 'none'} "
                  f"| {ms(r['ours_s'])} | {gib(r['ours_peak_bytes'])} | {gib(r.get('out_bytes'))} "
                  f"| {gib(r.get('temp_bytes'))} |")
    epochs = [r for r in rows if r.get("kind") == "epoch"]
    if epochs:
        print("\nTraining epochs (benchmarks/train_step.py --epoch), in the order run:")
        for r in epochs:
            print(f"- {r['resolution']}³ on {r['device']}: {r['sec_per_epoch']:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="r <= 128 (memory: r <= 64), rho_f 0.5, fewer repeats")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON-lines output (default: %(default)s)")
    parser.add_argument("--table", action="store_true", help="print the markdown tables of --out and exit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loop-calls", type=int, default=20, help="calls per graph loop for the device time")
    parser.add_argument("--dataflow", choices=("auto", "sort", "dense", "bitmap", "atomic"), default="auto",
                        help="our convolution's dataflow (direct_conv's dataflow=; rows record it unless 'auto')")
    parser.add_argument("--trace", action="store_true",
                        help="also trace the unrolled padded calls: GPU busy time and launches per call")
    parser.add_argument("--only-time", action="store_true", help="only the time rows (no memory rows)")
    parser.add_argument("--time-resolutions", type=int, nargs="+", choices=RESOLUTIONS, default=None,
                        help="the time rows' resolutions (default: all)")
    parser.add_argument("--memory-only", action="store_true",
                        help="only the memory rows (no dense baseline), appended to --out")
    parser.add_argument("--temp-limit-mb", type=int, default=None,
                        help="with --memory-only: our op's temp_limit_bytes, in MiB")
    parser.add_argument("--resolutions", type=int, nargs="+", choices=RESOLUTIONS, default=None,
                        help="with --memory-only: these resolutions (default: all)")
    add_replace_argument(parser)
    args = parser.parse_args()
    if args.table:
        markdown_tables(args.out)
        return
    if (args.temp_limit_mb is not None or args.resolutions) and not args.memory_only:
        parser.error("--temp-limit-mb and --resolutions go with --memory-only")
    if args.temp_limit_mb is not None and args.temp_limit_mb < 1:
        parser.error("--temp-limit-mb must be at least 1")
    args.warmup, args.repeats, args.budget = (1, 3, 0.5) if args.quick else (2, 7, 2.0)
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        sys.exit("no GPU visible to TensorFlow")
    device_name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    resolutions = args.time_resolutions or (RESOLUTIONS[:3] if args.quick else RESOLUTIONS)
    time_densities = [0.5] if args.quick else FILTER_DENSITIES
    memory_resolutions = RESOLUTIONS[:2] if args.quick else RESOLUTIONS
    memory_densities = [0.5] if args.quick else MEMORY_FILTER_DENSITIES
    print(f"direct sparse conv vs tf.nn.conv3d on {device_name}, TensorFlow {tf.__version__}", flush=True)
    started = time.time()
    records = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    configs = ([("time", TIME_BATCH, r, rho_f) for r in resolutions for rho_f in time_densities]
               + ([] if args.only_time else
                  [("memory", MEMORY_BATCH, r, rho_f) for r in memory_resolutions for rho_f in memory_densities]))
    if args.memory_only:
        configs = [("memory", MEMORY_BATCH, r, rho_f) for r in (args.resolutions or RESOLUTIONS)
                   for rho_f in MEMORY_FILTER_DENSITIES]
    # A run replaces the rows of the configurations it runs but keeps the others, the epoch
    # rows of benchmarks/train_step.py and the stack rows of benchmarks/direct_conv_stack_gpu.py.
    run_now = {(mode, r, rho_f) for mode, _, r, rho_f in configs}
    if not args.memory_only:
        refuse_to_replace(parser, args.out, args.replace,
                          lambda row: (row.get("kind"), row.get("r"), row.get("rho_f")) in run_now)
    epoch_rows = []
    if not args.memory_only and os.path.exists(args.out):
        with open(args.out) as f:
            epoch_rows = [line for line in f if line.strip()
                          and (json.loads(line).get("kind"), json.loads(line).get("r"), json.loads(line).get("rho_f"))
                          not in run_now]
    # Written as the configurations finish, so a cut-off run keeps its rows.
    with open(args.out, "a" if args.memory_only else "w") as f:
        f.writelines(epoch_rows)
        for mode, batch, r, rho_f in configs:
            rows = run_config(mode, batch, r, rho_f, device_name, args)
            for rec in rows:
                f.write(json.dumps(rec) + "\n")
            f.flush()
            records += rows
    summary(records)
    print(f"\n{len(records)} records in {time.time() - started:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
