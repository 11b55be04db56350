"""Data for channel-sparse CNNs: voxelization, dataset loaders and tf.data pipelines.

- voxelize:  point clouds -> ChannelSparseTensor [B, r, r, r, C] (occupancy, counts, normals,
             offsets within the voxel).
             A dense grid [B, r, r, r, C] that already exists goes through ts.from_dense.
- modelnet:  ModelNet40/10 from OFF meshes (<root>/<class>/{train,test}/*.off) or the .npz clouds.
- scannet:   ScanNet furniture instances cropped from the official scans (19 classes, §4.5).
- mnist:     MNIST from .npz or idx files, thresholded at 50 as in §4.2.
- synthetic: procedurally generated primitives, the default data set (no download).
- pipeline:  stratified and balanced splits, augmentation, (ChannelSparseTensor, labels) batches for Keras fit.
- point_files: clouds and images from single files (.off, .ply, .npy, .npz, .png), for predicting.
- test_split: labelled test data found by its layout, for scoring a trained model.
"""
from tf_sparseconv.data.mnist import image_arrays, images_to_channel_sparse, load_mnist, read_idx
from tf_sparseconv.data.modelnet import (MODELNET10_CLASSES, MODELNET40_TEST_COUNTS, load_modelnet_meshes,
                                         load_modelnet_npz, modelnet40_test_counts, normalize_to_unit_sphere, read_off,
                                         sample_surface)
from tf_sparseconv.data.pipeline import (NAMED_AUGMENTATIONS, UP_AXIS, Augmentation, ReplicaSplit,
                                         augment_point_clouds, balanced_split, image_dataset, point_cloud_dataset,
                                         rotate_about_up, stratified_split)
from tf_sparseconv.data.point_files import read_image_file, read_point_file
from tf_sparseconv.data.scannet import SCANNET_CLASSES, load_scannet_objects, read_ply, scene_objects
from tf_sparseconv.data.synthetic import SHAPE_CLASSES, make_shapes
from tf_sparseconv.data.test_split import detect_kind, load_test_split
from tf_sparseconv.data.voxelize import FEATURE_CHANNELS, num_channels, voxelize_arrays, voxelize_points

__all__ = [
    "voxelize_points", "voxelize_arrays", "num_channels", "FEATURE_CHANNELS",
    "read_off", "sample_surface", "normalize_to_unit_sphere", "load_modelnet_meshes", "load_modelnet_npz",
    "MODELNET10_CLASSES", "MODELNET40_TEST_COUNTS", "modelnet40_test_counts",
    "read_ply", "scene_objects", "load_scannet_objects", "SCANNET_CLASSES",
    "read_idx", "load_mnist", "image_arrays", "images_to_channel_sparse",
    "make_shapes", "SHAPE_CLASSES",
    "stratified_split", "balanced_split", "Augmentation", "NAMED_AUGMENTATIONS", "augment_point_clouds",
    "rotate_about_up", "UP_AXIS", "point_cloud_dataset",
    "image_dataset", "ReplicaSplit",
    "read_point_file", "read_image_file", "detect_kind", "load_test_split",
]
