"""What a training run shows and leaves behind: one short progress line per epoch, the
present weights per epoch, TensorBoard scalars, the training-curve PNG and the closing
summary.

Keras' own per-epoch line lists every metric (each sparse layer's density among them) and
runs to ~1,000 characters; outside a terminal EpochProgress prints one line per epoch
instead: epoch, loss, accuracy, validation loss and accuracy, seconds.
"""
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from tf_sparseconv.training.pruning import present_weight_count

DENSITY_SUFFIX = "_density"


class PresentWeights(keras.callbacks.Callback):
    """Adds `present_weights` (the unpruned weights of every DirectSparseConv) to each epoch's logs,
    unless warning-shot pruning, placed before it, has added them already."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and "present_weights" not in logs:
            logs["present_weights"] = present_weight_count(self.model)


class EpochProgress(keras.callbacks.Callback):
    """One line per finished epoch: `epoch 3/20  loss 1.234  acc 0.567  val_loss 1.345
    val_acc 0.512  val_mean_class 0.487  12.3 s`."""

    def __init__(self, epochs, stream=None):
        super().__init__()
        self.epochs, self.stream = epochs, stream

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        print(epoch_line(epoch, self.epochs, logs or {}, time.perf_counter() - self._start),
              file=self.stream or sys.stdout, flush=True)


def epoch_line(epoch, epochs, logs, seconds):
    """The short progress line of epoch (counted from 0) of epochs."""
    parts = [f"epoch {epoch + 1}/{epochs}"]
    for key, label in (("loss", "loss"), ("accuracy", "acc"), ("val_loss", "val_loss"), ("val_accuracy", "val_acc"),
                       ("val_mean_class_accuracy", "val_mean_class"),
                       ("val_test_weighted_accuracy", "val_test_w")):
        if key in logs:
            parts.append(f"{label} {float(logs[key]):.4f}")
    parts.append(f"{seconds:.1f} s")
    return "  ".join(parts)


def _scalar_metadata():
    """TensorBoard's marker of a scalar summary (plugin "scalars"): tf.summary.scalar
    needs the tensorboard package, which TensorFlow no longer installs; tf.summary.write
    with this marker writes the same event without it."""
    from tensorflow.core.framework import summary_pb2
    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    return metadata


class TensorBoardScalars(keras.callbacks.Callback):
    """Per-epoch scalars under log_dir: train/ holds loss, accuracy, each sparse layer's
    density (density/<layer>), present_weights, seconds_per_epoch and
    cpu_seconds_per_epoch; validation/ holds
    loss, accuracy and mean_class_accuracy under the same tags, so TensorBoard draws both in one chart. Needs
    no tensorboard package to write; `tensorboard --logdir <log_dir>` shows them."""

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir
        self._writers = None

    def _writer(self, name):
        if self._writers is None:
            self._writers = {split: tf.summary.create_file_writer(os.path.join(self.log_dir, split))
                             for split in ("train", "validation")}
        return self._writers[name]

    def on_epoch_end(self, epoch, logs=None):
        train, validation = {}, {}
        for key, value in (logs or {}).items():
            if key.startswith("val_"):
                if not key.endswith(DENSITY_SUFFIX):
                    validation[key[4:]] = value
            elif key.endswith(DENSITY_SUFFIX):
                train[f"density/{key[:-len(DENSITY_SUFFIX)]}"] = value
            elif key in ("sec_per_epoch", "cpu_sec_per_epoch"):
                train[key.replace("sec_per_epoch", "seconds_per_epoch")] = value
            elif key != "peak_rss_bytes":
                train[key] = value
        metadata = _scalar_metadata()
        for name, scalars in (("train", train), ("validation", validation)):
            writer = self._writer(name)
            with writer.as_default():
                for tag, value in scalars.items():
                    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=epoch + 1, metadata=metadata)
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in (self._writers or {}).values():
            writer.close()
        self._writers = None


def density_series(history):
    """{layer: [density per epoch]} of the training logs' `<layer>_density` metrics."""
    return {key[:-len(DENSITY_SUFFIX)]: values for key, values in history.items()
            if key.endswith(DENSITY_SUFFIX) and not key.startswith("val_")}


def plot_training_curve(history, path, bounds=None, title=None):
    """Writes a PNG of four panels over the epochs: loss, accuracy (training and
    validation, overall and mean per class), each sparse layer's output density (with its bound rho_up from bounds,
    {layer: rho_up or None}, dashed) and the present weights."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = np.arange(1, len(history.get("loss", [])) + 1)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, key, label in ((axes[0, 0], "loss", "loss"), (axes[0, 1], "accuracy", "accuracy")):
        for prefix, name in (("", "training"), ("val_", "validation")):
            if prefix + key in history:
                ax.plot(epochs, history[prefix + key], marker=".", label=name)
        if key == "accuracy" and "val_mean_class_accuracy" in history:
            ax.plot(epochs, history["val_mean_class_accuracy"], marker=".", linestyle="--",
                    label="validation, mean per class")
        ax.set_title(label)
        ax.legend()
    densities = density_series(history)
    ax = axes[1, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (layer, values) in enumerate(densities.items()):
        color = colors[i % len(colors)]
        ax.plot(epochs, values, color=color, label=layer)
        rho = (bounds or {}).get(layer)
        if rho:
            ax.axhline(rho, color=color, linestyle="--", linewidth=0.8)
    ax.set_title("output density per sparse layer (dashed: bound rho_up)")
    if densities:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no channel-sparse layers", ha="center", va="center", transform=ax.transAxes)
    ax = axes[1, 1]
    if "present_weights" in history:
        ax.plot(epochs, history["present_weights"], marker=".")
    else:
        ax.text(0.5, 0.5, "no channel-sparse layers", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("present weights of the sparse layers")
    for ax in axes.flat:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def megabytes(num_bytes):
    return f"{num_bytes / 2 ** 20:.1f} MB"


def memory_lines(results):
    """The memory bound of the forward pass for the batch size, its activations against
    the same layers' outputs as dense grids, and the bound without the density bounds."""
    activations, dense = results["memory_bound_activation_bytes"], results["memory_dense_bytes"]
    replicas = results.get("replicas", 1)
    at = (f"per replica at its batch {results['batch_size_per_replica']} (global {results['batch_size']})"
          if replicas > 1 else f"at batch {results['batch_size']}")
    sites = results.get("memory_bound_sites_per_sample")
    inputs = f"any input of at most {sites} sites per sample" if sites else "any input"
    lines = [f"memory bound {at}: {megabytes(results['memory_bound_bytes'])} for {inputs} (per layer in "
             "results.json)"]
    if dense:
        lines.append(f"  activations {megabytes(activations)} against the dense grid's {megabytes(dense)} "
                     f"({activations / dense:.2f}x)")
    if results.get("memory_unbounded_bytes"):
        lines.append(f"  without the density bounds (rho = 1): {megabytes(results['memory_unbounded_bytes'])}")
    return lines


def summary_lines(results, written, next_commands):
    """The closing summary: accuracy, the sparse layers, the memory bound against the dense
    grid's, peak memory, the files written ({name: description}) and the commands to run next."""
    seconds, cpu = results["sec_per_epoch"], results["history"].get("cpu_sec_per_epoch")
    chance = 1 / results["num_classes"]
    scored = (f"validation accuracy {results['val_accuracy']:.4f} (chance {chance:.3f})"
              if results["val_accuracy"] is not None else
              f"no validation (--val-split none: trained on all {results['examples']} examples)")
    lines = [f"{scored} after {results['epochs']} epochs; {np.mean(seconds):.1f} s per epoch (first {seconds[0]:.1f} s"
             + (f"; CPU time {np.mean(cpu):.1f} s per epoch" if cpu else "") + ")"]
    if "replicas" in results:
        rate = f"{results['shapes_per_s']:.1f} {'images' if results.get('dataset') == 'mnist' else 'shapes'}/s"
        lines.append(f"throughput {rate} on one device (batch {results['batch_size']})" if results["replicas"] == 1
                     and results["strategy"] == "default" else
                     f"{results['replicas']} replicas (--strategy {results['strategy']}), global batch "
                     f"{results['batch_size']} ({results['batch_size_per_replica']} per replica): {rate} over all "
                     "replicas")
    if results.get("val_mean_class") is not None:
        lines.append(f"validation mean per-class accuracy {results['val_mean_class']:.4f} over "
                     f"{results['val_examples']} examples (--val-split {results['val_split']})")
    if results.get("val_overall_test_weighted") is not None:
        lines.append(f"validation accuracy at the official test split's class balance "
                     f"{results['val_overall_test_weighted']:.4f} ± {results['val_overall_test_weighted_se']:.4f} "
                     "(standard error)")
    if results.get("vote", "none") != "none":
        views = ("each cloud and its mirror image" if results["vote"] == "mirror" else
                 f"{results['vote'].split('-')[1]} rotations of each cloud about the up axis")
        lines.append(f"validation accuracy voting over {views} {results['val_overall_vote']:.4f} (mean per-class "
                     f"{results['val_mean_class_vote']:.4f})")
    if results["layers"]:
        lines.append(f"{'sparse layer':<18}{'rho_up':>8}{'density':>10}{'present weights':>20}")
        for row in results["layers"]:
            lines.append(f"{row['layer']:<18}{row['rho_up'] or 1.0:>8.3f}{row['density']:>10.4f}"
                         f"{row['present_weights']:>11} / {row['weights']:<7}")
    if results.get("memory_bound_bytes") is not None:
        lines.extend(memory_lines(results))
    lines.append(f"peak resident memory {results['peak_rss_bytes'] / 2 ** 20:.0f} MiB"
                 + (f", GPU peak {results['peak_gpu_bytes'] / 2 ** 20:.0f} MiB" if results.get("peak_gpu_bytes")
                    else "") + f" ({results['device']})")
    lines.append(f"written to {results['out']}:")
    width = max(len(name) for name in written)
    lines += [f"  {name:<{width}}  {text}" for name, text in written.items()]
    lines.append("next:")
    lines += [f"  {command}" for command in next_commands]
    return lines
