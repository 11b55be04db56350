"""Builds the tf_sparseconv op library against the TensorFlow installed in this environment.

    pip install --no-build-isolation -e .      # or: pip install --no-build-isolation .

Metadata and dependencies are in pyproject.toml; this file compiles the op library, a
plain shared object loaded with tf.load_op_library, with TensorFlow's own flags
(tf.sysconfig: include path, C++ ABI flag, C++ standard) and linked against
libtensorflow_framework. TensorFlow is not a build requirement that pip could install in
an isolated build environment: the library must match the TensorFlow it runs with, so it
is built with --no-build-isolation against the one already installed. The TensorFlow
version and ABI used are written to tf_sparseconv/_build_info.py so that import can
refuse a mismatched TensorFlow with a message that says what to rebuild.

Each compiled unit prints one progress line; compiler output (warnings) is shown only
for a unit that fails, and the build stops there.

GPU kernels are compiled when the installed TensorFlow is built with CUDA and a CUDA
compiler is found (first $CUDA_HOME/bin/nvcc or $CUDA_PATH/bin/nvcc, then nvcc on PATH,
then /usr/local/cuda/bin/nvcc, then the nvcc of the nvidia-cuda-nvcc-cu12 pip package),
for the GPUs that nvidia-smi lists: csrc/**/*.cu with nvcc, the *_gpu.cc OpKernels with
-DGOOGLE_CUDA=1, the CUDA runtime linked statically (dynamically where the toolkit has
no libcudart_static.a). Otherwise the build has CPU kernels only and says why in one line.
Environment:

    TF_SPARSECONV_CUDA=0                 CPU kernels only
    TF_SPARSECONV_CUDA=1                 GPU kernels too, even against tensorflow-cpu
                                         (a library built here to run elsewhere); fails
                                         if no usable CUDA toolkit is found
    TF_SPARSECONV_CUDA_ARCHS="80;90"     GPU architectures to compile for, with PTX of the
                                         highest (default: the GPUs of this machine, else
                                         75;80;86;89;90, those the nvcc supports)
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, ExecError, LinkError

HERE = os.path.dirname(os.path.abspath(__file__))
OP_LIBRARY = "tf_sparseconv._tf_sparseconv_ops"
# The C++ and CUDA sources, and the one include root: #include "common/key_layout.h".
SOURCES = "csrc"
# Turing through Hopper, for a build on a machine without a visible GPU. Each
# architecture adds about a minute of nvcc time on 2 cores.
DEFAULT_CUDA_ARCHS = ["75", "80", "86", "89", "90"]
NO_TENSORFLOW = (
    "the op library is compiled against the TensorFlow it will run with, and this build "
    "environment has none ({error}). pip's default build isolation hides the installed "
    "TensorFlow: install TensorFlow first (pip install tensorflow-cpu==2.21.*, or tensorflow), "
    "then install tf_sparseconv with `pip install --no-build-isolation .` (or -e .)."
)


class BuildConfigError(ValueError):
    """A build setting (environment variable, toolkit) that cannot be honoured."""


def say(message):
    """One line of build output; unbuffered, so progress shows while pip streams it."""
    print(f"tf_sparseconv: {message}", flush=True)


# ---------------------------------------------------------------------------------------
# The CUDA decision: pure functions of what was found, tested in tests/test_install.py.

def cuda_build_decision(tf_built_with_cuda, nvcc_path, env):
    """(build GPU kernels?, why) from TensorFlow's CUDA support, the nvcc found (or None)
    and the environment's TF_SPARSECONV_CUDA (unset/"auto", "0" or "1")."""
    setting = env.get("TF_SPARSECONV_CUDA", "").strip().lower()
    if setting not in ("", "auto", "0", "1"):
        raise BuildConfigError(f"TF_SPARSECONV_CUDA={env['TF_SPARSECONV_CUDA']!r} is not one of 0 (CPU kernels "
                               "only), 1 (GPU kernels too) or auto (unset: GPU kernels when TensorFlow has CUDA)")
    if setting == "0":
        return False, "TF_SPARSECONV_CUDA=0"
    if setting == "1":
        if nvcc_path is None:
            raise BuildConfigError("TF_SPARSECONV_CUDA=1 asks for GPU kernels, but no CUDA compiler (nvcc) was "
                                   "found: set CUDA_HOME to the CUDA toolkit or put nvcc on PATH")
        return True, f"TF_SPARSECONV_CUDA=1, nvcc at {nvcc_path}"
    ignored = "; TF_SPARSECONV_CUDA_ARCHS is ignored" if env.get("TF_SPARSECONV_CUDA_ARCHS", "").strip() else ""
    if not tf_built_with_cuda:
        return False, ("the installed TensorFlow is built without CUDA (TF_SPARSECONV_CUDA=1 builds the GPU "
                       f"kernels anyway){ignored}")
    if nvcc_path is None:
        return False, ("TensorFlow has CUDA but no CUDA compiler (nvcc) was found (set CUDA_HOME or put nvcc "
                       f"on PATH for GPU kernels){ignored}")
    return True, f"TensorFlow is built with CUDA, nvcc at {nvcc_path}"


def parse_cuda_archs(text):
    """Architectures as nvcc numbers from "80;90", "8.0, 9.0", "sm_80 sm_90" or "90a": sorted, unique."""
    archs = []
    for item in re.split(r"[;, ]+", text.strip()):
        if not item:
            continue
        match = re.fullmatch(r"(?:sm_|compute_)?(\d+)\.?(\d*)([af]?)", item.strip().lower())
        if not match:
            raise BuildConfigError(f"{item!r} is not a GPU architecture (write e.g. 90, 9.0 or sm_90)")
        archs.append(match.group(1) + match.group(2) + match.group(3))
    return sorted(set(archs), key=lambda a: int(re.sub(r"\D", "", a)))


def parse_compute_caps(nvidia_smi_output):
    """The architectures of `nvidia-smi --query-gpu=compute_cap --format=csv,noheader` ("9.0" -> "90")."""
    lines = [line.strip() for line in nvidia_smi_output.splitlines()]
    return parse_cuda_archs(";".join(line for line in lines if re.fullmatch(r"\d+\.\d+", line)))


def choose_cuda_archs(env, gpu_archs, supported_archs):
    """(architectures, where they come from): TF_SPARSECONV_CUDA_ARCHS, else the GPUs of this
    machine, else DEFAULT_CUDA_ARCHS; each checked against the nvcc's supported list (empty:
    unknown, no check)."""
    def check(archs, origin, advice):
        numeric = [re.sub(r"\D", "", a) for a in archs]
        unsupported = [a for a, n in zip(archs, numeric) if supported_archs and n not in supported_archs]
        if unsupported:
            raise BuildConfigError(f"{origin} asks for sm_{', sm_'.join(unsupported)}, which this nvcc does not "
                                   f"support (it has sm_{', sm_'.join(supported_archs)}); {advice}")
        return archs
    requested = env.get("TF_SPARSECONV_CUDA_ARCHS", "").strip()
    if requested:
        archs = parse_cuda_archs(requested)
        if not archs:
            raise BuildConfigError(f"TF_SPARSECONV_CUDA_ARCHS={requested!r} names no architecture")
        return check(archs, "TF_SPARSECONV_CUDA_ARCHS", "choose others"), "TF_SPARSECONV_CUDA_ARCHS"
    if gpu_archs:
        return (check(gpu_archs, "this machine's GPU", "set TF_SPARSECONV_CUDA_ARCHS or use a newer CUDA toolkit"),
                "the GPUs of this machine")
    if not supported_archs:
        return list(DEFAULT_CUDA_ARCHS), "no GPU visible, the default list"
    archs = [a for a in DEFAULT_CUDA_ARCHS if a in supported_archs]
    # An nvcc that dropped Turing starts at its lowest architecture instead.
    if DEFAULT_CUDA_ARCHS[0] not in supported_archs:
        archs = sorted(set(archs) | {supported_archs[0]}, key=int)
    return archs, "no GPU visible, the default list"


def gencode_flags(archs):
    """nvcc -gencode flags: machine code for each architecture, PTX of the highest as well."""
    flags = [f"-gencode=arch=compute_{arch},code=sm_{arch}" for arch in archs[:-1]]
    top = archs[-1]
    flags.append(f"-gencode=arch=compute_{top},code=[sm_{top},compute_{top}]")
    return flags


# ---------------------------------------------------------------------------------------
# What this machine has.

def _tensorflow():
    """(version, compile flags, link flags, built with CUDA) of the importable TensorFlow."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # fewer start-up log lines in the build output
    try:
        import tensorflow as tf
    except ImportError as e:
        raise SystemExit("tf_sparseconv: " + NO_TENSORFLOW.format(error=e)) from None
    return (tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags(),
            tf.test.is_built_with_cuda())


def _pip_cuda_dirs(component, subdir):
    """Directories such as site-packages/nvidia/cuda_nvcc/bin of the nvidia-* pip packages."""
    dirs = []
    for entry in sys.path:
        candidate = os.path.join(entry, "nvidia", component, subdir)
        if entry and os.path.isdir(candidate):
            dirs.append(candidate)
    return dirs


def find_nvcc():
    candidates = [os.path.join(os.environ[var], "bin", "nvcc")
                  for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    candidates += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    candidates += [os.path.join(d, "nvcc") for d in _pip_cuda_dirs("cuda_nvcc", "bin")]
    for nvcc in candidates:
        if nvcc and os.path.isfile(nvcc) and os.access(nvcc, os.X_OK):
            return nvcc
    return None


def visible_gpu_archs():
    """The architectures of the GPUs nvidia-smi lists ([] without nvidia-smi or a GPU)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        result = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_compute_caps(result.stdout) if result.returncode == 0 else []


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

    def problem(self):
        """Why this toolkit cannot build the GPU kernels, or None."""
        with tempfile.TemporaryDirectory() as tmp:
            probe = os.path.join(tmp, "probe.cu")
            with open(probe, "w") as f:
                f.write("#include <cuda_runtime.h>\n#include <cub/block/block_scan.cuh>\n")
            includes = [f"-I{d}" for d in self.extra_include_dirs]
            result = subprocess.run([self.nvcc, "-std=c++17", "-E", probe, "-o", os.devnull] + includes,
                                    capture_output=True, text=True)
        if result.returncode != 0:
            last = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "?"
            return f"{self.nvcc} cannot find the CUDA runtime or CUB headers ({last})"
        if self.cudart_link_args()[0] is None or self.runtime_include_dir() is None:
            return f"no CUDA runtime library next to {self.nvcc}"
        return None


def cuda_toolkit(tf_built_with_cuda, env=os.environ):
    """(the CUDA toolkit to build GPU kernels with, or None; the one line that says so)."""
    nvcc = find_nvcc()
    wanted, why = cuda_build_decision(tf_built_with_cuda, nvcc, env)
    if not wanted:
        return None, f"CPU kernels only: {why}"
    forced = env.get("TF_SPARSECONV_CUDA", "").strip() == "1"
    try:
        toolkit = CudaToolkit(nvcc)
        problem = toolkit.problem()
    except (OSError, subprocess.CalledProcessError) as e:
        problem = f"{nvcc} does not run ({e})"
    if problem and forced:
        raise BuildConfigError(f"TF_SPARSECONV_CUDA=1 asks for GPU kernels, but {problem}")
    if problem:
        return None, f"CPU kernels only: {problem}"
    toolkit.archs, origin = choose_cuda_archs(env, visible_gpu_archs(), toolkit.supported_archs)
    return toolkit, (f"CPU and GPU kernels ({why}; nvcc {toolkit.version} for sm_{', sm_'.join(toolkit.archs)} "
                     f"from {origin})")


# ---------------------------------------------------------------------------------------
# Compiling: in parallel, one progress line per unit, compiler output only on failure.

class _Progress:
    """Numbers the units as they start: "[3/13] csrc/channel/direct_conv/direct_conv_kernels.cc"."""

    def __init__(self, total):
        self.total, self.started, self.lock = total, 0, threading.Lock()

    def start(self, name):
        with self.lock:
            self.started += 1
            say(f"[{self.started}/{self.total}] {name}")


class UnitFailed(Exception):
    """A compile or link step failed; .output is the command and everything it printed."""

    def __init__(self, unit, output):
        super().__init__(f"{unit} failed")
        self.unit, self.output = unit, output


_last_output = threading.local()  # the failed command's output, per compiling thread


def _run_quietly(cmd, env=None):
    """Runs a compiler or linker with its output captured: kept for the error, else dropped."""
    cmd = [os.fspath(a) for a in cmd]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if result.returncode != 0:
        _last_output.text = f"{subprocess.list2cmdline(cmd)}\n{result.stdout}"
    return result


def _silence(compiler):
    """Routes the compiler object's commands through _run_quietly, keeping the errors each
    setuptools version expects: call() raises CalledProcessError, the older spawn() ExecError."""
    def call(cmd, *, env=None, **kwargs):
        result = _run_quietly(cmd, env)
        if result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, cmd)

    def spawn(cmd, **kwargs):
        if _run_quietly(cmd, kwargs.get("env")).returncode != 0:
            raise ExecError(f"command {cmd[0]!r} failed")
    if hasattr(compiler, "call"):
        compiler.call = call
    compiler.spawn = spawn


def _compile_with_progress(compiler, cuda, progress):
    """Replaces compiler.compile: sources compiled in parallel (they are independent), .cu with
    nvcc and slowest first; cuda = (nvcc command, extra flags of the GPU .cc files) or None.
    The first failure stops the build (units under way finish) with UnitFailed."""
    serial_compile = compiler.compile
    _silence(compiler)

    def compile_one(source, args, kwargs):
        progress.start(source)
        _last_output.text = ""
        try:
            if source.endswith(".cu"):
                obj = os.path.join(kwargs.get("output_dir") or ".", os.path.splitext(source)[0] + ".o")
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                if _run_quietly(cuda[0] + ["-c", source, "-o", obj]).returncode != 0:
                    raise CompileError(source)
                return [obj]
            extra = list(kwargs.get("extra_postargs") or [])
            if source.endswith("_gpu.cc"):
                extra += cuda[1]
            if source.endswith("_avx2.cc"):  # called only where the CPU has AVX2 and FMA
                extra += ["-mavx2", "-mfma"]
            if source.endswith("_avx512.cc"):  # called only where the CPU has AVX-512
                extra += ["-mavx512f", "-mfma"]
            return serial_compile([source], *args, **dict(kwargs, extra_postargs=extra))
        except CompileError as e:
            raise UnitFailed(f"compiling {source}", _last_output.text or str(e)) from None

    def compile_all(sources, *args, **kwargs):
        order = sorted(sources, key=lambda s: not s.endswith(".cu"))
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        pool = ThreadPoolExecutor(max_workers=jobs)
        futures = {source: pool.submit(compile_one, source, args, kwargs) for source in order}
        wait(futures.values(), return_when=FIRST_EXCEPTION)
        failed = next((f.exception() for f in futures.values() if f.done() and f.exception()), None)
        pool.shutdown(wait=True, cancel_futures=failed is not None)
        if failed is not None:
            raise failed
        progress.start(f"linking {OP_LIBRARY.replace('.', '/')}.so")
        _last_output.text = ""
        return [obj for source in sources for obj in futures[source].result()]

    compiler.compile = compile_all


def _build_info_source(version, abi, toolkit):
    return ("# Written by setup.py: the TensorFlow this op library was compiled against.\n"
            f"TF_VERSION = {version!r}\nCXX11_ABI = {abi!r}\n"
            f"CUDA = {bool(toolkit)}\nCUDA_ARCHS = {toolkit.archs if toolkit else []!r}\n"
            f"CUDA_VERSION = {toolkit.version if toolkit else None!r}\n")


class BuildTensorFlowOps(build_ext):
    """Compiles csrc/**/*.cc but *_gpu.cc (and with CUDA csrc/**/*.cu and *_gpu.cc) with
    TensorFlow's flags, includes relative to csrc/, and records the build's TensorFlow and CUDA
    architectures in _build_info.py."""

    def finalize_options(self):
        super().finalize_options()
        # Always compile: an object left in build/ by another TensorFlow or another CUDA
        # decision would otherwise be linked as up to date.
        self.force = True

    def run(self):
        inplace = self.inplace  # setuptools builds in build_lib, then copies in place
        super().run()
        if inplace:
            shutil.copyfile(os.path.join(self.build_lib, "tf_sparseconv", "_build_info.py"),
                            os.path.join(HERE, "tf_sparseconv", "_build_info.py"))

    def build_extensions(self):
        started = time.time()
        version, compile_flags, link_flags, tf_cuda = _tensorflow()
        abi = next((f.split("=")[1] for f in compile_flags if "_GLIBCXX_USE_CXX11_ABI" in f), "?")
        try:
            toolkit, decision = cuda_toolkit(tf_cuda)
        except BuildConfigError as e:
            raise SystemExit(f"tf_sparseconv: {e}") from None
        say(f"building against TensorFlow {version}: {decision}")
        # Python's own C flags, less a C-only warning flag and debug information.
        for attribute in ("compiler_so", "compiler_so_cxx", "linker_so", "linker_so_cxx"):
            if hasattr(self.compiler, attribute):
                setattr(self.compiler, attribute, [a for a in getattr(self.compiler, attribute)
                                                   if a not in ("-Wstrict-prototypes", "-g")])
        cuda = None
        for ext in self.extensions:
            if not toolkit:
                ext.sources = [s for s in ext.sources if not (s.endswith("_gpu.cc") or s.endswith(".cu"))]
            ext.extra_compile_args = compile_flags + ["-O3", "-fPIC", "-Wall", "-Wno-sign-compare",
                                                      "-Wno-unused-function", "-Wno-deprecated-declarations"]
            ext.extra_link_args = list(link_flags)
            if toolkit:
                cudart_args, linkage = toolkit.cudart_link_args()
                ext.extra_link_args += cudart_args
                shim = self._cuda_shim(toolkit)
                gpu_cc_flags = ["-DGOOGLE_CUDA=1", f"-I{shim}", f"-I{toolkit.runtime_include_dir()}"]
                nvcc_command = [toolkit.nvcc, "-std=c++17", "-O3", "-DNDEBUG", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                                "-Xcompiler", "-fPIC", f"-I{SOURCES}", "-Wno-deprecated-gpu-targets"] + \
                    [f"-I{d}" for d in toolkit.extra_include_dirs] + gencode_flags(toolkit.archs)
                cuda = (nvcc_command, gpu_cc_flags)
        _compile_with_progress(self.compiler, cuda,
                               _Progress(sum(len(ext.sources) for ext in self.extensions) + 1))
        try:
            super().build_extensions()
        except (UnitFailed, LinkError) as e:
            unit, output = (e.unit, e.output) if isinstance(e, UnitFailed) else ("linking", _last_output.text)
            print(output, flush=True)
            raise SystemExit(f"tf_sparseconv: the build stopped: {unit} failed (compiler output above)") from None
        info_dir = os.path.join(self.build_lib, "tf_sparseconv")
        os.makedirs(info_dir, exist_ok=True)
        with open(os.path.join(info_dir, "_build_info.py"), "w") as f:
            f.write(_build_info_source(version, abi, toolkit))
        kernels = f"CPU and GPU kernels ({linkage} CUDA runtime)" if toolkit else "CPU kernels only"
        say(f"built {OP_LIBRARY} with {kernels} in {time.time() - started:.0f} s")

    def _cuda_shim(self, toolkit):
        """TensorFlow's headers include "third_party/gpus/cuda/include/...": point that at CUDA."""
        shim = os.path.abspath(os.path.join(self.build_temp, "cuda_shim"))
        link = os.path.join(shim, "third_party", "gpus", "cuda", "include")
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(toolkit.runtime_include_dir(), link)
        return shim

    def get_ext_filename(self, ext_name):
        # A TensorFlow op library, not a Python extension module: no ABI-tagged suffix.
        return os.path.join(*ext_name.split(".")) + ".so"


def _relative(*suffixes):
    """The files under csrc/ (any depth) whose names end with one of suffixes, sorted."""
    return sorted(path for path in glob.glob(f"{SOURCES}/**/*", root_dir=HERE, recursive=True)
                  if path.endswith(suffixes))


if __name__ == "__main__":  # pip's build backend and `python setup.py` both run it as __main__
    setup(
        ext_modules=[
            Extension(
                OP_LIBRARY,
                # The GPU units are dropped at build time when the build has no CUDA.
                sources=_relative(".cc", ".cu"),
                depends=_relative(".h", ".cuh"),
                include_dirs=[SOURCES],
                language="c++",
            )
        ],
        cmdclass={"build_ext": BuildTensorFlowOps},
    )
