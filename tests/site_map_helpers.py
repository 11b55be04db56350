"""Helpers shared by the CPU and GPU site-convolution tests. Imported as
`tests.site_map_helpers`, so that a subprocess importing a test module finds it too."""


def hand_built(m, **changes):
    """m as a hand-built KernelMap (trusted=False), with some fields replaced."""
    from tf_sparseconv.site.tensor import KernelMap
    fields = dict(in_rows=m.in_rows, out_rows=m.out_rows, offset_splits=m.offset_splits, in_coords=m.in_coords,
                  out_coords=m.out_coords, in_spatial_shape=m.in_spatial_shape,
                  out_spatial_shape=m.out_spatial_shape, mode=m.mode, kernel_size=m.kernel_size, strides=m.strides,
                  padding=m.padding, dilation=m.dilation)
    fields.update(changes)
    return KernelMap(**fields)
