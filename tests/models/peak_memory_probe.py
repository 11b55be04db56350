"""Measures peak resident memory beside the memory bound and prints it as JSON. Run in a
fresh process with MALLOC_MMAP_THRESHOLD_ set, so that large buffers are mapped and
unmapped and RSS follows live memory.

    python tests/models/peak_memory_probe.py random|modelnet40 RESOLUTION BATCH POINTS
        per layer and per forward pass of the test classifier
    python tests/models/peak_memory_probe.py serving CORE RESOLUTION BATCH POINTS [BUDGET_BYTES]
        (CORE: octnet3, site_resnet, site_resnet-select or octnet3-normals)
        one forward pass of a serving model (point_cloud_classifier around the core) on
        NumPy clouds, through BoundedInference where a budget is given

The measured peak is the growth of peak RSS over the call (VmHWM, reset first, minus VmRSS
just before it): the model, its weights and the input are the baseline. The model is
called before on clouds of 64 points, at each batch size the measured call runs (serving),
so that its weights exist, its kernels are loaded and its traces made without growing the
allocator's pool ahead of the measured call.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.models.test_memory_bound import DATA, classifier, peak_bytes_of, random_surfaces  # noqa: E402
from tf_sparseconv.models.memory_bound import BoundedInference, memory_bound  # noqa: E402


def layers(source, resolution, batch, points_per_sample):
    rng = np.random.default_rng(0)
    if source == "modelnet40":
        with np.load(DATA) as data:
            points = data["points"][rng.choice(len(data["points"]), batch, replace=False)] / 255.0 * 2 - 1
        points = points.astype(np.float32)
    else:
        points = random_surfaces(rng, batch, points_per_sample)
    model = classifier(resolution)
    model(points)
    bound = memory_bound(model, batch, points_per_sample=points.shape[1])
    by_name = {b.name: b for b in bound.layers}
    rows, h = [], points
    for layer in model.layers[1:]:
        layer(h)
        measured, out = peak_bytes_of(lambda: layer(h))
        b = by_name[layer.name]
        rows.append({"layer": layer.name, "measured": measured, "bound": b.output_bytes + b.temporary_bytes})
        h = out
    measured, _ = peak_bytes_of(lambda: model(points))
    rows.append({"layer": "forward_pass", "measured": measured, "bound": bound.total_bytes})
    return rows


def serving_model(core, resolution):
    """octnet3, site_resnet, site_resnet-select (at most 64 sites per sample after the stem,
    SiteSelect), or octnet3-normals (occupancy and the normals the model estimates from 16
    neighbours per point)."""
    from tf_sparseconv import models
    if core == "octnet3-normals":
        return models.point_cloud_classifier(models.octnet3(resolution, 10, in_channels=4), resolution,
                                             features=("occupancy", "normals"), estimate_normals=16)
    if core == "site_resnet-select":
        return models.point_cloud_classifier(models.site_resnet(10, resolution, select_k=64), resolution)
    core = models.octnet3(resolution, 10) if core == "octnet3" else models.site_resnet(10, resolution)
    return models.point_cloud_classifier(core, resolution)


def serving(core, resolution, batch, points_per_sample, budget_bytes=None):
    model = serving_model(core, resolution)
    rng = np.random.default_rng(0)
    points = random_surfaces(rng, batch, points_per_sample)
    runner = None if budget_bytes is None else BoundedInference(model, budget_bytes)
    plan = None if runner is None else runner.plan(points)
    # The warm-up runs every batch size the measured call will, on 64 points a cloud: the first
    # call of a batch size traces (about 5.7 MB of a site ResNet's peak on 2026-12-01, not its
    # tensors: the second call of the same batch measured 0.9 MB against a bound of 7.0 MB).
    sizes = {batch} if plan is None else {plan.chunk_size, batch - (plan.chunks - 1) * plan.chunk_size}
    for size in sorted(sizes):
        model(random_surfaces(rng, size, 64))
    if runner is None:
        bound, calls = memory_bound(model, batch, points_per_sample).total_bytes, 1
        measured, logits = peak_bytes_of(lambda: model(points))
    else:
        bound, calls = plan.chunk_bytes, plan.chunks
        measured, logits = peak_bytes_of(lambda: runner(points))
    return {"bound": bound, "measured": measured, "calls": calls, "logits": list(logits.shape)}


if __name__ == "__main__":
    if sys.argv[1] == "serving":
        budget = int(sys.argv[6]) if len(sys.argv) > 6 else None
        print(json.dumps(serving(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), budget)))
    else:
        print(json.dumps(layers(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
