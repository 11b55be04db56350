"""Losses of the training entry point."""
import keras

from tf_sparseconv.layer_config import real


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SmoothedSparseCrossentropy(keras.losses.Loss):
    """Cross-entropy of logits against integer labels smoothed toward the uniform
    distribution: the target puts 1 - s + s / C on the label and s / C on every other
    class (Szegedy et al. 2016). Keras' SparseCategoricalCrossentropy has no smoothing,
    and one-hot labels would change what the accuracy metric expects."""

    def __init__(self, label_smoothing=0.1, name="smoothed_sparse_crossentropy", **kwargs):
        label_smoothing = real(label_smoothing, "label_smoothing", "SmoothedSparseCrossentropy", 0.0, 1.0,
                               high_open=True)
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        classes = keras.ops.shape(y_pred)[-1]
        labels = keras.ops.reshape(keras.ops.cast(y_true, "int32"), (-1,))
        target = keras.ops.one_hot(labels, classes, dtype=y_pred.dtype)
        target = target * (1.0 - self.label_smoothing) + self.label_smoothing / keras.ops.cast(classes, y_pred.dtype)
        return keras.ops.categorical_crossentropy(target, y_pred, from_logits=True)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}
