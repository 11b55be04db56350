"""Loads the compiled op library, refusing a TensorFlow it was not built against.

The ops are registered under the namespace "TfSparseconv>" (e.g. TfSparseconv>SiteSparseConv,
the name graphs and SavedModels show); `ops` offers their Python wrappers without the
namespace's prefix (ops.site_sparse_conv), and OP_NAMESPACE + "SiteSparseConv" is the name
to give tf.RegisterGradient.

A library built against another TensorFlow version or C++ ABI fails with undefined
symbols or, worse, loads and corrupts memory; both are turned into an ImportError that
says what to rebuild.
"""
import functools
import os

import tensorflow as tf

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_PATH = os.path.join(_HERE, "_tf_sparseconv_ops.so")
_REBUILD = (
    "Rebuild the op library against the TensorFlow in this environment: "
    "`pip install --no-build-isolation -e .` (or `python setup.py build_ext --inplace`) "
    "from the tf_sparseconv source tree."
)


def _installed_abi():
    for flag in tf.sysconfig.get_compile_flags():
        if flag.startswith("-D_GLIBCXX_USE_CXX11_ABI="):
            return flag.split("=", 1)[1]
    return "?"


def load():
    if not os.path.exists(_LIBRARY_PATH):
        raise ImportError(f"tf_sparseconv's op library is not built ({_LIBRARY_PATH} is missing). {_REBUILD}")
    try:
        from tf_sparseconv import _build_info
    except ImportError:
        raise ImportError(f"tf_sparseconv/_build_info.py is missing, so the op library's build is unknown. {_REBUILD}")
    if _build_info.TF_VERSION != tf.__version__ or _build_info.CXX11_ABI != _installed_abi():
        raise ImportError(
            f"tf_sparseconv was built against TensorFlow {_build_info.TF_VERSION} "
            f"(_GLIBCXX_USE_CXX11_ABI={_build_info.CXX11_ABI}) but TensorFlow {tf.__version__} "
            f"(_GLIBCXX_USE_CXX11_ABI={_installed_abi()}) is installed. {_REBUILD}"
        )
    try:
        return tf.load_op_library(_LIBRARY_PATH)
    except tf.errors.NotFoundError as e:
        raise ImportError(f"tf_sparseconv's op library does not load with TensorFlow {tf.__version__}: "
                          f"{e.message.splitlines()[0]}. {_REBUILD}") from None


OP_NAMESPACE = "TfSparseconv>"
_WRAPPER_PREFIX = "tf_sparseconv_"  # TensorFlow's Python name of the namespace


# List inputs added to an op after its first release, as (position, name): graphs saved
# before load them as empty lists (their type attrs default to []), and the wrappers below
# default them to empty too, so that calls written before them keep working.
_LATER_LIST_INPUTS = {"site_sparse_conv": (7, "epilogue")}


def _with_empty_list_input(wrapper, position, name):
    @functools.wraps(wrapper)
    def call(*args, **kwargs):
        if len(args) <= position and name not in kwargs:
            kwargs[name] = []
        return wrapper(*args, **kwargs)
    return call


class _Ops:
    """The library's op wrappers, named without the namespace's prefix."""

    def __init__(self, library):
        for name in dir(library):
            if not name.startswith("_"):
                short = name[len(_WRAPPER_PREFIX):] if name.startswith(_WRAPPER_PREFIX) else name
                wrapper = getattr(library, name)
                if short in _LATER_LIST_INPUTS:
                    wrapper = _with_empty_list_input(wrapper, *_LATER_LIST_INPUTS[short])
                setattr(self, short, wrapper)


ops = _Ops(load())
