"""Network builders from the papers, serving models that wrap a trained network so it
takes point clouds or images (and ensembles of them), and saving / loading .keras files
with a checksum."""
from tf_sparseconv.models.ensemble import MeanSoftmax, ensemble_classifier
from tf_sparseconv.models.octnet3 import DEFAULT_RHOS, octnet3
from tf_sparseconv.models.saving import ModelFileError, load_model, save_model
from tf_sparseconv.models.serving import (class_names, core_model, image_classifier, input_spec,
                                          normalize_point_clouds, point_cloud_classifier)
from tf_sparseconv.models.site_nets import site_resnet, site_unet

__all__ = ["octnet3", "DEFAULT_RHOS", "site_resnet", "site_unet", "point_cloud_classifier", "image_classifier",
           "normalize_point_clouds", "core_model", "class_names", "input_spec", "save_model", "load_model",
           "ModelFileError", "ensemble_classifier", "MeanSoftmax"]
