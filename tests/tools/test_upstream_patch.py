"""tools/upstream_patch.py: the generated TorchRL contribution works.

(a) The new files (``--out``) run: the generated tests pass against the installed
TorchRL, with the generated modules grafted into its packages and this project
blocked from import, so nothing in them still depends on it.
(b) With a TorchRL checkout (``TORCHRL_CHECKOUT``, else /work/torchrl_checkout), the
patch applies to a clean checkout at the pinned commit, reproduces what the
generator writes, and the generated tests pass in the patched checkout; so does
each patch of ``--series``, applied in order.
(c) The sota folder is the hand-written one, rewritten: no vendored package, only
TorchRL's, its dependencies' and the standard library's imports, within its size.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from builders import load_script, torchrl_checkout_or_skip

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "upstream_patch.py"


tool = load_script("tools/upstream_patch.py")
GENERATED_TESTS = sorted(tool.TEST_TARGETS.values())
# what pytest runs of them: the new modules, and the classes appended to TorchRL's
TEST_NODES = [node for target in GENERATED_TESTS for node in tool.test_nodes(target)]
# with --out: the new modules, and the appended tests as their fragments (the tests
# with the imports they need, a module of their own)
OUT_TESTS = [f"_edits/{t}" if t in tool.TEST_APPENDED else t for t in GENERATED_TESTS]

# A pytest plugin for the subprocess: makes the generated files part of the
# installed torchrl (their folders join the packages' __path__, and each fragment
# of _edits/ runs in the namespace of the module it edits, as the edit would), and
# makes torchrl_acer and this project's test helpers impossible to import.
HARNESS = """
import importlib
import importlib.abc
import json
import os
import sys
from pathlib import Path


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torchrl_acer", "builders", "reference"):
            raise ImportError(f"the generated code imports {name}")
        return None


sys.meta_path.insert(0, _Blocked())
out = Path(os.environ["ACER_UPSTREAM_OUT"])
for folder in sorted((out / "torchrl").rglob("*")):
    if folder.is_dir() and any(folder.glob("*.py")):
        package = ".".join(folder.relative_to(out).parts)
        importlib.import_module(package).__path__.append(str(folder))
for edit in json.loads((out / "_edits" / "manifest.json").read_text()):
    if edit["kind"] == "python":
        fragment = out / "_edits" / edit["fragment"]
        module = importlib.import_module(edit["module"])
        exec(compile(fragment.read_text(), str(fragment), "exec"), module.__dict__)
"""


def run(*args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result


def passed(output: str) -> int:
    counts = dict(
        (kind, int(n)) for n, kind in re.findall(r"(\d+) (passed|failed|error)", output)
    )
    assert counts.get("failed", 0) == counts.get("error", 0) == 0, output
    return counts.get("passed", 0)


def run_generated_tests(*args, cwd, env):
    """pytest on the generated tests (``args``): all pass, and more than 50 ran."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert passed(result.stdout) > 50


def test_generated_tests_pass_against_the_installed_torchrl(tmp_path):
    out = tmp_path / "out"
    run(sys.executable, str(TOOL), "--out", str(out))
    for path in (
        "torchrl/objectives/acer.py",
        "torchrl/objectives/value/retrace.py",
        "sota-implementations/acer/README.md",
        *OUT_TESTS,
    ):
        assert (out / path).is_file(), path
    generated = [p for p in out.rglob("*.py") if "_edits" not in p.parts]
    generated += [out / t for t in OUT_TESTS if t.startswith("_edits")]
    for path in generated:  # every reference to this project was rewritten
        assert "torchrl_acer" not in path.read_text(), path
    # each helper is defined once, in the shared module the tests import
    defined = {}
    for path in (*OUT_TESTS, tool.TEST_COMMON):
        for node in ast.parse((out / path).read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.setdefault(node.name, []).append(path)
    repeated = {name: paths for name, paths in defined.items() if len(paths) > 1}
    assert not repeated, repeated
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "acer_upstream_harness.py").write_text(HARNESS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # TorchRL's test base (test/objectives/_objectives_common.py) is not in its
    # wheel: the generated tests import this project's stand-in for it here
    stand_in = Path(__file__).parents[1] / "upstream"
    # the shared helpers, imported as TorchRL's tests import _objectives_common
    common = (out / tool.TEST_COMMON).parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(harness), str(stand_in), str(common)]),
        "ACER_UPSTREAM_OUT": str(out),
    }
    run_generated_tests(
        "-p",
        "acer_upstream_harness",
        "-c",
        str(tmp_path / "pytest.ini"),
        "--import-mode=importlib",
        *(str(out / t) for t in OUT_TESTS),
        cwd=tmp_path,
        env=env,
    )


def checkout_or_skip() -> Path:
    return torchrl_checkout_or_skip(tool.PINNED_COMMIT)


def clean_copy(source: Path, dest: Path) -> Path:
    run("git", "clone", "-q", "--shared", "--no-checkout", str(source), str(dest))
    run("git", "-C", str(dest), "checkout", "-q", "--detach", tool.PINNED_COMMIT)
    return dest


def tree_hash(checkout: Path) -> str:
    run("git", "-C", str(checkout), "add", "-A")
    return run("git", "-C", str(checkout), "write-tree").stdout.strip()


def test_patch_applies_to_a_clean_pinned_checkout(tmp_path):
    source = checkout_or_skip()
    work = clean_copy(source, tmp_path / "work")
    patch = tmp_path / "acer.patch"
    run(sys.executable, str(TOOL), str(work), "--patch", str(patch))
    # a rerun on the written checkout is a no-op
    run(sys.executable, str(TOOL), str(work))
    clean = clean_copy(source, tmp_path / "clean")
    run("git", "-C", str(clean), "apply", "--check", str(patch))
    run("git", "-C", str(clean), "apply", str(patch))
    assert tree_hash(clean) == tree_hash(work)
    # the generated tests, on the patched checkout's own torchrl
    env = {**os.environ, "PYTHONPATH": str(work)}
    run_generated_tests(*TEST_NODES, cwd=work, env=env)


def test_imports_are_sorted_as_torchrls_usort_does():
    text = (
        "from __future__ import annotations\n\n"
        "import torch\n"
        "import math\n"
        "from tensordict.nn import (\n    TensorDictModule,\n    dispatch,\n)\n"
        "from torchrl.objectives.utils import ValueEstimators\n\n"
        "from torchrl.objectives.utils import distance_loss\n"
        "from torchrl._utils import is_compiling\n"
        "from .acer import ACERLoss\n\n"
        "X = 1\n"
    )
    expected = (
        "from __future__ import annotations\n\n"
        "import math\n\n"
        "import torch\n"
        # case-insensitive names on one line when they fit; torchrl is third-party
        "from tensordict.nn import dispatch, TensorDictModule\n"
        "from torchrl._utils import is_compiling\n"
        "from torchrl.objectives.utils import distance_loss, ValueEstimators\n\n"
        "from .acer import ACERLoss\n\n"
        "X = 1\n"
    )
    assert tool.sort_imports(text, keep_blank_lines=False) == expected
    assert tool.sort_imports(expected) == expected


def test_import_sorting_leaves_torchrls_own_files_as_they_are():
    """TorchRL's files pass its usort: the sorter, which orders the edited ones,
    must leave them unchanged (else it departs from usort)."""
    source = checkout_or_skip()
    files = [
        *sorted((source / "torchrl").rglob("*.py")),
        *sorted((source / "test").rglob("*.py")),
    ]
    assert len(files) > 300
    changed = [
        str(path.relative_to(source))
        for path in files
        if path.stat().st_size
        and tool.sort_imports(path.read_text()) != path.read_text()
    ]
    assert not changed, changed[:10]


SOTA_IMPORTS = {"torch", "torchrl", "tensordict", "gymnasium", "hydra", "omegaconf"}


def test_sota_folder_is_the_upstream_one_rewritten(tmp_path):
    out = tmp_path / "out"
    run(sys.executable, str(TOOL), "--out", str(out))
    folder = out / tool.SOTA_DIR
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    names = {p.relative_to(folder).as_posix() for p in files}
    source = ROOT / tool.SOTA_SOURCE
    expected = {
        p.name
        for p in source.iterdir()
        if p.is_file()
        and p.name != tool.SOTA_ENTRIES[0]
        and not p.name.startswith("run_")
    }
    assert names == expected, names ^ expected
    assert not any("acer_utils" in n for n in names)
    assert sum(len(p.read_text().splitlines()) for p in files) <= 1200
    local = {p.stem for p in files if p.suffix == ".py"}
    for path in files:
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                assert (
                    top in SOTA_IMPORTS
                    or top in local
                    or top in sys.stdlib_module_names
                    or top == "__future__"
                ), (path.name, module)
    for script in ("run_acer_atari.sh", "run_acer_mujoco.sh"):
        assert (out / "sota-check" / script).is_file()
    # the trainer, its guard and configs land where TorchRL keeps theirs
    for path in (
        "torchrl/trainers/algorithms/acer.py",
        "torchrl/trainers/guards.py",
        "torchrl/trainers/algorithms/configs/acer.py",
    ):
        assert "torchrl_acer" not in (out / path).read_text(), path


TRAINER_IMPORTS = """
from torchrl.trainers import NonFiniteGuard, NonFiniteTrainingError
from torchrl.trainers.algorithms import ACERTrainer
from torchrl.trainers.algorithms.acer import make_segment_replay_buffer
from torchrl.trainers.algorithms.configs import ACERLossConfig, ACERTrainerConfig
from hydra.core.config_store import ConfigStore
import torchrl.trainers.algorithms.acer as acer
assert acer.__file__.startswith({root!r}), acer.__file__
repo = ConfigStore.instance().repo
assert "acer.yaml" in repo["loss"] and "acer.yaml" in repo["trainer"]
assert not [m for m in __import__("sys").modules if m.startswith("torchrl_acer")]
print("ok")
"""


@pytest.mark.slow
def test_series_applies_in_order_and_each_part_passes_its_tests(tmp_path):
    source = checkout_or_skip()
    work = clean_copy(source, tmp_path / "work")
    series = tmp_path / "series"
    run(sys.executable, str(TOOL), str(work), "--series", str(series))
    assert run("git", "-C", str(work), "status", "--porcelain").stdout == ""
    patches = sorted(series.glob("*.patch"))
    assert len(patches) == len(tool.SERIES) == 3
    clean = clean_copy(source, tmp_path / "clean")
    env = {**os.environ, "PYTHONPATH": str(clean)}
    identity = ("-c", "user.name=t", "-c", "user.email=t@t")
    tests = []
    for part, patch in enumerate(patches, 1):
        run("git", "-C", str(clean), "apply", "--check", str(patch))
        run(
            "git",
            "-C",
            str(clean),
            *identity,
            "am",
            "-q",
            "--keep-non-patch",
            str(patch),
        )
        tests += [
            node
            for t, p in tool.TEST_PARTS.items()
            if p == part
            for node in tool.test_nodes(t)
        ]
        if part < len(patches):
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    *tests,
                ],
                capture_output=True,
                text=True,
                cwd=clean,
                env=env,
            )
            assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
            assert passed(result.stdout) > 10
    # the whole series is the single patch
    whole = clean_copy(source, tmp_path / "whole")
    run(sys.executable, str(TOOL), str(whole))
    assert (
        tree_hash(whole)
        == run("git", "-C", str(clean), "rev-parse", "HEAD^{tree}").stdout.strip()
    )
    # the last part: the trainer, its guard and configs import from the checkout
    done = run(
        sys.executable,
        "-c",
        TRAINER_IMPORTS.format(root=str(clean)),
        cwd=tmp_path,
        env=env,
    )
    assert done.stdout.strip() == "ok"
    for script in (clean / tool.SOTA_DIR).glob("*.py"):
        compile(script.read_text(), str(script), "exec")
