"""Warning-shot pruning (Hackel et al. §3.6) as a Keras callback.

At every epoch end, weights with |w| < epsilon are flagged; a weight flagged at two
consecutive epoch ends is pruned: its mask and value are set to 0, after which the op
skips it and gives it no gradient, so the count of present weights never grows. A weight
that is small only once (crossing zero between two large values) keeps its place.
"""
import keras
import numpy as np

from tf_sparseconv.channel.conv_layer import DirectSparseConv
from tf_sparseconv.layer_config import real


def sparse_conv_layers(model):
    return [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, DirectSparseConv)]


def present_weight_count(model):
    return sum(layer.present_weights() for layer in sparse_conv_layers(model))


class WarningShotPruning(keras.callbacks.Callback):
    def __init__(self, epsilon=1e-3, verbose=0):
        super().__init__()
        # a finite epsilon: an infinite one would flag, and then prune, every weight
        self.epsilon = real(epsilon, "epsilon", "WarningShotPruning", 0.0, low_open=True)
        self.verbose = verbose
        self.active = True  # FineTunePhase stops the checks, fixing the masks
        self.history = []  # per epoch: {"epoch", "pruned", "present_weights"}

    def prune(self, model):
        """One warning-shot check over every DirectSparseConv of model; returns the number pruned."""
        pruned = 0
        for layer in sparse_conv_layers(model):
            kernel = layer.kernel.numpy()
            mask = layer.mask.numpy() > 0
            small = mask & (np.abs(kernel) < self.epsilon)
            cut = small & (layer.warned.numpy() > 0)
            mask &= ~cut
            layer.mask.assign(mask.astype(layer.mask.dtype))
            layer.kernel.assign(np.where(mask, kernel, 0).astype(kernel.dtype))
            layer.warned.assign((small & ~cut).astype(layer.warned.dtype))
            pruned += int(cut.sum())
        return pruned

    def on_epoch_end(self, epoch, logs=None):
        pruned = self.prune(self.model) if self.active else 0
        present = present_weight_count(self.model)
        self.history.append({"epoch": epoch, "pruned": pruned, "present_weights": present})
        if logs is not None:
            logs["present_weights"] = present
        if self.verbose:
            print(f"\nwarning-shot pruning: pruned {pruned} weights, {present} present")
