"""Named arrays from .npz archives: unreadable files and missing arrays give errors naming them."""
import numpy as np
import pytest

from tf_sparseconv.data.npz import read_npz_arrays


def test_read_npz_arrays_names_bad_files_and_missing_arrays(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    with pytest.raises(ValueError, match="single .npy array"):
        read_npz_arrays(tmp_path / "a.npy", ["x"])
    (tmp_path / "b.npz").write_bytes(b"garbage bytes")
    with pytest.raises(ValueError, match="not a readable .npz"):
        read_npz_arrays(tmp_path / "b.npz", ["x"])
    np.savez(tmp_path / "c.npz", x=np.ones(2))
    with pytest.raises(ValueError, match=r"missing arrays \['y'\]"):
        read_npz_arrays(tmp_path / "c.npz", ["x", "y"])
    assert read_npz_arrays(tmp_path / "c.npz", ["x"])["x"].sum() == 2


@pytest.mark.parametrize("where", ["file", "member"])
def test_pickled_contents_are_refused_without_suggesting_allow_pickle(tmp_path, where):
    path = tmp_path / "pickled.npz"
    if where == "file":  # bytes numpy would try to unpickle
        import pickle
        path.write_bytes(pickle.dumps({"x": 1}))
    else:  # a member array of Python objects
        np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="not a readable .npz") as error:
        read_npz_arrays(path, ["x"])
    assert "allow_pickle" not in str(error.value)
