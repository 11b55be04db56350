"""models.ensemble_classifier: one serving model whose softmax is the mean of its members'
(on fresh clouds, against the members themselves), saved and loaded with its checksum,
scored by the CLI like any model; bad member sets refused; its memory bound counts the
shared preprocessing once and every member's core."""
import keras
import numpy as np
import pytest

from tf_sparseconv import cli
from tf_sparseconv.data import make_shapes
from tf_sparseconv.models import (class_names, ensemble_classifier, image_classifier, input_spec, load_model,
                                  octnet3, point_cloud_classifier, save_model)
from tf_sparseconv.models.memory_bound import memory_bound

POINTS = 96


def softmax(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def members():
    """Three point models on the same classes, trained briefly from different seeds."""
    clouds, labels, classes = make_shapes(num_per_class=8, num_points=POINTS, seed=0)
    out = []
    for seed in range(3):
        keras.utils.set_random_seed(seed)
        core = octnet3(8, len(classes), rhos=(0.5, 1.0), fc_units=16)
        model = point_cloud_classifier(core, 8, class_names=classes, points_per_cloud=POINTS)
        model.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(clouds, labels, epochs=3 + seed, batch_size=16, verbose=0)
        out.append(model)
    return out, classes


def test_the_ensembles_softmax_is_the_members_mean(members, tmp_path):
    models, classes = members
    clouds, _, _ = make_shapes(num_per_class=3, num_points=POINTS, classes=classes, seed=7)
    ensemble = ensemble_classifier(models)
    assert input_spec(ensemble) == input_spec(models[0]) and class_names(ensemble) == tuple(classes)
    single = [softmax(m.predict(clouds, verbose=0)) for m in models]
    want = np.mean(single, axis=0)
    assert not np.allclose(single[0], want, atol=1e-3)  # the members differ
    np.testing.assert_allclose(softmax(ensemble.predict(clouds, verbose=0)), want, rtol=1e-5, atol=1e-7)
    save_model(ensemble, tmp_path / "ensemble.keras")
    loaded = load_model(tmp_path / "ensemble.keras")  # the checked loader
    np.testing.assert_allclose(softmax(loaded.predict(clouds, verbose=0)), want, rtol=1e-5, atol=1e-7)


def test_the_cli_scores_an_ensemble_file_as_one_model(members, tmp_path, capsys):
    models, classes = members
    path = tmp_path / "ensemble.keras"
    save_model(ensemble_classifier(models[:2]), path)
    clouds, _, _ = make_shapes(num_per_class=1, num_points=POINTS, classes=classes, seed=9)
    np.savez(tmp_path / "clouds.npz", points=clouds)
    assert cli.main(["predict", str(path), str(tmp_path / "clouds.npz"), "--top-k", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    want = np.mean([softmax(m.predict(clouds, verbose=0)) for m in models[:2]], axis=0)
    assert [line.split()[1] for line in out] == [classes[i] for i in want.argmax(1)]
    assert cli.main(["bound", str(path), "--batch-size", "2"]) == 0
    assert "mean_softmax" in capsys.readouterr().out


def test_bad_member_sets_are_refused(members):
    models, classes = members
    with pytest.raises(ValueError, match="two or more"):
        ensemble_classifier(models[:1])
    with pytest.raises(ValueError, match="given twice"):
        ensemble_classifier([models[0], models[0]])
    other = point_cloud_classifier(octnet3(8, len(classes), rhos=(1.0,), fc_units=8), 8,
                                   class_names=list(reversed(classes)), points_per_cloud=POINTS)
    with pytest.raises(ValueError, match="other classes"):
        ensemble_classifier([models[0], other])
    coarse = point_cloud_classifier(octnet3(8, len(classes), rhos=(1.0,), fc_units=8), 8, class_names=classes,
                                    points_per_cloud=2 * POINTS)
    with pytest.raises(ValueError, match="other inputs"):
        ensemble_classifier([models[0], coarse])
    images = image_classifier(octnet3(28, len(classes), rhos=(1.0,), spatial_dims=2, fc_units=8),
                              class_names=classes)
    with pytest.raises(ValueError, match="other inputs"):
        ensemble_classifier([models[0], images])
    with pytest.raises(ValueError, match="takes sparse inputs"):
        ensemble_classifier([models[0], models[1].layers[2]])  # a bare core


def test_the_memory_bound_counts_the_preprocessing_once_and_every_core(members):
    models, _ = members
    ensemble = ensemble_classifier(models)
    bound = memory_bound(ensemble, 4, points_per_sample=POINTS, device="cpu")
    singles = [memory_bound(m, 4, points_per_sample=POINTS, device="cpu") for m in models]
    preprocessing = sum(b.output_bytes for b in singles[0].layers if b.kind in ("input", "voxelize"))
    mean = [b for b in bound.layers if b.kind == "MeanSoftmax"]
    assert len(mean) == 1
    assert bound.activation_bytes == (sum(s.activation_bytes for s in singles) - 2 * preprocessing
                                      + mean[0].output_bytes)
    assert bound.temporary_bytes == max(max(s.temporary_bytes for s in singles), mean[0].temporary_bytes)
    assert bound.total_bytes > max(s.total_bytes for s in singles)
