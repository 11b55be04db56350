"""The op library loader refuses a TensorFlow it was not built against, saying what to do,
and keeps TensorFlow's start-up notices out of the user's terminal."""
import os
import subprocess
import sys

import pytest

from tf_sparseconv import _build_info, _op_library
from tf_sparseconv._native_logs import is_startup_notice


def test_loads_against_the_installed_tensorflow():
    library = _op_library.load()
    assert hasattr(library, "tf_sparseconv_direct_sparse_conv")  # the op TfSparseconv>DirectSparseConv
    assert callable(_op_library.ops.direct_sparse_conv)  # its wrapper without the prefix


@pytest.mark.parametrize("attribute,value", [("TF_VERSION", "2.0.0"), ("CXX11_ABI", "7")])
def test_mismatched_tensorflow_build_raises_import_error_naming_the_rebuild(monkeypatch, attribute, value):
    monkeypatch.setattr(_build_info, attribute, value)
    with pytest.raises(ImportError, match=r"was built against TensorFlow .* Rebuild the op library"):
        _op_library.load()


def test_missing_library_raises_import_error_naming_the_build(monkeypatch, tmp_path):
    monkeypatch.setattr(_op_library, "_LIBRARY_PATH", str(tmp_path / "absent.so"))
    with pytest.raises(ImportError, match="is not built .*pip install --no-build-isolation"):
        _op_library.load()


def test_library_with_unresolvable_symbols_raises_import_error(monkeypatch, tmp_path):
    broken = tmp_path / "broken.so"
    broken.write_bytes(b"not an ELF shared object")
    monkeypatch.setattr(_op_library, "_LIBRARY_PATH", str(broken))
    with pytest.raises(ImportError, match="does not load with TensorFlow"):
        _op_library.load()


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          env={k: v for k, v in os.environ.items() if k != "TF_SPARSECONV_TF_LOGS"})


def test_import_prints_none_of_tensorflows_startup_notices():
    result = run_python("import tf_sparseconv")
    assert result.returncode == 0, result.stderr
    assert not any(is_startup_notice(line) for line in result.stderr.splitlines()), result.stderr


def test_quiet_startup_writes_back_every_other_line_of_descriptor_2():
    result = run_python(
        "import os\n"
        "from tf_sparseconv._native_logs import quiet_startup\n"
        "with quiet_startup():\n"
        "    os.write(2, b'I0000 port.cc:153] oneDNN custom operations are on. You may see\\n')\n"
        "    os.write(2, b'a real error\\n')\n"
        "    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n')\n"
        "    os.write(2, b'and its second line\\n')\n")
    assert result.returncode == 0
    assert result.stderr == "a real error\nand its second line\n"


def test_op_library_was_built_with_cuda(gpu):
    """With a GPU visible, the suite's GPU cases need the library's GPU kernels."""
    assert _build_info.CUDA, "the op library has no GPU kernels; rebuild with nvcc available"
    assert _build_info.CUDA_ARCHS
