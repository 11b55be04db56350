"""python -m tf_sparseconv: the tf-sparseconv command (see tf_sparseconv.cli)."""
import sys

from tf_sparseconv.cli import main

sys.exit(main())
