"""The site-sparse tensor: active sites with integer coordinates and a feature row each.

coords [N, 1 + d] int32 holds the batch index and d spatial coordinates of every active
site; features [N, C] its feature row (the layout of spconv, MinkowskiEngine and
TorchSparse). The tensor carries the kernel maps built for it and its ancestors, keyed
like spconv's `indice_key`, so layers with the same geometry build a map once and an
inverse convolution finds the map of the strided convolution it undoes.

Both types are tf.experimental.ExtensionTypes: they pass through tf.function, tf.data
and SavedModel signatures like tensors.
"""
import collections.abc
import typing

import tensorflow as tf

from tf_sparseconv.geometry import MODES, ConvGeometry
from tf_sparseconv.inputs import finite_checks, integer_tensor, real_tensor


class KernelMap(tf.experimental.ExtensionType):
    """Which input site feeds which output site through which kernel offset.

    Offset q (row-major over the kernel dimensions) owns pairs offset_splits[q] ..
    offset_splits[q + 1] of (in_rows, out_rows). in_coords / out_coords are the sites
    on either side, so an inverse convolution can map back onto in_coords.

    A map is tied to the sites it was built from: a layer reading it from
    SiteSparseTensor.kernel_maps checks that its input sites (the inverse convolution:
    its output sites) are the tensor's, for free where they are the same tensors (as
    along the layers of a model; a submanifold map's out_coords are its in_coords), by
    comparing coordinates and spatial shapes otherwise (InvalidArgumentError where they
    differ, e.g. a map of other sites with the same count).

    trusted: the map came from the SiteKernelMap op (tf_sparseconv.kernel_map), or from
    SiteSubmanifoldNeighbours and SiteTablePairs (a layer's table map), so its rows are in range and no output row repeats within an offset, in either direction,
    and its pairs are those of its stated geometry; the convolutions then pass
    map_is_trusted and the GPU kernels skip the row checks and the NaN scan of the
    features, and with them a device-to-host round trip per call. A map built by hand
    keeps the default False: the op checks its rows on every call, and a layer reading it
    under an indice_key first checks that it is the map SiteKernelMap builds for its
    stated geometry over its input sites (InvalidArgumentError otherwise). Setting
    trusted on a map that breaks those rules is undefined behaviour on the GPU and wrong
    results on either device.

    neighbours / inverse_neighbours: the map's SiteNeighbourTable (output-major; see
    tf_sparseconv.site.kernel_map.neighbour_table), and that of the reversed map (for the
    inverse convolution), when built. The layers build them once per map stored under an
    indice_key, for half and bfloat16 features on a GPU, where the convolution then runs
    output-stationary from them; they change no value. A layer's submanifold map may be
    built as its table first (tf_sparseconv.site.kernel_map.table_map): its pairs are then
    made from the table where something reads them.
    """

    __name__ = "tf_sparseconv.KernelMap"

    in_rows: tf.Tensor
    out_rows: tf.Tensor
    offset_splits: tf.Tensor
    in_coords: tf.Tensor
    out_coords: tf.Tensor
    in_spatial_shape: tf.Tensor
    out_spatial_shape: tf.Tensor
    mode: str
    kernel_size: typing.Tuple[int, ...]
    strides: typing.Tuple[int, ...]
    padding: typing.Tuple[int, ...]
    dilation: typing.Tuple[int, ...]
    trusted: bool = False
    neighbours: typing.Optional[tf.Tensor] = None
    inverse_neighbours: typing.Optional[tf.Tensor] = None

    def __validate__(self):
        if self.mode not in MODES:
            raise ValueError(f"KernelMap mode must be one of {MODES}, got {self.mode!r}")

    @property
    def volume(self):
        """The number of kernel offsets K."""
        v = 1
        for k in self.kernel_size:
            v *= k
        return v

    @property
    def num_pairs(self):
        return tf.shape(self.in_rows)[0]

    def geometry(self):
        return ConvGeometry(self.mode, self.kernel_size, self.strides, self.padding, self.dilation)

    def with_tables(self, neighbours=None, inverse_neighbours=None):
        """This map with its neighbour tables set (None keeps the present one)."""
        fields = {name: getattr(self, name) for name in (
            "in_rows", "out_rows", "offset_splits", "in_coords", "out_coords", "in_spatial_shape",
            "out_spatial_shape", "mode", "kernel_size", "strides", "padding", "dilation", "trusted")}
        return KernelMap(**fields, neighbours=self.neighbours if neighbours is None else neighbours,
                         inverse_neighbours=self.inverse_neighbours if inverse_neighbours is None
                         else inverse_neighbours)


class SiteSparseTensor(tf.experimental.ExtensionType):
    """Active sites (coords [N, 1 + d] int32: batch, x1..xd) with features [N, C]."""

    __name__ = "tf_sparseconv.SiteSparseTensor"

    coords: tf.Tensor
    features: tf.Tensor
    spatial_shape: tf.Tensor
    batch_size: tf.Tensor
    kernel_maps: typing.Mapping[str, KernelMap] = {}
    # What is known of spatial_shape while tracing (Keras layers build from it).
    static_spatial_shape: tf.TensorShape = tf.TensorShape(None)

    def __validate__(self):
        if self.coords.dtype != tf.int32 or self.spatial_shape.dtype != tf.int32 or self.batch_size.dtype != tf.int32:
            raise TypeError("SiteSparseTensor coords, spatial_shape and batch_size must be int32, got "
                            f"{self.coords.dtype.name}, {self.spatial_shape.dtype.name} and "
                            f"{self.batch_size.dtype.name}")
        if not self.features.dtype.is_floating:
            raise TypeError(f"SiteSparseTensor features must be floating point, got {self.features.dtype.name}")
        for name, rank, layout in (("coords", 2, "[N, 1 + d]"), ("features", 2, "[N, C]"),
                                   ("spatial_shape", 1, "[d]"), ("batch_size", 0, "a scalar")):
            shape = getattr(self, name).shape
            if shape.rank is not None and shape.rank != rank:
                raise ValueError(f"SiteSparseTensor {name} must be {layout}, got shape {shape}")
        n_coords, n_features = self.coords.shape[0], self.features.shape[0]
        if n_coords is not None and n_features is not None and n_coords != n_features:
            raise ValueError(f"SiteSparseTensor has {n_coords} sites but {n_features} feature rows")
        d = self.spatial_shape.shape[0]
        if d is not None and self.coords.shape[1] is not None and self.coords.shape[1] != d + 1:
            raise ValueError(f"SiteSparseTensor coords must be [N, {d + 1}] for {d} spatial dimensions, "
                             f"got {self.coords.shape}")

    @classmethod
    def spec(cls, spatial_shape, channels, dtype=tf.float32):
        """TypeSpec for tf.function signatures (no cached kernel maps)."""
        spatial_shape = tf.TensorShape(spatial_shape)
        d = spatial_shape.rank
        return cls.Spec(coords=tf.TensorSpec([None, d + 1], tf.int32),
                        features=tf.TensorSpec([None, channels], dtype),
                        spatial_shape=tf.TensorSpec([d], tf.int32), batch_size=tf.TensorSpec([], tf.int32),
                        kernel_maps={}, static_spatial_shape=spatial_shape)

    @property
    def dtype(self):
        return self.features.dtype

    @property
    def spatial_rank(self):
        return self.coords.shape[1] - 1

    @property
    def channels(self):
        return self.features.shape[1]

    @property
    def num_sites(self):
        return tf.shape(self.coords)[0]

    @property
    def batch_index(self):
        return self.coords[:, 0]

    def with_features(self, features):
        """The same sites (and maps) with other feature rows, e.g. after a Keras layer."""
        return SiteSparseTensor(self.coords, features, self.spatial_shape, self.batch_size, self.kernel_maps,
                                self.static_spatial_shape)

    def with_map(self, key, kernel_map):
        maps = dict(self.kernel_maps)
        maps[key] = kernel_map
        return SiteSparseTensor(self.coords, self.features, self.spatial_shape, self.batch_size, maps,
                                self.static_spatial_shape)

    def without_maps(self):
        return SiteSparseTensor(self.coords, self.features, self.spatial_shape, self.batch_size, {},
                                self.static_spatial_shape)


def make_site_sparse(coords, features, spatial_shape, batch_size, kernel_maps=None, non_finite="raise"):
    """A SiteSparseTensor from tensors or arrays; the static spatial shape is taken from
    spatial_shape where it is known.

    coords, spatial_shape and batch_size must be integers within int32 (a float or
    complex value is TypeError, an integer outside the range ValueError or, in a graph,
    InvalidArgumentError: nothing is truncated or wrapped). features must be real
    (integers become float32; complex is TypeError) and finite: NaN or infinite features
    are InvalidArgumentError unless non_finite="allow" (tf_sparseconv.inputs states the
    policy). The sites themselves (in range, each once) are checked by the ops and
    helpers that read them, e.g. SiteKernelMap."""
    coords = integer_tensor(coords, tf.int32, "coords", "make_site_sparse")
    features = real_tensor(features, "features", "make_site_sparse")
    spatial_shape = integer_tensor(spatial_shape, tf.int32, "spatial_shape", "make_site_sparse")
    batch_size = integer_tensor(batch_size, tf.int32, "batch_size", "make_site_sparse")
    checks = finite_checks(features, non_finite, "features", "make_site_sparse")
    # Eager checks have run (and raised) already; the features stay the caller's tensor, so
    # a tape watching it sees the ops that use them.
    if checks and not tf.executing_eagerly():
        with tf.control_dependencies(checks):
            features = tf.identity(features)
    known = tf.get_static_value(spatial_shape)
    if known is not None and (known.ndim != 1 or (known < 1).any()):
        raise ValueError(f"make_site_sparse: spatial_shape must be a vector of extents >= 1, got {known.tolist()}")
    batch = tf.get_static_value(batch_size)
    if batch is not None and (batch.ndim != 0 or batch < 1):
        raise ValueError(f"make_site_sparse: batch_size must be a scalar >= 1, got {batch.tolist()}")
    if kernel_maps is not None and not (isinstance(kernel_maps, collections.abc.Mapping) and all(
            isinstance(k, str) and isinstance(m, KernelMap) for k, m in kernel_maps.items())):
        raise TypeError(f"make_site_sparse: kernel_maps must be a dict of indice_key (str) -> KernelMap, got "
                        f"{type(kernel_maps).__name__}")
    static = tf.TensorShape([int(v) for v in known]) if known is not None else \
        tf.TensorShape([None] * spatial_shape.shape[0]) if spatial_shape.shape[0] is not None else tf.TensorShape(None)
    return SiteSparseTensor(coords, features, spatial_shape, batch_size, dict(kernel_maps or {}), static)


def check_site_tensor(x, what):
    if not isinstance(x, SiteSparseTensor):
        raise TypeError(f"{what} expects a SiteSparseTensor, got {type(x).__name__}")
