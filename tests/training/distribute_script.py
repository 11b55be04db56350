"""Trains small models of both families on one device and under tf.distribute, for
tests/training/test_distribute.py, which starts it in a fresh process: logical devices
must be configured, and MultiWorkerMirroredStrategy created, before TensorFlow
initialises. Writes what the test compares into --out:

  python distribute_script.py mirrored --out DIR  2 logical CPUs: DIR/single.npz (on one of them),
                                                  DIR/mirrored.npz (on both), DIR/checks.json
  python distribute_script.py worker --out DIR    a MultiWorkerMirroredStrategy task (TF_CONFIG):
                                                  DIR/worker<task>.npz
  python distribute_script.py train -- ARGS...    `tf-sparseconv train ARGS` with 2 logical CPUs

Every run trains the same models on the same global batches (16 synthetic shapes at 8^3,
global batch 8, 2 epochs of 2 steps): an OctNet3 with k-selection and Eq. 4 through
model.fit, the same OctNet3 with Eq. 4's per-channel density through a custom loop
(strategy.run), a site ResNet with batch norm (synchronized under a strategy) through
model.fit, and a site UNet labelling every site with its shape's class through a custom
loop that averages over the sites of all replicas. Dropout is off, so one device and R
replicas must end with the same weights.
"""
import argparse
import json
import os
import sys

MODES = ("mirrored", "worker", "train")
RESOLUTION, GLOBAL_BATCH, EPOCHS, EXAMPLES = 8, 8, 2, 16


def configure(mode):
    import tensorflow as tf
    if mode in ("mirrored", "train"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    if mode == "worker":
        # the trainer's strategy, each gradient in an all-reduce of its own (packed is what
        # the trainer test of test_distribute.py runs)
        from tf_sparseconv.training.distribute import make_strategy
        return make_strategy("multi-worker", "ring", "per-gradient")
    return None


def data():
    from tf_sparseconv import data as datasets
    clouds, labels, _ = datasets.make_shapes(num_per_class=2, seed=0)
    return clouds[:EXAMPLES], labels[:EXAMPLES]


def batches(family, split=None):
    """The global batches, or one input pipeline's replica batches with split."""
    import tensorflow as tf

    from tf_sparseconv import data as datasets
    from tf_sparseconv.training.train import keras_batches, site_keras_batches
    clouds, labels = data()
    dataset = datasets.point_cloud_dataset(clouds, labels, RESOLUTION, GLOBAL_BATCH, seed=3, drop_remainder=True,
                                           split=split)
    if family == "unet":  # per-site labels: the class of the site's shape
        return site_keras_batches(dataset).map(lambda x, y: (x, tf.gather(y, x["coords"][:, 0])))
    return (site_keras_batches if family == "site" else keras_batches)(dataset)


def feed(strategy, family):
    """(dataset, fit arguments): the global batches on one device, per-replica batches
    under a strategy; repeated in both, so both draw epoch e's order from the e-th pass of
    the shuffle (Keras starts an unused pass between epochs of a dataset it re-iterates)."""
    from tf_sparseconv.training.distribute import per_replica_dataset, steps_per_epoch
    steps = {"steps_per_epoch": steps_per_epoch(EXAMPLES, GLOBAL_BATCH, drop_remainder=True)}
    if strategy is None:
        return batches(family).repeat(), steps
    return per_replica_dataset(strategy, lambda split: batches(family, split)), steps


def build(family, synchronized_bn=False, density="layer"):
    import keras

    from tf_sparseconv.models import octnet3, site_resnet, site_unet
    from tf_sparseconv.training import DensityRegularizer
    keras.utils.set_random_seed(0)
    if family == "unet":
        return site_unet(8, RESOLUTION, channels=(8, 16), synchronized_bn=synchronized_bn)
    if family == "site":
        model = site_resnet(8, RESOLUTION, channels=(8, 16), dropout=0.0, pool="mean", synchronized_bn=synchronized_bn)
    else:
        # rho 0.1 and 0.3: k-selection cuts in every sparse layer of these shapes
        model = octnet3(RESOLUTION, 8, (0.1, 0.3), dropout=0.0, fc_units=32,
                        density_regularizer=DensityRegularizer(1.0, density=density))
    return model


def weights(model):
    return [w.numpy() for w in model.weights]


def fit(strategy, family):
    import keras
    import tensorflow as tf
    with (strategy or tf.distribute.get_strategy()).scope():
        model = build(family, synchronized_bn=strategy is not None)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    dataset, steps = feed(strategy, family)
    # Keras' averages of the step logs over the workers: the strategy.reduce calls on tensors (those
    # on variables read the metrics' sums and counts, at the epochs' ends)
    reduced = []
    counting = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if counting:
        reduce = strategy.reduce
        strategy.reduce = lambda *args, **kwargs: reduced.append(
            not isinstance(args[1], tf.Variable)) or reduce(*args, **kwargs)
    try:
        history = model.fit(dataset, epochs=EPOCHS, verbose=0, **steps).history
    finally:
        if counting:
            del strategy.reduce  # the class's method again
    return model, history, sum(reduced)


def train_loop(strategy, family, replica_loss, **build_args):
    """SGD with momentum on replica_loss(model, cross_entropy, x, y) through strategy.run (or
    directly on one device); (model, the step losses summed over the replicas)."""
    import keras
    import tensorflow as tf
    dataset, _ = feed(strategy, family)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model = build(family, **build_args)
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
        optimizer.build(model.trainable_variables)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = replica_loss(model, cross_entropy, x, y)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def step(iterator):
        return strategy.reduce("SUM", strategy.run(replica_step, args=next(iterator)), axis=None)

    iterator = iter(dataset)
    losses = [float(step(iterator)) for _ in range(EPOCHS * EXAMPLES // GLOBAL_BATCH)]
    # the elements of each all-reduce of the step: its gradients one by one, or in one pack
    graph = step.get_concrete_function(iterator).graph
    sizes = [op.inputs[0].shape.num_elements() for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    variables = [int(v.shape.num_elements()) for v in model.trainable_variables]
    return model, losses, {"largest_all_reduce": max(sizes, default=0), "largest_variable": max(variables),
                           "variable_elements": sum(variables)}


def custom_loop(strategy):
    """Eq. 4 with per-channel densities, trained by strategy.run (or directly on one device)."""
    import tensorflow as tf

    def replica_loss(model, cross_entropy, x, y):
        logits = model(x, training=True)
        loss = tf.nn.compute_average_loss(cross_entropy(y, logits), global_batch_size=GLOBAL_BATCH)
        return loss + tf.nn.scale_regularization_loss(tf.add_n(model.losses))

    return train_loop(strategy, "channel", replica_loss, density="channel")


def unet_loop(strategy):
    """The site UNet's per-site cross-entropy averaged over the sites of all replicas (each
    replica divides its sum by the all-reduced site count), trained by strategy.run."""
    import tensorflow as tf

    def replica_loss(model, cross_entropy, x, y):
        sites = tf.distribute.get_replica_context().all_reduce("SUM", tf.cast(tf.size(y), tf.float32))
        return tf.reduce_sum(cross_entropy(y, model(x, training=True))) / sites

    return train_loop(strategy, "unet", replica_loss, synchronized_bn=strategy is not None)


def run_all(strategy):
    """{name: weights} and {name: losses} of the four trainings."""
    results, losses, log_reductions, all_reduces = {}, {}, {}, {}
    for family in ("channel", "site"):
        model, history, reductions = fit(strategy, family)
        results[f"fit_{family}"] = weights(model)
        losses[f"fit_{family}"] = history["loss"]
        log_reductions[f"fit_{family}"] = {"reductions": reductions, "logs": sorted(history)}
    for name, loop in (("loop_channel", custom_loop), ("loop_unet", unet_loop)):
        model, loop_losses, all_reduces[name] = loop(strategy)
        results[name] = weights(model)
        losses[name] = loop_losses
    return results, losses, log_reductions, all_reduces


def save(path, results, losses, log_reductions, all_reduces):
    import numpy as np
    arrays = {f"{name}/{i}": w for name, ws in results.items() for i, w in enumerate(ws)}
    np.savez(path, losses=json.dumps(losses), log_reductions=json.dumps(log_reductions),
             all_reduces=json.dumps(all_reduces), **arrays)


def pruning_checks(strategy):
    """Masks, warnings and kernels of every replica after warning-shot pruning epochs."""
    import keras
    import numpy as np

    from tf_sparseconv.training import WarningShotPruning, sparse_conv_layers
    with strategy.scope():
        model = build("channel")
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    dataset, steps = feed(strategy, "channel")
    pruning = WarningShotPruning(epsilon=0.05)
    model.fit(dataset, epochs=3, verbose=0, callbacks=[pruning], **steps)
    checks = {"pruned": sum(row["pruned"] for row in pruning.history), "replicas_equal": True, "replicas": 0}
    for layer in sparse_conv_layers(model):
        for variable in (layer.mask, layer.warned, layer.kernel):
            copies = [v.numpy() for v in strategy.experimental_local_results(variable.value)]
            checks["replicas"] = len(copies)
            checks["replicas_equal"] &= all(np.array_equal(copies[0], c) for c in copies[1:])
    return checks


def batch_norm_checks(strategy):
    """Synchronized batch norms over replicas holding 5 and 11 sites against one over all 16:
    Keras' own and the library's FusedBatchNormalization (one all-reduce forward, one in its
    gradient): outputs, moving statistics, and the gradients of x (each replica's rows),
    gamma and beta (summed over the replicas); then, for the library's, rows around 1000
    whose variance E[x^2] - E[x]^2 in float32 would lose to cancellation, once the moving
    mean it shifts by is near theirs."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tf_sparseconv.site.batch_norm import FusedBatchNormalization
    rng = np.random.default_rng(0)
    upstream = rng.normal(0.0, 1.0, (16, 4)).astype(np.float32)
    slices = (slice(0, 5), slice(5, 16))

    def synchronized_call(layer, rows):
        @tf.function
        def step():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            x, dy = (tf.switch_case(replica, [lambda a=a[s]: tf.constant(a) for s in slices]) for a in (rows, upstream))
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(tf.cast(y, tf.float32) * dy)
            return (y, *tape.gradient(loss, [x, layer.gamma, layer.beta]))

        results = [strategy.experimental_local_results(t) for t in strategy.run(step)]
        y, dx = (np.concatenate([t.numpy() for t in results[i]]) for i in (0, 1))
        return y, dx, *(sum(t.numpy() for t in results[i]) for i in (2, 3))

    def collectives_per_replica(layer, rows):
        """The all-reduces a replica's forward and backward pass of the layer wait for."""
        def step():
            x = tf.constant(rows[:5])
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(tf.square(layer(x, training=True)))
            return tape.gradient(loss, x)

        graph = tf.function(lambda: strategy.run(step)).get_concrete_function().graph
        kinds = ("CollectiveReduceV2", "NcclAllReduce", "CollectiveReduce")
        return sum(op.type in kinds for op in graph.get_operations()) // strategy.num_replicas_in_sync

    def one_device(rows):
        layer = keras.layers.BatchNormalization(momentum=0.0)
        x = tf.constant(rows)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * upstream)
        return (y.numpy(), *(g.numpy() for g in tape.gradient(loss, [x, layer.gamma, layer.beta])))

    rows = rng.normal(2.0, 3.0, (16, 4)).astype(np.float32)
    expected = one_device(rows)
    checks = {}
    for name, layer_class in (("keras", keras.layers.BatchNormalization), ("fused", FusedBatchNormalization)):
        with strategy.scope():
            synced = layer_class(momentum=0.0, synchronized=True)
            synced.build((None, 4))
        actual = synchronized_call(synced, rows)
        checks[name] = {
            "outputs_close": bool(np.allclose(actual[0], expected[0], atol=1e-4)),
            "gradients_close": all(bool(np.allclose(a, e, atol=1e-4)) for a, e in zip(actual[1:], expected[1:])),
            "mean_close": bool(np.allclose(synced.moving_mean.numpy(), rows.mean(0), atol=1e-5)),
            "variance_close": bool(np.allclose(synced.moving_variance.numpy(), rows.var(0), rtol=1e-4)),
            "collectives_per_replica": collectives_per_replica(synced, rows)}
    far = rng.normal(1000.0, 1.0, (16, 4)).astype(np.float32)
    with strategy.scope():
        synced = FusedBatchNormalization(momentum=0.0, synchronized=True)
        synced.build((None, 4))
    synchronized_call(synced, far)  # the moving mean is now near the rows' mean
    synchronized_call(synced, far)
    truth = far.astype(np.float64).var(0)
    checks["fused_far_from_zero"] = {"variance_close": bool(np.allclose(synced.moving_variance.numpy(), truth,
                                                                        rtol=1e-4))}
    # float16 rows (mixed precision) against float64 arithmetic on the same rows
    half = rows.astype(np.float16)
    with strategy.scope():
        synced = FusedBatchNormalization(momentum=0.0, synchronized=True, dtype="mixed_float16")
        synced.build((None, 4))
    actual = synchronized_call(synced, half)
    x = half.astype(np.float64)
    inv_std = 1.0 / np.sqrt(x.var(0) + synced.epsilon)
    xhat, dy = (x - x.mean(0)) * inv_std, upstream.astype(np.float64)
    dx = inv_std * (dy - dy.mean(0) - xhat * (dy * xhat).mean(0))
    checks["fused_float16"] = {
        "outputs_close": actual[0].dtype == np.float16 and bool(np.allclose(actual[0], xhat, atol=4e-3)),
        # dy reaches the layer in float16 (y's type): its rounding bounds gamma's and beta's sums
        "gradients_close": bool(np.allclose(actual[1], dx, atol=4e-3) and np.allclose(actual[2], (dy * xhat).sum(0),
                                                                                     atol=1e-2)
                                and np.allclose(actual[3], dy.sum(0), atol=1e-2))}
    return checks


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--out")
    parser.add_argument("train_args", nargs="*")
    args = parser.parse_args(argv)
    strategy = configure(args.mode)
    if args.mode == "train":
        from tf_sparseconv.training import train
        train.main(args.train_args)
        return 0
    import tf_sparseconv  # noqa: F401  registers the layers
    trained = run_all(strategy)
    if args.mode == "mirrored":
        save(os.path.join(args.out, "single.npz"), *run_all(None))
        save(os.path.join(args.out, "mirrored.npz"), *trained)
        checks = {"pruning": pruning_checks(strategy), "batch_norm": batch_norm_checks(strategy),
                  "replicas": strategy.num_replicas_in_sync}
        with open(os.path.join(args.out, "checks.json"), "w") as f:
            json.dump(checks, f)
    else:
        task = strategy.cluster_resolver.task_id
        save(os.path.join(args.out, f"worker{task}.npz"), *trained)
    return 0


if __name__ == "__main__":
    sys.exit(main())
