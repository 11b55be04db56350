"""Helpers shared by the site tests (CPU and GPU): random sites, dense grids of them, and
hand-built kernel maps. Imported as `tests.site.helpers`, so that a subprocess importing a
test module finds it too."""
import numpy as np


def random_coords(rng, batch, shape, density):
    """Unique random sites in shuffled order (nothing may rely on the order)."""
    occupied = rng.random((batch, *shape)) < density
    coords = np.argwhere(occupied).astype(np.int32)
    return coords[rng.permutation(len(coords))]


def random_sites(rng, batch, shape, density, channels, dtype=np.float32):
    """random_coords and standard-normal features of them."""
    coords = random_coords(rng, batch, shape, density)
    features = rng.standard_normal((len(coords), channels)).astype(dtype)
    return coords, features


def to_grid(coords, features, batch, shape, fill=0.0):
    grid = np.full((batch, *shape, features.shape[1]), fill, features.dtype)
    grid[tuple(coords.T)] = features
    return grid


def rows_at(grid, coords):
    return grid[tuple(np.asarray(coords).T)]


def hand_built(m, **changes):
    """m as a hand-built KernelMap (trusted=False), with some fields replaced."""
    from tf_sparseconv.site.tensor import KernelMap
    fields = dict(in_rows=m.in_rows, out_rows=m.out_rows, offset_splits=m.offset_splits, in_coords=m.in_coords,
                  out_coords=m.out_coords, in_spatial_shape=m.in_spatial_shape,
                  out_spatial_shape=m.out_spatial_shape, mode=m.mode, kernel_size=m.kernel_size, strides=m.strides,
                  padding=m.padding, dilation=m.dilation)
    fields.update(changes)
    return KernelMap(**fields)
