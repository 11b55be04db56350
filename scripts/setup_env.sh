#!/usr/bin/env bash
# Sets up .venv for this source tree: Python 3.11 or 3.12, TensorFlow ($TF_PACKAGE, default
# tensorflow-cpu==2.21.*), then tf_sparseconv installed editable with its dependencies
# (`pip install --no-build-isolation -e .[test]`), which compiles the op library against that
# TensorFlow. Safe to re-run: the package is reinstalled only when the op library's sources,
# setup.py or pyproject.toml changed, the TensorFlow changed, or TF_SPARSECONV_CUDA asks for
# other kernels than the library has. TF_SPARSECONV_CUDA and TF_SPARSECONV_CUDA_ARCHS go to
# setup.py (see its docstring); the full build log is kept in .venv/build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
tf_requested="${TF_PACKAGE:-}"
TF_PACKAGE="${TF_PACKAGE:-tensorflow-cpu==2.21.*}"
py=.venv/bin/python
started=$SECONDS

split=""
say() { echo "[setup] $*"; }
took() { split="$split, $1 $((SECONDS - $2)) s"; }  # took STEP START: the time split printed at the end
# pip, quiet; this machine's pip configuration may name index locations that do not exist,
# about which pip warns on every call.
pip_quiet() {
  "$py" -m pip -q "$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }
  return "${PIPESTATUS[0]}"
}

if [ ! -x "$py" ]; then
  PYTHON=""
  for candidate in python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null; then
      PYTHON="$candidate"; break
    fi
  done
  [ -n "$PYTHON" ] || { echo "[setup] need Python 3.11 or 3.12 on PATH (found none)" >&2; exit 1; }
  say "creating .venv with $($PYTHON --version)"
  step=$SECONDS
  "$PYTHON" -m venv .venv
  pip_quiet install --upgrade pip
  took "venv" $step
fi

if [ -n "$tf_requested" ] || ! "$py" -I -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("tensorflow") is None)'; then
  say "installing $TF_PACKAGE"
  step=$SECONDS
  pip_quiet install "$TF_PACKAGE"
  took "TensorFlow" $step
fi

# Build tools for --no-build-isolation (the build uses this environment's setuptools).
if [ ! -f .venv/.build-tools ] || [ requirements.txt -nt .venv/.build-tools ]; then
  say "installing the build tools (requirements.txt)"
  step=$SECONDS
  pip_quiet install -r requirements.txt
  touch .venv/.build-tools
  took "build tools" $step
fi

# Why the editable install must be (re)done, or nothing when it is current.
reason=$("$py" -I - "$root" <<'PY'
import importlib.metadata as md, json, os, sys
root = sys.argv[1]
lib = os.path.join(root, "tf_sparseconv", "_tf_sparseconv_ops.so")
info_path = os.path.join(root, "tf_sparseconv", "_build_info.py")
try:
    dist = md.distribution("tf_sparseconv")
except md.PackageNotFoundError:
    sys.exit(print("tf_sparseconv is not installed in .venv"))
url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
if url != "file://" + root:
    sys.exit(print(f"the installed tf_sparseconv is not this source tree's ({url or 'not editable'})"))
if not (os.path.exists(lib) and os.path.exists(info_path)):
    sys.exit(print("the op library is not built"))
built = os.path.getmtime(lib)
for folder, _, names in sorted(os.walk(os.path.join(root, "csrc"))):
    if os.path.getmtime(folder) > built:  # a file added, removed or renamed there
        sys.exit(print(f"{os.path.relpath(folder, root)}/ changed"))
    for name in sorted(names):
        if os.path.getmtime(os.path.join(folder, name)) > built:
            sys.exit(print(f"{os.path.relpath(os.path.join(folder, name), root)} changed"))
for name in ("setup.py", "pyproject.toml"):
    if os.path.getmtime(os.path.join(root, name)) > built:
        sys.exit(print(f"{name} changed"))
info = {}
exec(open(info_path).read(), info)
tf_dists = sorted(md.packages_distributions().get("tensorflow", []), key=lambda d: not d.lower().startswith("tensorflow"))
tf_version = md.version(tf_dists[0]) if tf_dists else None
if tf_version != info["TF_VERSION"]:
    sys.exit(print(f"the op library was built for TensorFlow {info['TF_VERSION']}, .venv has {tf_version}"))
wanted = os.environ.get("TF_SPARSECONV_CUDA", "").strip()
if wanted in ("0", "1") and info["CUDA"] != (wanted == "1"):
    sys.exit(print(f"TF_SPARSECONV_CUDA={wanted} but the op library has "
                   f"{'GPU' if info['CUDA'] else 'no GPU'} kernels"))
PY
) || true

if [ -n "$reason" ]; then
  say "installing tf_sparseconv into .venv: $reason"
  step=$SECONDS
  # pip shows a build's output only with -v: keep the whole log, show setup.py's own lines.
  set +e
  "$py" -m pip install -v --no-build-isolation -e ".[test]" 2>&1 | tee .venv/build.log |
    sed -un 's/^ *tf_sparseconv: /[setup]   /p'
  status=${PIPESTATUS[0]}
  set -e
  if [ $status -ne 0 ]; then
    echo "[setup] installing tf_sparseconv failed (full log: .venv/build.log):" >&2
    if grep -q "tf_sparseconv: the build stopped" .venv/build.log; then
      # The failing unit's compiler output: everything after the last progress line.
      last=$(grep -n "tf_sparseconv: \[" .venv/build.log | tail -n 1 | cut -d: -f1)
      tail -n +"$((last + 1))" .venv/build.log | grep -v "^WARNING: Location '.*' is ignored" >&2
    else
      grep -v "^WARNING: Location '.*' is ignored" .venv/build.log | tail -n 30 >&2
    fi
    exit $status
  fi
  took "tf_sparseconv" $step
fi
say "ready in $((SECONDS - started)) s${split:+ (${split#, })}: tf_sparseconv $("$py" -I -c 'import importlib.metadata as md; print(md.version("tf_sparseconv"))'), $(.venv/bin/pip list 2>/dev/null | grep -i -m 1 -E "^(tensorflow|tf-nightly|tf_nightly)" | tr -s ' ')"
