"""ChannelSparseTensor as a TensorFlow extension type: properties, type checks, tf.function
signatures, tf.data pipelines and SavedModel round trips."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sparseconv as ts

SHAPES = [pytest.param([2, 9, 3], id="1d"), pytest.param([3, 4, 5, 2], id="2d"),
          pytest.param([2, 3, 4, 2, 4], id="3d"), pytest.param([2, 2, 3, 2, 3, 1], id="4d")]
SHAPE_2D = [2, 6, 5, 3]


def spec(dtype, rank):
    return ts.ChannelSparseTensor.spec([None] * rank, dtype)


def relu_pool_to_dense(x):
    pooled = ts.sparse_max_pool(ts.sparse_relu(x), [2, 3])
    return pooled, ts.to_dense(pooled)


@pytest.fixture
def assert_same_outputs(assert_same_channel_sparse):
    """check(actual, expected) for (pooled ChannelSparseTensor, dense) pairs of relu_pool_to_dense."""
    def check(actual, expected):
        (actual_pooled, actual_dense), (expected_pooled, expected_dense) = actual, expected
        assert_same_channel_sparse(actual_pooled, expected_pooled)
        np.testing.assert_array_equal(actual_dense.numpy(), expected_dense.numpy())
    return check


@pytest.mark.parametrize("shape", SHAPES)
def test_properties_describe_the_stored_entries(shape, fill, dtype, random_dense):
    dense = random_dense(shape, dtype=dtype, **fill)
    x = ts.from_dense(dense)
    n = np.count_nonzero(dense)
    assert x.dtype == dtype
    assert (x.rank, x.spatial_rank) == (len(shape), len(shape) - 2)
    assert x.num_entries.numpy() == n
    assert x.density().numpy() == pytest.approx(n / dense.size)
    assert x.memory_bytes().numpy() == n * (8 + np.dtype(dtype).itemsize)
    doubled = x.with_values(2 * x.values)
    np.testing.assert_array_equal(ts.to_dense(doubled).numpy(), 2 * dense)
    np.testing.assert_array_equal(doubled.keys.numpy(), x.keys.numpy())


@pytest.mark.parametrize("keys, values, dense_shape, error, message", [
    pytest.param(tf.constant([1], tf.int32), tf.constant([1.0]), tf.constant([1, 2, 1], tf.int64),
                 TypeError, "keys and dense_shape must be int64", id="int32-keys"),
    pytest.param(tf.constant([1], tf.int64), tf.constant([1.0]), tf.constant([1, 2, 1], tf.int32),
                 TypeError, "keys and dense_shape must be int64", id="int32-dense-shape"),
    pytest.param(tf.constant([1], tf.int64), tf.constant([1], tf.int32), tf.constant([1, 2, 1], tf.int64),
                 TypeError, "values must be float32 or float64", id="int32-values"),
    pytest.param(tf.constant([1], tf.int64), tf.constant([1.0], tf.float16), tf.constant([1, 2, 1], tf.int64),
                 TypeError, "values must be float32 or float64", id="float16-values"),
    pytest.param(tf.constant([0, 1], tf.int64), tf.constant([1.0]), tf.constant([1, 2, 1], tf.int64),
                 ValueError, "has 2 keys but 1 values", id="length-mismatch"),
    pytest.param(tf.constant([[0, 1]], tf.int64), tf.constant([1.0, 2.0]), tf.constant([1, 2, 1], tf.int64),
                 ValueError, r"keys must be a vector \(rank 1\), got shape \(1, 2\)", id="keys-rank-2"),
    pytest.param(tf.constant([0, 1], tf.int64), tf.constant([[1.0, 2.0]]), tf.constant([1, 2, 1], tf.int64),
                 ValueError, r"values must be a vector \(rank 1\), got shape \(1, 2\)", id="values-rank-2"),
    pytest.param(tf.constant([0], tf.int64), tf.constant([1.0]), tf.constant(3, tf.int64),
                 ValueError, r"dense_shape must be a vector \(rank 1\), got shape \(\)", id="dense-shape-scalar"),
])
def test_constructor_rejects_wrong_component_types(keys, values, dense_shape, error, message):
    with pytest.raises(error, match=message):
        ts.ChannelSparseTensor(keys, values, dense_shape)


def test_tf_function_with_spec_signature_matches_eager_and_traces_once(dtype, random_dense, assert_same_outputs):
    relu_pool = tf.function(relu_pool_to_dense, input_signature=[spec(dtype, len(SHAPE_2D))])
    for density in (0.0, 0.3, 1.0):  # different entry counts share one trace
        x = ts.from_dense(random_dense(SHAPE_2D, density, dtype))
        assert_same_outputs(relu_pool(x), relu_pool_to_dense(x))
    assert relu_pool.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("shape", SHAPES)
def test_dataset_map_from_dense_round_trips_every_element(shape, random_dense):
    denses = np.stack([random_dense(shape, density) for density in (0.3, 0.0, 1.0)]).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(denses).map(ts.from_dense)
    elements = list(dataset)
    assert len(elements) == len(denses)
    for element, dense in zip(elements, denses):
        assert isinstance(element, ts.ChannelSparseTensor)
        np.testing.assert_array_equal(ts.to_dense(element).numpy(), dense)


def test_dataset_from_tensors_yields_the_tensor_and_maps_sparse_ops(random_dense, assert_same_channel_sparse,
                                                                    assert_same_outputs):
    x = ts.from_dense(random_dense(SHAPE_2D, 0.4, np.float32))
    (element,) = list(tf.data.Dataset.from_tensors(x))
    assert_same_channel_sparse(element, x)
    (outputs,) = list(tf.data.Dataset.from_tensors(x).map(relu_pool_to_dense))
    assert_same_outputs(outputs, relu_pool_to_dense(x))


def test_saved_model_round_trip_gives_identical_outputs(tmp_path, dtype, random_dense, assert_same_outputs):
    module = tf.Module()
    module.relu_pool = tf.function(relu_pool_to_dense, input_signature=[spec(dtype, len(SHAPE_2D))])
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    for density in (0.0, 0.5):
        x = ts.from_dense(random_dense(SHAPE_2D, density, dtype, empty_batch=1))
        assert_same_outputs(loaded.relu_pool(x), module.relu_pool(x))
        assert_same_outputs(loaded.relu_pool(x), relu_pool_to_dense(x))
