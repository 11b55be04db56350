"""The op library loader refuses a TensorFlow it was not built against, saying what to do."""
import pytest

from tf_sparseconv import _build_info, _op_library


def test_loads_against_the_installed_tensorflow():
    assert hasattr(_op_library.load(), "direct_sparse_conv")


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
