"""Where a traced training step spends its host time: the host planes' events of a trace kept
by `benchmarks/step_profile.py --keep-trace DIR`, per host thread, grouped by name (a TensorFlow
op's events by its type, the part after the last ':'), count and milliseconds per step, the
costliest first. Events nest (an executor's Process holds the ops it runs), so a thread's rows
overlap; the rows say where the time goes, not an exclusive split.

    python3 dev/step_host_events.py DIR --steps 20 [--top 25] [--merged]

--merged: one table over every host thread instead, each event's self time (its duration less
that of the events nested in it on its thread), so the rows add up to the threads' busy time.
"""
import argparse
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
sys.path.insert(0, HERE)

import gpu_trace  # noqa: E402
import host_time_fig4  # noqa: E402


def grouped(name):
    """A TensorFlow op's event ("scope/node:Type") by its type; others (kernel launches named by
    their signature, "<...>" events) as they are."""
    return name.rsplit(":", 1)[-1] if ":" in name and "(" not in name and not name.startswith("<") else name


def host_rows(space, steps, top):
    """[(thread, [(name, count per step, ms per step)])] of the non-GPU planes, the busiest
    threads first."""
    threads = host_time_fig4.host_events(space, steps, top, group=grouped, per=1e9)
    return sorted(threads.items(), key=lambda thread: -thread[1][0][2])


def self_times(space, steps, top):
    """[(name, count per step, self ms per step)] over every non-GPU plane's lines, grouped by
    grouped(name), the costliest first, and the sum of all self times (ms per step)."""
    by_name = {}
    enclosing = []  # [end ps, name, duration ps, nested ps] of the events around the current one

    def close(until):
        while enclosing and enclosing[-1][0] <= until:
            _, name, duration, nested = enclosing.pop()
            count, ps = by_name.get(name, (0, 0))
            by_name[name] = (count + 1, ps + duration - nested)

    for plane in space.planes:
        if plane.name.startswith("/device:GPU:"):
            continue
        names = {i: m.name for i, m in plane.event_metadata.items()}
        for line in plane.lines:
            for e in sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps)):
                close(e.offset_ps)
                if enclosing:
                    enclosing[-1][3] += e.duration_ps
                enclosing.append([e.offset_ps + e.duration_ps, grouped(names.get(e.metadata_id, "?")),
                                  e.duration_ps, 0])
            close(float("inf"))
    total = sum(ps for _, ps in by_name.values()) / 1e9 / steps
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return [(n[:140], c / steps, ps / 1e9 / steps) for n, (c, ps) in ranked], total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, required=True, help="the traced steps")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=6, help="how many host threads to print")
    parser.add_argument("--merged", action="store_true", help="one table of self times over all host threads")
    args = parser.parse_args()
    paths = glob.glob(os.path.join(args.trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        sys.exit(f"no .xplane.pb under {args.trace_dir}")
    for path in paths:
        if args.merged:
            rows, total = self_times(gpu_trace.read_xspace(path), args.steps, args.top)
            print(f"{path}: self time over all host threads, {total:.3f} ms per step")
            for name, count, ms in rows:
                print(f"   {ms:8.3f} ms {count:8.1f}x  {name}")
            continue
        threads = host_rows(gpu_trace.read_xspace(path), args.steps, args.top)
        print(f"{path}: {len(threads)} host threads with events")
        for thread, rows in threads[:args.threads]:
            print(f"-- {thread}")
            for name, count, ms in rows:
                print(f"   {ms:8.3f} ms {count:8.1f}x  {name}")


if __name__ == "__main__":
    main()
