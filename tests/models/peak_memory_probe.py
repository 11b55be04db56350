"""Measures per-layer and forward-pass peak resident memory of the test classifier and
prints it beside the bounds as JSON. Run in a fresh process with MALLOC_MMAP_THRESHOLD_
set, so that large buffers are mapped and unmapped and RSS follows live memory.

    python tests/models/peak_memory_probe.py random|modelnet40 RESOLUTION BATCH POINTS
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.models.test_memory_bound import DATA, classifier, peak_bytes_of, random_surfaces  # noqa: E402
from tf_sparseconv.models.memory_bound import memory_bound  # noqa: E402


def main(source, resolution, batch, points_per_sample):
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
    print(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
