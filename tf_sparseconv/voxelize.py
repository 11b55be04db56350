"""Point clouds to channel-sparse occupancy grids (vectorised NumPy)."""
import numpy as np
import tensorflow as tf

from tf_sparseconv.channel_sparse_tensor import ChannelSparseTensor


def voxelize_points(point_clouds, resolution, bounds=(-1.0, 1.0), dtype=np.float32):
    """Occupancy [B, r, r, r, 1] of a batch of point clouds (each [N_i, 3]).

    Points outside `bounds` are clipped to the border voxels. Each occupied voxel gets
    value 1; keys come out sorted, as the ops require.
    """
    if resolution < 1:
        raise ValueError(f"resolution must be >= 1, got {resolution}")
    lo, hi = bounds
    keys = []
    for b, points in enumerate(point_clouds):
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != 3:
            raise ValueError(f"point cloud {b} must have shape [N, 3], got {points.shape}")
        if not np.all(np.isfinite(points)):
            raise ValueError(f"point cloud {b} contains NaN or infinite coordinates")
        cells = np.clip(((points - lo) / (hi - lo) * resolution).astype(np.int64), 0, resolution - 1)
        lin = (cells[:, 0] * resolution + cells[:, 1]) * resolution + cells[:, 2]
        # Single channel: key = b * r^3 + lin.
        keys.append(np.unique(lin) + b * resolution ** 3)
    keys = np.concatenate(keys) if keys else np.zeros([0], np.int64)
    return ChannelSparseTensor(tf.constant(keys, tf.int64), tf.ones([keys.size], dtype),
                               tf.constant([len(point_clouds), resolution, resolution, resolution, 1], tf.int64))
