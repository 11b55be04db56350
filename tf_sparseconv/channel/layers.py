"""The sparse layers around the convolution: ReLU, max-pooling, and the ways in and out
of the channel-sparse representation."""
import keras

from tf_sparseconv.channel.conversions import from_dense, to_dense
from tf_sparseconv.channel.keras_io import (CustomOpLayer, SparseLayer, as_keras_inputs, check_padded_output,
                                            from_keras_inputs, logical_shape, padded_now)
from tf_sparseconv.channel.max_pool import sparse_max_pool
from tf_sparseconv.channel.relu import sparse_relu
from tf_sparseconv.geometry import per_dim
from tf_sparseconv.layer_config import whole_or_wholes


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseReLU(SparseLayer):
    """Drops entries <= 0.

    padded_output: False (the output holds its kept entries only), True (padded, see
    sparse_relu: on the GPU the layer then does not wait for the device) or "auto" (padded
    inside a traced function, as in fit, evaluate and predict, where TensorFlow sees a GPU).
    A convolution's own activation="relu" does the same work inside the convolution.
    """

    def __init__(self, padded_output=False, **kwargs):
        super().__init__(**kwargs)
        self.padded_output = check_padded_output(padded_output, self.name)

    def sparse_call(self, x, training=None):
        return sparse_relu(x, padded_output=padded_now(self.padded_output))

    def get_config(self):
        return {**super().get_config(), "padded_output": self.padded_output}


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class SparseMaxPool(SparseLayer):
    """Max-pooling with window = stride (§3.3): [B, R..., C] -> [B, ceil(R/s)..., C].

    padded_output: False (the output holds its live entries only), True (padded, see
    sparse_max_pool: on the GPU the layer then does not wait for the device; the library's
    layers that follow skip the padding) or "auto" (padded inside a traced function, as in
    fit, evaluate and predict, where TensorFlow sees a GPU). Not the default: the layers after
    a padded pooling work over its capacity; after exact convolutions a ModelNet40 32^3 epoch
    ran 3 % slower with it, after padded ones (octnet3's default) faster (docs/benchmarks.md).
    A model whose output is this layer's dict hands the padding back with it.
    """

    def __init__(self, pool_size=2, padded_output=False, **kwargs):
        super().__init__(**kwargs)
        self.pool_size = whole_or_wholes(pool_size, "pool_size", self.name)
        self.padded_output = check_padded_output(padded_output, self.name)

    def build(self, input_shape):
        d = logical_shape(input_shape).rank - 2
        self.strides = list(per_dim(self.pool_size, d, "pool_size", what=self.name))

    def sparse_call(self, x, training=None):
        return sparse_max_pool(x, self.strides, padded_output=padded_now(self.padded_output))

    def get_config(self):
        return {**super().get_config(), "pool_size": self.pool_size, "padded_output": self.padded_output}


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
