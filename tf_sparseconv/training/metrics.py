"""Per-class accuracies: the mean per-class accuracy that ModelNet papers report beside the
overall accuracy, and the overall accuracy reweighted to another class balance (that of the
official test split, whose classes are weighted differently from a validation split drawn
from the training set). As Keras metrics (one value per epoch in the logs, `val_<name>` on
the validation data) and in NumPy for predictions made outside fit (voting)."""
import keras
import numpy as np
from keras import ops

from tf_sparseconv.inputs import count_arg


def _class_weight_values(class_weights, num_classes, what):
    """class_weights as float64 [num_classes] (ones for None): finite, >= 0, not all 0."""
    if class_weights is None:
        return np.ones(num_classes)
    try:
        weights = np.asarray(class_weights, np.float64)
    except (TypeError, ValueError):
        weights = None
    if (weights is None or weights.shape != (num_classes,) or not np.isfinite(weights).all() or (weights < 0).any()
            or not weights.sum() > 0):
        raise ValueError(f"{what}: class_weights must be {num_classes} finite values >= 0, not all 0, "
                         f"got {class_weights}")
    return weights


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class MeanClassAccuracy(keras.metrics.Metric):
    """sum_c w_c acc_c / sum_c w_c over the classes c with examples in the data seen so far,
    from logits (or probabilities) [B, K] and integer labels [B]: the mean per-class accuracy
    with class_weights None (w_c = 1), otherwise the accuracy expected on data whose class
    c makes the fraction w_c / sum w of it. Sample weights count examples, so a weight-0
    filler (a distributed batch's empty part) counts nothing. The counts are summed over
    replicas."""

    def __init__(self, num_classes, class_weights=None, name="mean_class_accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.num_classes = count_arg(num_classes, "num_classes", "MeanClassAccuracy")
        weights = _class_weight_values(class_weights, self.num_classes, "MeanClassAccuracy")
        self.class_weights = None if class_weights is None else [float(w) for w in weights]
        self._class_weight_values = weights
        self.examples = self.add_variable(shape=(self.num_classes,), initializer="zeros", name="examples",
                                          aggregation="sum")
        self.correct = self.add_variable(shape=(self.num_classes,), initializer="zeros", name="correct",
                                         aggregation="sum")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(ops.reshape(y_true, [-1]), "int32")
        weight = (ops.ones_like(y_true, dtype=self.dtype) if sample_weight is None
                  else ops.cast(ops.reshape(sample_weight, [-1]), self.dtype))
        hit = ops.cast(ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true), self.dtype)
        of_class = ops.one_hot(y_true, self.num_classes, dtype=self.dtype) * weight[:, None]
        self.examples.assign_add(ops.sum(of_class, axis=0))
        self.correct.assign_add(ops.sum(of_class * hit[:, None], axis=0))

    def result(self):
        weights = ops.cast(self._class_weight_values, self.dtype) * ops.cast(self.examples > 0, self.dtype)
        accuracy = self.correct / ops.maximum(self.examples, 1.0)
        total = ops.sum(weights)
        return ops.where(total > 0, ops.sum(accuracy * weights) / ops.maximum(total, 1e-12), 0.0)

    def reset_state(self):
        for variable in (self.examples, self.correct):
            variable.assign(ops.zeros_like(variable))

    def get_config(self):
        return {"num_classes": self.num_classes, "class_weights": self.class_weights, "name": self.name,
                "dtype": self.dtype}


def class_accuracies(labels, predicted, num_classes, class_weights=None):
    """Scores of integer predictions [M]: {"overall", "mean_class", "per_class" [num_classes]
    (NaN for a class without examples, left out of the means)} and, with class_weights,
    "weighted" (sum_c w_c acc_c / sum_c w_c over the classes present, as MeanClassAccuracy)
    and "weighted_se", its standard error sqrt(sum_c (w_c / sum w)^2 p_c (1 - p_c) / n_c) with
    each class's examples taken as independent draws; p_c = (correct_c + 1) / (n_c + 2), not
    acc_c, so a class of few examples all right (or all wrong) still counts its uncertainty."""
    num_classes = count_arg(num_classes, "num_classes", "class_accuracies")
    labels, predicted = np.asarray(labels), np.asarray(predicted)
    if labels.shape != predicted.shape or labels.ndim != 1 or not len(labels):
        raise ValueError(f"expected labels and predictions [M], M > 0, got {labels.shape} and {predicted.shape}")
    for name, values in (("labels", labels), ("predictions", predicted)):
        if values.dtype.kind not in "iu":
            raise TypeError(f"class_accuracies: {name} must be integers (class indices), got dtype {values.dtype}")
        if values.min() < 0 or values.max() >= num_classes:
            raise ValueError(f"class_accuracies: {name} must be class indices in 0..{num_classes - 1}, got "
                             f"{values.min()}..{values.max()}")
    labels, predicted = labels.astype(np.int64), predicted.astype(np.int64)
    examples = np.bincount(labels, minlength=num_classes).astype(np.float64)
    correct = np.bincount(labels[labels == predicted], minlength=num_classes).astype(np.float64)
    per_class = np.divide(correct, examples, out=np.full(num_classes, np.nan), where=examples > 0)
    scores = {"overall": float(np.mean(labels == predicted)), "mean_class": float(np.nanmean(per_class)),
              "per_class": per_class}
    if class_weights is not None:
        present = examples > 0
        weights = np.where(present, _class_weight_values(class_weights, num_classes, "class_accuracies"), 0.0)
        weights = weights / weights.sum()
        accuracy = np.where(present, per_class, 0.0)
        scores["weighted"] = float(np.sum(weights * accuracy))
        smoothed = (correct + 1) / (examples + 2)
        scores["weighted_se"] = float(np.sqrt(np.sum(
            np.divide(weights ** 2 * smoothed * (1 - smoothed), examples, out=np.zeros(num_classes), where=present))))
    return scores
