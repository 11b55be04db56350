"""TensorFlow's start-up notices, kept out of the user's terminal.

Importing TensorFlow 2.21 and loading an op library print absl's "All log messages before
absl::InitializeLog()" warning, the oneDNN notice and the CPU-feature notice straight to
file descriptor 2, before TF_CPP_MIN_LOG_LEVEL is consulted. They say nothing about the
user's work and turn every one-line error of the command line into five lines. While
TensorFlow starts, descriptor 2 goes to a temporary file; afterwards every line that is not
one of those notices is written back. TF_SPARSECONV_TF_LOGS=1 leaves descriptor 2 alone.
"""
import contextlib
import os
import sys
import tempfile

STARTUP_NOTICES = (
    "All log messages before absl::InitializeLog() is called",
    "oneDNN custom operations are on",
    "cpu_feature_guard.cc",
    "To enable the following instructions:",
)


def is_startup_notice(line):
    return any(notice in line for notice in STARTUP_NOTICES)


@contextlib.contextmanager
def quiet_startup():
    """Runs the block with descriptor 2 captured; writes back all but the start-up notices."""
    if os.environ.get("TF_SPARSECONV_TF_LOGS") == "1":
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 to redirect
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not is_startup_notice(line)]
            if kept:
                os.write(2, "".join(kept).encode())
