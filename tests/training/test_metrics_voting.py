"""Mean per-class accuracy (the Keras metric and its NumPy twin), the overall accuracy at
another class balance with its standard error, and test-time voting over mirrored and
rotated views: each against sums worked out by hand."""
import keras
import numpy as np
import pytest

from tf_sparseconv.training import train
from tf_sparseconv.training.metrics import MeanClassAccuracy, class_accuracies
from tf_sparseconv.training.voting import parse_vote, softmax, vote_views, voted_probabilities

# 7 examples of 3 classes: class 0 right 2 of 4, class 1 right 1 of 1, class 2 right 0 of 2
LABELS = np.array([0, 0, 0, 0, 1, 2, 2])
PREDICTED = np.array([0, 1, 0, 2, 1, 0, 1])


def one_hot_logits(predicted, classes=4):
    return np.eye(classes, dtype=np.float32)[predicted] * 3.0 - 1.0


def test_class_accuracies_by_hand():
    scores = class_accuracies(LABELS, PREDICTED, 4)
    assert scores["overall"] == pytest.approx(3 / 7)
    assert scores["mean_class"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)  # class 3 has no examples
    np.testing.assert_allclose(scores["per_class"], [0.5, 1.0, 0.0, np.nan])
    weighted = class_accuracies(LABELS, PREDICTED, 4, class_weights=[100, 20, 50, 86])
    # class 3 is absent, so the weights of the others are renormalised: (100, 20, 50) / 170
    assert weighted["weighted"] == pytest.approx((100 * 0.5 + 20 * 1.0 + 50 * 0.0) / 170)
    # smoothed accuracies (correct + 1) / (n + 2): 3/6, 2/3, 1/4
    se = np.sqrt((100 / 170) ** 2 * (1 / 2 * 1 / 2) / 4 + (20 / 170) ** 2 * (2 / 3 * 1 / 3) / 1
                 + (50 / 170) ** 2 * (1 / 4 * 3 / 4) / 2)
    assert weighted["weighted_se"] == pytest.approx(se)
    with pytest.raises(ValueError, match="expected labels and predictions"):
        class_accuracies(LABELS, PREDICTED[:3], 4)


def test_mean_class_accuracy_metric_matches_the_hand_sums_over_batches():
    metric = MeanClassAccuracy(4)
    metric.update_state(LABELS[:3], one_hot_logits(PREDICTED[:3]))
    metric.update_state(LABELS[3:], one_hot_logits(PREDICTED[3:]))
    assert float(metric.result()) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    weighted = MeanClassAccuracy(4, class_weights=[100, 20, 50, 86], name="test_weighted_accuracy")
    weighted.update_state(LABELS, one_hot_logits(PREDICTED))
    assert float(weighted.result()) == pytest.approx(70 / 170)
    metric.reset_state()
    assert float(metric.result()) == 0.0


def test_mean_class_accuracy_counts_sample_weights_as_examples():
    # a weight-0 filler (a distributed batch's empty part) changes nothing
    metric = MeanClassAccuracy(4)
    labels, predicted = np.append(LABELS, 3), np.append(PREDICTED, 0)
    metric.update_state(labels, one_hot_logits(predicted), sample_weight=np.append(np.ones(7), 0.0))
    assert float(metric.result()) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="class_weights"):
        MeanClassAccuracy(4, class_weights=[1, 2])


def test_mean_class_accuracy_in_a_compiled_model_and_its_config():
    inputs = keras.Input([4])
    model = keras.Model(inputs, keras.layers.Identity()(inputs))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy", MeanClassAccuracy(4)])
    logs = model.evaluate(one_hot_logits(PREDICTED), LABELS, batch_size=2, verbose=0, return_dict=True)
    assert logs["accuracy"] == pytest.approx(3 / 7)
    assert logs["mean_class_accuracy"] == pytest.approx(0.5)
    config = MeanClassAccuracy(4, class_weights=[1, 2, 3, 4], name="w").get_config()
    assert MeanClassAccuracy.from_config(config).class_weights == [1.0, 2.0, 3.0, 4.0]


class _LinearXY:
    """Logits [x, y, -x] of each cloud's mean point: a model that sees the azimuth."""

    def __call__(self, clouds):
        mean = np.asarray(clouds, np.float64)[..., :2].mean(axis=1)
        return np.stack([mean[:, 0], mean[:, 1], -mean[:, 0]], axis=-1)


def test_rotation_vote_is_the_mean_softmax_over_the_rotated_clouds(rng):
    clouds = rng.normal(size=(5, 7, 3)).astype(np.float32) + np.array([0.8, 0.1, 0.0], np.float32)
    before = clouds.copy()
    model = _LinearXY()
    voted = voted_probabilities(model, clouds, "rotations-4")
    # by hand: quarter turns about z send (x, y, z) to (-y, x, z), (-x, -y, z), (y, -x, z)
    turns = [clouds, np.stack([-clouds[..., 1], clouds[..., 0], clouds[..., 2]], -1),
             np.stack([-clouds[..., 0], -clouds[..., 1], clouds[..., 2]], -1),
             np.stack([clouds[..., 1], -clouds[..., 0], clouds[..., 2]], -1)]
    expected = np.mean([softmax(model(view)) for view in turns], axis=0)
    np.testing.assert_allclose(voted, expected, rtol=1e-5, atol=1e-6)
    # the vote is the same for a quarter-turned cloud: it averages over the same four views
    np.testing.assert_allclose(voted_probabilities(model, turns[1], "rotations-4"), voted, rtol=1e-5, atol=1e-6)
    assert not np.allclose(softmax(model(turns[1])), softmax(model(clouds)), atol=1e-3)
    np.testing.assert_array_equal(clouds, before)
    assert len(list(vote_views(clouds, "rotations-12"))) == 12
    assert len(list(vote_views(clouds, "none"))) == 1


@pytest.mark.parametrize("columns", [3, 6])
def test_mirror_vote_averages_the_softmax_of_a_cloud_and_its_mirror_image(columns):
    clouds = np.zeros([3, 4, columns], np.float32)
    clouds[0, :, 0] = 3.0  # [3, .5]: p0 0.924; mirrored [-3, .5]: p0 0.029; mean 0.476 -> class 1
    clouds[1, :, 0] = 0.1  # [.1, .5] and [-.1, .5]: class 1 both ways
    if columns == 6:
        # [2, .5]: p0 0.818; with the normal mirrored too [-2, .5]: p0 0.076 -> class 1
        # (mirroring x alone would repeat [2, .5] and vote class 0)
        clouds[2, :, 3] = 2.0
    before = clouds.copy()
    labels = np.array([1, 1, 1])

    def predict(view):  # logits [mean x + mean normal x, 0.5]
        x = view[..., 0].mean(axis=1) + (view[..., 3].mean(axis=1) if view.shape[-1] >= 6 else 0.0)
        return np.stack([x, np.full_like(x, 0.5)], axis=-1)

    plain = np.mean(np.argmax(predict(clouds), axis=-1) == labels)
    assert plain == pytest.approx(1 / 3 if columns == 6 else 2 / 3)
    voted = voted_probabilities(predict, clouds, "mirror")
    np.testing.assert_allclose(voted[0, 0], (softmax([3, .5])[0] + softmax([-3, .5])[0]) / 2, rtol=1e-6)
    assert np.mean(np.argmax(voted, axis=-1) == labels) == pytest.approx(1.0)
    np.testing.assert_array_equal(clouds, before)  # the caller's clouds are not mirrored in place


class _KerasLike:
    def __init__(self, predict):
        self._predict = predict

    def predict(self, batches, verbose=0):
        return self._predict(batches)


def test_validation_scores_vote_and_weigh_by_the_test_balance(rng):
    clouds = rng.normal(size=(6, 5, 3)).astype(np.float32)
    labels = np.array([0, 0, 1, 1, 2, 2])
    model = _KerasLike(_LinearXY())
    scores = train.validation_scores(model, lambda view: view, clouds, labels, 3, vote="rotations-3",
                                     test_weights=[100, 20, 50])
    expected = np.mean([softmax(_LinearXY()(v)) for v in vote_views(clouds, "rotations-3")], axis=0).argmax(-1)
    by_hand = class_accuracies(labels, expected, 3, [100, 20, 50])
    assert scores["overall"] == pytest.approx(by_hand["overall"])
    assert scores["mean_class"] == pytest.approx(by_hand["mean_class"])
    assert scores["weighted"] == pytest.approx(by_hand["weighted"])
    assert scores["per_class"] == pytest.approx(list(by_hand["per_class"]))


@pytest.mark.parametrize("text,name", [("none", "none"), ("mirror", "mirror"), ("rotations-12", "rotations-12"),
                                       ("rotations-012", "rotations-12")])
def test_parse_vote(text, name):
    assert parse_vote(text) == name


@pytest.mark.parametrize("text", ["rotations", "rotations-1", "rotations-361", "rotate-12", "mirrors", ""])
def test_parse_vote_refuses(text):
    with pytest.raises(ValueError, match="the vote must be none, mirror or rotations-N"):
        parse_vote(text)


@pytest.mark.parametrize("num_classes", [2.5, True, "3", None, float("inf")])
def test_mean_class_accuracy_num_classes_is_an_int(num_classes):
    # 2.5 and True were truncated to 2 and 1 classes, "3" was parsed, inf an OverflowError
    with pytest.raises(TypeError, match="MeanClassAccuracy: num_classes must be an int"):
        MeanClassAccuracy(num_classes)


@pytest.mark.parametrize("weights", [[1.0, float("inf")], ["a", "b"]])
def test_mean_class_accuracy_class_weights_are_finite_numbers(weights):
    # an infinite weight made every result NaN; text failed inside NumPy
    with pytest.raises(ValueError, match="MeanClassAccuracy: class_weights must be 2 finite values >= 0"):
        MeanClassAccuracy(2, class_weights=weights)


def test_class_accuracies_refuses_labels_outside_the_classes_and_bad_weights():
    # before: NumPy broadcast errors (a label >= num_classes, weights of another length), a
    # bincount error (a negative label), float labels truncated, and NaN scores for negative
    # or all-zero weights
    with pytest.raises(ValueError, match=r"class_accuracies: labels must be class indices in 0..3, got 0..5"):
        class_accuracies(np.append(LABELS, 5), np.append(PREDICTED, 0), 4)
    with pytest.raises(ValueError, match=r"class_accuracies: predictions must be class indices in 0..3, got -1..2"):
        class_accuracies(LABELS, np.append(PREDICTED[:-1], -1), 4)
    with pytest.raises(TypeError, match="class_accuracies: labels must be integers"):
        class_accuracies(LABELS + 0.5, PREDICTED, 4)
    with pytest.raises(TypeError, match="class_accuracies: num_classes must be an int"):
        class_accuracies(LABELS, PREDICTED, 4.0)
    for weights in ([1, 1], [-1, 1, 1, 1], [0, 0, 0, 0], [np.nan, 1, 1, 1]):
        with pytest.raises(ValueError, match="class_accuracies: class_weights must be 4 finite values >= 0"):
            class_accuracies(LABELS, PREDICTED, 4, weights)


def test_voting_refuses_clouds_and_predictions_of_the_wrong_shape():
    # a single cloud [N, 3] was voted over as N clouds of 3 points (its mirror negated one
    # point's x), [M, N, 3, 1] failed inside einsum, and a predict giving fewer rows than
    # clouds was averaged by broadcasting
    with pytest.raises(ValueError, match=r"vote_views: clouds must be numbers \[M, N, 3\+\]"):
        list(vote_views(np.zeros((5, 3)), "mirror"))
    with pytest.raises(ValueError, match=r"vote_views: clouds must be numbers \[M, N, 3\+\]"):
        list(vote_views(np.zeros((2, 5, 3, 1)), "rotations-4"))
    with pytest.raises(ValueError, match=r"voted_probabilities: predict must map 2 clouds to logits \[2, K\]"):
        voted_probabilities(lambda view: np.zeros((1, 3)), np.zeros((2, 5, 3)), "none")
