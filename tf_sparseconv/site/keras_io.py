"""How a site-sparse tensor travels through Keras.

Keras layers take tensors or nested structures of tensors, not extension types, so
between Keras layers a SiteSparseTensor is the dict

    {"coords": [N, 1 + d] int32, "features": [N, C], "spatial_shape": [d] int32,
     "batch_size": [B, 0] int32, "shape_token": [0, R1, ..., Rd] int32,
     "maps": {indice_key: {"in_rows", "out_rows", "offset_splits", "in_coords", "out_coords",
                           "in_spatial_shape", "out_spatial_shape", "geometry"
                           [, "neighbours", "inverse_neighbours"]}}}

"maps" is left out while there are no cached kernel maps. The zero-element tokens cost
nothing at run time; their shapes carry what Keras must know:

- batch_size [B, 0]: the batch size B as its first dimension. Keras' fit and evaluate
  count the examples of a batch by the first dimension of the first entry of the
  inputs (sorted by key: "batch_size"), so the loss and metrics are averaged per
  example as for dense inputs; a scalar is accepted too.
- shape_token [0, R1, ..., Rd]: the static spatial shape.
- geometry [0, mode, k1..kd, s1..sd, p1..pd, l1..ld, I1..Id]: the map's static geometry
  (mode: 0 submanifold, 1 strided, 2 transposed, plus 3 for a map built by the
  SiteKernelMap op, KernelMap.trusted; kernel size, strides, padding, dilation) and the
  static spatial shape I of the sites the map starts from (0 where unknown), so a
  SiteInverseConv finds the strided layer's map by indice_key, checks its geometry when
  it builds, and knows the static shape it maps back onto.

A map's neighbour tables (KernelMap.neighbours, .inverse_neighbours) travel with it
when built, so the layers sharing a map build them once.

Because the maps are ordinary entries of the dict, they flow through functional
models (skip connections included), subclassed models, tf.function and SavedModels.
"""
import keras
import tensorflow as tf

from tf_sparseconv.geometry import MODES, ConvGeometry
from tf_sparseconv.layer_config import FLOATS, MAX_EXTENT, dtype_policy, whole
from tf_sparseconv.site.tensor import KernelMap, SiteSparseTensor

FIELDS = ("coords", "features", "spatial_shape", "batch_size", "shape_token")
MAP_FIELDS = ("in_rows", "out_rows", "offset_splits", "in_coords", "out_coords", "in_spatial_shape",
              "out_spatial_shape", "geometry")
MAP_TABLES = ("neighbours", "inverse_neighbours")  # optional


def _spatial_static_of(tensor, rank):
    """The static value of a spatial-shape tensor, or None per dimension."""
    known = tf.get_static_value(tensor) if not isinstance(tensor, keras.KerasTensor) else None
    return tuple(int(v) for v in known) if known is not None else (None,) * rank


def geometry_token(kernel_map, in_static_shape=None):
    """The zero-element int32 token whose static shape encodes kernel_map's geometry and
    the static spatial shape of its input sites (in_static_shape; 0 where unknown)."""
    d = len(kernel_map.kernel_size)
    in_static = tuple(in_static_shape) if in_static_shape is not None else _spatial_static_of(
        kernel_map.in_spatial_shape, d)
    if len(in_static) != d:
        in_static = (None,) * d
    mode = MODES.index(kernel_map.mode) + (len(MODES) if kernel_map.trusted else 0)
    dims = [mode, *kernel_map.kernel_size, *kernel_map.strides, *kernel_map.padding,
            *kernel_map.dilation, *(0 if v is None else int(v) for v in in_static)]
    return tf.zeros([0, *dims], tf.int32)


def decode_geometry(token_shape):
    """(geometry, in_static_shape) from a geometry token's static shape, where geometry =
    (mode, kernel_size, strides, padding, dilation) as KernelMap.geometry() gives it."""
    dims = tuple(token_shape)[1:]
    if not dims or (len(dims) - 1) % 5 or any(v is None for v in dims):
        raise ValueError(f"not a kernel-map geometry token: shape {tuple(token_shape)}")
    d = (len(dims) - 1) // 5
    if not 0 <= int(dims[0]) < 2 * len(MODES):
        raise ValueError(f"not a kernel-map geometry token: shape {tuple(token_shape)}")
    mode = MODES[int(dims[0]) % len(MODES)]
    parts = [tuple(int(v) for v in dims[1 + i * d:1 + (i + 1) * d]) for i in range(5)]
    in_static = tuple(v if v > 0 else None for v in parts[4])
    return ConvGeometry(mode, *parts[:4]), in_static


def token_is_trusted(token_shape):
    """Whether a geometry token (its static shape) carries a KernelMap.trusted map."""
    return int(tuple(token_shape)[1]) >= len(MODES)


def map_geometries(inputs):
    """{indice_key: (geometry, in_static_shape)} of the maps a site dict (or its dict of
    shapes, as build() receives it) carries."""
    maps = inputs.get("maps", {}) if isinstance(inputs, dict) else {}
    out = {}
    for key, fields in maps.items():
        token = fields["geometry"]
        out[key] = decode_geometry(token if isinstance(token, (tuple, list)) else tuple(token.shape))
    return out


def _map_fields(m, in_static_shape=None):
    fields = {"in_rows": m.in_rows, "out_rows": m.out_rows, "offset_splits": m.offset_splits, "in_coords": m.in_coords,
              "out_coords": m.out_coords, "in_spatial_shape": m.in_spatial_shape,
              "out_spatial_shape": m.out_spatial_shape, "geometry": geometry_token(m, in_static_shape)}
    fields.update({name: getattr(m, name) for name in MAP_TABLES if getattr(m, name) is not None})
    return fields


def as_site_keras_inputs(x, map_in_shapes=None, reuse_batch_size=(), reuse_shape_token=()):
    """SiteSparseTensor -> the dict Keras layers and models take (use in tf.data .map).

    map_in_shapes: optional {indice_key: static spatial shape of the map's input sites},
    for maps whose in_spatial_shape is not a constant. (reuse_*: tokens of an input to
    pass on, used by the layers.)
    """
    if not isinstance(x, SiteSparseTensor):
        raise TypeError(f"expected a SiteSparseTensor, got {type(x).__name__}")
    static = x.static_spatial_shape
    if static.rank is None or not static.is_fully_defined():
        raise ValueError(f"the static spatial shape {static} must be known to enter a Keras model; build the "
                         "tensor with a constant spatial_shape (make_site_sparse(coords, features, (R1, ..., Rd), "
                         "batch_size)) or give SiteSparseTensor its static_spatial_shape")
    out = {"coords": x.coords, "features": x.features, "spatial_shape": x.spatial_shape,
           "batch_size": reuse_batch_size[0] if reuse_batch_size else tf.zeros(tf.stack([x.batch_size, 0]), tf.int32),
           "shape_token": reuse_shape_token[0] if reuse_shape_token else tf.zeros([0, *static.as_list()], tf.int32)}
    if x.kernel_maps:
        map_in_shapes = map_in_shapes or {}
        out["maps"] = {key: _map_fields(m, map_in_shapes.get(key)) for key, m in x.kernel_maps.items()}
    return out


def _is_site_dict(inputs):
    return isinstance(inputs, dict) and set(FIELDS) <= set(inputs) and set(inputs) <= set(FIELDS) | {"maps"}


def from_site_keras_inputs(inputs):
    """The dict of as_site_keras_inputs (or a SiteSparseTensor) -> SiteSparseTensor."""
    if isinstance(inputs, SiteSparseTensor):
        return inputs
    if not _is_site_dict(inputs):
        got = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
        raise TypeError("site Keras layers take the dict {coords, features, spatial_shape, batch_size, shape_token"
                        "[, maps]} made by tf_sparseconv.keras_layers.as_site_keras_inputs, site_input or "
                        f"SiteVoxelize; got {got}")
    static = tf.TensorShape(inputs["shape_token"].shape[1:])
    maps = {}
    for key, fields in inputs.get("maps", {}).items():
        missing = set(MAP_FIELDS) - set(fields)
        if missing:
            raise TypeError(f"the kernel map under indice_key {key!r} lacks {sorted(missing)}")
        (mode, kernel_size, strides, padding, dilation), _ = decode_geometry(tuple(fields["geometry"].shape))
        maps[key] = KernelMap(fields["in_rows"], fields["out_rows"], fields["offset_splits"], fields["in_coords"],
                              fields["out_coords"], fields["in_spatial_shape"], fields["out_spatial_shape"], mode,
                              kernel_size, strides, padding, dilation,
                              trusted=token_is_trusted(fields["geometry"].shape),
                              **{name: fields[name] for name in MAP_TABLES if name in fields})
    batch_size = inputs["batch_size"]
    if batch_size.shape.rank != 0:
        batch_size = tf.shape(batch_size, out_type=tf.int32)[0]
    return SiteSparseTensor(inputs["coords"], inputs["features"], inputs["spatial_shape"], batch_size, maps, static)


def site_input(spatial_shape, channels, dtype="float32", name=None):
    """keras.Input dict for site-sparse batches of static spatial shape (R1, ..., Rd) and
    `channels` features per site (no cached maps: the layers build them)."""
    extents = () if isinstance(spatial_shape, (str, bytes)) or not hasattr(spatial_shape, "__len__") \
        else tuple(spatial_shape)
    if not 1 <= len(extents) <= 4:
        raise ValueError(f"spatial_shape must be 1 to 4 extents >= 1, got {spatial_shape!r}")
    spatial_shape = tuple(whole(s, "spatial_shape entry", "site_input", 1, MAX_EXTENT) for s in extents)
    d = len(spatial_shape)
    channels = whole(channels, "channels", "site_input")
    if keras.backend.standardize_dtype(dtype) not in FLOATS:
        raise ValueError(f"site_input: dtype must be one of {FLOATS}, got {dtype!r}")
    prefix = f"{name}_" if name else ""
    return {"coords": keras.Input(batch_shape=(None, d + 1), dtype="int32", name=prefix + "coords"),
            "features": keras.Input(batch_shape=(None, channels), dtype=dtype, name=prefix + "features"),
            "spatial_shape": keras.Input(batch_shape=(d,), dtype="int32", name=prefix + "spatial_shape"),
            "batch_size": keras.Input(batch_shape=(None, 0), dtype="int32", name=prefix + "batch_size"),
            "shape_token": keras.Input(batch_shape=(0, *spatial_shape), dtype="int32", name=prefix + "shape_token")}


def site_shapes(input_shape, what="site layer"):
    """(static spatial shape tuple, channels) from the dict of shapes build() receives."""
    if isinstance(input_shape, dict) and "shape_token" in input_shape and "features" in input_shape:
        return tuple(input_shape["shape_token"][1:]), input_shape["features"][-1]
    raise TypeError(f"{what} takes the site dict made by as_site_keras_inputs / site_input / SiteVoxelize; "
                    f"got shapes {input_shape}")


class SiteLayer(keras.layers.Layer):
    """Base of the site layers: site dict in, site dict out; custom ops XLA cannot compile.

    Subclasses define site_call(SiteSparseTensor, training) -> SiteSparseTensor. Maps the
    input carried keep their tokens; a map new in the output was built from this layer's
    input sites, whose static shape its token records.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        dtype_policy(self, FLOATS)
        # The ops are TensorFlow custom ops: tell Keras not to jit_compile models using them.
        self.supports_jit = False

    def call(self, inputs, training=None):
        x = from_site_keras_inputs(inputs)
        y = self.site_call(x, training=training)
        return site_dict_from(y, [(inputs, x)])

    def site_call(self, x, training=None):
        raise NotImplementedError


def site_dict_from(y, sources):
    """as_site_keras_inputs(y) for the output y of a layer whose inputs were the
    (input dict, SiteSparseTensor) pairs `sources`: what y shares with an input (the batch
    size, the static shape, a carried map) keeps that input's tensors and tokens; a map
    new in y was built from the first input's sites, whose static shape its token gets."""
    if not isinstance(y, SiteSparseTensor):
        raise TypeError(f"expected a SiteSparseTensor, got {type(y).__name__}")
    first_dict, first = sources[0]
    static = y.static_spatial_shape
    out = as_site_keras_inputs(y.without_maps(), reuse_batch_size=[
        raw["batch_size"] for raw, x in sources if x.batch_size is y.batch_size][:1], reuse_shape_token=[
        raw["shape_token"] for raw, x in sources if x.static_spatial_shape == static and static.is_fully_defined()][:1])
    if y.kernel_maps:
        maps = {}
        new_in_shape = tuple(first.static_spatial_shape.as_list()) if first.static_spatial_shape.rank else None
        for key, m in y.kernel_maps.items():
            carried = [raw["maps"][key] for raw, x in sources if x.kernel_maps.get(key) is m]
            maps[key] = carried[0] if carried else _map_fields(m, new_in_shape)
        out["maps"] = maps
    return out
