"""MNIST as sparse 2-D input (Hackel et al. §4.2): pixels v < 50 are set to 0, which leaves
the strokes (16% of the pixels of the training set; the paper quotes a density of 0.23); kept pixels carry v / 255.

Reads the .npz form (images uint8 [M, 28, 28], labels) or the standard idx files
(train-images-idx3-ubyte / train-labels-idx1-ubyte, t10k-* for test, optionally .gz).
"""
import gzip
import os

import numpy as np
import tensorflow as tf

from tf_sparseconv.channel.tensor import ChannelSparseTensor
from tf_sparseconv.data.npz import read_npz_arrays
from tf_sparseconv.layer_config import real

THRESHOLD = 50

# idx type byte -> big-endian element type
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path):
    """The array stored in an idx file (plain or .gz), checking the magic number and size."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:  # gzip reports corruption as OSError / EOFError
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path}: unreadable gzip stream ({e})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES or data[3] == 0:
        raise ValueError(f"{path}: bad idx magic number {data[:4].hex() or 'none'}, expected 0000<type><ndim> "
                         "(e.g. 00000803 for images, 00000801 for labels)")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise ValueError(f"{path}: truncated idx header ({ndim} dimensions announced)")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
    dtype = np.dtype(_IDX_TYPES[data[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    payload = len(data) - 4 - 4 * ndim
    if payload != expected:
        raise ValueError(f"{path}: idx shape {shape} needs {expected} data bytes, file has {payload}")
    return np.frombuffer(data, dtype, offset=4 + 4 * ndim).reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx(root, name):
    for candidate in (name, name + ".gz"):
        if os.path.isfile(os.path.join(root, candidate)):
            return os.path.join(root, candidate)
    raise FileNotFoundError(f"missing {os.path.join(root, name)!r}[.gz]; expected the MNIST idx files "
                            f"{IDX_FILES['train'] + IDX_FILES['test']} (optionally .gz) in {root!r}")


def load_mnist(path, split="train"):
    """(images uint8 [M, 28, 28], labels int64 [M]) from an .npz file or a folder of idx files."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if split not in IDX_FILES:
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        image_file, label_file = (_find_idx(path, name) for name in IDX_FILES[split])
        images, labels = read_idx(image_file), read_idx(label_file)
        source = f"{image_file} / {label_file}"
    elif os.path.isfile(path):
        arrays = read_npz_arrays(path, ("images", "labels"))
        images, labels = arrays["images"], arrays["labels"]
        source = path
    else:
        raise FileNotFoundError(f"MNIST path {path!r} does not exist; expected an .npz (images, labels) or a "
                                f"folder with {IDX_FILES[split if split in IDX_FILES else 'train']} (optionally .gz)")
    if images.ndim != 3 or images.dtype != np.uint8 or labels.shape != (len(images),):
        raise ValueError(f"{source}: expected uint8 images [M, H, W] and labels [M], got images {images.dtype} "
                         f"{images.shape} and labels {labels.shape}")
    if labels.dtype.kind not in "iu" or (len(labels) and (labels.min() < 0 or labels.max() > 9)):
        shown = f"{labels.min()}..{labels.max()}" if len(labels) and labels.dtype.kind in "iuf" else labels.dtype
        raise ValueError(f"{source}: labels must be the digits 0..9 (integers), got {shown}")
    return images, labels.astype(np.int64)


def image_arrays(images, threshold=THRESHOLD, dtype=np.float32):
    """NumPy (keys, values, dense_shape) of uint8 images [B, H, W] as a channel-sparse [B, H, W, 1].

    Pixels below `threshold` are dropped; the rest keep v / 255. With one channel the key
    b * H * W + lin(x) is the flat pixel index, so np.flatnonzero yields them sorted.
    """
    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"images must have shape [B, H, W], got {images.shape}")
    threshold = real(threshold, "threshold", "image_arrays", 0.0)  # NaN dropped every pixel
    flat = images.reshape(-1)
    keys = np.flatnonzero(flat >= threshold).astype(np.int64)
    values = flat[keys].astype(dtype) / np.dtype(dtype).type(255)
    return keys, values, np.array([*images.shape, 1], np.int64)


def images_to_channel_sparse(images, threshold=THRESHOLD, dtype=np.float32):
    """ChannelSparseTensor [B, H, W, 1] of thresholded images; see image_arrays."""
    keys, values, dense_shape = image_arrays(images, threshold, dtype)
    return ChannelSparseTensor(tf.constant(keys), tf.constant(values), tf.constant(dense_shape))

