#!/usr/bin/env bash
# TorchRL's pre-commit checks (.pre-commit-config.yaml at the pinned commit), tool by
# tool, on files the upstream patch adds or changes.
#
#   tools/upstream_lint/run.sh ROOT [FILE ...]
#
# ROOT is a TorchRL checkout the patch was written into (FILEs default to what git
# there sees as added or modified), or a directory written by
# `upstream_patch.py --out` with this folder's setup.cfg and pyproject.toml (the
# [flake8], [pydocstyle], [tool.usort] and [tool.codespell] settings of TorchRL's)
# copied in. The tools come from $LINT_BIN (default: the PATH), at the versions
# TorchRL pins. Prints one "tool: N finding(s)" line per tool and the findings;
# exits 1 if any tool found something.
set -uo pipefail
root=$(cd "$1" && pwd)
shift
bin=${LINT_BIN:+$(cd "$LINT_BIN" && pwd)/}
for tool in ufmt flake8 pydocstyle pyupgrade codespell autoflake; do
    # a missing tool must not read as a clean run
    command -v "${bin}$tool" > /dev/null || { echo "no $tool (${bin:-PATH})" >&2; exit 2; }
done
cd "$root"
if [ $# -gt 0 ]; then
    files=("$@")
else
    mapfile -t files < <(git diff --name-only -- '*.py'; git ls-files --others --exclude-standard -- '*.py')
fi
[ ${#files[@]} -gt 0 ] || { echo "no files to lint" >&2; exit 2; }
torchrl_files=()
for f in "${files[@]}"; do
    case $f in torchrl/*) torchrl_files+=("$f") ;; esac
done
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0

report() {  # tool name, file of findings
    local n
    n=$(grep -c . "$2" || true)
    echo "$1: $n finding(s)"
    [ "$n" -eq 0 ] || { sed 's/^/    /' "$2"; failed=1; }
}

"${bin}ufmt" check "${files[@]}" 2>&1 | grep -E "^(Would format|Error)" > "$scratch/ufmt"
report "ufmt (black 22.3.0, usort 1.0.3)" "$scratch/ufmt"
"${bin}flake8" --config=setup.cfg "${files[@]}" > "$scratch/flake8" 2>&1
report "flake8 6.1.0" "$scratch/flake8"
if [ ${#torchrl_files[@]} -gt 0 ]; then
    "${bin}pydocstyle" "${torchrl_files[@]}" 2>&1 | grep -E "^[^ ].*:[0-9]+ " > "$scratch/pydocstyle"
else
    : > "$scratch/pydocstyle"
fi
report "pydocstyle 6.3.0 (torchrl/)" "$scratch/pydocstyle"
# pyupgrade and autoflake rewrite files: run them on copies
mkdir -p "$scratch/copy"
for f in "${files[@]}"; do
    mkdir -p "$scratch/copy/$(dirname "$f")"
    cp "$f" "$scratch/copy/$f"
done
(cd "$scratch/copy" && "${bin}pyupgrade" --py311-plus "${files[@]}" 2>&1) | grep -E "^Rewriting" > "$scratch/pyupgrade"
report "pyupgrade --py311-plus" "$scratch/pyupgrade"
"${bin}codespell" "${files[@]}" > "$scratch/codespell" 2>&1
report "codespell 2.4.1" "$scratch/codespell"
"${bin}autoflake" --check --remove-unused-variables --remove-all-unused-imports "${files[@]}" 2>&1 | grep -v "No issues detected" > "$scratch/autoflake"
report "autoflake" "$scratch/autoflake"
if [ -x scripts/check-docstring-args ] && [ ${#torchrl_files[@]} -gt 0 ]; then
    scripts/check-docstring-args "${torchrl_files[@]}" > "$scratch/args" 2>&1
    report "check-docstring-args (the checkout's script)" "$scratch/args"
fi
exit $failed
