"""Training: what the channel family's paper adds to a Keras fit, and the trainer.

- density_regularizer.py: the adaptive density penalty (Hackel et al. Eq. 4);
- pruning.py: warning-shot pruning (§3.6); fine_tune.py: the phase after it;
- losses.py: label-smoothed sparse cross-entropy; metrics.py: mean per-class accuracy (and
  accuracy at another class balance); voting.py: test-time voting over mirrored or rotated views;
- distribute.py: the tf.distribute strategies of `--strategy` and per-replica sparse batches;
- train.py: `tf-sparseconv train`; report.py: its progress lines, curves and summary.

Only the Keras objects are imported here; train.py loads with the command.
"""
from tf_sparseconv.training.density_regularizer import DensityRegularizer
from tf_sparseconv.training.fine_tune import FineTunePhase
from tf_sparseconv.training.losses import SmoothedSparseCrossentropy
from tf_sparseconv.training.metrics import MeanClassAccuracy
from tf_sparseconv.training.pruning import WarningShotPruning, present_weight_count, sparse_conv_layers

__all__ = ["DensityRegularizer", "WarningShotPruning", "FineTunePhase", "present_weight_count", "sparse_conv_layers",
           "SmoothedSparseCrossentropy", "MeanClassAccuracy"]
