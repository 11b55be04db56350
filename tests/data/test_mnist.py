"""idx parsing (plain and .gz, magic and size checks), the thresholded channel-sparse images,
the loaders' errors, and the real MNIST .npz."""
import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

import tf_sparseconv as ts
from tf_sparseconv.data.mnist import image_arrays, images_to_channel_sparse, load_mnist, read_idx

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def idx_bytes(array, type_code=0x08):
    big_endian = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[type_code]
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.asarray(array, big_endian).tobytes()


def write_idx_folder(folder, images, labels, gz=False, prefix="train"):
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
        data = idx_bytes(array)
        if gz:
            (folder / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


@pytest.fixture
def digits(rng):
    return rng.integers(0, 256, (5, 28, 28), dtype=np.uint8), rng.integers(0, 10, 5).astype(np.uint8)


def test_read_idx_types_and_gzip(tmp_path, rng):
    values = rng.integers(-1000, 1000, (3, 4)).astype(np.int32)
    (tmp_path / "a").write_bytes(idx_bytes(values, 0x0C))
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), values)
    floats = rng.normal(size=(2, 2, 2)).astype(np.float32)
    (tmp_path / "b.gz").write_bytes(gzip.compress(idx_bytes(floats, 0x0D)))
    np.testing.assert_array_equal(read_idx(tmp_path / "b.gz"), floats)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_load_mnist_idx_folder(tmp_path, digits, gz):
    images, labels = digits
    write_idx_folder(tmp_path, images, labels, gz)
    write_idx_folder(tmp_path, images[:2], labels[:2], gz, prefix="t10k")
    loaded_images, loaded_labels = load_mnist(tmp_path)
    np.testing.assert_array_equal(loaded_images, images)
    np.testing.assert_array_equal(loaded_labels, labels)
    assert loaded_labels.dtype == np.int64
    assert len(load_mnist(tmp_path, "test")[0]) == 2


def test_load_mnist_npz(tmp_path, digits):
    images, labels = digits
    np.savez(tmp_path / "m.npz", images=images, labels=labels)
    loaded_images, loaded_labels = load_mnist(tmp_path / "m.npz")
    np.testing.assert_array_equal(loaded_images, images)
    np.testing.assert_array_equal(loaded_labels, labels)


@pytest.mark.parametrize("labels, message", [
    ([3, 12, 0], r"labels must be the digits 0\.\.9 \(integers\), got 0\.\.12"),
    ([3, -1, 0], r"labels must be the digits 0\.\.9 \(integers\), got -1\.\.3"),
    ([3.0, 1.5, 0.0], r"labels must be the digits 0\.\.9 \(integers\), got 0\.0\.\.3\.0"),
])
def test_labels_that_are_not_digits_are_refused(tmp_path, digits, labels, message):
    np.savez(tmp_path / "m.npz", images=digits[0][:3], labels=np.array(labels))
    with pytest.raises(ValueError, match="m.npz: " + message):
        load_mnist(tmp_path / "m.npz")


@pytest.mark.parametrize("data, message", [
    (b"\x00\x00\x08", "bad idx magic number 000008"),
    (b"\x08\x03\x00\x00" + b"\x00" * 16, "bad idx magic number 08030000"),
    (b"\x00\x00\x07\x01" + struct.pack(">I", 2) + b"\x00\x00", "bad idx magic number 00000701"),
    (b"\x00\x00\x08\x03" + struct.pack(">I", 2), r"truncated idx header \(3 dimensions"),
    (b"\x00\x00\x08\x03" + struct.pack(">3I", 2, 2, 2) + b"\x00" * 7,
     r"idx shape \(2, 2, 2\) needs 8 data bytes, file has 7"),
])
def test_corrupt_idx_names_file_and_problem(tmp_path, data, message):
    (tmp_path / "bad-idx").write_bytes(data)
    with pytest.raises(ValueError, match="bad-idx: " + message):
        read_idx(tmp_path / "bad-idx")


def test_corrupt_gzip_and_missing_files(tmp_path, digits):
    (tmp_path / "x.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match="x.gz: unreadable gzip stream"):
        read_idx(tmp_path / "x.gz")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mnist(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.*expected the MNIST idx files"):
        load_mnist(tmp_path)
    images, labels = digits
    write_idx_folder(tmp_path, images, labels[:3])
    with pytest.raises(ValueError, match="train-images-idx3-ubyte / .*expected uint8 images"):
        load_mnist(tmp_path)
    np.savez(tmp_path / "wrong.npz", x=images)
    with pytest.raises(ValueError, match=r"wrong.npz: missing arrays.*found \['x'\]"):
        load_mnist(tmp_path / "wrong.npz")


def test_threshold_and_channel_sparse_layout(digits):
    images, _ = digits
    x = images_to_channel_sparse(images)
    ts.validate(x)
    assert x.dense_shape.numpy().tolist() == [5, 28, 28, 1]
    expected = np.where(images >= 50, images / 255.0, 0.0).astype(np.float32)[..., None]
    np.testing.assert_array_equal(ts.to_dense(x).numpy(), expected)
    np.testing.assert_array_equal(x.keys.numpy(), ts.from_dense(expected).keys.numpy())
    keys, values, _ = image_arrays(np.array([[[49, 50], [0, 255]]], np.uint8))
    assert keys.tolist() == [1, 3] and values.tolist() == [np.float32(50 / 255), 1.0]


@pytest.mark.skipif(not (DATA / "mnist_train.npz").exists(), reason="../shared/data not available")
def test_real_mnist():
    images, labels = load_mnist(DATA / "mnist_train.npz")
    assert images.shape == (60000, 28, 28) and labels.min() == 0 and labels.max() == 9
    x = images_to_channel_sparse(images[:1000])
    ts.validate(x)
    density = float(x.density())
    assert 0.1 < density < 0.25, density  # strokes only


@pytest.mark.parametrize("threshold", [float("nan"), "a", -1])
def test_image_arrays_refuses_a_threshold_that_is_not_a_number_in_range(threshold):
    # NaN dropped every pixel, a str failed in a NumPy ufunc
    with pytest.raises(ValueError, match=r"image_arrays: threshold must be >= 0 \(a finite number\)"):
        image_arrays(np.full((1, 3, 3), 200, np.uint8), threshold)
