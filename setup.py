"""Builds the tf_sparseconv op library against the TensorFlow installed in this environment.

    pip install --no-build-isolation -e .      # or: python setup.py build_ext --inplace

The op library is a plain shared object loaded with tf.load_op_library, compiled with
TensorFlow's own flags (tf.sysconfig: include path, C++ ABI flag, C++ standard) and
linked against libtensorflow_framework. The TensorFlow version and ABI used are written
to tf_sparseconv/_build_info.py so that import can refuse a mismatched TensorFlow with
a message that says what to rebuild.
"""
import glob
import os
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
OP_LIBRARY = "tf_sparseconv._tf_sparseconv_ops"


def _tensorflow_flags():
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - build-time guard
        sys.exit(
            "tf_sparseconv builds against the installed TensorFlow, but it cannot be "
            f"imported ({e}). Install tensorflow-cpu==2.21.* (or tensorflow) first and "
            "build with --no-build-isolation."
        )
    return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


def _compile_sources_in_parallel(compiler):
    """distutils compiles one source at a time; the op sources are independent."""
    from concurrent.futures import ThreadPoolExecutor

    serial_compile = compiler.compile

    def compile_all(sources, *args, **kwargs):
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = pool.map(lambda src: serial_compile([src], *args, **kwargs), sources)
            return [obj for objs in objects for obj in objs]

    compiler.compile = compile_all


class BuildTensorFlowOps(build_ext):
    """Compiles cc_ops/*.cc with TensorFlow's flags and records the build's TensorFlow."""

    def build_extensions(self):
        version, compile_flags, link_flags = _tensorflow_flags()
        abi = next((f.split("=")[1] for f in compile_flags if "_GLIBCXX_USE_CXX11_ABI" in f), "?")
        # setuptools compiles C++ with the C compiler driver; -std from TF's flags wins.
        self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a != "-Wstrict-prototypes"]
        for ext in self.extensions:
            ext.extra_compile_args = compile_flags + ["-O3", "-fPIC", "-Wall", "-Wno-sign-compare",
                                                      "-Wno-unused-function", "-Wno-deprecated-declarations"]
            ext.extra_link_args = link_flags
        _compile_sources_in_parallel(self.compiler)
        super().build_extensions()
        # Beside the library in every place it lands: the source tree (in-place and
        # editable builds) and the build directory that a wheel is packed from.
        for package_dir in {os.path.join(HERE, "tf_sparseconv"), os.path.join(self.build_lib, "tf_sparseconv")}:
            os.makedirs(package_dir, exist_ok=True)
            with open(os.path.join(package_dir, "_build_info.py"), "w") as f:
                f.write("# Written by setup.py: the TensorFlow this op library was compiled against.\n")
                f.write(f"TF_VERSION = {version!r}\nCXX11_ABI = {abi!r}\nCUDA = False\n")
        print(f"tf_sparseconv: built {OP_LIBRARY} against TensorFlow {version} "
              f"(_GLIBCXX_USE_CXX11_ABI={abi}), CPU kernels")

    def get_ext_filename(self, ext_name):
        # A TensorFlow op library, not a Python extension module: no ABI-tagged suffix.
        return os.path.join(*ext_name.split(".")) + ".so"


setup(
    name="tf_sparseconv",
    version="0.1.0",
    description="Trainable sparse CNNs for TensorFlow: direct channel-sparse and site-sparse convolution",
    packages=find_packages(include=["tf_sparseconv", "tf_sparseconv.*"]),
    ext_modules=[
        Extension(
            OP_LIBRARY,
            sources=sorted(glob.glob(os.path.join("cc_ops", "*.cc"))),
            include_dirs=["cc_ops"],
            language="c++",
        )
    ],
    cmdclass={"build_ext": BuildTensorFlowOps},
    python_requires=">=3.11",
    zip_safe=False,
)
