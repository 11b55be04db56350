"""Network builders from the papers."""
from tf_sparseconv.models.octnet3 import DEFAULT_RHOS, octnet3
from tf_sparseconv.models.site_nets import site_resnet, site_unet

__all__ = ["octnet3", "DEFAULT_RHOS", "site_resnet", "site_unet"]
