"""Builds the tf_sparseconv op library against the TensorFlow installed in this environment.

    pip install --no-build-isolation -e .      # or: python setup.py build_ext --inplace

The op library is a plain shared object loaded with tf.load_op_library, compiled with
TensorFlow's own flags (tf.sysconfig: include path, C++ ABI flag, C++ standard) and
linked against libtensorflow_framework. The TensorFlow version and ABI used are written
to tf_sparseconv/_build_info.py so that import can refuse a mismatched TensorFlow with
a message that says what to rebuild.

GPU kernels: when a CUDA compiler is found (first $CUDA_HOME/bin/nvcc or
$CUDA_PATH/bin/nvcc, then nvcc on PATH, then /usr/local/cuda/bin/nvcc, then the nvcc of
the nvidia-cuda-nvcc-cu12 pip package), cuda/*.cu are compiled with nvcc, the
*_gpu.cc OpKernels with -DGOOGLE_CUDA=1, and the CUDA runtime is linked statically
(dynamically where the toolkit has no libcudart_static.a). Environment:

    TF_SPARSECONV_CUDA=0                 CPU kernels only, even with a CUDA compiler
    TF_SPARSECONV_CUDA_ARCHS="80;90"     GPU architectures (default 75;80;86;89;90,
                                         those the nvcc supports), with PTX of the highest
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
OP_LIBRARY = "tf_sparseconv._tf_sparseconv_ops"
# Turing through Hopper. Each architecture adds about a minute of nvcc time on 2 cores.
DEFAULT_CUDA_ARCHS = ["75", "80", "86", "89", "90"]


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


def _pip_cuda_dirs(component, subdir):
    """Directories such as site-packages/nvidia/cuda_nvcc/bin of the nvidia-* pip packages."""
    dirs = []
    for entry in sys.path:
        candidate = os.path.join(entry, "nvidia", component, subdir)
        if entry and os.path.isdir(candidate):
            dirs.append(candidate)
    return dirs


def _find_nvcc():
    candidates = [os.path.join(os.environ[var], "bin", "nvcc")
                  for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    candidates += [os.path.join(d, "nvcc") for d in _pip_cuda_dirs("cuda_nvcc", "bin")]
    for nvcc in candidates:
        if nvcc and os.path.isfile(nvcc) and os.access(nvcc, os.X_OK):
            return nvcc
    return None


class CudaToolkit:
    """What nvcc says about itself: version, architectures, include and library dirs."""

    def __init__(self, nvcc):
        self.nvcc = nvcc
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
        match = re.search(r"release (\d+)\.(\d+)", version)
        self.version = f"{match.group(1)}.{match.group(2)}" if match else "?"
        listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True)
        self.supported_archs = sorted({m for m in re.findall(r"compute_(\d+)", listed.stdout)}, key=int)
        # nvcc's own view of its include and library directories (nvcc.profile).
        dryrun = subprocess.run([nvcc, "--dryrun", "-v", "-c", "probe.cu", "-o", "probe.o"],
                                capture_output=True, text=True).stderr
        own_includes, library_dirs = [], []
        for line in dryrun.splitlines():
            if line.startswith("#$ INCLUDES=") or line.startswith("#$ SYSTEM_INCLUDES="):
                own_includes += re.findall(r'-I"?([^"\s]+)', line)
                own_includes += re.findall(r'"-isystem"\s+"([^"]+)"', line)
            elif line.startswith("#$ LIBRARIES="):
                library_dirs += re.findall(r'-L"?([^"\s]+)', line)
        library_dirs.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "lib64"))
        # The nvcc of the nvidia-cuda-nvcc pip package finds neither the runtime nor CUB,
        # which other nvidia-* packages hold; a toolkit's nvcc is left to its own headers.
        extra_includes = []
        if os.sep.join(["nvidia", "cuda_nvcc"]) in os.path.realpath(nvcc):
            extra_includes = _pip_cuda_dirs("cuda_runtime", "include") + _pip_cuda_dirs("cuda_cccl", "include")
            library_dirs += _pip_cuda_dirs("cuda_runtime", "lib")

        def existing(dirs):
            return [os.path.normpath(d) for d in dict.fromkeys(dirs) if os.path.isdir(d)]
        self.own_include_dirs = existing(own_includes)
        self.extra_include_dirs = existing(extra_includes)  # passed to nvcc with -I
        self.library_dirs = existing(library_dirs)

    def runtime_include_dir(self):
        return next((d for d in self.own_include_dirs + self.extra_include_dirs
                     if os.path.isfile(os.path.join(d, "cuda_runtime.h"))), None)

    def cudart_link_args(self):
        """Static cudart (no runtime library of a matching version needed), else dynamic."""
        for d in self.library_dirs:
            static = os.path.join(d, "libcudart_static.a")
            if os.path.isfile(static):
                # Hidden symbols: TensorFlow's own CUDA runtime cannot interpose on ours.
                return [static, "-ldl", "-lrt", "-lpthread", "-Wl,--exclude-libs,libcudart_static.a"], "static"
        for d in self.library_dirs:
            shared = sorted(glob.glob(os.path.join(d, "libcudart.so*")))
            if shared:
                name = "-lcudart" if os.path.exists(os.path.join(d, "libcudart.so")) else \
                    "-l:" + os.path.basename(shared[0])
                return [f"-L{d}", name, f"-Wl,-rpath,{d}"], "dynamic"
        return None, None

    def archs(self):
        requested = os.environ.get("TF_SPARSECONV_CUDA_ARCHS")
        if requested:
            archs = [re.sub(r"\D", "", a) for a in re.split(r"[;, ]+", requested) if a.strip()]
            unsupported = [a for a in archs if self.supported_archs and a not in self.supported_archs]
            if unsupported:
                sys.exit(f"TF_SPARSECONV_CUDA_ARCHS asks for {unsupported}, which nvcc {self.version} "
                         f"does not support (it has {self.supported_archs})")
            return sorted(set(archs), key=int)
        if not self.supported_archs:
            return DEFAULT_CUDA_ARCHS
        archs = [a for a in DEFAULT_CUDA_ARCHS if a in self.supported_archs]
        # An nvcc that dropped Turing starts at its lowest architecture instead.
        if DEFAULT_CUDA_ARCHS[0] not in self.supported_archs:
            lowest = self.supported_archs[0]
            archs = sorted(set(archs) | {lowest}, key=int)
        return archs

    def gencode_flags(self, archs):
        flags = []
        for arch in archs[:-1]:
            flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        top = archs[-1]
        flags.append(f"-gencode=arch=compute_{top},code=[sm_{top},compute_{top}]")
        return flags


def _cuda_toolkit():
    """The usable CUDA toolkit, or None with the reason printed."""
    if os.environ.get("TF_SPARSECONV_CUDA", "").strip() == "0":
        print("tf_sparseconv: TF_SPARSECONV_CUDA=0, building CPU kernels only")
        return None
    nvcc = _find_nvcc()
    if nvcc is None:
        print("tf_sparseconv: no CUDA compiler (nvcc) found, building CPU kernels only")
        return None
    try:
        toolkit = CudaToolkit(nvcc)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"tf_sparseconv: {nvcc} does not run ({e}), building CPU kernels only")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.cu")
        with open(probe, "w") as f:
            f.write("#include <cuda_runtime.h>\n#include <cub/block/block_scan.cuh>\n")
        includes = [f"-I{d}" for d in toolkit.extra_include_dirs]
        result = subprocess.run([nvcc, "-std=c++17", "-E", probe, "-o", os.devnull] + includes,
                                capture_output=True, text=True)
    if result.returncode != 0:
        print(f"tf_sparseconv: {nvcc} cannot find the CUDA runtime or CUB headers "
              f"({result.stderr.strip().splitlines()[-1] if result.stderr.strip() else '?'}), "
              "building CPU kernels only")
        return None
    if toolkit.cudart_link_args()[0] is None or toolkit.runtime_include_dir() is None:
        print(f"tf_sparseconv: no CUDA runtime library next to {nvcc}, building CPU kernels only")
        return None
    return toolkit


def _cuda_shim(build_temp, toolkit):
    """TensorFlow's headers include "third_party/gpus/cuda/include/...": point that at CUDA."""
    shim = os.path.abspath(os.path.join(build_temp, "cuda_shim"))
    link = os.path.join(shim, "third_party", "gpus", "cuda", "include")
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(toolkit.runtime_include_dir(), link)
    return shim


def _compile_sources_in_parallel(compiler, cuda=None):
    """distutils compiles one source at a time; the op sources are independent. With
    cuda = (nvcc command, GPU .cc flags), .cu sources go to nvcc, slowest first."""
    from concurrent.futures import ThreadPoolExecutor

    serial_compile = compiler.compile

    def nvcc_compile(source, output_dir):
        obj = os.path.join(output_dir or ".", os.path.splitext(source)[0] + ".o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        command = cuda[0] + ["-c", source, "-o", obj]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"nvcc failed on {source}:\n{' '.join(command)}\n{result.stdout}{result.stderr}")
        return [obj]

    def compile_one(source, args, kwargs):
        if source.endswith(".cu"):
            return nvcc_compile(source, kwargs.get("output_dir"))
        if source.endswith("_gpu.cc"):
            kwargs = dict(kwargs, extra_postargs=list(kwargs.get("extra_postargs") or []) + cuda[1])
        if source.endswith("_avx2.cc"):  # called only where the CPU has AVX2 and FMA
            kwargs = dict(kwargs, extra_postargs=list(kwargs.get("extra_postargs") or []) + ["-mavx2", "-mfma"])
        return serial_compile([source], *args, **kwargs)

    def compile_all(sources, *args, **kwargs):
        order = sorted(sources, key=lambda s: not s.endswith(".cu"))
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            objects = dict(zip(order, pool.map(lambda src: compile_one(src, args, kwargs), order)))
        return [obj for src in sources for obj in objects[src]]

    compiler.compile = compile_all


class BuildTensorFlowOps(build_ext):
    """Compiles cc_ops/*.cc (and with CUDA cuda/*.cu) with TensorFlow's flags and records
    the build's TensorFlow and CUDA architectures."""

    def build_extensions(self):
        started = time.time()
        version, compile_flags, link_flags = _tensorflow_flags()
        abi = next((f.split("=")[1] for f in compile_flags if "_GLIBCXX_USE_CXX11_ABI" in f), "?")
        toolkit = _cuda_toolkit()
        archs = toolkit.archs() if toolkit else []
        # setuptools compiles C++ with the C compiler driver; -std from TF's flags wins.
        self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a != "-Wstrict-prototypes"]
        cuda = None
        for ext in self.extensions:
            ext.sources = [s for s in ext.sources if not s.endswith("_gpu.cc")]
            ext.extra_compile_args = compile_flags + ["-O3", "-fPIC", "-Wall", "-Wno-sign-compare",
                                                      "-Wno-unused-function", "-Wno-deprecated-declarations"]
            ext.extra_link_args = list(link_flags)
            if toolkit:
                ext.sources += sorted(glob.glob(os.path.join("cc_ops", "*_gpu.cc")))
                ext.sources += sorted(glob.glob(os.path.join("cuda", "*.cu")))
                cudart_args, linkage = toolkit.cudart_link_args()
                ext.extra_link_args += cudart_args
                shim = _cuda_shim(self.build_temp, toolkit)
                gpu_cc_flags = ["-DGOOGLE_CUDA=1", "-Icuda", f"-I{shim}", f"-I{toolkit.runtime_include_dir()}"]
                nvcc_command = [toolkit.nvcc, "-std=c++17", "-O3", "-DNDEBUG", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                                "-Xcompiler", "-fPIC", "-Icc_ops", "-Icuda", "-Wno-deprecated-gpu-targets"] + \
                    [f"-I{d}" for d in toolkit.extra_include_dirs] + toolkit.gencode_flags(archs)
                cuda = (nvcc_command, gpu_cc_flags)
        _compile_sources_in_parallel(self.compiler, cuda)
        super().build_extensions()
        # Beside the library in every place it lands: the source tree (in-place and
        # editable builds) and the build directory that a wheel is packed from.
        for package_dir in {os.path.join(HERE, "tf_sparseconv"), os.path.join(self.build_lib, "tf_sparseconv")}:
            os.makedirs(package_dir, exist_ok=True)
            with open(os.path.join(package_dir, "_build_info.py"), "w") as f:
                f.write("# Written by setup.py: the TensorFlow this op library was compiled against.\n")
                f.write(f"TF_VERSION = {version!r}\nCXX11_ABI = {abi!r}\n")
                f.write(f"CUDA = {bool(toolkit)}\nCUDA_ARCHS = {archs!r}\n")
                f.write(f"CUDA_VERSION = {toolkit.version if toolkit else None!r}\n")
        elapsed = time.time() - started
        if toolkit:
            print(f"tf_sparseconv: built {OP_LIBRARY} against TensorFlow {version} "
                  f"(_GLIBCXX_USE_CXX11_ABI={abi}), CPU and GPU kernels: nvcc {toolkit.version} "
                  f"({toolkit.nvcc}) for sm_{', sm_'.join(archs)} + PTX compute_{archs[-1]}, "
                  f"{linkage} CUDA runtime, in {elapsed:.0f} s")
        else:
            print(f"tf_sparseconv: built {OP_LIBRARY} against TensorFlow {version} "
                  f"(_GLIBCXX_USE_CXX11_ABI={abi}), CPU kernels only, in {elapsed:.0f} s")

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
