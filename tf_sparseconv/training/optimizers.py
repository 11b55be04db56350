"""FusedAdam: Keras' Adam (and AdamW) with each variable's update in one TensorFlow kernel.

Keras 3's Adam builds about ten elementwise ops per variable and step (the bias-corrected
rate from two powers, the two moment updates, the step), and its decoupled weight decay
evaluates the learning-rate schedule once more per variable. On a GPU each op is a kernel
launch, so a small network's step is bound by launches: OctNet3's traced training step has
about 2,100 ops for 28 variables, most of them the optimizer's. FusedAdam computes the
step's scalars once per device and updates each variable with `ResourceApplyAdam`, one
kernel for m, v and the variable (TensorFlow's Adam kernel: the same formulas as Keras' Adam,
lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)), and decays a variable
by one multiply-subtract. What it cannot fuse it hands to Keras' Adam: amsgrad, sparse
(IndexedSlices) gradients, and dtypes without a TensorFlow Adam kernel.
"""
import math
import numbers

import keras
import tensorflow as tf

from tf_sparseconv.layer_config import flag, real

FUSED_DTYPES = (tf.float16, tf.float32, tf.float64)


def _scalar(value, dtype):
    """value (a Python number, tensor or variable) as a dtype scalar; a Python number goes
    straight to dtype (tf.cast would round it to float32 first)."""
    return tf.cast(value, dtype) if tf.is_tensor(value) or isinstance(value, (tf.Variable, keras.Variable)) \
        else tf.constant(value, dtype)


def _tf_variable(variable):
    """The tf.Variable behind a Keras variable (or the variable itself)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


@keras.saving.register_keras_serializable(package="tf_sparseconv")
class FusedAdam(keras.optimizers.Adam):
    """keras.optimizers.Adam (weight_decay: AdamW), same arguments, state and results
    within float rounding; each variable's step is one kernel (see the module's doc).
    Numbers among learning_rate, beta_1, beta_2, epsilon and weight_decay are checked here
    (Keras' Adam takes a beta of 1 or more, a negative epsilon or NaN and trains to NaN or
    away from the minimum), and amsgrad must be a bool (a string such as 'no' would be true)."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False,
                 weight_decay=None, **kwargs):
        what = "FusedAdam"
        for field, value, low, high in (("learning_rate", learning_rate, 0.0, None), ("beta_1", beta_1, 0.0, 1.0),
                                        ("beta_2", beta_2, 0.0, 1.0), ("epsilon", epsilon, 0.0, None),
                                        ("weight_decay", weight_decay, 0.0, None)):
            if tf.is_tensor(value) or isinstance(value, (tf.Variable, keras.Variable)):
                continue  # a tensor or variable: its value may change, as Keras allows
            if field == "learning_rate" and not isinstance(value, numbers.Number):
                continue  # a schedule or callable, which Keras checks
            if field == "weight_decay" and value is None:
                continue
            if not isinstance(value, numbers.Real):
                raise ValueError(f"{what}: {field} must be a number (or a tensor), got {value!r}")
            real(value, field, what, low, math.inf if high is None else high, low_open=field == "epsilon",
                 high_open=high is not None)
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                         amsgrad=flag(amsgrad, "amsgrad", what), weight_decay=weight_decay, **kwargs)

    def build(self, variables):
        if keras.backend.backend() != "tensorflow":
            raise ValueError(f"FusedAdam runs TensorFlow's Adam kernel; the Keras backend is "
                             f"{keras.backend.backend()!r}: use keras.optimizers.Adam")
        super().build(variables)

    def _fusable(self, gradient, variable):
        return (not self.amsgrad and not isinstance(gradient, tf.IndexedSlices)
                and variable.dtype in FUSED_DTYPES)

    def _step_scalars(self, cache, var, learning_rate):
        """(lr, beta_1^t, beta_2^t) in var's dtype, made once per device and dtype in a step."""
        key, dtype = (var.device, var.dtype), var.dtype
        if key not in cache:
            step = tf.cast(self.iterations + 1, dtype)
            cache[key] = (_scalar(learning_rate, dtype), tf.pow(_scalar(self.beta_1, dtype), step),
                          tf.pow(_scalar(self.beta_2, dtype), step))
        return cache[key]

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        cache = {}

        def apply(var, grad, learning_rate):
            if not self._fusable(grad, var):
                return self.update_step(grad, var, learning_rate)
            lr, beta_1_power, beta_2_power = self._step_scalars(cache, var, learning_rate)
            index = self._get_variable_index(var)
            m, v = _tf_variable(self._momentums[index]), _tf_variable(self._velocities[index])
            dtype = var.dtype
            return tf.raw_ops.ResourceApplyAdam(
                var=var.handle, m=m.handle, v=v.handle, beta1_power=beta_1_power, beta2_power=beta_2_power,
                lr=lr, beta1=_scalar(self.beta_1, dtype), beta2=_scalar(self.beta_2, dtype),
                epsilon=_scalar(self.epsilon, dtype), grad=tf.cast(grad, dtype))

        for grad, var in grads_and_vars:
            distribution.extended.update(var, apply, args=(grad, learning_rate), group=False)

    def _apply_weight_decay(self, variables):
        if self.weight_decay is None:
            return
        cache = {}

        def decay(variable):
            if not self._use_weight_decay(variable):
                return
            key = (variable.device, variable.dtype)
            if key not in cache:  # the schedule evaluated once per device, not per variable
                cache[key] = _scalar(self.learning_rate, variable.dtype) * _scalar(self.weight_decay, variable.dtype)
            variable.assign_sub(variable * cache[key])

        def distributed_decay(distribution, variables):
            for variable in variables:
                distribution.extended.update(_tf_variable(variable), decay, group=False)

        merge_call = tf.__internal__.distribute.interim.maybe_merge_call
        merge_call(distributed_decay, self._distribution_strategy, variables)
