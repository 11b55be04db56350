"""The tf-sparseconv command (console script `tf_sparseconv.cli:main`, also
`python -m tf_sparseconv`): commands.py parses and dispatches; evaluate.py, predict.py
and bound.py are the subcommands (train is tf_sparseconv.training.train); common.py holds
what they share."""
from tf_sparseconv.cli.commands import COMMANDS, PROG, build_parser, main
from tf_sparseconv.cli.common import UsageError, one_line

__all__ = ["main", "build_parser", "COMMANDS", "PROG", "UsageError", "one_line"]
