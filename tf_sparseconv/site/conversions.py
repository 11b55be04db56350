"""Conversions of the site-sparse tensor: dense grids, point clouds (voxelization with a
point -> site map) and the channel-sparse tensor of the direct family.

All are compositions of TensorFlow ops, so they run on every device, inside tf.function
and tf.data, and carry gradients to the features.
"""
import tensorflow as tf

from tf_sparseconv.channel.conversions import decode_keys, encode_keys, validate
from tf_sparseconv.channel.tensor import ChannelSparseTensor, make_channel_sparse
from tf_sparseconv.inputs import finite_checks, integer_tensor, real_tensor
from tf_sparseconv.site.kernel_map import site_checks
from tf_sparseconv.site.tensor import SiteSparseTensor, make_site_sparse

REDUCTIONS = ("mean", "max", "first")


def _row_major_keys(coords, extents):
    """int64 key of (batch, x1..xd) rows, row-major over extents [B, R1..Rd]."""
    coords = tf.cast(coords, tf.int64)
    key = coords[:, 0]
    for j in range(1, coords.shape[1]):
        key = key * tf.cast(extents[j], tf.int64) + coords[:, j]
    return key


def _decode_row_major(keys, extents, d):
    columns = []
    for j in range(d, 0, -1):
        extent = tf.cast(extents[j], tf.int64)
        columns.append(keys % extent)
        keys = keys // extent
    columns.append(keys)
    return tf.cast(tf.stack(columns[::-1], axis=1), tf.int32)


def site_from_dense(dense, non_finite="raise"):
    """[B, R1, ..., Rd, C] -> the sites where any channel is non-zero, sorted by batch
    then coordinates. dense must be real (integers become float32, complex is TypeError)
    and finite: NaN or infinite entries are InvalidArgumentError unless
    non_finite="allow" (tf_sparseconv.inputs)."""
    dense = real_tensor(dense, "dense", "site_from_dense")
    if dense.shape.rank is None or dense.shape.rank < 3:
        raise ValueError(f"site_from_dense takes [B, R1, ..., Rd, C] with d >= 1, got shape {dense.shape}")
    if 0 in dense.shape.as_list():  # no sample, no cell or no channel: nothing a site tensor can hold
        raise ValueError(f"site_from_dense: dense must have a sample, a cell per extent and a channel, got shape "
                         f"{dense.shape}")
    with tf.control_dependencies(finite_checks(dense, non_finite, "dense entries", "site_from_dense")):
        coords = tf.cast(tf.where(tf.reduce_any(tf.not_equal(dense, 0), axis=-1)), tf.int32)
    shape = tf.shape(dense, out_type=tf.int32)
    x = make_site_sparse(coords, tf.gather_nd(dense, coords), shape[1:-1], shape[0], non_finite="allow")
    static = dense.shape[1:-1]
    return x if not static.is_fully_defined() else SiteSparseTensor(
        x.coords, x.features, x.spatial_shape, x.batch_size, {}, static)


def site_to_dense(x):
    """The sites as a dense [B, R1, ..., Rd, C] grid, zero elsewhere. The sites are
    checked first (site_checks: in range, each once; InvalidArgumentError otherwise)."""
    with tf.control_dependencies(site_checks(x, "site_to_dense")):
        coords = tf.identity(x.coords)
    shape = tf.concat([x.batch_size[None], x.spatial_shape, tf.shape(x.features, out_type=tf.int32)[1:]], 0)
    # each site once (checked): written as it is, where scatter_nd's sum flushes subnormals
    return tf.tensor_scatter_nd_update(tf.zeros(shape, x.features.dtype), coords, x.features)


def _check_point_shapes(points, spatial_shape, batch_index, batch_size, features, origin):
    """voxelize_sites' inputs against points [N, d]: ValueError for a shape that would
    broadcast or fail inside TensorFlow's ops (statically known), InvalidArgumentError
    for a row count that differs at run time."""
    d = points.shape[-1]
    for name, value, layout in (("spatial_shape", spatial_shape, [d]), ("origin", origin, [d]),
                                ("batch_index", batch_index, [None]), ("batch_size", batch_size, []),
                                ("features", features, [None, None])):
        if not value.shape.is_compatible_with(layout):
            raise ValueError(f"voxelize_sites: {name} must have shape {layout} (None: any) for points of shape "
                             f"{points.shape}, got {value.shape}")
    n = tf.shape(points)[0]
    return [tf.debugging.assert_equal(tf.shape(value)[0], n, message=f"voxelize_sites: {name} must have one row "
                                                                     f"per point")
            for name, value in (("batch_index", batch_index), ("features", features))]


def voxelize_sites(points, voxel_size, spatial_shape, batch_index=None, batch_size=None, features=None,
                   origin=None, reduction="mean", non_finite="raise"):
    """Point clouds -> sites (voxels holding at least one point) and the point -> site map.

    points [N, d] (float); batch_index [N] (default all 0); features [N, F] per point
    (default a column of ones, i.e. occupancy); the voxel of a point is
    floor((p - origin) / voxel_size), kept when inside spatial_shape. reduction combines
    the points of a voxel: 'mean', 'max' or 'first' (the point with the lowest index).
    Returns (SiteSparseTensor with sites sorted by batch then coordinates,
    point_to_site [N] int32: the site row of each point, -1 for points outside), so
    per-point outputs are tf.gather(site_features, point_to_site) for the points inside.
    Refused with InvalidArgument: a voxel_size that is not positive and finite (scalar or
    one per axis), an origin that is not finite (TypeError: not real), batch indices
    outside [0, batch_size), NaN or infinite features, and NaN or infinite coordinates
    unless non_finite="drop", which maps such points to -1 like the points outside the grid
    (their features are then not read).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if non_finite not in ("raise", "drop"):
        raise ValueError(f"non_finite must be 'raise' or 'drop', got {non_finite!r}")
    points = tf.convert_to_tensor(points)
    if not (points.dtype.is_floating or points.dtype.is_integer):
        raise TypeError(f"voxelize_sites: points must be real numbers, got {points.dtype.name}")
    if not points.dtype.is_floating:
        points = tf.cast(points, tf.float32)
    d = points.shape[-1]
    if points.shape.rank != 2 or d is None or not 1 <= d <= 4:
        raise ValueError(f"points must be [N, d] with 1 <= d <= 4, got shape {points.shape}")
    n = tf.shape(points)[0]
    spatial_shape = integer_tensor(spatial_shape, tf.int32, "spatial_shape", "voxelize_sites")
    batch_index = tf.zeros([n], tf.int32) if batch_index is None else integer_tensor(
        batch_index, tf.int32, "batch_index", "voxelize_sites")
    if batch_size is None:
        batch_size = tf.reduce_max(tf.concat([batch_index, [-1]], 0)) + 1
        batch_size = tf.maximum(batch_size, 1)
    batch_size = integer_tensor(batch_size, tf.int32, "batch_size", "voxelize_sites")
    features = tf.ones([n, 1], points.dtype) if features is None else real_tensor(features, "features",
                                                                                  "voxelize_sites")
    origin = (tf.zeros([d], points.dtype) if origin is None
              else real_tensor(origin, "origin", "voxelize_sites", points.dtype))
    voxel_size = tf.convert_to_tensor(voxel_size)
    if voxel_size.dtype.is_complex or not (voxel_size.dtype.is_floating or voxel_size.dtype.is_integer):
        raise TypeError(f"voxelize_sites: voxel_size must be real, got {voxel_size.dtype.name}")
    if voxel_size.shape.rank not in (0, 1) or (voxel_size.shape.rank == 1 and voxel_size.shape[0] not in (1, d)):
        raise ValueError(f"voxelize_sites: voxel_size must be a scalar or one size per axis ({d}), "
                         f"got shape {voxel_size.shape}")
    voxel_size = tf.cast(voxel_size, points.dtype)
    with tf.control_dependencies(_check_point_shapes(points, spatial_shape, batch_index, batch_size, features,
                                                     origin)):
        points, features = tf.identity(points), tf.identity(features)
    finite = tf.reduce_all(tf.math.is_finite(points), axis=1)
    features_finite = (tf.reduce_all(tf.math.is_finite(features), axis=1) if features.dtype.is_floating
                       else tf.ones_like(finite))
    checks = [
        tf.debugging.assert_equal(tf.reduce_all(tf.math.is_finite(voxel_size) & (voxel_size > 0)), True,
                                  message="voxelize_sites: voxel_size must be positive and finite"),
        # a NaN or infinite origin would leave every point outside the grid (no sites)
        tf.debugging.assert_equal(tf.reduce_all(tf.math.is_finite(origin)), True,
                                  message="voxelize_sites: origin must be finite"),
        tf.debugging.assert_equal(tf.reduce_all((batch_index >= 0) & (batch_index < batch_size)), True,
                                  message="voxelize_sites: batch_index must lie in [0, batch_size)"),
        # The features of a dropped point are never read: only those of the kept ones must be finite.
        tf.debugging.assert_equal(tf.reduce_all(features_finite | ~finite), True,
                                  message="voxelize_sites: features hold NaN or Inf"),
    ]
    if non_finite == "raise":
        checks.append(tf.debugging.assert_equal(
            tf.reduce_all(finite), True, message="voxelize_sites: points hold NaN or Inf coordinates "
                                                 "(non_finite='drop' leaves such points out)"))
    with tf.control_dependencies(checks):
        cells = tf.floor((points - origin) / voxel_size)
    # TensorFlow flushes subnormal results to zero: a point just below the origin whose
    # quotient underflows (a voxel size far larger than the coordinates) would floor to
    # cell 0. Below the origin is cell -1 or less, whatever the quotient.
    cells = tf.where(points < origin, tf.minimum(cells, -1), cells)
    inside = tf.reduce_all((cells >= 0) & (cells < tf.cast(spatial_shape, points.dtype)), axis=1)
    inside &= finite
    kept = tf.cast(tf.where(inside)[:, 0], tf.int32)
    coords = tf.concat([tf.gather(batch_index, kept)[:, None], tf.cast(tf.gather(cells, kept), tf.int32)], 1)
    keys = _row_major_keys(coords, tf.concat([batch_size[None], spatial_shape], 0))
    order = tf.argsort(keys, stable=True)
    unique_keys, site_of_sorted = tf.unique(tf.gather(keys, order), out_idx=tf.int32)
    num_sites = tf.shape(unique_keys)[0]
    point_of_sorted = tf.gather(kept, order)
    point_features = tf.gather(features, point_of_sorted)
    if reduction == "mean":
        site_features = tf.math.unsorted_segment_mean(point_features, site_of_sorted, num_sites)
    elif reduction == "max":
        site_features = tf.math.unsorted_segment_max(point_features, site_of_sorted, num_sites)
    else:
        # The stable sort keeps each voxel's points in index order: its first is the first.
        first = tf.math.unsorted_segment_min(tf.range(tf.shape(order)[0]), site_of_sorted, num_sites)
        site_features = tf.gather(point_features, first)
    point_to_site = tf.tensor_scatter_nd_update(-tf.ones([n], tf.int32), point_of_sorted[:, None], site_of_sorted)
    site_coords = _decode_row_major(unique_keys, tf.concat([batch_size[None], spatial_shape], 0), d)
    x = make_site_sparse(site_coords, site_features, spatial_shape, batch_size, non_finite="allow")
    return x, point_to_site


def to_channel_sparse(x):
    """Sites -> the channel-sparse tensor [B, R1..Rd, C] of their non-zero feature entries.
    The sites are checked first (site_checks: in range, each once; InvalidArgumentError
    otherwise)."""
    with tf.control_dependencies(site_checks(x, "to_channel_sparse")):
        coords = tf.identity(x.coords)
    channels = tf.shape(x.features, out_type=tf.int32)[1]
    nonzero = tf.where(tf.not_equal(x.features, 0))
    site_rows, channel = nonzero[:, 0], nonzero[:, 1]
    indices = tf.concat([tf.cast(tf.gather(coords, site_rows), tf.int64), channel[:, None]], 1)
    dense_shape = tf.cast(tf.concat([x.batch_size[None], x.spatial_shape, channels[None]], 0), tf.int64)
    keys = encode_keys(indices, dense_shape)
    order = tf.argsort(keys)
    values = tf.gather_nd(x.features, nonzero)
    static = tf.TensorShape([None]).concatenate(x.static_spatial_shape).concatenate([x.features.shape[1]]) \
        if x.static_spatial_shape.rank is not None else None
    return make_channel_sparse(tf.gather(keys, order), tf.gather(values, order), dense_shape, static)


def from_channel_sparse(x):
    """Channel-sparse [B, R1..Rd, C] -> sites (every position with a stored entry), with
    the stored values as feature rows (zeros in the channels not stored). x is checked
    first (tf_sparseconv.validate: sorted unique keys in range, no NaN values)."""
    if not isinstance(x, ChannelSparseTensor):
        raise TypeError(f"from_channel_sparse expects a ChannelSparseTensor, got {type(x).__name__}")
    x = validate(x).without_padding()
    indices = decode_keys(x.keys, x.dense_shape)
    rank = x.rank
    extents = x.dense_shape
    site_keys = _row_major_keys(indices[:, :rank - 1], extents)
    unique_keys, rows = tf.unique(site_keys, out_idx=tf.int32)
    order = tf.argsort(unique_keys)
    rank_of = tf.math.invert_permutation(order)
    rows = tf.gather(rank_of, rows)
    num_sites = tf.shape(unique_keys)[0]
    # A site tensor counts batch elements and channels in int32: larger ones are refused, not wrapped.
    channels = integer_tensor(extents[-1], tf.int32, "x's channel count (dense_shape[-1])", "from_channel_sparse")
    batch_size = integer_tensor(extents[0], tf.int32, "x's batch size (dense_shape[0])", "from_channel_sparse")
    # The (site, channel) pairs are unique (x is validated): an update writes each value as
    # it is, where scatter_nd's sum would flush a subnormal value to zero.
    features = tf.tensor_scatter_nd_update(tf.zeros(tf.stack([num_sites, channels]), x.values.dtype),
                                           tf.stack([rows, tf.cast(indices[:, -1], tf.int32)], 1), x.values)
    coords = _decode_row_major(tf.gather(unique_keys, order), extents, rank - 2)
    spatial = tf.cast(extents[1:-1], tf.int32)
    y = make_site_sparse(coords, features, spatial, batch_size, non_finite="allow")
    static = x.shape[1:-1] if x.shape.rank is not None else tf.TensorShape(None)
    return SiteSparseTensor(y.coords, y.features, y.spatial_shape, y.batch_size, {},
                            y.static_spatial_shape.merge_with(static) if static.rank is not None else
                            y.static_spatial_shape)
