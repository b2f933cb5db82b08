#!/usr/bin/env bash
# TorchRL's pre-commit tools on a freshly generated patch, as CI runs them.
#
#   LINT_BIN=.lintenv/bin tools/upstream_lint/generated.sh
#
# With TORCHRL_CHECKOUT (a pytorch/rl clone holding the pinned commit): the patch
# is written into a throwaway clone and every file it adds or changes is linted
# with the checkout's own settings. Without one: the new files only
# (upstream_patch.py --out), with TorchRL's settings copied in this folder; the
# additions to TorchRL's existing files (the __init__ imports, the ValueEstimators
# member, the code appended to value/functional.py) are then not linted in place.
# The library's files (torchrl/) must be clean; the findings in the tests and the
# sota scripts are printed without failing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -n "${TORCHRL_CHECKOUT:-}" ]; then
    git clone -q --shared "$TORCHRL_CHECKOUT" "$work/rl"
    commit=$("$python" -c "import sys; sys.path.insert(0, '$repo/tools'); import upstream_patch; print(upstream_patch.PINNED_COMMIT)")
    git -C "$work/rl" checkout -q "$commit"
    "$python" "$repo/tools/upstream_patch.py" "$work/rl" > /dev/null
    root=$work/rl
    mapfile -t files < <(cd "$root" && { git diff --name-only -- '*.py'; git ls-files --others --exclude-standard -- '*.py'; } | sort)
else
    "$python" "$repo/tools/upstream_patch.py" --out "$work/out" > /dev/null
    cp "$here/setup.cfg" "$here/pyproject.toml" "$work/out/"
    root=$work/out
    mapfile -t files < <(cd "$root" && find torchrl test sota-implementations -name '*.py' | sort)
fi
library=() others=()
for f in "${files[@]}"; do
    case $f in torchrl/*) library+=("$f") ;; *) others+=("$f") ;; esac
done
echo "== the library's files (${#library[@]}, must be clean)"
"$here/run.sh" "$root" "${library[@]}"
echo "== tests and sota scripts (${#others[@]}, reported)"
"$here/run.sh" "$root" "${others[@]}" || echo "(findings above are reported, not failed)"
