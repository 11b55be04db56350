"""The sparse layers around the convolution: ReLU, max-pooling, and the ways in and out
of the channel-sparse representation."""
import keras

from tf_sparseconv.channel.conversions import from_dense, to_dense
from tf_sparseconv.channel.keras_io import (CustomOpLayer, SparseLayer, as_keras_inputs, from_keras_inputs,
                                            logical_shape)
from tf_sparseconv.channel.max_pool import sparse_max_pool
from tf_sparseconv.channel.relu import sparse_relu
from tf_sparseconv.geometry import per_dim
from tf_sparseconv.layer_config import whole_or_wholes


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseReLU(SparseLayer):
    """Drops entries <= 0."""

    def sparse_call(self, x, training=None):
        return sparse_relu(x)


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseMaxPool(SparseLayer):
    """Max-pooling with window = stride (§3.3): [B, R..., C] -> [B, ceil(R/s)..., C]."""

    def __init__(self, pool_size=2, **kwargs):
        super().__init__(**kwargs)
        self.pool_size = whole_or_wholes(pool_size, "pool_size", self.name)

    def build(self, input_shape):
        d = logical_shape(input_shape).rank - 2
        self.strides = list(per_dim(self.pool_size, d, "pool_size", what=self.name))

    def sparse_call(self, x, training=None):
        return sparse_max_pool(x, self.strides)

    def get_config(self):
        return {**super().get_config(), "pool_size": self.pool_size}


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseToDense(CustomOpLayer):
    """The channel-sparse batch as a dense [B, R1, ..., Rd, C] tensor (zeros elsewhere)."""

    def call(self, inputs):
        return to_dense(from_keras_inputs(inputs))

    def compute_output_shape(self, input_shape):
        return tuple(logical_shape(input_shape).as_list())


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class DenseToSparse(CustomOpLayer):
    """A dense batch [B, R1, ..., Rd, C] (e.g. occupancy grids) -> its non-zero entries."""

    def call(self, inputs):
        return as_keras_inputs(from_dense(inputs))