"""benchmarks/step_profile.py: its reading of a profiler trace (busy time as the union of a
GPU's stream events, NCCL kernels apart, derived lines left out) on a hand-built XSpace, and
one traced CPU run whose row carries its keys."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu_trace  # noqa: E402
import step_profile  # noqa: E402


def test_union_length_counts_overlaps_once():
    assert gpu_trace.union_length([]) == 0
    assert gpu_trace.union_length([(0, 10), (5, 20), (30, 35), (31, 32)]) == 25
    assert gpu_trace.union_length([(30, 35), (0, 10), (10, 12)]) == 17


def add_event(line, metadata_id, offset_ps, duration_ps):
    """An event on a profiler trace's line (also tests/test_benchmark_stack.py's)."""
    event = line.events.add()
    event.metadata_id, event.offset_ps, event.duration_ps = metadata_id, offset_ps, duration_ps


def trace_with_one_gpu(event_names):
    """A profiler XSpace with a busy host line (host time is not GPU time) and an empty
    /device:GPU:0 plane whose event metadata i + 1 is event_names[i]: (space, gpu plane).
    Also tests/test_benchmark_stack.py's."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    space = xplane_pb2.XSpace()
    host = space.planes.add()
    host.name = "/host:CPU"
    add_event(host.lines.add(), 1, 0, 10**9)
    gpu = space.planes.add()
    gpu.name = "/device:GPU:0"
    for i, name in enumerate(event_names, 1):
        gpu.event_metadata[i].name = name
    return space, gpu


def test_gpu_summary_reads_the_stream_lines_of_each_gpu(tmp_path):
    space, gpu = trace_with_one_gpu(["DirectConvKernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "MemcpyDtoH"])
    compute = gpu.lines.add()
    # as CUPTI names a stream's line: every kind of event it carried
    compute.name, compute.timestamp_ns = "Stream #13(MemcpyDtoH,Compute,Memset)", 1
    add_event(compute, 1, 0, 4000)          # [1000, 5000) ps
    add_event(compute, 2, 6000, 2000)       # [7000, 9000): NCCL
    add_event(compute, 3, 7000, 500)        # a copy on a compute stream: busy, but no kernel
    copies = gpu.lines.add()
    copies.name, copies.timestamp_ns = "Stream #14(MemcpyDtoH)", 0
    add_event(copies, 3, 4000, 2000)        # [4000, 6000): overlaps the first kernel by 1000
    derived = gpu.lines.add()
    derived.name = "TensorFlow Ops"      # repeats the streams' time: left out
    add_event(derived, 1, 0, 10**6)
    add_event(compute, 1, 10**8 + 9000 - 1000, 1000)  # [10^8 + 9000, ...): after an idle 0.1 ms
    path = tmp_path / "t.xplane.pb"
    path.write_bytes(space.SerializeToString())
    [(name, busy, kernels, nccl, lines, gaps)] = step_profile.gpu_summary(str(path))
    assert name == "/device:GPU:0"
    assert busy == 4000 + 1000 + 2000 + 1000  # [1000, 6000), [7000, 9000) and the last kernel
    assert kernels == 3 and nccl == 2000
    assert lines == sorted(["Stream #13(MemcpyDtoH,Compute,Memset)", "Stream #14(MemcpyDtoH)", "TensorFlow Ops"])
    assert gaps == [10**8]  # the 1000 ps hole at [6000, 7000) is a queued kernel's, not the host's


def test_first_gpu_work_is_measured_from_each_python_call(tmp_path):
    """gpu_trace.first_gpu_work: per traced call (a Python-thread event of that name), the time
    from its start to the first GPU stream event after it; other threads' events and derived
    GPU lines do not count."""
    space, gpu = trace_with_one_gpu(["Kernel", "MemcpyH2D"])
    host = space.planes[0]
    host.event_metadata[1].name = "ExecutorState::Process"
    host.event_metadata[2].name = "fwd"
    python = host.lines.add()
    python.name, python.timestamp_ns = "python3", 2
    add_event(python, 2, 0, 50_000)           # call 1 at [2000, 52000) ps
    add_event(python, 2, 100_000, 50_000)     # call 2 at [102000, 152000)
    add_event(python, 1, 60_000, 1000)        # not a call: another event name
    stream = gpu.lines.add()
    stream.name, stream.timestamp_ns = "Stream #13(Compute)", 0
    add_event(stream, 2, 9000, 100)           # call 1's first GPU work, 7000 ps after it began
    add_event(stream, 1, 20_000, 100)
    add_event(stream, 1, 132_000, 100)        # call 2's: 30000 ps
    derived = gpu.lines.add()
    derived.name = "TensorFlow Ops"           # derived: left out even though earlier
    add_event(derived, 1, 103_000, 10)
    path = tmp_path / "t.xplane.pb"
    path.write_bytes(space.SerializeToString())
    assert gpu_trace.python_calls(str(path), "fwd") == [(2000, 52000), (102000, 152000)]
    assert gpu_trace.first_gpu_work(str(path), "fwd") == [7000, 30000]
    assert gpu_trace.first_gpu_work(str(path), "train") == []
    stream.ClearField("events")               # no GPU work after a call: None
    path.write_bytes(space.SerializeToString())
    assert gpu_trace.first_gpu_work(str(path), "fwd") == [None, None]


def test_idle_gaps_are_the_holes_of_the_union():
    assert gpu_trace.idle_gaps([], 1) == []
    assert gpu_trace.idle_gaps([(0, 10), (5, 20), (30, 35), (31, 32), (50, 51)], 10) == [10, 15]
    assert gpu_trace.idle_gaps([(50, 51), (0, 10), (30, 35)], 16) == [20]
    assert gpu_trace.idle_stretches([(0, 10), (5, 20), (30, 35), (31, 32), (50, 51)], 10) == [(20, 30), (35, 50)]
    # Named: the hole's length, the event that ended last before it and the one after it.
    events = [(30, 35, "c"), (0, 10, "a"), (5, 20, "b"), (31, 32, "d"), (50, 51, "e")]
    assert gpu_trace.named_gaps(events, 10, 5) == (25, 2, [(15, "c", "e"), (10, "b", "c")])
    assert gpu_trace.named_gaps(events, 10, 1) == (25, 2, [(15, "c", "e")])
    assert gpu_trace.named_gaps(events, 16, 5) == (0, 0, [])


def test_a_cpu_run_appends_a_row_with_its_keys(tmp_path):
    out = tmp_path / "rows.jsonl"
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "step_profile.py"),
                          "--steps", "2", "--optimizers", "keras-adam", "fused-adam", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["optimizer"] for row in rows] == ["keras-adam", "fused-adam"]
    for row in rows:
        assert row["workload"] == "synthetic_32_step" and row["replicas"] == 1 and row["device"] == "cpu"
        assert row["step_ms"] > 0 and row["gpu_busy_ms"] == [] and row["host_waits"] == 0
    assert "summary: 1 replica(s)" in run.stdout


def test_the_queued_train_function_trains_as_fit_does(tmp_path):
    """The same steps through Keras' train function and through queued_train_function give
    the same weights (one replica on the CPU: the order of the work is all they change)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tf_sparseconv import data as datasets
    from tf_sparseconv.models import octnet3

    points, labels, classes = datasets.make_shapes(2, num_points=256, seed=0)
    weights = []
    for queued in (False, True):
        keras.utils.set_random_seed(0)
        model = octnet3(16, len(classes), (1.0, 1.0, 1.0))
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if queued:
            queued_function = step_profile.queued_train_function(model)
            model.train_function = queued_function
        batches = step_profile.keras_batches(datasets.point_cloud_dataset(points, labels, 16, 8, shuffle=False))
        history = model.fit(batches, epochs=2, verbose=0, shuffle=False).history  # to the data's end, twice
        assert len(history["loss"]) == 2 and all(np.isfinite(history["loss"]))
        weights.append([w.numpy() for w in model.trainable_weights])
    # fit kept the queued function (had Keras made its own, both runs would be Keras' fit)
    assert model.train_function is queued_function
    assert isinstance(model.train_function, tf.types.experimental.GenericFunction)
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_step_calls_measure_each_call_and_the_wait_before_the_next(tmp_path):
    """dev/step_idle_causes.step_calls: per call of the step function on the Python thread but
    the last, its time and the time to the next call, the GPU's busy time within each, and
    the Python thread's device-to-host copies in between (fit's wait for the step's logs)."""
    sys.path.insert(0, os.path.join(ROOT, "dev"))
    import step_idle_causes
    space, gpu = trace_with_one_gpu(["Kernel"])
    host = space.planes[0]
    host.event_metadata[2].name = "train_function"
    host.event_metadata[3].name = "MemcpyD2H"
    python = host.lines.add()
    python.name, python.timestamp_ns = "python3", 0
    add_event(python, 2, 0, 100)        # call 1 [0, 100)
    add_event(python, 3, 150, 5)        # two copies after it
    add_event(python, 3, 160, 5)
    add_event(python, 2, 200, 100)      # call 2 [200, 300)
    add_event(python, 2, 320, 100)      # call 3 [320, 420): the last, no row
    other = host.lines.add()            # another thread's copy does not count
    other.name = "tf_Compute/1"
    add_event(other, 3, 170, 5)
    stream = gpu.lines.add()
    stream.name = "Stream #13(Compute)"
    add_event(stream, 1, 50, 100)       # [50, 150): 50 in call 1, 50 after it
    add_event(stream, 1, 140, 20)       # overlaps: counted once
    add_event(stream, 1, 290, 20)       # [290, 310): 10 in call 2, 10 after it
    intervals = [(b, e) for _, (_, evs) in gpu_trace.gpu_stream_events(space).items() for b, e, _ in evs]
    name, rows = step_idle_causes.step_calls(space, intervals)
    assert name == "train_function"
    assert rows == [(100, 50, 100, 60, 2), (100, 10, 20, 10, 0)]
    assert step_idle_causes.step_calls(space, intervals, "multi_step_on_iterator") == ("multi_step_on_iterator", [])


def test_copies_before_call_ends_names_what_a_call_waits_for(tmp_path):
    """dev/step_idle_causes.copies_before_call_ends: per call, the time from the GPU's last
    work in it to its end, and per op the time from each of its device-to-host copies (ended
    within a call, named by the copy's tf_op stat) to the call's end."""
    sys.path.insert(0, os.path.join(ROOT, "dev"))
    import step_idle_causes
    space, gpu = trace_with_one_gpu(["Kernel", "MemcpyD2H"])
    gpu.stat_metadata[7].name = "tf_op"
    stream = gpu.lines.add()
    stream.name = "Stream #13(Compute,MemcpyDtoH)"

    def copy(offset, duration, op):
        add_event(stream, 2, offset, duration)
        stat = stream.events[-1].stats.add()
        stat.metadata_id, stat.str_value = 7, op
    add_event(stream, 1, 10, 70)          # call 1 [0, 100): GPU work to 80
    copy(20, 5, "early/_1:_Send")         # ends 75 before call 1 ends
    copy(85, 10, "logs/_9:_Send")         # ends at 95: 5 before
    add_event(stream, 1, 200, 90)         # call 2 [200, 300): GPU work to 290
    copy(290, 8, "logs/_9:_Send")         # ends at 298: 2 before
    copy(305, 5, "after/_3:_Send")        # after every call: not counted
    intervals = [(b, e) for _, (_, evs) in gpu_trace.gpu_stream_events(space).items() for b, e, _ in evs]
    tails, by_op = step_idle_causes.copies_before_call_ends(space, [(0, 100), (200, 300)], intervals)
    assert tails == [5, 2]                # the copies are GPU work too
    assert dict(by_op) == {"early/_1:_Send": [75], "logs/_9:_Send": [5, 2]}
    assert step_idle_causes.d2h_copies(space) == {"early/_1:_Send": 1, "logs/_9:_Send": 2, "after/_3:_Send": 1}
