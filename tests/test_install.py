"""The install path: the package installed into the test environment (by scripts/setup_env.sh,
as CI does from a fresh clone) imports from outside the source tree, declares its dependencies
and its console script; a wheel carries the op library, and one with GPU kernels compiles
wherever nvcc is found; setup.py's CUDA decision and GPU architecture choice, as pure functions."""
import glob
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
NOT_INSTALLED = "tf_sparseconv is not installed in this environment: run `bash scripts/setup_env.sh`"
DECLARED = {"numpy", "keras", "matplotlib"}


def _load_setup():
    spec = importlib.util.spec_from_file_location("tf_sparseconv_setup", os.path.join(REPO, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # setup() runs only as __main__
    return module


setup_py = _load_setup()


def _clean_env():
    """The environment a user's shell would have: no PYTHONPATH, nothing pointing at the repo."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("PYTHON") and key not in ("VIRTUAL_ENV",)}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def _run_outside(tmp_path, *command):
    return subprocess.run(list(command), cwd=tmp_path, env=_clean_env(), capture_output=True, text=True,
                          timeout=300)


def _requirement_names(requirements):
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements if "extra ==" not in r}


# ---------------------------------------------------------------------------------------
# The installed package (what setup_env.sh did).

def test_installed_package_imports_outside_the_source_tree(tmp_path):
    try:
        importlib.metadata.distribution("tf_sparseconv")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(NOT_INSTALLED)
    result = _run_outside(tmp_path, sys.executable, "-c",
                          "import tf_sparseconv, tf_sparseconv._build_info as b, tensorflow as tf; "
                          "print(tf_sparseconv.__file__); print(b.TF_VERSION == tf.__version__)")
    assert result.returncode == 0, result.stderr[-2000:]
    module_file, same_tf = result.stdout.split()[-2:]
    assert os.path.isfile(module_file) and module_file.endswith(os.path.join("tf_sparseconv", "__init__.py"))
    assert same_tf == "True"


def test_installed_package_declares_its_dependencies_and_no_tensorflow():
    try:
        requirements = importlib.metadata.requires("tf_sparseconv") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(NOT_INSTALLED)
    names = _requirement_names(requirements)
    assert names == DECLARED
    keras = next(r for r in requirements if r.lower().startswith("keras"))
    assert ">=3.10" in keras
    # The user's choice of tensorflow or tensorflow-cpu: never pulled in by the package.
    assert not any(name.startswith("tensorflow") for name in names)
    assert importlib.metadata.metadata("tf_sparseconv")["Requires-Python"] == ">=3.11"


def test_environment_dependencies_are_consistent():
    pip = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert "No broken requirements found" in pip.stdout


def test_console_script_is_installed_and_runs(tmp_path):
    try:
        entry_points = importlib.metadata.distribution("tf_sparseconv").entry_points
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(NOT_INSTALLED)
    scripts = {ep.name: ep.value for ep in entry_points if ep.group == "console_scripts"}
    assert scripts == {"tf-sparseconv": "tf_sparseconv.cli:main"}
    script = os.path.join(BIN, "tf-sparseconv")
    assert os.access(script, os.X_OK), f"{script} is missing: the console script was not installed"
    if importlib.util.find_spec("tf_sparseconv.cli") is None:
        pytest.skip("tf_sparseconv/cli.py (module tf_sparseconv.cli) does not exist yet")
    result = _run_outside(tmp_path, script, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    for command in ("train", "evaluate", "predict", "bound"):
        assert command in result.stdout


# ---------------------------------------------------------------------------------------
# Metadata and the wheel, built from a copy of the source tree.

def _source_copy(tmp_path):
    """The tracked files of the checkout (git ls-files), or the working tree without build outputs."""
    destination = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True)
    if listed.returncode == 0:
        for relative in filter(None, listed.stdout.split("\0")):
            if os.path.isfile(os.path.join(REPO, relative)):
                os.makedirs(destination / os.path.dirname(relative), exist_ok=True)
                shutil.copy2(os.path.join(REPO, relative), destination / relative)
    else:
        shutil.copytree(REPO, destination, ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "*.so", "*.egg-info", "_build_info.py", "__pycache__"))
    return destination


def test_wheel_metadata_declares_dependencies_and_console_script(tmp_path):
    source = _source_copy(tmp_path)
    out = tmp_path / "meta"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
         "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))", str(out)],
        cwd=source, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    dist_info = out / result.stdout.split()[-1]
    metadata = (dist_info / "METADATA").read_text()
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, flags=re.M)
    assert _requirement_names(requires) == DECLARED
    assert re.search(r"^License-Expression: Apache-2.0$", metadata, flags=re.M)
    assert "tf-sparseconv = tf_sparseconv.cli:main" in (dist_info / "entry_points.txt").read_text()


def test_wheel_contains_the_op_library_and_its_build_info(tmp_path):
    """A full CPU build (about a minute on 2 cores): `pip wheel --no-build-isolation`."""
    source = _source_copy(tmp_path)
    env = dict(os.environ, TF_SPARSECONV_CUDA="0")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
                             "-w", str(tmp_path / "wheels"), str(source)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    output = result.stdout + result.stderr  # pip -v passes the build's output on to stderr
    assert result.returncode == 0, output[-6000:]
    progress = re.findall(r"tf_sparseconv: \[(\d+)/(\d+)\] (\S+)", output)
    assert progress and all(total == progress[0][1] for _, total, _ in progress)
    assert [int(k) for k, _, _ in progress] == list(range(1, int(progress[0][1]) + 1))
    assert "CPU kernels only: TF_SPARSECONV_CUDA=0" in output
    assert not re.search(r":\d+:\d+: warning:", output), "compiler warnings reached the build output"
    (wheel,) = (tmp_path / "wheels").glob("tf_sparseconv-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        build_info = archive.read("tf_sparseconv/_build_info.py").decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "tf_sparseconv/_tf_sparseconv_ops.so" in names
    assert "tf_sparseconv/__init__.py" in names
    assert "CUDA = False" in build_info
    import tensorflow as tf
    assert f"TF_VERSION = {tf.__version__!r}" in build_info
    assert _requirement_names(re.findall(r"^Requires-Dist: (.+)$", metadata, flags=re.M)) == DECLARED
    # A non-editable build leaves the source tree's build info alone.
    assert not (source / "tf_sparseconv" / "_build_info.py").exists()


def _cuda_compile_problem():
    """Why this machine cannot compile the GPU kernels (no nvcc, or a toolkit without the CUDA
    runtime or CUB headers), or None."""
    nvcc = setup_py.find_nvcc()
    if nvcc is None:
        return "no CUDA compiler (nvcc): set CUDA_HOME or put nvcc on PATH to compile the GPU kernels"
    try:
        return setup_py.CudaToolkit(nvcc).problem()
    except (OSError, subprocess.CalledProcessError) as e:
        return f"{nvcc} does not run ({e})"


def test_wheel_with_gpu_kernels_compiles(tmp_path):
    """Every CUDA source and GPU OpKernel compiles and links, for one architecture (sm_90), where
    nvcc is found, also without a GPU or a CUDA TensorFlow (TF_SPARSECONV_CUDA=1): CI's check of the
    GPU code it cannot run (about 4 minutes on 2 cores)."""
    problem = _cuda_compile_problem()
    if problem:
        pytest.skip(problem)
    source = _source_copy(tmp_path)
    env = dict(os.environ, TF_SPARSECONV_CUDA="1", TF_SPARSECONV_CUDA_ARCHS="90")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
                             "-w", str(tmp_path / "wheels"), str(source)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=2400)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "CPU and GPU kernels (TF_SPARSECONV_CUDA=1" in output and "for sm_90 from TF_SPARSECONV_CUDA_ARCHS" in output
    units = set(re.findall(r"tf_sparseconv: \[\d+/\d+\] (\S+)", output))
    expected = {os.path.relpath(path, source) for pattern in ("**/*.cu", "**/*_gpu.cc")
                for path in glob.glob(str(source / setup_py.SOURCES / pattern), recursive=True)}
    assert expected and expected <= units, f"not compiled: {sorted(expected - units)}"
    assert not re.search(r":\d+:\d+: warning:|\(\d+\): warning", output), "compiler warnings reached the build output"
    (wheel,) = (tmp_path / "wheels").glob("tf_sparseconv-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        build_info = archive.read("tf_sparseconv/_build_info.py").decode()
    assert "CUDA = True" in build_info and "CUDA_ARCHS = ['90']" in build_info


# ---------------------------------------------------------------------------------------
# setup.py's CUDA decision: pure functions of what the build finds.

NVCC = "/usr/local/cuda/bin/nvcc"


@pytest.mark.parametrize("tf_cuda, nvcc, env, expected, why", [
    (False, NVCC, {}, False, "built without CUDA"),
    (False, None, {}, False, "built without CUDA"),
    (True, NVCC, {}, True, "TensorFlow is built with CUDA"),
    (True, None, {}, False, "no CUDA compiler"),
    (True, NVCC, {"TF_SPARSECONV_CUDA": "0"}, False, "TF_SPARSECONV_CUDA=0"),
    (False, NVCC, {"TF_SPARSECONV_CUDA": "1"}, True, "TF_SPARSECONV_CUDA=1"),
    (True, NVCC, {"TF_SPARSECONV_CUDA": "auto"}, True, "TensorFlow is built with CUDA"),
    (False, NVCC, {"TF_SPARSECONV_CUDA": " "}, False, "built without CUDA"),
], ids=["tf-cpu", "tf-cpu-no-nvcc", "tf-cuda", "tf-cuda-no-nvcc", "forced-off", "forced-on", "auto", "blank"])
def test_cuda_build_decision(tf_cuda, nvcc, env, expected, why):
    build, reason = setup_py.cuda_build_decision(tf_cuda, nvcc, env)
    assert build is expected
    assert why in reason


def test_cuda_decision_says_when_architectures_are_ignored():
    build, reason = setup_py.cuda_build_decision(False, NVCC, {"TF_SPARSECONV_CUDA_ARCHS": "90"})
    assert not build and "TF_SPARSECONV_CUDA_ARCHS is ignored" in reason
    assert "ignored" not in setup_py.cuda_build_decision(False, NVCC, {})[1]


@pytest.mark.parametrize("env, message", [
    ({"TF_SPARSECONV_CUDA": "1"}, "no CUDA compiler"),
    ({"TF_SPARSECONV_CUDA": "yes"}, "is not one of 0"),
])
def test_cuda_decision_refuses(env, message):
    with pytest.raises(setup_py.BuildConfigError, match=message):
        setup_py.cuda_build_decision(True, None, env)


def test_default_build_here_matches_the_installed_tensorflow():
    """With this environment's TensorFlow and no setting, the build decision follows
    tf.test.is_built_with_cuda(): tensorflow-cpu gives a CPU build, whatever nvcc exists."""
    import tensorflow as tf
    if tf.test.is_built_with_cuda():
        pytest.skip("this TensorFlow is built with CUDA; the CPU default is checked with tensorflow-cpu")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_SPARSECONV_CUDA")}
    toolkit, line = setup_py.cuda_toolkit(False, env)
    assert toolkit is None
    assert line.startswith("CPU kernels only: the installed TensorFlow is built without CUDA")


@pytest.mark.parametrize("text, expected", [
    ("80;90", ["80", "90"]),
    ("9.0, 8.0 9.0", ["80", "90"]),
    ("sm_86;compute_90", ["86", "90"]),
    ("90a,100", ["90a", "100"]),
    ("", []),
])
def test_parse_cuda_archs(text, expected):
    assert setup_py.parse_cuda_archs(text) == expected


def test_parse_cuda_archs_refuses_garbage():
    with pytest.raises(setup_py.BuildConfigError, match="'hopper' is not a GPU architecture"):
        setup_py.parse_cuda_archs("90;hopper")


@pytest.mark.parametrize("output, expected", [
    ("9.0\n", ["90"]),
    ("8.6\n9.0\n9.0\n", ["86", "90"]),
    ("No devices were found\n", []),
    ("", []),
])
def test_parse_compute_caps(output, expected):
    assert setup_py.parse_compute_caps(output) == expected


NVCC13 = ["75", "80", "86", "87", "88", "89", "90", "100", "103", "110", "120", "121"]


@pytest.mark.parametrize("env, gpus, supported, archs, origin", [
    ({"TF_SPARSECONV_CUDA_ARCHS": "90"}, ["80"], NVCC13, ["90"], "TF_SPARSECONV_CUDA_ARCHS"),
    ({}, ["90"], NVCC13, ["90"], "the GPUs of this machine"),
    ({}, ["86", "90"], NVCC13, ["86", "90"], "the GPUs of this machine"),
    ({}, [], NVCC13, ["75", "80", "86", "89", "90"], "no GPU visible"),
    ({}, [], ["80", "86", "89", "90", "100"], ["80", "86", "89", "90"], "no GPU visible"),
    ({}, [], ["87", "90", "100"], ["87", "90"], "no GPU visible"),
    ({}, [], [], ["75", "80", "86", "89", "90"], "no GPU visible"),
])
def test_choose_cuda_archs(env, gpus, supported, archs, origin):
    chosen, where = setup_py.choose_cuda_archs(env, gpus, supported)
    assert chosen == archs
    assert where.startswith(origin)


@pytest.mark.parametrize("env, gpus, message", [
    ({"TF_SPARSECONV_CUDA_ARCHS": "60;90"}, [], "TF_SPARSECONV_CUDA_ARCHS asks for sm_60"),
    ({}, ["61"], "this machine's GPU asks for sm_61"),
    ({"TF_SPARSECONV_CUDA_ARCHS": ";"}, [], "names no architecture"),
])
def test_choose_cuda_archs_refuses(env, gpus, message):
    with pytest.raises(setup_py.BuildConfigError, match=message):
        setup_py.choose_cuda_archs(env, gpus, NVCC13)


def test_gencode_flags_add_ptx_of_the_highest():
    assert setup_py.gencode_flags(["80", "90"]) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=[sm_90,compute_90]",
    ]
