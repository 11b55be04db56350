"""Networks of the site-sparse family, built from the site Keras layers.

- site_resnet: a ResNet-style classifier: a submanifold stem, residual blocks of
  submanifold 3^d convolutions (+ batch norm, ReLU) per level, stride-2 strided
  convolutions between levels, global pooling and a dense head.
- site_unet: a small MinkUNet-style segmentation network: per level submanifold
  convolutions (+ batch norm, ReLU), stride-2 strided convolutions down under indice_keys
  "down1", "down2", ..., SparseInverseConv up through the same keys, skip connections by
  feature concatenation at equal sites, a 1^d convolution to per-site logits.

Both take site inputs (site_input) or point clouds [B, N, d + F] (points=True, through
SiteVoxelize). Submanifold layers of one level share one kernel map ("subm<level>").

Under a tf.distribute strategy each replica holds its own sites; synchronized_bn=True makes
every batch norm compute its statistics over the sites of all replicas (sums and counts
all-reduced, so replicas holding different numbers of sites weigh each site alike), as one
device would over the global batch. The batch norms are FusedBatchNormalization (Keras'
layer computed by the library's row batch-norm ops; synchronized, by one all-reduce per
layer forward and one backward: site/batch_norm.py).
"""
import keras

from tf_sparseconv.inputs import count_arg
from tf_sparseconv.models.host_seed_dropout import HostSeedDropout
from tf_sparseconv.models.replicas import accept_per_replica_batches
from tf_sparseconv.site.batch_norm import FusedBatchNormalization
from tf_sparseconv.site.conv_layers import SPARSE_CONV, SPARSE_INVERSE_CONV, SUBM_CONV
from tf_sparseconv.site.keras_io import site_input
from tf_sparseconv.site.layers import SiteAdd, SiteConcat, SiteFeatures, SiteSelect, SiteToPoints, SiteVoxelize
from tf_sparseconv.site.pool_layers import SiteGlobalPool


def _check_args(what, num_classes, resolution, spatial_dims, in_channels, channels, points, point_features):
    """The spatial shape of the builder's arguments, after checking them: counts and extents
    are ints >= 1 (TypeError for a float or a bool, never truncated; ValueError below 1),
    channels a sequence, point_features given only with points=True."""
    count_arg(num_classes, "num_classes", what)
    count_arg(in_channels, "in_channels", what)
    if isinstance(resolution, (str, bytes)):
        raise TypeError(f"{what}: resolution must be an int or a sequence of ints, got {resolution!r}")
    if hasattr(resolution, "__iter__"):
        spatial_shape = tuple(count_arg(r, "resolution", what) for r in resolution)
        if spatial_dims is not None and count_arg(spatial_dims, "spatial_dims", what) != len(spatial_shape):
            raise ValueError(f"{what}: resolution {tuple(resolution)} has {len(spatial_shape)} axes but spatial_dims "
                             f"is {spatial_dims}; give one of them")
    else:
        spatial_dims = 3 if spatial_dims is None else spatial_dims
        spatial_shape = (count_arg(resolution, "resolution", what),) * count_arg(spatial_dims, "spatial_dims", what)
    if isinstance(channels, (str, bytes)) or not hasattr(channels, "__iter__"):
        raise TypeError(f"{what}: channels must be a sequence of channel counts, one per level, got {channels!r}")
    if count_arg(point_features, "point_features", what, minimum=0) and not points:
        raise ValueError(f"{what}: point_features={point_features} applies to point-cloud inputs: give points=True")
    return spatial_shape


def _inputs(spatial_shape, in_channels, points, point_features, bounds, return_point_map, name):
    """(model inputs, site dict, point_to_site or None)."""
    if points:
        inputs = keras.Input((None, len(spatial_shape) + point_features), name=f"{name}_points")
        out = SiteVoxelize(spatial_shape, bounds=bounds, return_point_map=return_point_map,
                           name=f"{name}_voxelize")(inputs)
        return (inputs, *out) if return_point_map else (inputs, out, None)
    inputs = site_input(spatial_shape, in_channels)
    return inputs, inputs, None


def bn_relu(h, name, relu=True, synchronized=False):
    h = SiteFeatures(FusedBatchNormalization(momentum=0.9, synchronized=synchronized), name=f"{name}_bn")(h)
    return SiteFeatures(keras.layers.ReLU(), name=f"{name}_relu")(h) if relu else h


def conv_bn_relu(h, conv, filters, kernel_size, name, relu=True, synchronized=False, **conv_kwargs):
    """conv (a layer class such as SubMConv3D) without bias, then batch norm and ReLU."""
    h = conv(filters, kernel_size, use_bias=False, name=name, **conv_kwargs)(h)
    return bn_relu(h, name, relu, synchronized)


def residual_block(h, filters, in_channels, key, name, rank, synchronized=False):
    """Two submanifold 3^d convolutions with batch norm around an identity shortcut (a
    1^d convolution where the channel count changes)."""
    shortcut = h
    subm = SUBM_CONV[rank]
    sync = dict(synchronized=synchronized)
    if in_channels != filters:
        shortcut = conv_bn_relu(h, subm, filters, 1, f"{name}_proj", relu=False, indice_key=f"{key}_1x1", **sync)
    h = conv_bn_relu(h, subm, filters, 3, f"{name}_conv1", indice_key=key, **sync)
    h = conv_bn_relu(h, subm, filters, 3, f"{name}_conv2", relu=False, indice_key=key, **sync)
    h = SiteAdd(name=f"{name}_add")([h, shortcut])
    return SiteFeatures(keras.layers.ReLU(), name=f"{name}_relu")(h)


def _inputs_and_stem(spatial_shape, channels, in_channels, points, point_features, bounds, point_map, name, sync):
    """Both networks' start: the check that every stride-2 level fits the spatial shape, the
    inputs, and the submanifold stem -> (inputs, stem output, point_to_site, rank)."""
    if any(r < 2 ** (len(channels) - 1) for r in spatial_shape):
        raise ValueError(f"spatial shape {spatial_shape} is too small for {len(channels) - 1} stride-2 levels")
    inputs, h, point_to_site = _inputs(spatial_shape, in_channels, points, point_features, bounds, point_map, name)
    rank = len(spatial_shape)
    h = conv_bn_relu(h, SUBM_CONV[rank], channels[0], 3, "stem", indice_key="subm0", **sync)
    return inputs, h, point_to_site, rank


def site_resnet(num_classes, resolution=16, spatial_dims=None, in_channels=1, channels=(16, 32, 64), blocks=1,
                points=False, point_features=0, bounds=(-1.0, 1.0), select_k=None, pool="max", dropout=0.3,
                synchronized_bn=False, name="site_resnet"):
    """A functional ResNet-style classifier -> logits [B, num_classes].

    resolution: int (spatial_dims axes, default 3) or a tuple (spatial_dims, if given, must
    be its length); channels: per level (level l > 0
    starts with a stride-2 strided convolution, "down<l>"); blocks: residual blocks per
    level; select_k: keep at most this many sites per example after the stem
    (SiteSelect, density-bounded sites); points=True: takes point clouds [B, N, d + F]
    mapped from bounds, else site_input(resolution, in_channels); synchronized_bn: batch
    norm over the sites of all replicas (module docstring).
    """
    spatial_shape = _check_args("site_resnet", num_classes, resolution, spatial_dims, in_channels, channels, points,
                                point_features)
    if not channels:
        raise ValueError("site_resnet needs at least one level (channels)")
    blocks = count_arg(blocks, "blocks", "site_resnet", minimum=0)
    if select_k is not None:
        select_k = count_arg(select_k, "select_k", "site_resnet")
    sync = dict(synchronized=synchronized_bn)
    inputs, h, _, rank = _inputs_and_stem(spatial_shape, channels, in_channels, points, point_features, bounds, False,
                                          name, sync)
    if select_k:
        h = SiteSelect(select_k, name="select")(h)
    width = channels[0]
    for level, filters in enumerate(channels):
        if level:
            h = conv_bn_relu(h, SPARSE_CONV[rank], filters, 2, f"down{level}", strides=2, indice_key=f"down{level}",
                             **sync)
            width = filters
        for b in range(blocks):
            h = residual_block(h, filters, width, f"subm{level}", f"level{level}_block{b + 1}", rank, **sync)
            width = filters
    h = SiteGlobalPool(pool, name="global_pool")(h)
    if dropout:
        h = HostSeedDropout(dropout)(h)
    outputs = keras.layers.Dense(num_classes, name="logits")(h)
    return accept_per_replica_batches(keras.Model(inputs, outputs, name=name))


def site_unet(num_classes, resolution=32, spatial_dims=None, in_channels=1, channels=(16, 32, 64), points=False,
              point_features=0, bounds=(-1.0, 1.0), synchronized_bn=False, name="site_unet"):
    """A functional MinkUNet-style segmentation network.

    Site inputs -> per-site logits [N, num_classes], one row per input site in input
    order; points=True -> per-point logits [B, N, num_classes] (zeros for dropped points).
    synchronized_bn: batch norm over the sites of all replicas (module docstring).
    """
    spatial_shape = _check_args("site_unet", num_classes, resolution, spatial_dims, in_channels, channels, points,
                                point_features)
    if len(channels) < 2:
        raise ValueError("site_unet needs at least two levels (channels)")
    sync = dict(synchronized=synchronized_bn)
    inputs, h, point_to_site, rank = _inputs_and_stem(spatial_shape, channels, in_channels, points, point_features,
                                                      bounds, True, name, sync)
    h = residual_block(h, channels[0], channels[0], "subm0", "enc0", rank, **sync)
    skips = [h]
    for level in range(1, len(channels)):
        h = conv_bn_relu(h, SPARSE_CONV[rank], channels[level], 2, f"down{level}", strides=2,
                         indice_key=f"down{level}", **sync)
        h = residual_block(h, channels[level], channels[level], f"subm{level}", f"enc{level}", rank, **sync)
        skips.append(h)
    for level in range(len(channels) - 1, 0, -1):
        h = SPARSE_INVERSE_CONV[rank](channels[level - 1], indice_key=f"down{level}", use_bias=False,
                                      name=f"up{level}")(h)
        h = bn_relu(h, f"up{level}", **sync)
        h = SiteConcat(name=f"skip{level - 1}")([h, skips[level - 1]])
        h = residual_block(h, channels[level - 1], 2 * channels[level - 1], f"subm{level - 1}", f"dec{level - 1}",
                           rank, **sync)
    h = SUBM_CONV[rank](num_classes, 1, indice_key="head", name="logits")(h)
    outputs = SiteToPoints(name="to_points")([h, point_to_site]) if points else h["features"]
    return accept_per_replica_batches(keras.Model(inputs, outputs, name=name))
