"""Whole site-sparse networks for benchmarks/site_e2e_gpu.py, in NumPy only, so that our
TensorFlow process and the spconv (PyTorch) process build the same network with the same
weights on the same sites.

A network is a list of steps over named tensors, each a tuple:

    ("conv", out, in, kind, cin, cout, kernel, key)  kind: 'subm' (sites kept), 'down'
                                                     (stride 2, level + 1) or 'inv' (back
                                                     onto the sites of the 'down' of key)
    ("bn", out, in, channels)                        batch norm (eps BN_EPS)
    ("relu", out, in)
    ("add", out, a, b)                               feature sum at equal sites
    ("concat", out, a, b)                            features of a, then of b

The input tensor is "x", the output the last step's. Convolutions of one key share one
kernel map, as spconv's indice_key and our layers' indice_key do; no convolution has a bias.

Networks (issue 24's result names):
- unet5: the end-to-end chain of site_scenes (CHAIN: three submanifold levels of 64, 128
  and 256 channels, two stride-2 convolutions down and two inverse convolutions up, seven
  convolutions on five kernel maps) with the weights of site_conv_gpu.py's chain.
- resunet42: a SparseResUNet42-style network (TorchSparse's layout): a stem of two
  submanifold 3^3 convolutions (32), four encoder stages (a 2^3 stride-2 convolution, then
  two residual blocks; 32, 64, 128, 256 channels) and four decoder stages (a 2^3 inverse
  convolution, the encoder's features concatenated, two residual blocks; 256, 128, 96, 96),
  batch norm after every convolution, a residual block's projection a 1^3 submanifold
  convolution where the channel count changes; 49 convolutions on 14 kernel maps (five
  3^3 and five 1^3 submanifold, four strided).
"""
import numpy as np

from site_scenes import CHAIN, LAYERS, layer_weights, level_features, voxelize

BN_EPS = 1e-3
# The training loss of both sides: the mean over output sites of s_i * (y_i . u), where
# s_i = ((b, x, y, z)_i . SITE_HASH mod 2^20) / 2^20 - 0.5 is computed from the site's
# coordinates (so it needs no common row order) and u is loss_channel_weights(). A loss of
# the plain squares of batch-normalised outputs would be nearly invariant to every weight
# before the last batch norm, leaving gradients of rounding noise to compare.
SITE_HASH = (7919, 104729, 1299709, 15485863)
SITE_HASH_MOD = 1 << 20
IN_CHANNELS = {"unet5": 64, "resunet42": 4}
LEVELS = {"unet5": 2, "resunet42": 4}  # stride-2 levels: the spatial shape must divide by 2^levels


def unet5():
    spec = {name: (kind, cin, cout, k, key, li) for li, (name, kind, _, cin, cout, k, _, key) in enumerate(LAYERS)}
    steps, src = [], "x"
    for i, name in enumerate(CHAIN):
        kind, cin, cout, k, key, _ = spec[name]
        steps.append(("conv", f"c{i}", src, kind, cin, cout, k, key))
        src = f"c{i}"
    return steps


def _residual(steps, src, cin, cout, key, name):
    """Two submanifold 3^3 convolutions with batch norm around a shortcut -> output name."""
    shortcut = src
    if cin != cout:
        steps += [("conv", f"{name}_proj", src, "subm", cin, cout, 1, f"{key}_1x1"),
                  ("bn", f"{name}_proj_bn", f"{name}_proj", cout)]
        shortcut = f"{name}_proj_bn"
    steps += [("conv", f"{name}_c1", src, "subm", cin, cout, 3, key), ("bn", f"{name}_b1", f"{name}_c1", cout),
              ("relu", f"{name}_r1", f"{name}_b1"),
              ("conv", f"{name}_c2", f"{name}_r1", "subm", cout, cout, 3, key),
              ("bn", f"{name}_b2", f"{name}_c2", cout),
              ("add", f"{name}_add", f"{name}_b2", shortcut), ("relu", name, f"{name}_add")]
    return name


def _conv_bn_relu(steps, src, kind, cin, cout, k, key, name):
    steps += [("conv", f"{name}_conv", src, kind, cin, cout, k, key), ("bn", f"{name}_bn", f"{name}_conv", cout),
              ("relu", name, f"{name}_bn")]
    return name


def resunet42(in_channels=IN_CHANNELS["resunet42"], stem=32, encoder=(32, 64, 128, 256), decoder=(256, 128, 96, 96)):
    steps = []
    h = _conv_bn_relu(steps, "x", "subm", in_channels, stem, 3, "subm0", "stem1")
    h = _conv_bn_relu(steps, h, "subm", stem, stem, 3, "subm0", "stem2")
    skips, width = [(h, stem)], stem
    for level, c in enumerate(encoder, 1):
        h = _conv_bn_relu(steps, h, "down", width, width, 2, f"down{level}", f"enc{level}_down")
        h = _residual(steps, h, width, c, f"subm{level}", f"enc{level}_res1")
        h = _residual(steps, h, c, c, f"subm{level}", f"enc{level}_res2")
        width = c
        skips.append((h, c))
    for i, c in enumerate(decoder):
        level = len(encoder) - i
        h = _conv_bn_relu(steps, h, "inv", width, c, 2, f"down{level}", f"dec{level}_up")
        skip, skip_c = skips[level - 1]
        steps.append(("concat", f"dec{level}_cat", h, skip))
        h = _residual(steps, f"dec{level}_cat", c + skip_c, c, f"subm{level - 1}", f"dec{level}_res1")
        h = _residual(steps, h, c, c, f"subm{level - 1}", f"dec{level}_res2")
        width = c
    return steps


NETWORKS = {"unet5": unet5, "resunet42": resunet42}


def conv_kinds(steps):
    """{convolution step: its kind ('subm', 'down' or 'inv')}."""
    return {s[1]: s[3] for s in steps if s[0] == "conv"}


def sorted_rows(coords, features, rows=None):
    """(coords, features) in coordinate order, the first `rows` of them (None: all): rows of
    two implementations compare whatever order each keeps its sites in."""
    order = np.lexsort(coords.T[::-1])[:rows]
    return coords[order], features[order]


def relative(got, want):
    """Largest absolute difference relative to the largest magnitude of want."""
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def loss_channel_weights(channels):
    return np.random.default_rng(12).standard_normal(channels).astype(np.float32)


def site_scores(coords):
    """s_i of the training loss for coords [N, 4] (NumPy; both sides compute the same in-graph)."""
    h = (coords.astype(np.int64) * np.array(SITE_HASH, np.int64)).sum(1) % SITE_HASH_MOD
    return (h / SITE_HASH_MOD - 0.5).astype(np.float32)


def network(name):
    return NETWORKS[name]()


def conv_weights(name, steps):
    """{conv step name: [k, k, k, Cin, Cout] float32}, the same in both processes: unet5's
    are site_conv_gpu.py's chain weights; resunet42's He-normal from a seed per layer."""
    out = {}
    if name == "unet5":
        index = {n: li for li, (n, *_) in enumerate(LAYERS)}
        for (op, out_name, _, kind, cin, cout, k, _), layer in zip(steps, CHAIN):
            out[out_name] = layer_weights(cin, cout, k, seed=2000 + index[layer])
        return out
    for i, step in enumerate(s for s in steps if s[0] == "conv"):
        _, out_name, _, _, cin, cout, k, _ = step
        rng = np.random.default_rng(7000 + i)
        out[out_name] = (rng.standard_normal((k, k, k, cin, cout)) * np.sqrt(2.0 / (k ** 3 * cin))).astype(np.float32)
    return out


def scene(net, batch, lidar_path, tiny=False):
    """(coords [N, 4] int32 sorted by (batch, x, y, z), spatial shape [3] int32, features
    [N, C] float32) for network `net`: the LiDAR frame at 5 cm, `batch` copies (odd copies
    mirrored in x, so that the copies differ), the spatial shape a multiple of 2^levels;
    tiny: a small random scene instead (tests on the CPU)."""
    if tiny:
        rng = np.random.default_rng(5)
        cells = np.unique(rng.integers(0, 16, (300, 3)), axis=0)
        coords = np.concatenate([np.concatenate([np.full((len(cells), 1), b), cells], 1) for b in range(batch)])
    else:
        pc = np.load(lidar_path)["pc"]
        parts = []
        for b in range(batch):
            p = pc.copy()
            if b % 2:
                p[:, 0] = -p[:, 0]
            parts.append(voxelize(p, 0.05, b))
        coords = np.concatenate(parts)
    coords = coords[np.lexsort(coords.T[::-1])].astype(np.int32)
    step = 2 ** LEVELS[net]
    spatial = ((coords[:, 1:].max(0) + 1 + step - 1) // step * step).astype(np.int32)
    if net == "unet5":
        features = level_features(len(coords), IN_CHANNELS[net], seed=1000 + [n for n, *_ in LAYERS].index(CHAIN[0]))
    else:
        features = np.random.default_rng(11).standard_normal((len(coords), IN_CHANNELS[net])).astype(np.float32)
    return coords, spatial, features
