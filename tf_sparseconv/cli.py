"""The tf-sparseconv command: train, evaluate, predict and bound, from the shell.

    tf-sparseconv train --dataset modelnet40 --resolution 32        (or python -m tf_sparseconv ...)
    tf-sparseconv evaluate runs/<run>/model.keras --data ModelNet40/
    tf-sparseconv predict runs/<run>/model.keras chair.off scan.ply --top-k 3
    tf-sparseconv bound runs/<run>/model.keras --batch-size 64

Arguments are checked before anything loads: a bad one ends the command with a one-line
message on stderr and exit code 2, and nothing is written. Problems with the user's data
found later (a malformed file, classes the model does not know) end the same way. The
commands import TensorFlow and Keras only once the arguments pass.
"""
import argparse
import json
import os
import re
import sys
import time
import zipfile

PROG = "tf-sparseconv"

COMMANDS = {
    "train": "train a classifier and save it as <out>/model.keras",
    "evaluate": "score a saved model on labelled data (accuracy, confusion)",
    "predict": "label point or image files with a model's top-k classes",
    "bound": "print a model's memory bound beside the dense grid's",
}


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
    # numpy's own advice for pickled files is unsafe; say what the file is instead.
    if "allow_pickle" in line:
        line = "the file holds pickled Python objects, which are not loaded since that would run code from it"
    return line


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
    import keras

    import tf_sparseconv  # noqa: F401  (registers the layers a saved model names)
    from tf_sparseconv.models import class_names, input_spec

    try:
        model = keras.models.load_model(path, compile=False)
    except Exception as e:  # Keras raises many types for a broken or foreign archive
        raise UsageError(f"{path}: cannot be loaded as a tf_sparseconv model ({one_line(e)})") from None
    try:
        spec = input_spec(model)
    except (TypeError, ValueError) as e:
        if serving:
            raise UsageError(f"{path}: {one_line(e)}; the model.keras that tf-sparseconv train writes takes raw "
                             "data") from None
        spec = None
    return model, spec, class_names(model)


def check_out_dir(path, overwrite):
    """UsageError if path is a file, or a non-empty folder without --overwrite."""
    if os.path.isfile(path):
        raise UsageError(f"--out {path}: is a file, expected a folder")
    if os.path.isdir(path) and os.listdir(path) and not overwrite:
        raise UsageError(f"--out {path}: exists and is not empty; choose another folder or pass --overwrite")


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


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the message and where to read the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser():
    from tf_sparseconv import bound, evaluate, predict

    parser = _Parser(
        prog=PROG, description="Sparse CNNs on point clouds and images: train a classifier, score it, use it.",
        epilog=f"'{PROG} COMMAND --help' describes each command's options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    # train has its own parser (tf_sparseconv.train); main() hands it the arguments unparsed.
    commands.add_parser("train", help=COMMANDS["train"], add_help=False)
    for name, module in (("evaluate", evaluate), ("predict", predict), ("bound", bound)):
        sub = commands.add_parser(name, help=COMMANDS[name], description=module.DESCRIPTION,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def _version():
    from tf_sparseconv import __version__
    return __version__


def _train(argv):
    from tf_sparseconv import train

    result = train.main(argv)
    return result if isinstance(result, int) else 0


def main(argv=None):
    """Runs one command; returns the exit code (0 done, 2 refused: bad arguments or data)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["train"]:
            return _train(argv[1:])
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            print(f"{PROG}: error: name a command: {', '.join(COMMANDS)} (see {PROG} --help)", file=sys.stderr)
            return 2
        return args.run(args) or 0
    except SystemExit as e:  # argparse: --help (0) or a bad argument (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except UsageError as e:
        print(f"{PROG} {argv[0]}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
