"""The fixes to TorchRL in ``upstream/torchrl/``, applied to a copy
of the installed TorchRL, so that they can be tested and measured here.

    python tools/torchrl_fixes.py DEST      # DEST/torchrl: the installed one, patched

The patches are ``git format-patch`` files against pytorch/rl (the commit in
``upstream/torchrl/README.md``); each changes TorchRL's sources and adds its
tests to TorchRL's test files. :func:`patched_copy` copies the installed
``torchrl`` package and applies the patches' source changes to it (``git apply
--include 'torchrl/*'``): put ``DEST`` first on ``PYTHONPATH`` to import it.
``tests/tools/test_torchrl_fixes.py`` and ``bench/torchrl_fixes.py`` use it.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATCHES = sorted((ROOT / "upstream" / "torchrl").glob("*.patch"))
# the pytorch/rl commit the patches were made against (upstream/torchrl/README.md)
BASE_COMMIT = "ae9719f17b1517af5c2523a36c4616f003ee55cf"


def installed_torchrl() -> Path:
    """The folder of the installed ``torchrl`` package (without importing it)."""
    spec = importlib.util.find_spec("torchrl")
    if spec is None or spec.origin is None:
        raise RuntimeError("torchrl is not installed")
    return Path(spec.origin).parent


def patched_copy(dest: str | Path, patches=PATCHES) -> Path:
    """Copies the installed ``torchrl`` into ``dest/torchrl`` and applies the
    source changes of ``patches`` (in order) to the copy; returns ``dest``.

    Raises ``RuntimeError`` naming the patch if one does not apply (TorchRL
    changed where it edits)."""
    dest = Path(dest)
    if (dest / "torchrl").exists():
        raise FileExistsError(f"{dest / 'torchrl'} exists")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(
        installed_torchrl(),
        dest / "torchrl",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for patch in patches:
        result = subprocess.run(
            ["git", "apply", "--include", "torchrl/*", str(patch)],
            cwd=dest,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{patch.name} does not apply to the installed torchrl: "
                f"{result.stderr.strip()}"
            )
    return dest


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", help="folder for the patched copy (DEST/torchrl)")
    args = parser.parse_args()
    dest = patched_copy(args.dest)
    names = ", ".join(patch.name for patch in PATCHES)
    print(f"{dest / 'torchrl'}: installed torchrl with {names}")
    print(f"use it with PYTHONPATH={dest}")


if __name__ == "__main__":
    main()
