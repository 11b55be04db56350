"""Surface normals estimated from the points alone, for clouds that come without them
(ModelNet40's point clouds, scans): each point's normal is the direction of least variance
of its k nearest neighbours (itself included; principal component analysis of their
covariance), turned to point away from the cloud's centroid.

The same function serves training (the normals of the training clouds, estimated once
when they are loaded and then turned with the augmentation) and the saved model
(PointCloudToSparse(estimate_normals=k) estimates them inside the graph, so a user gives
x, y, z only).

Distances are computed coordinate by coordinate in float64 (no |q|^2 + |p|^2 - 2 q.p
expansion, whose rounding would differ between devices and reorder near ties); ties
between equally distant neighbours go to the lower point index (tf.math.top_k).
Queries are taken in chunks of at most CHUNK_ELEMENTS query-point pairs, one chunk at a
time, so memory grows with the points of a cloud, not with their square.
"""
import numpy as np
import tensorflow as tf

NEIGHBOURS = 16
MIN_NEIGHBOURS, MAX_NEIGHBOURS = 3, 256
# Query-point pairs per chunk: each float64 [rows, N] temporary is at most 16 MiB.
CHUNK_ELEMENTS = 1 << 21


def check_neighbours(neighbours, what="estimate_normals"):
    """neighbours as an int in [MIN_NEIGHBOURS, MAX_NEIGHBOURS] (ValueError otherwise)."""
    if isinstance(neighbours, bool) or not isinstance(neighbours, (int, np.integer)) \
            or not MIN_NEIGHBOURS <= int(neighbours) <= MAX_NEIGHBOURS:
        raise ValueError(f"{what} takes the neighbours per point as an integer from {MIN_NEIGHBOURS} to "
                         f"{MAX_NEIGHBOURS} (a plane needs three points), got {neighbours!r}")
    return int(neighbours)


def chunk_rows(points_per_cloud):
    """Queries per chunk for clouds of points_per_cloud points (a Python int or a scalar tensor)."""
    if isinstance(points_per_cloud, (int, np.integer)):
        return max(1, min(int(points_per_cloud), CHUNK_ELEMENTS // max(int(points_per_cloud), 1)))
    n = tf.cast(points_per_cloud, tf.int32)
    return tf.maximum(1, tf.minimum(n, CHUNK_ELEMENTS // tf.maximum(n, 1)))


def estimate_normals(points, neighbours=NEIGHBOURS):
    """Point clouds [B, N, 3+] (columns beyond 3 ignored) -> unit normals [B, N, 3] float64.

    A cloud of fewer than `neighbours` points uses all of its points. Where the
    neighbours span no plane (all equal, or on one line) the direction is one of the
    degenerate eigenvectors, still of unit length. A normal at right angles to the
    direction from the centroid keeps the sign the eigen-solver gave it.
    """
    neighbours = check_neighbours(neighbours)
    xyz = tf.cast(tf.convert_to_tensor(points)[..., :3], tf.float64)
    shape = tf.shape(xyz)
    batch, n = shape[0], shape[1]
    k = tf.minimum(neighbours, n)
    rows = chunk_rows(n)
    chunks = (n + rows - 1) // rows
    centroids = tf.reduce_mean(xyz, axis=1)

    def chunk(j, normals):
        cloud, start = j // chunks, (j % chunks) * rows
        p = xyz[cloud]
        q = p[start:tf.minimum(start + rows, n)]
        d2 = tf.zeros([tf.shape(q)[0], n], tf.float64)
        for axis in range(3):
            d = q[:, axis, None] - p[None, :, axis]
            d2 += d * d
        _, nearest = tf.math.top_k(-d2, k)
        near = tf.gather(p, nearest)
        centred = near - tf.reduce_mean(near, axis=1, keepdims=True)
        covariance = tf.matmul(centred, centred, transpose_a=True)
        # On the host: TensorFlow's GPU kernel for eigh solves a batch one matrix at a time
        # (a cuSOLVER call each), its CPU kernel thousands of 3x3 matrices in microseconds each.
        with tf.device("/cpu:0"):
            _, vectors = tf.linalg.eigh(covariance)
        normal = vectors[:, :, 0]  # eigenvalues ascending: the direction of least variance
        away = tf.reduce_sum(normal * (q - centroids[cloud]), axis=1, keepdims=True)
        return j + 1, normals.write(j, tf.where(away < 0, -normal, normal))

    normals = tf.TensorArray(tf.float64, size=batch * chunks, infer_shape=False,
                             element_shape=tf.TensorShape([None, 3]))
    _, normals = tf.while_loop(lambda j, _: j < batch * chunks, chunk, [tf.constant(0), normals],
                               parallel_iterations=1)
    return tf.reshape(normals.concat(), [batch, n, 3])


def with_estimated_normals(clouds, neighbours=NEIGHBOURS, clouds_per_call=64, progress=None):
    """NumPy clouds [M, N, 3] -> [M, N, 6] float32: the points and their estimated normals
    (estimate_normals, clouds_per_call at a time). progress(done, total) is called after
    each call."""
    clouds = np.asarray(clouds)
    if clouds.ndim != 3 or clouds.shape[-1] != 3:
        raise ValueError(f"expected point clouds [M, N, 3], got shape {clouds.shape}")
    if len(clouds) == 0 or clouds.shape[1] == 0:
        raise ValueError(f"cannot estimate normals of {clouds.shape[0]} clouds of {clouds.shape[1]} points")
    fn = tf.function(lambda x: estimate_normals(x, neighbours), reduce_retracing=True)
    out = np.empty(clouds.shape[:2] + (6,), np.float32)
    out[..., :3] = clouds
    for start in range(0, len(clouds), clouds_per_call):
        part = out[start:start + clouds_per_call, :, :3]  # float32, as the saved model's layer gets them
        out[start:start + len(part), :, 3:] = fn(tf.constant(part)).numpy()
        if progress is not None:
            progress(start + len(part), len(clouds))
    return out
