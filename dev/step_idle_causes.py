"""What the host was doing while the GPU idled, in a kept profiler trace of training steps
(`benchmarks/step_profile.py --keep-trace DIR`): the GPU's idle stretches of at least --min-gap
microseconds between its first and last stream event, sampled every --every microseconds; at
each sample, each host thread's innermost event (the latest-starting one that covers it). Per
thread kind (python, tf_Compute, tf_data, other), the event names by idle time per step; then
the device-to-host copies per step, by the op that made them (the copies' `tf_op` stat), since
an op that needs a GPU value on the host waits for the GPU to reach it. Last, the step
function's calls on the Python thread (Keras' `multi_step_on_iterator`, or a `train_function`
of one's own; --function NAME for another): each call's time and the time until the next call,
with the GPU's busy time within each and the Python thread's device-to-host copies between
calls (where fit waits for a step's GPU work before the next step); then, for a call that
lasts as long as its GPU work, what it waits for at its end: the device-to-host copies that end
last within a call, by op.

    python3 dev/step_idle_causes.py DIR --steps 20 [--min-gap 5] [--every 2] [--top 20] [--function NAME]
"""
import argparse
import bisect
import collections
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import gpu_trace  # noqa: E402


def thread_kind(line_name):
    for kind in ("python", "tf_Compute", "tf_data"):
        if line_name.startswith(kind):
            return kind
    return "other"


def host_lines(space):
    """[(kind, sorted begins, [(begin ps, end ps, name)])] of the non-GPU planes' lines."""
    out = []
    for plane in space.planes:
        if plane.name.startswith("/device:GPU:"):
            continue
        names = {i: m.name for i, m in plane.event_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            events = sorted((base + e.offset_ps, base + e.offset_ps + e.duration_ps, names.get(e.metadata_id, "?"))
                            for e in line.events)
            if events:
                out.append((thread_kind(line.name), [e[0] for e in events], events))
    return out


def innermost(begins, events, t, look_back=400):
    """The latest-starting event of one line that covers t, or None."""
    i = bisect.bisect_right(begins, t) - 1
    for j in range(i, max(-1, i - look_back), -1):
        if events[j][1] > t:
            return events[j][2]
    return None


def d2h_copies(space):
    """Counter of the GPU planes' device-to-host copies by their tf_op stat (or event name)."""
    return collections.Counter(op for op, _, _ in d2h_copy_events(space))


def d2h_copy_events(space):
    """[(op, begin ps, end ps)] of the GPU planes' device-to-host copies, op being the copy's
    tf_op stat (or its event name)."""
    copies = []
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        names = {i: m.name for i, m in plane.event_metadata.items()}
        stat_names = {i: m.name for i, m in plane.stat_metadata.items()}
        for line in plane.lines:
            if "stream" not in line.name.lower():
                continue
            for e in line.events:
                name = names.get(e.metadata_id, "")
                if "memcpyd2h" not in name.lower().replace(" ", ""):
                    continue
                op = next((s.str_value or str(s.ref_value) for s in e.stats
                           if stat_names.get(s.metadata_id) == "tf_op"), None)
                if op is not None and op.isdigit():
                    op = stat_names.get(int(op), op)
                begin = line.timestamp_ns * 1000 + e.offset_ps
                copies.append((op or name, begin, begin + e.duration_ps))
    return copies


def copies_before_call_ends(space, calls, intervals):
    """What a step-function call waits for at its end: over the calls, the median picoseconds
    from the GPU's last work within each call to the call's end, and per op whose
    device-to-host copy ends within a call, [(ps from the copy's end to the call's end)]."""
    copies = sorted(d2h_copy_events(space), key=lambda c: c[2])
    ends = [c[2] for c in copies]
    gpu_ends = sorted(e for _, e in intervals)
    tails, by_op = [], collections.defaultdict(list)
    for b0, e0 in calls:
        last = bisect.bisect_right(gpu_ends, e0) - 1
        if last >= 0 and gpu_ends[last] > b0:
            tails.append(e0 - gpu_ends[last])
        for i in range(bisect.bisect_left(ends, b0), bisect.bisect_right(ends, e0)):
            by_op[copies[i][0]].append(e0 - copies[i][2])
    return tails, by_op


STEP_FUNCTIONS = ("multi_step_on_iterator", "train_function")


def busy_within(intervals, begin, end):
    """The GPU's busy time (union of intervals) within [begin, end)."""
    return gpu_trace.union_length([(max(b, begin), min(e, end)) for b, e in intervals if e > begin and b < end])


def step_calls(space, intervals, name=None):
    """(name, [(call ps, GPU busy ps in it, ps to the next call, GPU busy ps in between, the
    Python threads' device-to-host copies in between)]) per traced call of the step function
    but the last: the Python-thread events called name, by default the first of
    STEP_FUNCTIONS with any."""
    names = [name] if name else STEP_FUNCTIONS
    for candidate in names:
        calls = gpu_trace.python_calls(space, candidate)
        if calls:
            break
    else:
        return names[0], []
    copies = sorted(b for kind, _, events in host_lines(space) if kind == "python"
                    for b, _, event in events if event.replace(" ", "").lower() == "memcpyd2h")
    rows = []
    for (b0, e0), (b1, _) in zip(calls, calls[1:]):
        between = bisect.bisect_left(copies, b1) - bisect.bisect_left(copies, e0)
        rows.append((e0 - b0, busy_within(intervals, b0, e0), b1 - e0, busy_within(intervals, e0, b1), between))
    return candidate, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--min-gap", type=float, default=5.0, help="us")
    parser.add_argument("--every", type=float, default=2.0, help="us between samples")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--function", help=f"the step function's Python name (default: {' or '.join(STEP_FUNCTIONS)})")
    args = parser.parse_args()
    paths = glob.glob(os.path.join(args.trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        sys.exit(f"no .xplane.pb under {args.trace_dir}")
    space = gpu_trace.read_xspace(paths[-1])
    intervals = [(b, e) for _, (_, evs) in gpu_trace.gpu_stream_events(space).items() for b, e, _ in evs]
    gaps = gpu_trace.idle_stretches(intervals, args.min_gap * 1e6)
    lines = host_lines(space)
    step = 1e9 * args.steps  # ps -> ms per step
    every = args.every * 1e6
    by_kind = collections.defaultdict(collections.Counter)
    for g0, g1 in gaps:
        t = g0 + every / 2
        while t < g1:
            seen = set()
            for kind, begins, events in lines:
                name = innermost(begins, events, t)
                if name is not None and (kind, name) not in seen:
                    seen.add((kind, name))
                    by_kind[kind][name[:110]] += every
            t += every
    idle = sum(b - a for a, b in gaps)
    print(f"{paths[-1]}: {len(gaps) / args.steps:.1f} GPU idle stretches >= {args.min_gap} us per step, "
          f"{idle / step:.2f} ms per step; busy {gpu_trace.union_length(intervals) / step:.2f} ms per step")
    for kind in ("python", "tf_Compute", "tf_data", "other"):
        print(f"-- {kind}: what its threads were in while the GPU idled (ms per step; threads overlap)")
        for name, ps in by_kind[kind].most_common(args.top):
            print(f"   {ps / step:8.3f}  {name}")
    print("-- device-to-host copies per step, by op")
    for op, count in d2h_copies(space).most_common(args.top):
        print(f"   {count / args.steps:6.1f}  {op[:120]}")
    name, rows = step_calls(space, intervals, args.function)
    if not rows:
        print(f"-- no two calls of the step function {name!r} on a Python thread")
        return
    columns = list(zip(*rows))

    def spread(values, scale=1e9):
        values = sorted(values)
        return f"{values[len(values) // 2] / scale:.2f} ({values[0] / scale:.2f}-{values[-1] / scale:.2f})"
    print(f"-- the step function {name!r}, {len(rows)} calls and the time to the next (median (min-max))")
    print(f"   call {spread(columns[0])} ms, GPU busy in it {spread(columns[1])} ms")
    print(f"   until the next call {spread(columns[2])} ms, GPU busy meanwhile {spread(columns[3])} ms, "
          f"Python-thread device-to-host copies meanwhile {spread(columns[4], 1)}")
    tails, by_op = copies_before_call_ends(space, gpu_trace.python_calls(space, name), intervals)
    if tails:
        print(f"   from the GPU's last work in a call to the call's end {spread(tails)} ms")
    print(f"-- the copies to the host that end last in a call of {name!r} (ms before the call ends, "
          "median (min-max), copies per call)")
    ranked = sorted(by_op.items(), key=lambda item: sorted(item[1])[len(item[1]) // 2])
    for op, gaps in ranked[:args.top]:
        print(f"   {spread(gaps)}  {len(gaps) / max(1, len(rows) + 1):4.1f}  {op[:100]}")


if __name__ == "__main__":
    main()
