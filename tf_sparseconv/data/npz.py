"""Reading named arrays from an .npz archive with errors that name the file and the problem,
and the one wording of why Python objects in a file are not read (every reader of .npy and
.npz files uses it)."""
import zipfile

import numpy as np

# Python objects in a file are never loaded: unpickling runs code from the file.
NOT_UNPICKLED = "Python objects and pickles are not loaded, since unpickling runs code from the file"


def without_pickle_advice(text):
    """text, or, where it is numpy's refusal to unpickle (a file of Python objects, or bytes
    numpy could read only as a pickle), which advises allow_pickle=True, what is wrong instead."""
    text = str(text)
    if "allow_pickle" in text:
        return f"its contents are not plain arrays: {NOT_UNPICKLED}"
    return text


def read_npz_arrays(path, names):
    """{name: array} for the given names; ValueError for an unreadable file or a missing array."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:  # np.load tries pickle on non-zip bytes
        raise ValueError(f"{path}: not a readable .npz file ({without_pickle_advice(e)})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: not a readable .npz file (a single .npy array, not an .npz archive)")
    with data:
        missing = set(names) - set(data.files)
        if missing:
            raise ValueError(f"{path}: missing arrays {sorted(missing)}; expected {list(names)}, found {data.files}")
        try:
            return {name: data[name] for name in names}
        except (OSError, EOFError, ValueError, zipfile.BadZipFile) as e:  # a member that does not decode
            raise ValueError(f"{path}: not a readable .npz file ({without_pickle_advice(e)})") from None
