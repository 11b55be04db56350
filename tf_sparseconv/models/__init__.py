"""Network builders from the papers."""
from tf_sparseconv.models.octnet3 import DEFAULT_RHOS, octnet3

__all__ = ["octnet3", "DEFAULT_RHOS"]
