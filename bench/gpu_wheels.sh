#!/usr/bin/env bash
# Fills .whl/ with the wheels bench/gpu_check.sh installs on a lent GPU machine.
#
#     bash bench/gpu_wheels.sh
#
# Run it here (pip reaches the registry here; the GPU machine reaches nothing). The
# GPU machine's python3 is CPython 3.12 with torch (CUDA), pytest, numpy, PyYAML,
# packaging, cloudpickle, typing-extensions and zipp already installed, but none of
# what this project adds to them: torchrl, tensordict and their requirements
# (pyvers, hoptorch, orjson, importlib_metadata, lazy-importer), gymnasium
# (farama-notifications), ale-py (the Atari ROMs are in its wheel), hydra-core,
# omegaconf and antlr4-python3-runtime. Each is fetched without its dependencies, as
# a cp312 manylinux x86_64 wheel or a pure-python one, one version each (two
# versions of one package stop the whole install there); antlr4-python3-runtime 4.9.3
# (what omegaconf and hydra-core pin) exists as a source archive only, so its pure
# python wheel is built here. .whl/ is ignored through .git/info/exclude and
# travels in the device tool's `carry`, which allows 64 MiB for the whole working
# tree: the total size is printed at the end and checked against 40 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEST=.whl

# name==version, pinned to what the project's environment runs
BINARY=(
    torchrl==0.14.1
    tensordict==0.14.3
    orjson==3.13.0
    ale-py==0.12.1
)
PURE=(
    pyvers==0.2.3
    hoptorch==0.1.4
    importlib_metadata==10.2.0
    lazy-importer==0.1.0
    gymnasium==1.4.0
    farama-notifications==0.0.6
    hydra-core==1.3.8
    omegaconf==2.3.1
)
SOURCE_ONLY=(antlr4-python3-runtime==4.9.3)

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
grep -qxF '/.whl/' "$exclude" || echo '/.whl/' >>"$exclude"

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
target=(--python-version 3.12 --implementation cp --abi cp312)
for spec in "${BINARY[@]}"; do
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: "${target[@]}" \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$DEST" "$spec"
done
for spec in "${PURE[@]}"; do
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: "${target[@]}" \
        --platform any -d "$DEST" "$spec"
done
for spec in "${SOURCE_ONLY[@]}"; do
    "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$spec"
done

# one version of each, every one a wheel the GPU machine's CPython 3.12 can take
"$PYTHON" - "$DEST" <<'EOF'
import collections, pathlib, sys, zipfile

dest = pathlib.Path(sys.argv[1])
names = collections.Counter()
for wheel in sorted(dest.glob("*.whl")):
    name, version, *_, python, abi, platform = wheel.stem.split("-")
    names[name.lower().replace("_", "-")] += 1
    ok_python = any(t in ("py3", "cp312") for t in python.split("."))
    ok_platform = platform == "any" or "x86_64" in platform
    if not (ok_python and ok_platform and abi in ("none", "cp312", "abi3")):
        sys.exit(f"{wheel.name}: not a wheel for CPython 3.12 on x86_64")
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in z.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line
        ]
    print(f"{wheel.name:<75} {wheel.stat().st_size / 2**20:6.2f} MiB")
    if requires:
        print(f"    requires: {', '.join(requires)}")
twice = [n for n, c in names.items() if c > 1]
if twice:
    sys.exit(f"more than one version of {twice}")
EOF

bytes=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "$(ls "$DEST"/*.whl | wc -l) wheels in $DEST: $((bytes / 1024)) KiB"
if ((bytes > 40 * 1024 * 1024)); then
    echo "$DEST holds over 40 MiB: the working tree that travels is limited to 64 MiB" >&2
    exit 1
fi
