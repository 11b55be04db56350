"""The debug switch of the library's input checks.

Tensors that enter from the user are checked by the op that first takes them; what a
library op computes from checked inputs (a forward call's output keys, the inputs its
gradient receives back) is not checked again, so that on the GPU those calls queue their
work without waiting for the device. TF_SPARSECONV_CHECK_EVERY_OP=1 in the environment,
set before a model is built or traced, makes every op check its inputs again (on the
GPU at the cost of one wait per call), for tests and for users chasing a bug.
"""
import os

CHECK_EVERY_OP_ENV = "TF_SPARSECONV_CHECK_EVERY_OP"


def check_every_op():
    """True where TF_SPARSECONV_CHECK_EVERY_OP is 1 (read when an op is added to a graph)."""
    value = os.environ.get(CHECK_EVERY_OP_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{CHECK_EVERY_OP_ENV} must be 0 or 1, got {value!r}")
    return value == "1"
