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
import sys

from tf_sparseconv.cli.common import UsageError

PROG = "tf-sparseconv"

COMMANDS = {
    "train": "train a classifier and save it as <out>/model.keras",
    "evaluate": "score a saved model on labelled data (accuracy, confusion)",
    "predict": "label point or image files with a model's top-k classes",
    "bound": "print a model's memory bound beside the dense grid's",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the message and where to read the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser():
    from tf_sparseconv.cli import bound, evaluate, predict

    parser = _Parser(
        prog=PROG, description="Sparse CNNs on point clouds and images: train a classifier, score it, use it.",
        epilog=f"'{PROG} COMMAND --help' describes each command's options.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    # train has its own parser (tf_sparseconv.training.train); main() hands it the arguments unparsed.
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
    from tf_sparseconv.training import train

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
