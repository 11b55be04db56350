"""Saving and loading .keras models, with an optional checksum of what was saved.

save_model(model, path, checksum=True) saves as model.save does, then adds
CHECKSUM_MEMBER to the archive: the SHA-256 of each of its files (the weights, the config,
the metadata). load_model(path) checks the archive before Keras reads it and reports in one
message naming the file what is wrong with it: not there, truncated or damaged (zip CRC),
changed since it was saved (a checksum differs), or a config outside a layer's valid range
(the layers' own message). The checksum detects accidental damage and naive edits; anyone
who can change the file can also rewrite the checksum, so it is no signature.

keras.models.load_model still loads these files (it ignores the extra member) but checks
nothing of the above.
"""
import hashlib
import json
import os
import zipfile
import zlib

import keras

CHECKSUM_MEMBER = "tf_sparseconv_checksum.json"
_CHUNK = 1 << 20


class ModelFileError(ValueError):
    """A .keras file that cannot be loaded: missing, truncated, damaged, changed since it
    was saved, or holding a config the layers refuse. The message names the file."""


def _digests(archive):
    """{member: SHA-256 hex} of every member but the checksum's own."""
    digests = {}
    for info in archive.infolist():
        if info.filename == CHECKSUM_MEMBER or info.is_dir():
            continue
        sha = hashlib.sha256()
        with archive.open(info) as member:
            for block in iter(lambda: member.read(_CHUNK), b""):
                sha.update(block)
        digests[info.filename] = sha.hexdigest()
    return digests


def save_model(model, path, checksum=True):
    """model.save(path) (a .keras file); with checksum=True the archive also gets the
    SHA-256 of each of its files, which load_model verifies."""
    path = os.fspath(path)
    model.save(path)
    if checksum:
        with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
            record = {"algorithm": "sha256", "files": _digests(archive)}
            archive.writestr(CHECKSUM_MEMBER, json.dumps(record, indent=1, sort_keys=True))
    return path


def _check_archive(path, checksum):
    """ModelFileError unless path is a complete .keras archive whose checksum (if any, or
    required with checksum=True) matches; checksum=False skips the comparison."""
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such model file")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a folder, expected a .keras model file")
    size = os.path.getsize(path)
    if not zipfile.is_zipfile(path):
        raise ModelFileError(f"{path}: not a .keras model file: not a complete zip archive ({size} bytes; the file is "
                             "truncated or damaged, or was never a Keras 3 model)")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "config.json" not in names:
                raise ModelFileError(f"{path}: not a .keras model file (the archive has no config.json)")
            damaged = archive.testzip()  # reads every member, comparing its zip CRC-32
            if damaged is not None:
                raise ModelFileError(f"{path}: damaged: the archive member {damaged} fails its CRC check")
            if checksum is False:
                return
            if CHECKSUM_MEMBER not in names:
                if checksum:
                    raise ModelFileError(f"{path}: has no checksum ({CHECKSUM_MEMBER}); it was saved without "
                                         "tf_sparseconv.models.save_model(..., checksum=True)")
                return
            record = json.loads(archive.read(CHECKSUM_MEMBER))
            expected, actual = record["files"], _digests(archive)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, ModelFileError):
            raise
        raise ModelFileError(f"{path}: damaged .keras archive ({type(e).__name__}: {e})") from e
    if record.get("algorithm") != "sha256" or not isinstance(expected, dict):
        raise ModelFileError(f"{path}: its checksum record is not one tf_sparseconv writes")
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            raise ModelFileError(f"{path}: changed since it was saved: {name} is missing from the archive")
        if name not in expected:
            raise ModelFileError(f"{path}: changed since it was saved: {name} was added to the archive")
        if expected[name] != actual[name]:
            raise ModelFileError(f"{path}: changed since it was saved: the SHA-256 of {name} is "
                                 f"{actual[name][:16]}..., the checksum saved with the model says "
                                 f"{expected[name][:16]}...; restore the file or save the model again")


def _innermost(error):
    """The message of the exception at the bottom of Keras' chain of deserialization
    errors (a layer's own ValueError), or error's own."""
    seen = error
    while seen.__cause__ is not None or (seen.__context__ is not None and not seen.__suppress_context__):
        seen = seen.__cause__ or seen.__context__
    text = str(seen)
    marker = "Exception encountered: "
    return text[text.rindex(marker) + len(marker):].strip() if marker in text else text.strip()


def load_model(path, checksum=None, compile=True):
    """The model saved at path (a .keras file), after checking the file.

    checksum: None verifies the checksum where the file has one (save_model's), True
    requires one, False skips it. ModelFileError (a ValueError) naming the file for a
    missing, truncated or damaged file, one changed since it was saved, and one whose
    config a layer refuses (that layer's message). compile: as keras.models.load_model's.
    """
    path = os.fspath(path)
    _check_archive(path, checksum)
    try:
        return keras.models.load_model(path, compile=compile)
    except Exception as e:  # Keras raises many types, wrapping the layers' own errors
        raise ModelFileError(f"{path}: cannot be loaded as a Keras model: {_innermost(e)}") from e


__all__ = ["save_model", "load_model", "ModelFileError", "CHECKSUM_MEMBER"]
