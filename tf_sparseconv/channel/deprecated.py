"""The channel layers' names before issue 23 (tf_sparseconv 0.1), kept for one release:
they warn (DeprecationWarning) when built, and models saved with them load.

    SparseConv -> DirectSparseConv (spconv's SparseConv is the strided site convolution,
                  tf_sparseconv.keras_layers.SparseConv3D)
    accumulator= -> dataflow= ('merge' is 'sort'), of direct_conv and DirectSparseConv: it
                  warns in tf_sparseconv.channel.direct_conv.check_dataflow
"""
import warnings

import keras

from tf_sparseconv.channel.conv_layer import DirectSparseConv


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseConv(DirectSparseConv):
    """Deprecated: DirectSparseConv."""

    def __init__(self, *args, **kwargs):
        warnings.warn("tf_sparseconv: SparseConv is deprecated and will be removed; use DirectSparseConv (the name "
                      "SparseConv3D is spconv's strided site convolution)", DeprecationWarning, stacklevel=2)
        super().__init__(*args, **kwargs)
