"""A fine-tuning phase after density regularisation and pruning.

From a chosen epoch on, every DirectSparseConv's Eq. 4 penalty is off and warning-shot
pruning stops checking, so the pruned structure is fixed (pruned weights stay exactly zero:
the op skips them and gives them no gradient) and the remaining weights and biases train on
the data loss alone. §4.3 of Hackel et al. suggests fine-tuning a pruned model this way for
transfer learning. In this project's Fig. 6 studies (experiments/README.md) the masks and
densities stayed where the regulariser left them, and the phase recovered little accuracy.
"""
import keras

from tf_sparseconv.inputs import int_attr
from tf_sparseconv.training.pruning import WarningShotPruning, sparse_conv_layers


class FineTunePhase(keras.callbacks.Callback):
    def __init__(self, start_epoch, pruning=None, verbose=0):
        """start_epoch: the first epoch (counted from 0) of the phase; pruning: the
        WarningShotPruning callback to stop (its last check is at the end of epoch
        start_epoch - 1), or None."""
        super().__init__()
        start_epoch = int_attr(start_epoch, "start_epoch", "FineTunePhase")
        if start_epoch < 1:
            raise ValueError(f"FineTunePhase: start_epoch must be >= 1 (some epochs must regularise or prune first), "
                             f"got {start_epoch}")
        self.start_epoch = start_epoch
        if pruning is not None and not isinstance(pruning, WarningShotPruning):
            raise TypeError(f"FineTunePhase: pruning must be a WarningShotPruning callback or None, got {pruning!r}")
        self.pruning = pruning
        self.verbose = verbose
        self.started = False

    def on_epoch_begin(self, epoch, logs=None):
        if self.started or epoch < self.start_epoch:
            return
        self.started = True
        for layer in sparse_conv_layers(self.model):
            layer.density_regularization_on = False
        if self.pruning is not None:
            self.pruning.active = False
        # The penalty's on/off is a Python attribute read while tracing: trace the step again.
        self.model.make_train_function(force=True)
        if self.verbose:
            print(f"\nfine-tuning from epoch {epoch + 1}: density regularisation off, pruning stopped")
