"""Runtime and memory of ts.direct_conv against dense tf.nn.conv3d on random sparse grids.

The synthetic setting of Hackel et al. §4.1 (Fig. 4, Table 1), on this machine's CPU:
r^3 grids, input density rho = 1/r (r^2 random entries per (batch, channel)), a 3x3x3
kernel with Cin 1 -> Cout 8, filter density rho_f in {0.1, 0.5, 1.0}, with k-selection
('signed', rho_up = 1/r) and without it (selection='none').

Two kinds of rows go to the JSON-lines file (one object per configuration):
  kind "time"   batch 1: medians over repeats after warm-up, ours and dense in this
                process; peak memory of each at batch 1 from a fresh subprocess.
  kind "memory" batch 32: peak memory of each from a fresh subprocess (one cold run,
                timed once); dense is not run where its tensors would not fit.

Peak bytes are the growth of process peak RSS over the op call (VmHWM after minus VmRSS
before, with the peak reset just before): what the op adds on top of its inputs, its
output included. Inputs are reported separately (*_input_bytes). Where dense is not run,
dense_peak_bytes is its computed output size (as in the paper's Table 1) and
dense_peak_measured is false.

Usage:
  python benchmarks/direct_conv.py            # full run, r in {32, 64, 128, 256}
  python benchmarks/direct_conv.py --quick    # r in {32, 64}, few repeats
  python benchmarks/direct_conv.py --table    # markdown table from an existing results file
  (--out PATH: results file to write, or to read with --table)
tf_sparseconv is imported from PYTHONPATH if it is there (e.g. a frozen copy of one
build), else from this checkout.
"""
import argparse
import ctypes
import gc
import hashlib
import importlib.util
import json
import math
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if importlib.util.find_spec("tf_sparseconv") is None:
    sys.path.insert(0, REPO_ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_sparseconv as ts  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import add_replace_argument, refuse_to_replace  # noqa: E402

DEFAULT_OUT = os.path.join(REPO_ROOT, "benchmarks", "results", "direct_conv_cpu.jsonl")
FULL_RESOLUTIONS = (32, 64, 128, 256)
QUICK_RESOLUTIONS = (32, 64)
FILTER_DENSITIES = (0.1, 0.5, 1.0)
KERNEL_SIZE = (3, 3, 3)
CIN, COUT = 1, 8
TIME_BATCH, MEMORY_BATCH = 1, 32
SEED = 0
# Dense is not run where its input + output exceed this (the machine has 24 GiB).
DENSE_RUN_LIMIT_BYTES = 12e9
# A measurement subprocess is killed beyond this RSS, before it can take the machine down.
CHILD_RSS_LIMIT_BYTES = 16 * 2**30
GB = 1e9  # decimal, as in the paper's Table 1


@dataclass(frozen=True)
class Config:
    r: int
    rho_f: float
    batch: int
    k_selection: bool

    @property
    def rho(self):
        return 1.0 / self.r

    @property
    def spatial_size(self):
        return self.r ** 3

    @property
    def entries_per_segment(self):
        return round(self.spatial_size * self.rho)

    @property
    def k(self):
        """Per-(batch, channel) bound of k-selection with rho_up = 1/r, or None."""
        return ts.k_from_rho_up(self.rho, (self.r,) * 3) if self.k_selection else None

    def dense_bytes(self):
        """(input, output) bytes of the dense float32 tensors."""
        cells = self.batch * self.spatial_size
        return cells * CIN * 4, cells * COUT * 4


@dataclass(frozen=True)
class Repeats:
    ours_warmup: int
    ours_timed: int
    dense_warmup: int
    dense_timed: int


def repeats_for(r, quick):
    if quick:
        return Repeats(1, 3, 1, 3)
    if r <= 64:
        return Repeats(2, 10, 2, 10)
    if r == 128:
        return Repeats(2, 10, 2, 5)
    return Repeats(2, 7, 1, 3)  # dense 256^3 takes seconds per call


# ---------------------------------------------------------------------------------------
# Inputs


def random_sparse_input(r, batch, seed):
    """Sorted keys and values with round(r^3 / r) random positions per (batch, channel)."""
    spatial_size = r ** 3
    per_segment = round(spatial_size / r)
    rng = np.random.default_rng(seed)
    keys = np.concatenate([
        segment * spatial_size + np.sort(rng.choice(spatial_size, size=per_segment, replace=False))
        for segment in range(batch * CIN)
    ]).astype(np.int64)
    values = rng.standard_normal(keys.size, dtype=np.float32)
    return keys, values


def densify(keys, values, r, batch, channels):
    """The dense [B, r, r, r, C] float32 array of channel-sparse keys and values."""
    spatial_size = r ** 3
    segment, lin = np.divmod(keys, spatial_size)
    b, c = np.divmod(segment, channels)
    dense = np.zeros(batch * spatial_size * channels, np.float32)
    dense[(b * spatial_size + lin) * channels + c] = values
    return dense.reshape(batch, r, r, r, channels)


def random_filter(rho_f, seed):
    """A [3, 3, 3, Cin, Cout] filter and a mask with round(rho_f * size) weights present."""
    rng = np.random.default_rng(seed)
    shape = KERNEL_SIZE + (CIN, COUT)
    filters = rng.standard_normal(shape, dtype=np.float32)
    size = filters.size
    mask = np.zeros(size, bool)
    mask[rng.permutation(size)[:round(rho_f * size)]] = True
    return filters, mask.reshape(shape)


@dataclass
class SparseProblem:
    x: ts.ChannelSparseTensor
    filters: tf.Tensor
    mask: tf.Tensor
    bias: tf.Tensor


@dataclass
class DenseProblem:
    x: tf.Tensor
    masked_filters: tf.Tensor


def make_problems(config, seed=SEED, with_sparse=True, with_dense=True):
    """Input tensors for ours and/or dense; the numpy staging arrays are dropped."""
    keys, values = random_sparse_input(config.r, config.batch, seed)
    filters, mask = random_filter(config.rho_f, seed + 1)
    sparse = dense = None
    if with_sparse:
        shape = tf.constant([config.batch, config.r, config.r, config.r, CIN], tf.int64)
        sparse = SparseProblem(ts.ChannelSparseTensor(tf.constant(keys), tf.constant(values), shape),
                               tf.constant(filters), tf.constant(mask), tf.zeros([COUT]))
    if with_dense:
        dense = DenseProblem(tf.constant(densify(keys, values, config.r, config.batch, CIN)),
                             tf.constant(filters * mask))
    return sparse, dense


# ---------------------------------------------------------------------------------------
# The two convolutions. Eager CPU ops run synchronously, so a returned tensor is
# computed; no .numpy() copy (0.5 GB for the dense 256^3 output) is added to the timing.


def run_ours(problem, config):
    selection = dict(selection="signed", rho_up=config.rho) if config.k_selection else {}
    return ts.direct_conv(problem.x, problem.filters, problem.bias, problem.mask, **selection)


def run_dense(problem):
    return tf.nn.conv3d(problem.x, problem.masked_filters, strides=[1] * 5, padding="SAME")


def run_method(method, sparse, dense, config):
    return run_ours(sparse, config) if method == "ours" else run_dense(dense)


def timed_runs(fn, warmup, timed):
    """Seconds of each timed call of fn after `warmup` untimed calls, and the last result."""
    for _ in range(warmup):
        result = fn()
    seconds = []
    for _ in range(timed):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return seconds, result


def max_abs_error(ours, dense_out, full_support):
    """Largest |ours - dense| on ours' entries, or over the whole grid if full_support."""
    dense_out = dense_out.numpy()
    keys, values = ours.keys.numpy(), ours.values.numpy()
    cout = dense_out.shape[-1]
    spatial_size = math.prod(dense_out.shape[1:-1])
    segment, lin = np.divmod(keys, spatial_size)
    b, oc = np.divmod(segment, cout)
    flat_index = (b * spatial_size + lin) * cout + oc
    if not full_support:
        return float(np.max(np.abs(dense_out.reshape(-1)[flat_index] - values), initial=0.0))
    expected = np.zeros(dense_out.size, np.float32)
    expected[flat_index] = values
    return float(np.max(np.abs(dense_out.reshape(-1) - expected), initial=0.0))


# ---------------------------------------------------------------------------------------
# Peak memory, each measurement in a fresh spawned process


def read_proc_kib_field(path, field):
    """A 'Field:  <n> kB' line of a /proc file, in bytes."""
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def read_status_bytes(field, pid="self"):
    return read_proc_kib_field(f"/proc/{pid}/status", field)


def release_free_heap():
    """Returns freed staging memory to the OS so that the op cannot reuse it unseen."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_of_op_call(method, config):
    """Body of a measurement subprocess: peak RSS growth of one call of ours or dense."""
    tiny = Config(8, config.rho_f, 1, config.k_selection)
    sparse, dense = make_problems(tiny, with_sparse=method == "ours", with_dense=method == "dense")
    run_method(method, sparse, dense, tiny)  # loads kernels, starts the thread pools
    sparse, dense = make_problems(config, with_sparse=method == "ours", with_dense=method == "dense")
    release_free_heap()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    rss_before = read_status_bytes("VmRSS")
    start = time.perf_counter()
    out = run_method(method, sparse, dense, config)
    seconds = time.perf_counter() - start
    result = {"peak_bytes": read_status_bytes("VmHWM") - rss_before, "seconds": seconds}
    if method == "ours":
        result.update(n_in=int(sparse.x.keys.shape[0]), n_out=int(out.keys.shape[0]))
    return result


def _child_main(method, config, conn):
    try:
        conn.send(peak_of_op_call(method, config))
    except BaseException as e:  # report, don't hang the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def measure_peak_in_subprocess(method, config):
    """Runs peak_of_op_call in a fresh process; kills it past CHILD_RSS_LIMIT_BYTES."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(method, config, sender))
    child.start()
    sender.close()
    try:
        while True:
            if receiver.poll(0.05):
                return receiver.recv()
            if not child.is_alive():
                if receiver.poll(0):  # sent just before exiting
                    return receiver.recv()
                return {"error": f"measurement process exited with code {child.exitcode}"}
            try:
                rss = read_status_bytes("VmRSS", child.pid)
            except (FileNotFoundError, KeyError):
                continue  # exiting
            if rss > CHILD_RSS_LIMIT_BYTES:
                child.kill()
                return {"error": f"killed: RSS passed the {CHILD_RSS_LIMIT_BYTES / GB:.1f} GB guard"}
    finally:
        child.join()


# ---------------------------------------------------------------------------------------
# Rows


def machine_description():
    cpu = platform.processor() or "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gib = read_proc_kib_field("/proc/meminfo", "MemTotal") / 2**30
    return f"{platform.platform()}; {cpu}; nproc={os.cpu_count()}; mem={memory_gib:.0f} GiB"


PACKAGE_DIR = os.path.dirname(os.path.abspath(ts.__file__))


def op_library_digest():
    """Ties results to one build of the op library (it is rebuilt as the ops change)."""
    with open(os.path.join(PACKAGE_DIR, "_tf_sparseconv_ops.so"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def git_revision(directory):
    """Short HEAD of the checkout holding directory (+dirty), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=directory,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=directory, capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def run_context():
    """Extras shared by every row of one run."""
    return {"machine": machine_description(), "tf_version": tf.__version__,
            "package_dir": PACKAGE_DIR, "op_library_sha256": op_library_digest(),
            "git_revision": git_revision(PACKAGE_DIR)}


def base_row(kind, config):
    return {"kind": kind, "r": config.r, "rho": config.rho, "rho_f": config.rho_f,
            "batch": config.batch, "cin": CIN, "cout": COUT, "k_selection": config.k_selection,
            "k": config.k}


def memory_fields(config, ours_peak, dense_peak, n_out):
    """The peak / tensor-size fields of a row, with a note where a peak is missing."""
    dense_in, dense_out = config.dense_bytes()
    row = {"ours_input_bytes": config.batch * CIN * config.entries_per_segment * 12,
           "ours_output_bytes": n_out * 12 if n_out is not None else None,
           "dense_input_bytes": dense_in, "dense_output_bytes": dense_out,
           "ours_peak_bytes": ours_peak.get("peak_bytes")}
    if "error" in ours_peak:
        row["ours_peak_note"] = ours_peak["error"]
    if dense_peak is None:
        row.update(dense_peak_bytes=dense_out, dense_peak_measured=False,
                   dense_peak_note=f"not run: dense input + output {(dense_in + dense_out) / GB:.1f} GB "
                                   f"exceed the {DENSE_RUN_LIMIT_BYTES / GB:.0f} GB limit; "
                                   "dense_peak_bytes is the computed output size")
    else:
        row.update(dense_peak_bytes=dense_peak.get("peak_bytes"),
                   dense_peak_measured="peak_bytes" in dense_peak)
        if "error" in dense_peak:
            row["dense_peak_note"] = dense_peak["error"]
    return row


def ratio(dense_s, ours_s):
    return dense_s / ours_s if dense_s is not None and ours_s else None


def dense_fits(config):
    return sum(config.dense_bytes()) <= DENSE_RUN_LIMIT_BYTES


def time_rows(r, quick, context):
    """Batch-1 rows of one resolution: timed in this process, peaks from subprocesses."""
    repeats = repeats_for(r, quick)
    for rho_f in FILTER_DENSITIES:
        # Dense does the same work with or without k-selection: both rows share its timing.
        dense_config = Config(r, rho_f, TIME_BATCH, False)
        _, dense = make_problems(dense_config, with_sparse=False)
        dense_times, dense_out = timed_runs(lambda: run_dense(dense), repeats.dense_warmup,
                                            repeats.dense_timed)
        del dense
        dense_peak = measure_peak_in_subprocess("dense", dense_config)
        for k_selection in (False, True):
            config = Config(r, rho_f, TIME_BATCH, k_selection)
            sparse, _ = make_problems(config, with_dense=False)
            ours_times, y = timed_runs(lambda: run_ours(sparse, config),
                                       repeats.ours_warmup, repeats.ours_timed)
            ours_s, dense_s = statistics.median(ours_times), statistics.median(dense_times)
            n_out = int(y.keys.shape[0])
            row = base_row("time", config)
            row.update(ours_s=ours_s, dense_s=dense_s, ratio=ratio(dense_s, ours_s),
                       n_in=int(sparse.x.keys.shape[0]), n_out=n_out,
                       max_abs_err_vs_dense=max_abs_error(y, dense_out, full_support=not k_selection),
                       ours_times_s=ours_times, dense_times_s=dense_times,
                       warmup=[repeats.ours_warmup, repeats.dense_warmup])
            del sparse, y
            ours_peak = measure_peak_in_subprocess("ours", config)
            row.update(memory_fields(config, ours_peak, dense_peak, n_out))
            row.update(loadavg_1m=os.getloadavg()[0], **context)
            yield row


def memory_rows(r, context):
    """Batch-32 rows of one resolution: peak and one cold timing, all from subprocesses."""
    for rho_f in FILTER_DENSITIES:
        dense_config = Config(r, rho_f, MEMORY_BATCH, False)
        dense_peak = measure_peak_in_subprocess("dense", dense_config) if dense_fits(dense_config) else None
        for k_selection in (False, True):
            config = Config(r, rho_f, MEMORY_BATCH, k_selection)
            ours_peak = measure_peak_in_subprocess("ours", config)
            ours_s = ours_peak.get("seconds")
            dense_s = dense_peak.get("seconds") if dense_peak else None
            row = base_row("memory", config)
            row.update(ours_s=ours_s, dense_s=dense_s, ratio=ratio(dense_s, ours_s),
                       n_in=ours_peak.get("n_in", config.batch * CIN * config.entries_per_segment),
                       n_out=ours_peak.get("n_out"),
                       max_abs_err_vs_dense=None, timing_note="single cold run in the measurement process")
            if dense_s is None:
                row["dense_s_note"] = "dense not run (see dense_peak_note)"
            row.update(memory_fields(config, ours_peak, dense_peak, row["n_out"]))
            row.update(loadavg_1m=os.getloadavg()[0], **context)
            yield row


# ---------------------------------------------------------------------------------------
# Reporting


def _fmt(value, spec, missing="—"):
    return missing if value is None else format(value, spec)


def progress_line(row):
    dense_peak_kind = "" if row["dense_peak_measured"] else " (computed)"
    return (f"[{row['kind']:6s}] r={row['r']:3d} batch={row['batch']:2d} rho_f={row['rho_f']:.1f} "
            f"k-sel={'yes' if row['k_selection'] else 'no '}  "
            f"ours {_fmt(row['ours_s'], '.4f')} s  dense {_fmt(row['dense_s'], '.3f')} s  "
            f"x{_fmt(row['ratio'], '.1f')}  peak ours {_fmt(_gb(row['ours_peak_bytes']), '.3f')} GB "
            f"dense {_fmt(_gb(row['dense_peak_bytes']), '.3f')} GB{dense_peak_kind}  "
            f"n_out={row['n_out']}  err={_fmt(row['max_abs_err_vs_dense'], '.1e')}")


def _gb(n_bytes):
    return None if n_bytes is None else n_bytes / GB


TABLE_HEADER = ("| kind | r³ | batch | ρ_f | k-sel | n_in | n_out | ours [s] | dense [s] | dense/ours "
                "| ours peak [GB] | ours output [GB] | dense peak [GB] |\n"
                "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def table_line(row):
    dense_peak = _fmt(_gb(row["dense_peak_bytes"]), ".3f")
    if not row["dense_peak_measured"]:
        dense_peak += " (computed, not run)"
    return (f"| {row['kind']} | {row['r']}³ | {row['batch']} | {row['rho_f']:.1f} "
            f"| {'signed' if row['k_selection'] else 'none'} | {row['n_in']} | {_fmt(row['n_out'], 'd')} "
            f"| {_fmt(row['ours_s'], '.4f')} | {_fmt(row['dense_s'], '.3f')} | {_fmt(row['ratio'], '.1f')} "
            f"| {_fmt(_gb(row['ours_peak_bytes']), '.3f')} | {_fmt(_gb(row['ours_output_bytes']), '.3f')} "
            f"| {dense_peak} |")


def goal_lines(rows):
    """The project's stated targets, checked against the rows that exist."""
    lines = []
    for r, target in ((128, 20.0), (256, 100.0)):
        for row in rows:
            if row["kind"] == "time" and row["r"] == r and row["rho_f"] == 0.1 and row["ratio"]:
                met = "met" if row["ratio"] >= target else "NOT met"
                lines.append(f"- {r}³, ρ_f = 0.1, k-sel {'signed' if row['k_selection'] else 'none'}: "
                             f"dense/ours = {row['ratio']:.1f}× (goal ≥ {target:.0f}×: {met})")
    for row in rows:
        if row["kind"] == "memory" and row["r"] == 256 and row["k_selection"]:
            peak, output = _gb(row["ours_peak_bytes"]), _gb(row["ours_output_bytes"])
            met = "NOT met" if peak is None or peak > 0.2 else "met"
            lines.append(f"- 256³ batch 32, ρ_f = {row['rho_f']:.1f}, k-sel signed: ours peak "
                         f"{_fmt(peak, '.3f')} GB, output tensors {_fmt(output, '.3f')} GB "
                         f"(goal peak ≤ 0.2 GB: {met})")
    return lines


def render_markdown(rows):
    parts = [TABLE_HEADER] + [table_line(row) for row in rows]
    if rows:
        first = rows[0]
        source = f"git {first['git_revision']}" if first["git_revision"] else first["package_dir"]
        parts += ["", f"Machine: {first['machine']}; TensorFlow {first['tf_version']}; "
                      f"op library sha256 {first['op_library_sha256']} ({source}).",
                  "Peaks are process peak-RSS growth over one op call (inputs excluded); "
                  "time rows: medians after warm-up; memory rows: one cold run."]
        goals = goal_lines(rows)
        if goals:
            parts += ["", "Goals:"] + goals
    return "\n".join(parts)


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------------------------


def run_benchmark(quick, out_path):
    resolutions = QUICK_RESOLUTIONS if quick else FULL_RESOLUTIONS
    context = run_context()
    print(f"{context['machine']}; TensorFlow {context['tf_version']}; load {os.getloadavg()[0]:.2f}",
          flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    rows = []
    start = time.perf_counter()
    with open(out_path, "w") as out:
        row_sources = [time_rows(r, quick, context) for r in resolutions] + \
                      [memory_rows(r, context) for r in resolutions]
        for source in row_sources:
            for row in source:
                out.write(json.dumps(row) + "\n")
                out.flush()
                rows.append(row)
                print(progress_line(row), flush=True)
    print(f"\nTotal {time.perf_counter() - start:.0f} s; results in {out_path}\n")
    if op_library_digest() != context["op_library_sha256"]:
        print("WARNING: the op library was rebuilt during this run; rows may mix two builds.\n")
    print(render_markdown(rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="r in {32, 64} only, few repeats")
    parser.add_argument("--out", default=DEFAULT_OUT, help="results file (JSON lines)")
    parser.add_argument("--table", action="store_true",
                        help="print the markdown table of an existing results file and exit")
    add_replace_argument(parser)
    args = parser.parse_args()
    if args.table:
        print(render_markdown(read_rows(args.out)))
    else:
        refuse_to_replace(parser, args.out, args.replace)
        run_benchmark(args.quick, args.out)


if __name__ == "__main__":
    main()
