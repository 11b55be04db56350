"""OctNet3-style classifiers (Hackel et al., appendix Table 4; after Riegler et al.).

Blocks of three 3^d convolutions with 8, 16, 24, 32, 40, 48 channels, max-pooling by 2
between blocks. The first blocks are sparse, each with its density bound rho (the
paper's rho_x1, rho_x2, rho_x3); then sparseToDense, dense blocks down to 4^d, dropout
0.5, a 1024-unit layer and the classifier.

Kernels of the ReLU layers start from He initialisation (variance 2 / fan_in) by default:
with Keras' Glorot default the signal shrinks by about half per ReLU layer, and the deep
nets (64^3: 15 convolutions) do not train (docs/channel.md, "OctNet3").
"""
import math
import numbers

import keras

from tf_sparseconv.channel.conv_layer import DirectSparseConv
from tf_sparseconv.channel.direct_conv import SELECTION_MODES
from tf_sparseconv.channel.keras_io import sparse_input
from tf_sparseconv.channel.layers import SparseMaxPool, SparseToDense
from tf_sparseconv.inputs import count_arg
from tf_sparseconv.models.host_seed_dropout import HostSeedDropout
from tf_sparseconv.models.replicas import accept_per_replica_batches

BLOCK_CHANNELS = (8, 16, 24, 32, 40, 48)
# Table 4's default bounds for ModelNet40 (Figure 7, right) by resolution, and MNIST's
# OctNet3 (rho_22 = 2 rho_21; the paper's grid uses rho_21 in {0.035, 0.05, 0.075}).
DEFAULT_RHOS = {16: (1.0, 1.0), 32: (0.14, 0.33, 0.66), 64: (0.06, 0.14, 0.33), 128: (0.02, 0.06, 0.14),
                28: (0.05, 0.10)}


def _default_dense_blocks(resolution, sparse_blocks):
    # Table 4: 16^3 and MNIST (two sparse blocks) go straight to the classifier; deeper
    # nets continue with dense blocks until 4^d.
    if sparse_blocks < 3:
        return 0
    final = resolution // 2 ** (sparse_blocks - 1)
    return int(math.log2(final // 4)) if final >= 4 else 0


def octnet3(resolution, num_classes, rhos=None, spatial_dims=3, in_channels=1, selection="signed",
            density_regularizer=None, dense_blocks=None, dropout=0.5, fc_units=1024, kernel_initializer="he_normal",
            dataflow="auto", padded_convs="auto", padded_pools="auto", name=None):
    """A functional Keras model taking sparse_input((r,)*d + (in_channels,)) batches.

    kernel_initializer: of every ReLU layer (sparse and dense convolutions, the
    fc_units layer); the classifier keeps Glorot's.
    dataflow: of every DirectSparseConv ('auto', 'sort' or 'dense'; direct_conv).
    padded_convs, padded_pools: the convolutions' and the poolings' padded_output
    (DirectSparseConv, SparseMaxPool): "auto" (the default) pads them inside traced functions
    (fit, evaluate, predict) where TensorFlow sees a GPU, so that only the first convolution
    then waits for the device (it checks the user's keys); False keeps exact outputs.
    Built in a tf.distribute strategy's scope, it trains on per-replica sparse batches
    (models.replicas); the density bounds then hold per replica's batch, and Eq. 4 reads
    the density of the global batch."""
    resolution = count_arg(resolution, "resolution", "octnet3")
    num_classes = count_arg(num_classes, "num_classes", "octnet3")
    in_channels = count_arg(in_channels, "in_channels", "octnet3")
    spatial_dims = count_arg(spatial_dims, "spatial_dims", "octnet3")
    if spatial_dims > 4:
        raise ValueError(f"octnet3: spatial_dims must be 1 to 4 (the sparse convolutions' range), got {spatial_dims}")
    if selection not in SELECTION_MODES:
        raise ValueError(f"octnet3: selection must be one of {SELECTION_MODES}, got {selection!r}")
    if rhos is None and resolution not in DEFAULT_RHOS:
        raise ValueError(f"octnet3 has default density bounds (Table 4) for resolutions {sorted(DEFAULT_RHOS)}, "
                         f"got {resolution!r}: give rhos=(rho_1, ...) for another resolution")
    if rhos is not None and (isinstance(rhos, (str, bytes)) or not hasattr(rhos, "__iter__")):
        raise TypeError(f"octnet3: rhos must be a sequence of density bounds, one per sparse block, got {rhos!r}")
    rhos = tuple(rhos if rhos is not None else DEFAULT_RHOS[resolution])
    if not 1 <= len(rhos) <= len(BLOCK_CHANNELS):
        raise ValueError(f"need 1 to {len(BLOCK_CHANNELS)} sparse blocks, got {len(rhos)} rho values")
    for rho in rhos:
        # 1.0: the block is unbounded; NaN or above 1 would leave it unbounded silently
        if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not 0.0 < rho <= 1.0:
            raise ValueError(f"octnet3: every rho must be a number in (0, 1] (1: no bound), got rhos={rhos!r}")
    if resolution % 2 ** (len(rhos) - 1):
        raise ValueError(f"resolution {resolution} is not divisible by 2^{len(rhos) - 1} for {len(rhos)} blocks")
    final = resolution // 2 ** (len(rhos) - 1)
    if dense_blocks is None:
        dense_blocks = _default_dense_blocks(resolution, len(rhos))
    dense_blocks = count_arg(dense_blocks, "dense_blocks", "octnet3", minimum=0)
    if dense_blocks and spatial_dims not in (2, 3):
        raise ValueError(f"octnet3: dense blocks are 2-D or 3-D (Conv2D, Conv3D), got spatial_dims={spatial_dims} "
                         f"with dense_blocks={dense_blocks}; give dense_blocks=0")
    if final < 2 ** dense_blocks:
        raise ValueError(f"octnet3: {dense_blocks} dense blocks pool the {final}^d grid after the sparse blocks by "
                         f"2^{dense_blocks} = {2 ** dense_blocks}, more than its extent")
    if len(BLOCK_CHANNELS) < len(rhos) + dense_blocks:
        raise ValueError(f"octnet3: {len(rhos)} sparse and {dense_blocks} dense blocks are more than the "
                         f"{len(BLOCK_CHANNELS)} blocks of Table 4 ({BLOCK_CHANNELS} channels)")
    inputs = sparse_input((resolution,) * spatial_dims + (in_channels,))
    h = inputs
    for block, rho in enumerate(rhos):
        if block:
            h = SparseMaxPool(2, padded_output=padded_pools, name=f"pool{block}")(h)
        for i in range(3):
            bound = dict(rho_up=rho) if rho < 1.0 else {}
            h = DirectSparseConv(BLOCK_CHANNELS[block], 3, activation="relu", selection=selection if bound else None,
                           density_regularizer=density_regularizer if bound else None,
                           kernel_initializer=kernel_initializer, dataflow=dataflow, padded_output=padded_convs,
                           name=f"sparse_conv{block + 1}_{i + 1}", **bound)(h)
    h = SparseToDense(name="to_dense")(h)
    conv = keras.layers.Conv3D if spatial_dims == 3 else keras.layers.Conv2D
    pool = keras.layers.MaxPool3D if spatial_dims == 3 else keras.layers.MaxPool2D
    for block in range(len(rhos), len(rhos) + dense_blocks):
        h = pool(2, name=f"pool{block}")(h)
        for i in range(3):
            h = conv(BLOCK_CHANNELS[block], 3, padding="same", activation="relu", kernel_initializer=kernel_initializer,
                     name=f"conv{block + 1}_{i + 1}")(h)
    h = keras.layers.Flatten()(h)
    h = HostSeedDropout(dropout)(h)
    h = keras.layers.Dense(fc_units, activation="relu", kernel_initializer=kernel_initializer)(h)
    outputs = keras.layers.Dense(num_classes, name="logits")(h)
    return accept_per_replica_batches(keras.Model(inputs, outputs, name=name or f"octnet3_{resolution}"))
