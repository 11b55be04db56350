"""What the tf-sparseconv commands share: one-line usage errors, argument types, the
checks of model files and output folders made before TensorFlow loads, loading a saved
model, and progress lines."""
import argparse
import json
import os
import re
import sys
import time
import zipfile

from tf_sparseconv.data.npz import without_pickle_advice


class UsageError(Exception):
    """A problem with the user's arguments or data: reported as one line, exit code 2."""


def one_line(error):
    """An exception's message as one line: for TensorFlow's graph errors the failed
    assertion (or last line of the message), not the trace of where the graph was built."""
    text = str(getattr(error, "message", None) or error).strip()
    assertion = re.search(r"assertion failed: \[(.*?)\]\s*(?:\n|$)", text)
    if assertion:
        line = assertion.group(1).replace("\\'", "'")
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if text.startswith("Graph execution error"):
            lines = [line for line in lines if not line.startswith(("Graph execution", "Detected at", "File ", "[["))]
            lines = lines[-1:]
        line = lines[0] if lines else type(error).__name__
    return without_pickle_advice(line)


def positive_int(text, least=1):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def non_negative_int(text):
    """A seed: a whole number >= 0 (NumPy's generators take no negative seed)."""
    return positive_int(text, least=0)


def check_model_file(path):
    """UsageError unless path is a readable Keras 3 .keras archive (checked without loading TensorFlow)."""
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such model file (tf-sparseconv train writes <out>/model.keras)")
    if os.path.isdir(path):
        candidate = os.path.join(path, "model.keras")
        hint = f"; did you mean {candidate}?" if os.path.isfile(candidate) else ""
        raise UsageError(f"{path}: is a folder, expected a .keras model file{hint}")
    if not path.endswith(".keras"):
        raise UsageError(f"{path}: expected a .keras model file (as saved by tf-sparseconv train), "
                         f"got a {os.path.splitext(path)[1] or 'file without extension'}")
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as e:
        reason = "not a zip archive" if isinstance(e, zipfile.BadZipFile) else one_line(e)
        raise UsageError(f"{path}: not a Keras model file ({reason})") from None
    if not isinstance(config, dict) or "class_name" not in config:
        raise UsageError(f"{path}: not a Keras model file (its config.json describes no model)")


def load_model(path, serving=True):
    """(model, input_spec, class names) of a saved model; UsageError for anything else.

    serving: refuse a model on sparse tensors (a bare core, such as train's epoch
    snapshots); otherwise its input_spec is None."""
    from tf_sparseconv.models import ModelFileError, class_names, input_spec, load_model as load_checked

    try:
        model = load_checked(path, compile=False)  # verifies the checksum train saves with the model
    except ModelFileError as e:
        raise UsageError(one_line(e)) from None
    try:
        spec = input_spec(model)
    except (TypeError, ValueError) as e:
        if serving:
            raise UsageError(f"{path}: {one_line(e)}; the model.keras that tf-sparseconv train writes takes raw "
                             "data") from None
        spec = None
    return model, spec, class_names(model)


def load_ensemble(paths, shared, shared_names, purpose, check=None):
    """[(model, input spec)], class names and output count of the saved models at paths
    (an ensemble's members); UsageError unless they share their classes and the input spec's
    values under the keys in shared (shared_names says them in words; purpose ends the
    message). check(spec), where given, runs on each model's spec as it loads."""
    loaded = []
    for path in paths:
        model, spec, names = load_model(path)
        if check is not None:
            check(spec)
        loaded.append((path, model, spec, names, int(model.outputs[0].shape[-1])))
    _, _, first_spec, names, num_outputs = loaded[0]
    for path, _, spec, other_names, other_outputs in loaded[1:]:
        if (other_names, other_outputs) != (names, num_outputs):
            raise UsageError(f"{path} has other classes than {paths[0]} ({other_outputs} against {num_outputs} "
                             "outputs, or other names); an ensemble averages the same classes")
        if any(spec.get(key) != first_spec.get(key) for key in shared):
            raise UsageError(f"{path} takes other inputs than {paths[0]} ({shared_names}); {purpose}")
    return [(m, s) for _, m, s, _, _ in loaded], names, num_outputs


def centres_clouds(ensemble):
    """Whether every model of ensemble ([(model, input spec)], load_ensemble's) centres each
    cloud on its centroid itself (normalize='unit_sphere'; one saved with normalize='none'
    has absolute bounds), so that clouds may be read centred (point_files.as_clouds)."""
    return all(spec.get("normalize") != "none" for _, spec in ensemble)


def check_out_dir(path, overwrite):
    """UsageError if path is a file, a non-empty folder without --overwrite, or a folder that
    cannot be made or written in."""
    if os.path.isfile(path):
        raise UsageError(f"--out {path}: is a file, expected a folder")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise UsageError(f"--out {path}: exists and is not empty; choose another folder or pass --overwrite")
    problem = folder_problem(path)
    if problem:
        raise UsageError(f"--out {path}: cannot be written: {problem}")


def folder_problem(path):
    """Why the folder path cannot be made or written in, in words (the nearest existing path
    at or above it is a file, or a folder this user may not write in); None where it can."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


class Progress:
    """Progress of long work on stderr: one updating line on a terminal, else a line per ~10%
    or 10 s; the last step is always shown."""

    def __init__(self, label, total=None, stream=None):
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.start = self.last = time.monotonic()
        self.last_fraction = 0.0

    def __call__(self, done=None, total=None, what=""):
        """done of total steps (total: as given to the constructor unless given here)."""
        self.total = total or self.total
        now = time.monotonic()
        fraction = done / self.total if done is not None and self.total else None
        finished = fraction is not None and fraction >= 1
        if not finished:
            if self.tty and now - self.last < 0.2:
                return
            if not self.tty and now - self.last < 10 and (fraction is None or fraction - self.last_fraction < 0.1):
                return
        self.last, self.last_fraction = now, fraction or 0.0
        count = f" {done}/{self.total}" if fraction is not None else ""
        line = f"{self.label}:{count} {what}".rstrip() + f" ({now - self.start:.0f} s)"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if finished else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
