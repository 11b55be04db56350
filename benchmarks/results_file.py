"""A benchmark's results file is never replaced without being asked: the check each script
makes before it measures anything."""
import json
import os


def add_replace_argument(parser):
    parser.add_argument("--replace", action="store_true",
                        help="overwrite the rows of --out this run would replace (without it, a run stops "
                             "before measuring where --out already holds them)")


def refuse_to_replace(parser, path, replace, replaced=lambda row: True):
    """Stops the run (parser.error) where `path` holds rows the run would overwrite (those for
    which replaced(row) holds; by default any row), unless --replace was given."""
    if replace or not os.path.exists(path):
        return
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    held = sum(1 for row in rows if replaced(row))
    if held:
        parser.error(f"{path} already holds {held} row(s) this run would overwrite; give --replace to overwrite "
                     "them, or --out another file")
