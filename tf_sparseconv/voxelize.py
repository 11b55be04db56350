"""Point clouds to channel-sparse voxel grids: kept for `from tf_sparseconv.voxelize import
voxelize_points`; the implementation lives in tf_sparseconv.data.voxelize."""
from tf_sparseconv.data.voxelize import voxelize_points

__all__ = ["voxelize_points"]
