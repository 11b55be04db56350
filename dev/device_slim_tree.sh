#!/usr/bin/env bash
# The lent GPU's calls copy the tracked files and carry at most 64 MiB in all; the kept
# models (experiments/models, about 210 MB) would leave no room for a piece of .devparts.
# `on` untracks them in the index only (the files stay on disk, listed in .git/info/exclude),
# `off` tracks them again. Between the two, `git status` shows the models as deleted: commit
# nothing while the tree is slim (`on` refuses to start with other changes staged, `off`
# restores the index from HEAD for that folder only).
#   bash dev/device_slim_tree.sh on    # before a lease's first call
#   bash dev/device_slim_tree.sh off   # after its last
set -euo pipefail
cd "$(dirname "$0")/.."
folder=experiments/models
exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")"
case "${1:-}" in
  on)
    if ! git diff --cached --quiet; then echo "changes are staged: commit or unstage them first" >&2; exit 1; fi
    git rm -r -q --cached "$folder"
    grep -qx "$folder/" "$exclude" 2>/dev/null || echo "$folder/" >> "$exclude"
    ;;
  off)
    git reset -q -- "$folder"
    if [ -f "$exclude" ]; then sed -i "\#^$folder/\$#d" "$exclude"; fi
    ;;
  *) echo "usage: $0 on|off" >&2; exit 2 ;;
esac
echo "tracked files: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes"
