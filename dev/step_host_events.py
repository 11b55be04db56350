"""Where a traced training step spends its host time: the host planes' events of a trace kept
by `benchmarks/step_profile.py --keep-trace DIR`, per host thread, grouped by name (a TensorFlow
op's events by its type, the part after the last ':'), count and milliseconds per step, the
costliest first. Events nest (an executor's Process holds the ops it runs), so a thread's rows
overlap; the rows say where the time goes, not an exclusive split.

    python3 dev/step_host_events.py DIR --steps 20 [--top 25]
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace_dir")
    parser.add_argument("--steps", type=int, required=True, help="the traced steps")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--threads", type=int, default=6, help="how many host threads to print")
    args = parser.parse_args()
    paths = glob.glob(os.path.join(args.trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        sys.exit(f"no .xplane.pb under {args.trace_dir}")
    for path in paths:
        threads = host_rows(gpu_trace.read_xspace(path), args.steps, args.top)
        print(f"{path}: {len(threads)} host threads with events")
        for thread, rows in threads[:args.threads]:
            print(f"-- {thread}")
            for name, count, ms in rows:
                print(f"   {ms:8.3f} ms {count:8.1f}x  {name}")


if __name__ == "__main__":
    main()
