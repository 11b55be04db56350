"""Reading named arrays from an .npz archive with errors that name the file and the problem."""
import zipfile

import numpy as np


def _reason(error):
    # numpy suggests allow_pickle=True for bytes it cannot read as arrays; loading pickles
    # from a file runs its code, so the advice is never passed on.
    text = str(error)
    if "allow_pickle" in text or "pickle" in text.lower():
        return "its contents are not numeric arrays"
    return text


def read_npz_arrays(path, names):
    """{name: array} for the given names; ValueError for an unreadable file or a missing array."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:  # np.load tries pickle on non-zip bytes
        raise ValueError(f"{path}: not a readable .npz file ({_reason(e)})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a readable .npz file (a single .npy array, not an .npz archive)")
    with data:
        missing = set(names) - set(data.files)
        if missing:
            raise ValueError(f"{path}: missing arrays {sorted(missing)}; expected {list(names)}, found {data.files}")
        try:
            return {name: data[name] for name in names}
        except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:  # a member that does not decode
            raise ValueError(f"{path}: not a readable .npz file ({_reason(e)})") from None
