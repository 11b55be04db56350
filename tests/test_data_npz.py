"""Named arrays from .npz archives: unreadable files and missing arrays give errors naming them."""
import numpy as np, pytest
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
