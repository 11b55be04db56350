"""Reading TensorFlow's profiler traces for the benchmarks: the GPUs' stream events of an
XSpace (.xplane.pb), the union of their intervals (the GPU's busy time), the idle stretches
between them, the costliest kernels of a few traced calls, and their rows."""
import bisect
import glob
import json
import os
import tempfile


def union_length(intervals):
    """Total length covered by [begin, end) intervals (picoseconds)."""
    total, end = 0, None
    for b, e in sorted(intervals):
        if end is None or b > end:
            total += e - b
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def idle_stretches(intervals, at_least):
    """The idle stretches between [begin, end) intervals (their union's holes) of at least
    at_least picoseconds, as (begin, end), in order."""
    holes, end = [], None
    for b, e in sorted(intervals):
        if end is not None and b - end >= at_least:
            holes.append((end, b))
        end = e if end is None else max(end, e)
    return holes


def idle_gaps(intervals, at_least):
    """The lengths of idle_stretches(intervals, at_least), in order."""
    return [e - b for b, e in idle_stretches(intervals, at_least)]


def named_gaps(events, at_least, top):
    """(the idle stretches' total, their count, the `top` longest as (length, the event that
    ended last before it, the event after it)) between (begin, end, name) events, holes of
    their union of at least at_least (the events' time unit)."""
    gaps, end, last = [], None, None
    for b, e, name in sorted(events):
        if end is not None and b - end >= at_least:
            gaps.append((b - end, last, name))
        if end is None or e > end:
            end, last = e, name
    return sum(g[0] for g in gaps), len(gaps), sorted(gaps, key=lambda g: -g[0])[:top]


def read_xspace(xspace):
    """The XSpace protocol buffer of a profiler trace file (.xplane.pb); an XSpace already
    read is returned as it is, so that one reader can hand it to the others."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    if isinstance(xspace, xplane_pb2.XSpace):
        return xspace
    space = xplane_pb2.XSpace()
    with open(xspace, "rb") as f:
        space.ParseFromString(f.read())
    return space


def gpu_stream_events(xspace_path):
    """{GPU plane name: ([line names], [(begin ps, end ps, event name)])} of a profiler trace
    (a file or its read_xspace):
    the events on each GPU's stream lines (CUPTI's kernels, copies and memsets); derived
    lines (steps, ops), which repeat the streams' time, are named but their events left out."""
    space = read_xspace(xspace_path)
    out = {}
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU:"):
            continue
        names = {i: m.name for i, m in plane.event_metadata.items()}
        lines, events = out.setdefault(plane.name, ([], []))
        for line in plane.lines:
            lines.append(line.name)
            if "stream" not in line.name.lower():
                continue
            base = line.timestamp_ns * 1000
            for event in line.events:
                b = base + event.offset_ps
                events.append((b, b + event.duration_ps, names.get(event.metadata_id, "")))
    return out


def python_calls(xspace_path, name):
    """[(begin ps, end ps)] of the events called `name` on the Python thread of a profiler
    trace's host plane (a file or its read_xspace): one per traced call of a tf.function or ConcreteFunction of that
    Python name."""
    space = read_xspace(xspace_path)
    calls = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {i: m.name for i, m in plane.event_metadata.items()}
        for line in plane.lines:
            if not line.name.startswith("python"):
                continue
            base = line.timestamp_ns * 1000
            calls += [(base + e.offset_ps, base + e.offset_ps + e.duration_ps) for e in line.events
                      if names.get(e.metadata_id) == name]
    return sorted(calls)


def first_gpu_work(xspace_path, name):
    """For each traced call `name` (python_calls), the picoseconds from its start to the first
    GPU stream event that begins after it (None where none does, e.g. without a GPU): how
    long the GPU waits for the host's start of a call."""
    space = read_xspace(xspace_path)
    starts = sorted(b for _, stream in gpu_stream_events(space).values() for b, _, _ in stream)
    out = []
    for begin, _ in python_calls(space, name):
        i = bisect.bisect_left(starts, begin)
        out.append(starts[i] - begin if i < len(starts) else None)
    return out


def trace_file(run, args, calls):
    """The XSpace file (.xplane.pb, in a new temporary folder) of `calls` calls of run(*args)
    under TensorFlow's profiler (after one untraced call)."""
    import tensorflow as tf
    from timing import sync
    logdir = tempfile.mkdtemp(prefix="gpu_kernels_")
    run(*args)
    sync()  # the untraced call's kernels end before the trace starts
    tf.profiler.experimental.start(logdir)
    for _ in range(calls):
        run(*args)
    sync()  # the last calls' kernels land in the trace: a call returns before its GPU work ends
    tf.profiler.experimental.stop()
    return sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))[-1]


def traced_events(run, args, calls):
    """The GPUs' stream events (begin ps, end ps, name) during `calls` calls of run(*args)
    under TensorFlow's profiler (after one untraced call)."""
    path = trace_file(run, args, calls)
    return [event for _, stream in gpu_stream_events(path).values() for event in stream]


def kernel_times(run, args, calls, top):
    """The GPU's kernels, copies and memsets during `calls` calls of run(*args) under
    TensorFlow's profiler: rank_events of the trace (as kernels_in_trace)."""
    return rank_events(traced_events(run, args, calls), calls, top, 1e9)


def rank_events(events, calls, top, per_ms):
    """(busy ms per call, [(name, ms per call, launches per call)] of the `top` names by time)
    of (begin, end, name) events whose times are in units of which per_ms make a millisecond;
    busy is the union of the events' intervals."""
    by_name, intervals = {}, []
    for b, e, name in events:
        intervals.append((b, e))
        total, count = by_name.get(name or "?", (0, 0))
        by_name[name or "?"] = (total + e - b, count + 1)
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    return (union_length(intervals) / per_ms / calls,
            [(name[:160], t / per_ms / calls, count / calls) for name, (t, count) in ranked])


def kernels_in_trace(xspace_path, calls, top):
    """rank_events of the GPUs' stream events of a TensorFlow profiler trace
    (gpu_stream_events; picoseconds)."""
    events = [event for _, stream in gpu_stream_events(xspace_path).values() for event in stream]
    return rank_events(events, calls, top, 1e9)


def append_kernel_row(path, key, busy_ms, top, calls):
    """Appends one kernels row ({key}, the GPU's busy seconds per call, the traced calls and
    the costliest kernels as [name, seconds per call, launches per call]) to the JSON lines
    at path and prints it."""
    row = {**key, "gpu_busy_s": busy_ms / 1e3, "calls": calls,
           "kernels": [[name, ms / 1e3, n] for name, ms, n in top]}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"    GPU busy {busy_ms:.3f} ms per call; costliest kernels (ms, launches per call):", flush=True)
    for name, ms, n in top:
        print(f"      {ms:8.3f} {n:6.1f}  {name[:110]}", flush=True)
