#!/usr/bin/env python
"""Write torchrl-acer's core into a TorchRL checkout, as an upstream contribution.

    python tools/upstream_patch.py PATH_TO_TORCHRL                 # edit the checkout
    python tools/upstream_patch.py PATH_TO_TORCHRL --patch acer.patch [--no-write]
    python tools/upstream_patch.py --out DIR                       # new files only

Everything is read from this project at run time: the core modules (those that the
``__all__`` of ``torchrl_acer/objectives``, ``objectives/value`` and ``modules``
reach, with every module they import), the upstream tests in ``tests/upstream/``
(with the helpers they import from ``tests/builders.py`` and ``tests/reference.py``
gathered into one module they import, ``test/objectives/_acer_common.py``) and the example scripts, their configs and local modules for
``sota-implementations/acer/``. Imports and dotted references to ``torchrl_acer``
are rewritten to TorchRL's paths; a reference the mapping cannot place is an error.

With a checkout, the files it changes (``__init__`` exports, the appended value
functional, the docs' autosummary lists) are edited from their content at the
pinned commit (``git show COMMIT:PATH``), so a rerun gives the same result and the
``--patch`` diff applies to a clean checkout at that commit
(``git apply --check``). With ``--out``, only the new files are written, and the
edits to existing files go to ``DIR/_edits/`` as fragments listed in
``DIR/_edits/manifest.json``: each Python fragment, executed in the namespace of the
module it names, does what the edit does (the project's tests run the generated
tests against the installed TorchRL that way).

Standard library only. See tools/README.md.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import json
import posixpath
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "torchrl_acer"

# pytorch/rl main on 2026-08-22 ("Bump hydra-core from 1.3.2 to 1.3.4 in
# /sota-implementations/expert-iteration (#4141)"): the commit whose files the edits
# are made on and the patch applies to. --commit targets another one.
PINNED_COMMIT = "ae9719f17b1517af5c2523a36c4616f003ee55cf"

# The core's public packages (under torchrl_acer/): every name in their __all__ is
# contributed, with the modules that define it and everything those import.
CORE_PACKAGES = ("objectives", "objectives/value", "modules")
CORE_FLOORS = ("objectives", "modules", "trainers")
PACKAGE_TARGETS = {
    "torchrl_acer.objectives": "torchrl.objectives",
    "torchrl_acer.objectives.value": "torchrl.objectives.value",
    "torchrl_acer.modules": "torchrl.modules",
}

# Contributed modules outside the core packages: ACER's trainer, the guard it
# registers and its Hydra configs (module under torchrl_acer/ -> the names its
# target folder's EXPORT_INITS export). What they import of this project joins
# the core too; the training application (torchrl_acer/training/) may not.
CONTRIBUTED = {
    "trainers/acer.py": ("ACERTrainer",),
    "trainers/hooks.py": ("NonFiniteGuard", "NonFiniteTrainingError"),
    "trainers/configs.py": ("ACERLossConfig", "ACERTrainerConfig"),
}
# Modules of which only some definitions go upstream: those named, with the
# definitions and imports they use, under a docstring of their own (the rest of
# the module, other hooks and configs, stays here).
SLICES = {
    "trainers/hooks.py": (
        ("NonFiniteGuard", "NonFiniteTrainingError"),
        "A trainer hook that keeps non-finite values out of training.\n\n"
        ":class:`NonFiniteGuard` is an\n"
        ":class:`~torchrl.trainers.OptimizationStepper`: an update whose loss or\n"
        "gradients are not finite is skipped, a collected batch holding non-finite\n"
        "values is neither trained on nor stored, too many of either in a row stop\n"
        "training (:class:`NonFiniteTrainingError`), and no checkpoint is saved from\n"
        "non-finite parameters.\n",
    ),
    "trainers/configs.py": (
        (
            "ACERLossConfig",
            "_make_acer_loss",
            "ACERTrainerConfig",
            "_make_acer_trainer",
        ),
        "Hydra configurations for ACER's loss and trainer.\n\n"
        ":class:`ACERLossConfig` (group ``loss``, name ``acer``) builds a\n"
        ":class:`~torchrl.objectives.ACERLoss`, :class:`ACERTrainerConfig` (group\n"
        "``trainer``, name ``acer``) an\n"
        ":class:`~torchrl.trainers.algorithms.ACERTrainer`. Each checks its values\n"
        "when built: a value of the wrong type or\n"
        "out of range fails at start, naming the field, its value and what it must\n"
        "be.\n",
    ),
}
# The contributed configs' ConfigStore entries (read from the cs.store calls of
# this function of the module) go into TorchRL's registration function, each
# after the last entry of its group that sorts before it.
CONFIG_STORE = {
    "source": ("trainers/configs.py", "register_configs"),
    "path": "torchrl/trainers/algorithms/configs/__init__.py",
    "function": "_register_configs",
}

# Where core modules go (paths under torchrl_acer/ -> paths in the checkout). A
# module not listed here follows Project.target's rule: objectives/x.py ->
# torchrl/objectives/acer_x.py (_x.py -> _acer_x.py), objectives/value/x.py ->
# torchrl/objectives/value/x.py, modules/x.py -> torchrl/modules/models/x.py.
# APPENDED modules are added at
# the end of an existing TorchRL module instead of becoming a file of their own:
# TorchRL keeps its return estimators' functional forms together in
# value/functional.py, where users look for them.
MODULE_TARGETS = {
    "objectives/acer.py": "torchrl/objectives/acer.py",
    "modules/sdn.py": "torchrl/modules/models/stochastic_dueling.py",
    # next to SACTrainer, PPOTrainer, ...
    "trainers/acer.py": "torchrl/trainers/algorithms/acer.py",
    # TorchRL keeps its hooks in torchrl/trainers/trainers.py; the guard is a
    # module of its own beside it, exported from torchrl.trainers
    "trainers/hooks.py": "torchrl/trainers/guards.py",
    "trainers/configs.py": "torchrl/trainers/algorithms/configs/acer.py",
}
APPENDED = {
    "objectives/value/functional.py": "torchrl/objectives/value/functional.py",
}

# The __init__ files that export the public names of a new module, by the module's
# folder (innermost first; the last one is where tests and docs import from).
EXPORT_INITS = {
    "torchrl/objectives": ("torchrl/objectives/__init__.py",),
    "torchrl/objectives/value": ("torchrl/objectives/value/__init__.py",),
    "torchrl/modules/models": (
        "torchrl/modules/models/__init__.py",
        "torchrl/modules/__init__.py",
    ),
    "torchrl/trainers": ("torchrl/trainers/__init__.py",),
    "torchrl/trainers/algorithms": ("torchrl/trainers/algorithms/__init__.py",),
    "torchrl/trainers/algorithms/configs": (
        "torchrl/trainers/algorithms/configs/__init__.py",
    ),
}

# Docs: (autosummary entry, rst file, the entry it goes after). The entry's
# ``.. currentmodule::`` plus the entry must be the name's public path.
DOC_ENTRIES = (
    ("ACERLoss", "docs/source/reference/objectives_policy.rst", "A2CLoss"),
    ("RetraceEstimator", "docs/source/reference/objectives_common.rst", "VTrace"),
    (
        "functional.retrace_lambda_return_estimate",
        "docs/source/reference/objectives_common.rst",
        "RetraceEstimator",
    ),
    (
        "StochasticDuelingNetwork",
        "docs/source/reference/modules_critics.rst",
        "DuelingCnnDQNet",
    ),
    (
        "PlainQCritic",
        "docs/source/reference/modules_critics.rst",
        "StochasticDuelingNetwork",
    ),
    ("ACERTrainer", "docs/source/reference/trainers_basics.rst", "A2CTrainer"),
    ("NonFiniteGuard", "docs/source/reference/trainers_hooks.rst", "LRSchedulerHook"),
)
# exported names the docs do not list, as TorchRL's do not list their kind
UNDOCUMENTED = ("NonFiniteTrainingError", "ACERLossConfig", "ACERTrainerConfig")

# Modules of the core that stand in for TorchRL names this project cannot add to
# an installed TorchRL: not contributed; imports of their names are rewritten to
# TorchRL's module (core files) or public package (tests, scripts), and
# VALUE_ESTIMATOR_EDIT adds the names there.
SHIMS = {
    "torchrl_acer.objectives._value_estimators": (
        "torchrl.objectives.utils",
        "torchrl.objectives",
    ),
}
# ValueEstimators.Retrace: the member (from the shim's stand-in enum) and its
# defaults (from the decorator of the class that registers it) go into TorchRL's
# enum and _BUILTIN_VALUE_ESTIMATOR_DEFAULTS, next to VTrace's
VALUE_ESTIMATOR_EDIT = {
    "path": "torchrl/objectives/utils.py",
    "enum": "ValueEstimators",
    "defaults": "_BUILTIN_VALUE_ESTIMATOR_DEFAULTS",
    "member_source": "torchrl_acer.objectives._value_estimators",
    "registered_in": "torchrl_acer.objectives.value.retrace",
}

# Tests: this project's self-contained upstream modules -> TorchRL's test layout.
TEST_TARGETS = {
    "tests/upstream/test_acer_upstream.py": "test/objectives/test_acer.py",
    "tests/upstream/test_retrace_upstream.py": "test/objectives/test_values.py",
}
# targets that are TorchRL's own test modules: the tests (less their module
# docstring) are appended to it, with the imports they need, as TorchRL's value
# estimators' cases sit in test_values.py
TEST_APPENDED = ("test/objectives/test_values.py",)
# tests/<name>.py: the helpers the tests import from them (and what those use) are
# gathered into one module beside TorchRL's own _objectives_common.py, imported as
# TorchRL's tests import that one
TEST_HELPERS = ("builders", "reference")
TEST_COMMON = "test/objectives/_acer_common.py"
TEST_COMMON_DOC = (
    '"""Helpers of the ACER and Retrace tests: small networks, batches and losses, '
    "and\nplain references written from the equations.\n"
    '"""'
)

# sota-implementations/acer: the hand-written folder upstream/sota-implementations/acer
# (scripts on TorchRL's primitives and the contributed names, in a2c's shape), its
# imports of torchrl_acer rewritten, nothing of the application copied. Its run
# scripts (run_*.sh) go into sota-check/, listed where a2c's are; its test_sota
# entries (SOTA_ENTRIES: a file of the folder and the dict it holds) into the
# commands dict of TorchRL's test_sota.py, after a2c's; neither file is copied.
SOTA_SOURCE = "upstream/sota-implementations/acer"
SOTA_DIR = "sota-implementations/acer"
SOTA_MAX_LINES = 1200
SOTA_ENTRIES = ("test_sota_entries.py", "ACER_ENTRIES")
TEST_SOTA = {
    "path": ".github/unittest/linux_sota/scripts/test_sota.py",
    "dict": "commands",
    "after": "a2c_atari",
}
SOTA_CHECK = {
    "dir": "sota-check",
    "list": "sota-check/submitit-release-check.sh",
    "after": "run_a2c_mujoco.sh",
}

# --series: the contribution as three patches, each applying on the ones before it
# (a file belongs to the part of the module, test or entry it comes from, see
# part_of: a module imported by an earlier part's module joins that part; an edited
# file changes in each part that edits it; a test that needs a later part's names
# comes with that part). (subject, body) by part.
SERIES = (
    (
        "[Feature] Retrace return estimator and stochastic dueling network",
        "RetraceEstimator (torchrl.objectives.value) and its functional form\n"
        "retrace_lambda_return_estimate, ValueEstimators.Retrace, and the Q critics\n"
        "the estimator reads (StochasticDuelingNetwork, PlainQCritic in\n"
        "torchrl.modules), tests and docs.\n"
        "Munos et al., Safe and Efficient Off-Policy Reinforcement Learning, 2016.",
    ),
    (
        "[Feature] ACER loss",
        "ACERLoss (torchrl.objectives) with its trust region, tests and docs.\n"
        "Wang et al., Sample Efficient Actor-Critic with Experience Replay, 2017.",
    ),
    (
        "[Feature] ACER trainer and sota-implementations/acer",
        "ACERTrainer (torchrl.trainers.algorithms), the NonFiniteGuard hook it\n"
        "registers (torchrl.trainers), ACERLossConfig and ACERTrainerConfig, and\n"
        "sota-implementations/acer (Atari and MuJoCo) with its test_sota entries\n"
        "and sota-check scripts.",
    ),
)
TEST_PARTS = {
    "test/objectives/test_values.py": 1,
    "test/objectives/test_acer.py": 2,
}

LINE_LENGTH = 88
REFERENCE = re.compile(r"\btorchrl_acer(?:\.[A-Za-z_]\w*)*")
# this project's folders that have no counterpart upstream
LOCAL_PATH = re.compile(r"(?<![\w/.-])(?:bench|examples|tests|tools)/[\w./*-]*\w")
# words that speak of this project as a package of its own
PROJECT_WORDS = re.compile(r"\bthis (?:package|project)\b|\(README\b[^)]*\)")


class GenerationError(Exception):
    """The project's files cannot be mapped as they are; the message says why."""


# -- modules of this project -----------------------------------------------------


def module_file(name: str) -> Path | None:
    """The file of a ``torchrl_acer`` module or package, or ``None``."""
    base = ROOT.joinpath(*name.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def is_ours(name: str | None) -> bool:
    return name is not None and (name == PACKAGE or name.startswith(PACKAGE + "."))


def absolute_module(node: ast.ImportFrom, current: str | None, package: bool) -> str:
    """The absolute module an ``ImportFrom`` reads, ``current`` being the module it
    is in (``package``: whether that is a package ``__init__``)."""
    if node.level == 0:
        return node.module
    if current is None:
        raise GenerationError(f"relative import {ast.unparse(node)} outside a package")
    parts = current.split(".") if package else current.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def literal_all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, (ast.List, ast.Tuple))
        ):
            return [ast.literal_eval(e) for e in node.value.elts]
    return []


def render_from(module: str, names: list[str], indent: str = "") -> list[str]:
    line = f"{indent}from {module} import {', '.join(names)}"
    if len(line) <= LINE_LENGTH:
        return [line]
    return [
        f"{indent}from {module} import (",
        *(f"{indent}    {n}," for n in names),
        f"{indent})",
    ]


def alias_text(alias: ast.alias) -> str:
    return alias.name if alias.asname is None else f"{alias.name} as {alias.asname}"


def bound_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    return [a.asname or a.name for a in node.names]


class Project:
    """This project's package, what its core is and where each part goes."""

    def __init__(self):
        self._trees: dict[Path, ast.Module] = {}
        self.exports: dict[str, str] = {}  # public name -> defining module
        for package in CORE_PACKAGES:
            name = ".".join([PACKAGE, *package.split("/")])
            for public in literal_all(self.tree(module_file(name))):
                module, defined = self.resolve(name, public)
                if defined is not None:
                    self.exports[public] = module
        for rel, names in CONTRIBUTED.items():
            module = ".".join([PACKAGE, *rel.removesuffix(".py").split("/")])
            for public in names:
                defined, found = self.resolve(module, public)
                if (defined, found) != (module, public) or public not in self.defs(
                    module
                ):
                    raise GenerationError(f"{module} defines no {public} (CONTRIBUTED)")
                self.exports[public] = module
        # sliced modules: the definitions that go upstream, by module
        self.kept: dict[str, set[str]] = {}
        for rel, (names, _) in SLICES.items():
            module = ".".join([PACKAGE, *rel.removesuffix(".py").split("/")])
            self.kept[module] = kept_definitions(
                self.tree(module_file(module)), names, rel
            )
        self.core = self.closure(set(self.exports.values()), core=True)

    def part(self, module: str) -> int:
        """The --series part of a core module: its folder's (:func:`part_of`), or
        that of the earliest core module importing it, if earlier."""
        if not hasattr(self, "_parts"):
            parts = {m: part_of(self.relative(m)) for m in self.core}
            changed = True
            while changed:
                changed = False
                for user in self.core:
                    for used in self.imported_modules(user) & self.core:
                        if parts[used] > parts[user]:
                            parts[used] = parts[user]
                            changed = True
            self._parts = parts
        return self._parts[module]

    def defs(self, module: str) -> dict[str, ast.stmt]:
        return _definitions(self.tree(module_file(module)))

    def tree(self, path: Path) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(path.read_text(), str(path))
        return self._trees[path]

    def resolve(self, module: str, name: str, seen=()) -> tuple[str, str | None]:
        """``(module, name)`` where ``module.name`` is defined, following re-exports
        through this package's modules; ``(submodule, None)`` for a submodule."""
        if module_file(f"{module}.{name}"):
            return f"{module}.{name}", None
        path = module_file(module)
        if path is None:
            raise GenerationError(f"no module {module} in this project")
        if (module, name) in seen:
            raise GenerationError(f"circular re-export of {module}.{name}")
        package = path.name == "__init__.py"
        for node in self.tree(path).body:
            if isinstance(node, ast.ImportFrom):
                source = absolute_module(node, module, package)
                for alias in node.names:
                    if (alias.asname or alias.name) == name and is_ours(source):
                        return self.resolve(source, alias.name, (*seen, (module, name)))
        return module, name

    def imported_modules(self, module: str) -> set[str]:
        """The ``torchrl_acer`` modules ``module`` imports (names resolved to the
        modules defining them), at any depth of its code (of a sliced module: of
        the definitions kept and the module's top-level imports)."""
        path = module_file(module)
        package = path.name == "__init__.py"
        found = set()
        tree = self.tree(path)
        if module in self.kept:
            defs = _definitions(tree)
            tree = ast.Module(
                body=_top_imports(tree) + [defs[n] for n in sorted(self.kept[module])],
                type_ignores=[],
            )
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if is_ours(alias.name):
                        found.add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                source = absolute_module(node, module, package)
                if is_ours(source):
                    for alias in node.names:
                        found.add(self.resolve(source, alias.name)[0])
        return found

    def closure(self, start: set[str], core: bool) -> set[str]:
        """``start`` and the modules of this package they import, transitively
        (``core``: all must be in the core floors; else: stopping at the core)."""
        todo, seen = sorted(start), set(start)
        while todo:
            module = todo.pop()
            for used in self.imported_modules(module):
                if core and not self.in_core_floors(used):
                    raise GenerationError(
                        f"the core module {module} imports {used}, which is not in "
                        f"torchrl_acer/{{{','.join(CORE_FLOORS)}}}"
                    )
                if used in SHIMS:
                    continue
                if core or used not in self.core:
                    if used not in seen:
                        seen.add(used)
                        todo.append(used)
        return seen

    @staticmethod
    def in_core_floors(module: str) -> bool:
        parts = module.split(".")
        return len(parts) > 2 and parts[1] in CORE_FLOORS

    # -- targets ------------------------------------------------------------------

    @staticmethod
    def relative(module: str) -> str:
        return module_file(module).relative_to(ROOT / PACKAGE).as_posix()

    def target(self, module: str) -> str:
        """The checkout path of a core module."""
        rel = self.relative(module)
        if rel in APPENDED:
            return APPENDED[rel]
        if rel in MODULE_TARGETS:
            return MODULE_TARGETS[rel]
        folder, name = posixpath.split(rel)
        private = name.startswith("_")
        stem = name.lstrip("_")
        if folder == "objectives":  # prefixed: ACER's helpers among all the losses
            return f"torchrl/objectives/{'_' if private else ''}acer_{stem}"
        if folder == "objectives/value":
            return f"torchrl/objectives/value/{'_acer_' if private else ''}{stem}"
        if folder == "modules":
            return f"torchrl/modules/models/{'_acer_' if private else ''}{stem}"
        raise GenerationError(f"no target for the core module {module} ({rel})")

    def target_module(self, module: str) -> str:
        return self.target(module)[: -len(".py")].replace("/", ".")

    def public_home(self, module: str, name: str) -> str:
        """Where users import ``name`` (defined in the core ``module``) from."""
        inits = EXPORT_INITS.get(posixpath.dirname(self.target(module)))
        if self.exports.get(name) == module and inits and not self.appended(module):
            return posixpath.dirname(inits[-1]).replace("/", ".")
        return self.target_module(module)

    def appended(self, module: str) -> bool:
        return self.relative(module) in APPENDED


# -- sliced modules ------------------------------------------------------------------


def kept_definitions(tree: ast.Module, names, where: str) -> set[str]:
    """``names`` and the module-level definitions they use, transitively."""
    defs = _definitions(tree)
    kept, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        if name not in defs:
            raise GenerationError(f"{where} defines no {name} (SLICES)")
        kept.add(name)
        todo += [
            n.id
            for n in ast.walk(defs[name])
            if isinstance(n, ast.Name) and n.id in defs and n.id not in kept
        ]
    return kept


def slice_module(text: str, names, docstring: str, where: str) -> str:
    """The module reduced to ``names`` and what they use: ``docstring``, the
    imports those definitions need, an ``__all__`` of the public ``names`` and
    the definitions in their order in the module."""
    tree = ast.parse(text, where)
    lines = text.splitlines()
    kept = kept_definitions(tree, names, where)
    nodes = sorted(
        {id(n): n for name, n in _definitions(tree).items() if name in kept}.values(),
        key=lambda n: n.lineno,
    )
    used = {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}
    header = [f'"""{docstring.rstrip()}\n"""', ""]
    imports = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            header += [ast.unparse(node), ""]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            aliases = [
                a
                for a, bound in zip(node.names, bound_names(node), strict=True)
                if bound in used
            ]
            if not aliases:
                continue
            if isinstance(node, ast.Import):
                imports += [f"import {alias_text(a)}" for a in aliases]
            else:
                imports += render_from(
                    _from_text(node), [alias_text(a) for a in aliases]
                )
    public = [n for n in names if not n.startswith("_")]
    out = [*header, *imports, "", f"__all__ = {public!r}".replace("'", '"')]
    for node in nodes:
        out += ["", "", _segment(lines, node)]
    return "\n".join(out) + "\n"


# -- rewriting ---------------------------------------------------------------------


class Rewriter:
    """Rewrites ``torchrl_acer`` imports and dotted references for one kind of file:
    ``"core"`` (a contributed module: imports from defining modules), ``"test"``
    or ``"sota"`` (imports from the public homes)."""

    def __init__(self, project: Project, kind: str):
        self.project = project
        self.kind = kind

    def map_name(
        self, source: str, name: str, where: str, public: bool = False
    ) -> tuple[str, str]:
        """``(module, name)`` to import ``source.name`` from (``public``: the path
        users import it from, even in a core module)."""
        module, defined = self.project.resolve(source, name)
        if module in SHIMS and defined is not None:
            internal, public_home = SHIMS[module]
            if self.kind == "core" and not public:
                return internal, defined
            return public_home, defined
        if defined is None:  # a submodule
            target = self.map_module(module, where)
            return target.rpartition(".")[0], target.rpartition(".")[2]
        if module in self.project.core:
            kept = self.project.kept.get(module)
            if kept is not None and defined not in kept:
                raise GenerationError(
                    f"{where}: refers to {module}.{defined}, which stays out of the "
                    f"contribution (SLICES)"
                )
            if self.kind == "core" and not public:
                return self.project.target_module(module), defined
            return self.project.public_home(module, defined), defined
        raise GenerationError(
            f"{where}: imports {source}.{name}, which is not part of the contribution"
        )

    def map_module(self, module: str, where: str) -> str:
        if module in self.project.core:
            return self.project.target_module(module)
        if module in PACKAGE_TARGETS:
            return PACKAGE_TARGETS[module]
        raise GenerationError(
            f"{where}: refers to {module}, which is not part of the contribution"
        )

    def imports(self, text: str, current: str | None, where: str) -> str:
        tree = ast.parse(text, where)
        package = where.endswith("__init__.py")
        lines = text.splitlines()
        edits = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(
                is_ours(a.name) for a in node.names
            ):
                raise GenerationError(
                    f"{where}:{node.lineno}: write `from torchrl_acer... import name` "
                    f"instead of `{ast.unparse(node)}`"
                )
            if not isinstance(node, ast.ImportFrom):
                continue
            source = absolute_module(node, current, package)
            if not is_ours(source):
                continue
            groups: dict[str, list[str]] = {}
            for alias in node.names:
                module, name = self.map_name(source, alias.name, where)
                local = alias.asname or alias.name
                groups.setdefault(module, []).append(
                    name if name == local else f"{name} as {local}"
                )
            indent = " " * node.col_offset
            new = []
            for module, names in groups.items():
                new += render_from(module, names, indent)
            tail = lines[node.end_lineno - 1][node.end_col_offset :]
            if tail.strip():
                new[-1] += tail
            edits.append((node.lineno, node.end_lineno, new))
        for start, end, new in sorted(edits, reverse=True):
            lines[start - 1 : end] = new
        return "\n".join(lines) + "\n"

    def references(self, text: str, where: str) -> str:
        """Rewrites dotted ``torchrl_acer`` references in docstrings and comments."""
        unplaced = []

        def replace(match):
            try:
                return self.map_reference(match.group(0), where)
            except GenerationError:
                line = text.count("\n", 0, match.start()) + 1
                unplaced.append(f"{where}:{line}: {match.group(0)}")
                return match.group(0)

        text = REFERENCE.sub(replace, text)
        if unplaced:
            raise GenerationError(
                "references that have no place upstream (reword them, or map them "
                "in tools/upstream_patch.py):\n  " + "\n  ".join(unplaced)
            )
        return text

    def map_reference(self, dotted: str, where: str) -> str:
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module_file(module):
                break
        rest = parts[cut:]
        if not rest:
            return self.map_module(module, where)
        # the public path, where the docs document the name
        home, name = self.map_name(module, rest[0], where, public=True)
        return ".".join([home, name, *rest[1:]])


# -- edits to existing TorchRL files -------------------------------------------------


@dataclass
class PyEdit:
    """Additions to an existing Python module of the checkout."""

    path: str
    module: str
    imports: list[tuple[str, list[str]]] = field(default_factory=list)
    all_names: list[str] = field(default_factory=list)
    sort_all: bool = True
    block: str = ""  # code appended at the end
    block_imports: list[str] = field(default_factory=list)  # statements it needs
    part: int = 1  # of --series
    kind = "python"

    def apply(self, text: str) -> str:
        for statement in self.block_imports:
            text = add_import_statement(text, statement)
        relative = any(
            isinstance(n, ast.ImportFrom) and n.level for n in ast.parse(text).body
        )
        for module, names in self.imports:
            if module.startswith(".") and not relative:  # the file's own style
                module = self.module + module
            text = add_import(text, module, names)
        if self.block:
            text = append_block(text, self.block, self.path)
        for name in self.all_names:
            text = add_to_all(text, name, self.sort_all, self.path)
        return text

    def fragment(self) -> str:
        lines = [
            f"# Executed in the namespace of {self.module} ({self.path}): what the "
            "edit adds to it.",
            *self.block_imports,
            *(line for m, names in self.imports for line in render_from(m, names)),
        ]
        if self.block:
            lines += ["", "", self.block.rstrip("\n")]
        if self.all_names:
            names = ", ".join(f'"{n}"' for n in self.all_names)
            lines += ["", f"__all__ = [*__all__, {names}]"]
        return "\n".join(lines) + "\n"


@dataclass
class EnumMemberEdit:
    """A member added to an enum of the checkout and its entry in a dict keyed by
    the enum, each after the last of its kind."""

    path: str
    module: str
    enum: str
    member: str
    value: str
    table: str
    entry: dict
    part: int = 1
    kind = "python"

    def apply(self, text: str) -> str:
        tree = ast.parse(text)
        lines = text.splitlines()
        cls = next(
            (
                n
                for n in tree.body
                if isinstance(n, ast.ClassDef) and n.name == self.enum
            ),
            None,
        )
        table = next((n for n in tree.body if self.table in _assigned_names(n)), None)
        if cls is None or table is None or not isinstance(table.value, ast.Dict):
            raise GenerationError(
                f"{self.path}: no class {self.enum} or dict {self.table} to extend"
            )
        members = [n for n in cls.body if isinstance(n, ast.Assign)]
        if any(t.id == self.member for n in members for t in n.targets):
            raise GenerationError(f"{self.path}: {self.enum} has {self.member} already")
        last_value = table.value.values[-1]
        indent = " " * table.value.keys[-1].col_offset
        entry = [f"{indent}{self.enum}.{self.member}: {{"]
        entry += [
            f"{indent}    {k!r}: {v!r},".replace("'", '"')
            for k, v in self.entry.items()
        ]
        entry += [f"{indent}}},"]
        # the later position first, so that the earlier stays where it was
        lines[last_value.end_lineno : last_value.end_lineno] = entry
        member = f"{' ' * members[-1].col_offset}{self.member} = {self.value!r}"
        lines[members[-1].end_lineno : members[-1].end_lineno] = [
            member.replace("'", '"')
        ]
        return "\n".join(lines) + "\n"

    def fragment(self) -> str:
        # An enum takes no member after its class statement; the installed
        # TorchRL's gets one the way that statement makes them, so that code
        # importing it afterwards sees the edited module
        return f"""# Executed in the namespace of {self.module} ({self.path}): what the edit adds
# to it.
_member = object.__new__({self.enum})
_member._name_, _member._value_ = {self.member!r}, {self.value!r}
_member.__objclass__ = {self.enum}
_member._sort_order_ = len({self.enum}._member_names_)
{self.enum}._member_names_.append({self.member!r})
{self.enum}._member_map_[{self.member!r}] = _member
{self.enum}._value2member_map_[{self.value!r}] = _member
type.__setattr__({self.enum}, {self.member!r}, _member)
{self.table}[{self.enum}.{self.member}] = {self.entry!r}
del _member
"""


def _assigned_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def value_estimator_edit() -> EnumMemberEdit:
    """:data:`VALUE_ESTIMATOR_EDIT`, read from the shim and the registering class."""
    spec = VALUE_ESTIMATOR_EDIT
    shim = ast.parse(module_file(spec["member_source"]).read_text())
    stand_in = [
        n
        for n in ast.walk(shim)
        if isinstance(n, ast.ClassDef) and n.name == spec["enum"]
    ]
    members = [
        (n.targets[0].id, ast.literal_eval(n.value))
        for c in stand_in
        for n in c.body
        if isinstance(n, ast.Assign)
    ]
    if len(members) != 1:
        raise GenerationError(
            f"{spec['member_source']}: expected a stand-in {spec['enum']} with one "
            f"member, found {members}"
        )
    member, value = members[0]
    defaults = None
    estimator = ast.parse(module_file(spec["registered_in"]).read_text())
    for node in ast.walk(estimator):
        for decorator in getattr(node, "decorator_list", []):
            if (
                isinstance(decorator, ast.Call)
                and ast.unparse(decorator.func) == "register_value_estimator"
                and ast.unparse(decorator.args[0]) == f"{spec['enum']}.{member}"
            ):
                keywords = {k.arg: k.value for k in decorator.keywords}
                defaults = ast.literal_eval(keywords["default_kwargs"])
    if defaults is None:
        raise GenerationError(
            f"{spec['registered_in']}: no @register_value_estimator("
            f"{spec['enum']}.{member}, default_kwargs=...)"
        )
    path = spec["path"]
    return EnumMemberEdit(
        path=path,
        module=path[: -len(".py")].replace("/", "."),
        enum=spec["enum"],
        member=member,
        value=value,
        table=spec["defaults"],
        entry=defaults,
    )


@dataclass
class RstEdit:
    """Autosummary entries added to an rst file of the docs."""

    path: str
    entries: list[tuple[str, str, str]] = field(default_factory=list)
    part: int = 1
    kind = "rst"
    module = None

    def apply(self, text: str) -> str:
        for entry, after, dotted in self.entries:
            text = add_rst_entry(text, entry, after, dotted, self.path)
        return text

    def fragment(self) -> str:
        lines = [f".. Entries added to the autosummary lists of {self.path}:", ""]
        lines += [f"    {entry}  (after {after})" for entry, after, _ in self.entries]
        return "\n".join(lines) + "\n"


@dataclass
class StoreEdit:
    """``cs.store(group=..., name=..., node=...)`` calls added to the function of
    the checkout that registers its configs, each after the last one-line call of
    its group whose name sorts before it."""

    path: str
    module: str
    function: str
    calls: list[tuple[str, str, str]]  # group, name, node
    part: int = 1
    kind = "python"

    def apply(self, text: str) -> str:
        lines = text.splitlines()
        tree = ast.parse(text)
        function = next(
            (
                n
                for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name == self.function
            ),
            None,
        )
        if function is None:
            raise GenerationError(f"{self.path}: no function {self.function}")
        for group, name, node in self.calls:
            call = re.compile(rf'^(\s*)cs\.store\(group="{group}", name="(\w+)", ')
            found = [
                (i, m)
                for i in range(function.lineno - 1, function.end_lineno)
                if (m := call.match(lines[i]))
            ]
            if not found:
                raise GenerationError(
                    f"{self.path}: {self.function} stores no {group!r} config to follow"
                )
            if any(m.group(2) == name for _, m in found):
                continue
            before = [(i, m) for i, m in found if _key(m.group(2)) < _key(name)]
            at, match = before[-1] if before else found[0]
            line = (
                f'{match.group(1)}cs.store(group="{group}", name="{name}", node={node})'
            )
            lines.insert(at + 1 if before else at, line)
        return "\n".join(lines) + "\n"

    def fragment(self) -> str:
        lines = [
            f"# Executed in the namespace of {self.module} ({self.path}): what the "
            f"edit adds to {self.function}.",
            "from hydra.core.config_store import ConfigStore",
            "",
        ]
        lines += [
            f'ConfigStore.instance().store(group="{g}", name="{n}", node={node})'
            for g, n, node in self.calls
        ]
        return "\n".join(lines) + "\n"


@dataclass
class DictEntriesEdit:
    """Entries (their source lines) added to a literal dict of a checkout module,
    after the entry of a given key."""

    path: str
    name: str
    after: str
    entries: str
    part: int = 1
    kind = "text"
    module = None

    def apply(self, text: str) -> str:
        tree = ast.parse(text)
        node = next((n for n in tree.body if self.name in _assigned_names(n)), None)
        if node is None or not isinstance(node.value, ast.Dict):
            raise GenerationError(f"{self.path}: no dict {self.name}")
        keys = [ast.literal_eval(k) if k is not None else None for k in node.value.keys]
        new_keys = list(ast.literal_eval("{" + self.entries + "}"))
        if set(new_keys) & set(keys):
            return text  # written already
        if self.after not in keys:
            raise GenerationError(f"{self.path}: {self.name} has no {self.after!r}")
        value = node.value.values[keys.index(self.after)]
        lines = text.splitlines()
        lines[value.end_lineno : value.end_lineno] = self.entries.rstrip("\n").split(
            "\n"
        )
        return "\n".join(lines) + "\n"

    def fragment(self) -> str:
        return (
            f"# Entries added to the dict {self.name} of {self.path}, after "
            f"{self.after!r}:\n{self.entries}"
        )


@dataclass
class LinesEdit:
    """Lines added to a text file of the checkout after a given line (stripped),
    with its indentation."""

    path: str
    after: str
    new: list[str]
    part: int = 1
    kind = "text"
    module = None

    def apply(self, text: str) -> str:
        lines = text.splitlines()
        found = [i for i, line in enumerate(lines) if line.strip() == self.after]
        if not found:
            raise GenerationError(f"{self.path}: no line {self.after!r} to follow")
        if any(line.strip() in self.new for line in lines):
            return text
        indent = lines[found[0]][: len(lines[found[0]]) - len(lines[found[0]].lstrip())]
        lines[found[0] + 1 : found[0] + 1] = [indent + line for line in self.new]
        return "\n".join(lines) + "\n" if text.endswith("\n") else "\n".join(lines)

    def fragment(self) -> str:
        return f"# Lines added to {self.path} after {self.after!r}:\n" + "".join(
            f"{line}\n" for line in self.new
        )


def _key(name: str) -> str:
    return name.lower()


def _top_imports(tree: ast.Module):
    return [
        n
        for n in tree.body
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
    ]


def _bound_at_top(tree: ast.Module) -> set[str]:
    return {name for node in _top_imports(tree) for name in bound_names(node)}


def _from_text(node: ast.ImportFrom) -> str:
    return "." * node.level + (node.module or "")


def add_import_statement(text: str, statement: str) -> str:
    """Adds an import statement after the module's imports, unless what it binds
    is bound already."""
    tree = ast.parse(text)
    node = ast.parse(statement).body[0]
    if set(bound_names(node)) <= _bound_at_top(tree):
        return text
    lines = text.splitlines()
    imports = _top_imports(tree)
    last = imports[-1]
    if isinstance(node, ast.Import):
        # after the last plain import that sorts before it (usort's place; a run
        # of imports holding a comment is not re-sorted afterwards)
        key = (_import_category(node.names[0].name.split(".")[0]), node.names[0].name)
        before = [
            n
            for n in imports
            if isinstance(n, ast.Import)
            and (_import_category(n.names[0].name.split(".")[0]), n.names[0].name) < key
        ]
        last = before[-1] if before else last
    lines[last.end_lineno : last.end_lineno] = [statement]
    return "\n".join(lines) + "\n"


def add_import(text: str, module: str, names: list[str]) -> str:
    """``from module import names``: into the module's statement importing from
    ``module`` if there is one, else a new statement among those of its kind
    (relative or absolute) in sorted order."""
    tree = ast.parse(text)
    lines = text.splitlines()
    imports = [n for n in _top_imports(tree) if isinstance(n, ast.ImportFrom)]
    same = [n for n in imports if _from_text(n) == module]
    if same:
        node = same[0]
        present = {a.asname or a.name for a in node.names}
        for name in names:
            if name not in present:
                text = add_name_to_import(text, node.lineno, name)
        return text
    relative = module.startswith(".")
    kind = [
        n
        for n in imports
        if (n.level > 0) == relative and "usort:skip" not in lines[n.lineno - 1]
    ]
    new = render_from(module, names)
    after = [n for n in kind if _key(_from_text(n)) > _key(module)]
    if after:
        at = after[0].lineno - 1
    else:
        at = (kind or _top_imports(tree))[-1].end_lineno
    lines[at:at] = new
    return "\n".join(lines) + "\n"


def add_name_to_import(text: str, lineno: int, name: str) -> str:
    """Adds ``name`` to the ``ImportFrom`` starting at ``lineno``, before the first
    name that sorts after it (case-insensitively, as usort does)."""
    tree = ast.parse(text)
    node = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.lineno == lineno
    )
    lines = text.splitlines()
    one_per_line = node.lineno != node.end_lineno and len(
        {a.lineno for a in node.names}
    ) == len(node.names)
    if one_per_line:
        later = [a for a in node.names if _key(a.name) > _key(name)]
        at = later[0].lineno - 1 if later else node.names[-1].end_lineno
        indent = " " * node.names[0].col_offset
        lines[at:at] = [f"{indent}{name},"]
        return "\n".join(lines) + "\n"
    names = [alias_text(a) for a in node.names]
    later = [i for i, a in enumerate(node.names) if _key(a.name) > _key(name)]
    names.insert(later[0] if later else len(names), name)
    tail = lines[node.end_lineno - 1][node.end_col_offset :]
    new = render_from(_from_text(node), names, " " * node.col_offset)
    new[-1] += tail
    lines[node.lineno - 1 : node.end_lineno] = new
    return "\n".join(lines) + "\n"


def sort_imports(text: str, keep_blank_lines: bool = True) -> str:
    """Orders each top-level run of import statements as TorchRL's pre-commit
    (usort 1.0, ``first_party_detection = false``) does.

    Categories ``__future__``, standard library, third party (every absolute
    import, TorchRL's own included) and first party (relative imports), with one
    blank line between them; in each, ``import x`` before ``from x import``, then
    by module, case-insensitively; statements from one module are merged, their
    names sorted case-insensitively, on one line when it fits in
    :data:`LINE_LENGTH`, else one name per line. Inside a category a statement
    keeps the blank line it had before it, as usort does (``keep_blank_lines``;
    else the category is one block). A run holding a comment is left as it is.
    """
    tree = ast.parse(text)
    lines = text.splitlines()
    runs = []
    for parent in ast.walk(tree):  # every statement list, nested ones too
        for field_name in ("body", "orelse", "finalbody"):
            body = getattr(parent, field_name, None)
            if not isinstance(body, list):
                continue
            run = []
            for node in [*body, None]:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    run.append(node)
                elif run:
                    runs.append(run)
                    run = []
    if not runs:
        return text
    for run in sorted(runs, key=lambda r: -r[0].lineno):
        indent = " " * run[0].col_offset
        start, end = run[0].lineno, run[-1].end_lineno
        block = lines[start - 1 : end]
        if any("#" in line or ";" in line for line in block):
            continue
        statements = {}  # (category, is from, dots, module) -> [names, blank before]
        previous_end = None
        for node in run:
            blank = previous_end is not None and node.lineno > previous_end + 1
            previous_end = node.end_lineno
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    key = (_import_category(top), False, 0, alias_text(alias))
                    statements.setdefault(key, [[alias_text(alias)], blank])
                    blank = False
                continue
            dots = node.level
            module = "." * dots + (node.module or "")
            top = (node.module or "").split(".")[0]
            category = 3 if dots else _import_category(top)
            key = (category, True, 100 - dots if dots else 0, module)
            entry = statements.setdefault(key, [[], blank])
            entry[0] += [a for a in map(alias_text, node.names) if a not in entry[0]]

        def order(key):
            return (*key[:3], key[3].casefold())

        rendered, category = [], None
        for key in sorted(statements, key=order):
            names, blank = statements[key]
            if category is not None and (
                key[0] != category or (blank and keep_blank_lines)
            ):
                rendered.append("")
            category = key[0]
            if not key[1]:
                rendered.append(f"{indent}import {names[0]}")
                continue
            names = sorted(names, key=_name_key)
            one = f"{indent}from {key[3]} import {', '.join(names)}"
            if len(one) <= LINE_LENGTH:
                rendered.append(one)
            else:
                rendered += [
                    f"{indent}from {key[3]} import (",
                    *(f"{indent}    {n}," for n in names),
                    f"{indent})",
                ]
        lines[start - 1 : end] = rendered
    return "\n".join(lines) + "\n"


def _name_key(name: str):
    base, _, alias = name.partition(" as ")
    return (base.casefold(), alias.casefold())


def _import_category(top: str) -> int:
    if top == "__future__":
        return 0
    return 1 if top in sys.stdlib_module_names else 2


def merge_imports(text: str) -> str:
    """Merges the module's top-level ``from X import ...`` statements of the same
    ``X`` into the first one (rewriting can make two of them)."""
    while True:
        seen: dict[str, ast.ImportFrom] = {}
        for node in _top_imports(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom):
                continue
            first = seen.setdefault(_from_text(node), node)
            if first is node:
                continue
            lines = text.splitlines()
            del lines[node.lineno - 1 : node.end_lineno]
            text = "\n".join(lines) + "\n"
            present = {a.asname or a.name for a in first.names}
            for alias in node.names:
                if (alias.asname or alias.name) not in present:
                    text = add_name_to_import(text, first.lineno, alias_text(alias))
            break
        else:
            return text


def add_to_all(text: str, name: str, sort: bool, where: str) -> str:
    tree = ast.parse(text)
    assign = next(
        (
            n
            for n in tree.body
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
            and isinstance(n.value, (ast.List, ast.Tuple))
        ),
        None,
    )
    if assign is None:
        raise GenerationError(f"{where} has no literal __all__ to add {name!r} to")
    elements = assign.value.elts
    if name in [ast.literal_eval(e) for e in elements]:
        return text
    lines = text.splitlines()
    later = (
        [e for e in elements if _key(ast.literal_eval(e)) > _key(name)] if sort else []
    )
    if assign.lineno != assign.end_lineno and elements:
        at = later[0].lineno - 1 if later else elements[-1].end_lineno
        indent = " " * elements[0].col_offset
        lines[at:at] = [f'{indent}"{name}",']
    else:
        values = [ast.literal_eval(e) for e in elements]
        values.insert(
            values.index(ast.literal_eval(later[0])) if later else len(values), name
        )
        body = ["__all__ = ["] + [f'    "{v}",' for v in values] + ["]"]
        lines[assign.lineno - 1 : assign.end_lineno] = body
    return "\n".join(lines) + "\n"


def append_block(text: str, block: str, where: str) -> str:
    tree = ast.parse(text)
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    ours = {
        n.name
        for n in ast.parse(block).body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    if defined & ours:
        raise GenerationError(f"{where} already defines {sorted(defined & ours)}")
    return text.rstrip("\n") + "\n\n\n" + block.strip("\n") + "\n"


def add_rst_entry(text: str, entry: str, after: str, dotted: str, where: str) -> str:
    lines = text.splitlines()
    found = [i for i, line in enumerate(lines) if line.strip() == after]
    if not found:
        raise GenerationError(f"{where}: no autosummary entry {after!r} to follow")
    at = found[0]
    module = None
    for line in reversed(lines[:at]):
        if line.startswith(".. currentmodule::"):
            module = line.split("::", 1)[1].strip()
            break
    if f"{module}.{entry}" != dotted:
        raise GenerationError(
            f"{where}: {entry!r} after {after!r} would document {module}.{entry}, "
            f"not {dotted}"
        )
    if any(line.strip() == entry for line in lines):
        return text
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at + 1, indent + entry)
    return "\n".join(lines) + "\n"


# -- what is generated ---------------------------------------------------------------


@dataclass
class Generated:
    new_files: dict[str, str] = field(default_factory=dict)  # path -> text
    edits: list = field(default_factory=list)  # in order; each has .path, .part
    warnings: list[str] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)  # new file -> --series part
    # a new file's text in the --series parts before the next one that changes it
    early: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


def part_of(rel: str) -> int:
    """The --series part of a module of this project (path under torchrl_acer/) by
    its folder; :meth:`Project.part` moves a module into the part of the earliest
    module that imports it."""
    if rel.startswith("objectives/value/") or rel == "objectives/_value_estimators.py":
        return 1
    if rel.startswith(("objectives/", "modules/")):
        return 2
    return 3


def generate() -> Generated:
    project = Project()
    out = Generated()
    core = Rewriter(project, "core")
    # first: the modules written below import the member it adds
    out.edits.append(value_estimator_edit())

    appended: list[PyEdit] = []
    for module in sorted(project.core):
        path = module_file(module)
        rel = project.relative(module)
        where = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if rel in SLICES:
            names, docstring = SLICES[rel]
            text = slice_module(text, names, docstring, where)
        text = core.references(core.imports(text, module, where), where)
        if project.appended(module):
            edit = appended_edit(project, module, text)
            edit.part = project.part(module)
            appended.append(edit)
        else:
            out.new_files[project.target(module)] = text
            out.parts[project.target(module)] = project.part(module)
    out.edits += appended

    # exports: each new module's public names, from its folder's __init__ files
    # (the outer ones import them from the subpackage, as TorchRL's do)
    exports: dict[tuple[str, int], dict[str, list[str]]] = {}
    for name, module in sorted(project.exports.items()):
        if project.appended(module):
            continue
        target = project.target(module)
        part = project.part(module)
        for init in EXPORT_INITS.get(posixpath.dirname(target), ()):
            package = posixpath.dirname(init)
            child = target[len(package) + 1 :].split("/")[0].removesuffix(".py")
            names = exports.setdefault((init, part), {}).setdefault(f".{child}", [])
            names.append(name)
    # by part, inner __init__ files first
    for init, part in sorted(exports, key=lambda key: (key[1], -key[0].count("/"))):
        out.edits.append(
            PyEdit(
                init,
                posixpath.dirname(init).replace("/", "."),
                imports=list(exports[init, part].items()),
                all_names=[n for names in exports[init, part].values() for n in names],
                part=part,
            )
        )
    out.edits += doc_edits(project, out.warnings)
    out.edits += config_store_edits(project)

    tests, common = test_modules(project)

    def later_than(part: int) -> set[str]:
        return {
            name
            for name, module in project.exports.items()
            if project.part(module) > part
        }

    # the shared helpers come with the first part whose tests use them; those
    # that need a later part's names (a loss built on the estimator) with it
    first = min(TEST_PARTS.values())
    out.new_files[TEST_COMMON] = common
    out.parts[TEST_COMMON] = first
    early_common = without_tests_of(common, later_than(first))
    if early_common != common:
        out.early[TEST_COMMON] = [(first, early_common)]
    held_back = set(_definitions(ast.parse(common))) - set(
        _definitions(ast.parse(early_common))
    )
    for target, text in tests.items():
        part = TEST_PARTS[target]
        # the tests that need a later part's names (directly or through a shared
        # helper) come with that part
        later = later_than(part) | (held_back if part == first else set())
        early = without_tests_of(text, later)
        if target in TEST_APPENDED:
            if early != text:
                raise GenerationError(
                    f"{target}: the tests appended to it need names of a later "
                    f"--series part; move them to a test module of that part"
                )
            out.edits.append(appended_test_edit(target, text, part))
            continue
        out.new_files[target] = text
        out.parts[target] = part
        if early != text:
            out.early[target] = [(part, early)]
    sota, sota_edits = sota_files(project)
    out.new_files.update(sota)
    out.parts.update(dict.fromkeys(sota, len(SERIES)))
    out.edits += sota_edits
    for path, text in out.new_files.items():
        if path.endswith(".py"):
            # the rewritten imports were a block of their own (this project's
            # first-party ones); upstream they join TorchRL's third-party block
            out.new_files[path] = sort_imports(text, keep_blank_lines=False)
    texts = {**out.new_files, **{e.path: e.block for e in appended}}
    for path, text in sorted(texts.items()):
        mentions = sorted(
            set(LOCAL_PATH.findall(text)) | set(PROJECT_WORDS.findall(text))
        )
        if mentions and not path.startswith(SOTA_DIR):
            # the core and its tests go into TorchRL's own modules, where a word
            # about this project would be wrong: fix it at the source
            raise GenerationError(
                f"{path} mentions {', '.join(mentions)}, which means nothing in "
                f"TorchRL; reword its source"
            )
        for match in mentions:
            out.warnings.append(f"{path} mentions {match}, a path of this project")
    return out


def without_tests_of(text: str, names: set[str]) -> str:
    """``text`` less its top-level definitions that use ``names`` (directly or
    through other definitions), and less the imports nothing left uses."""
    tree = ast.parse(text)
    defs = _definitions(tree)
    uses = {
        name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for name, node in defs.items()
    }
    dropped: set[str] = set()
    while True:
        more = {
            name
            for name, used in uses.items()
            if name not in dropped and used & (names | dropped)
        }
        if not more:
            break
        dropped |= more
    if not dropped:
        return text
    lines = text.splitlines()
    spans = set()
    for name in dropped:
        node = defs[name]
        spans |= _spans_using(node, lines, names | dropped)
    for start, end in sorted(spans, reverse=True):
        del lines[start - 1 : end]
    text = re.sub(r"\n{3,}", "\n\n\n", "\n".join(lines).rstrip("\n") + "\n")
    tree = ast.parse(text)
    imports = _top_imports(tree)
    used = {
        n.id
        for node in tree.body
        if node not in imports
        for n in ast.walk(node)
        if isinstance(n, ast.Name)
    }
    lines = text.splitlines()
    for node in sorted(imports, key=lambda n: -n.lineno):
        keep = [
            alias_text(a)
            for a, bound in zip(node.names, bound_names(node), strict=True)
            if bound in used
        ]
        if len(keep) == len(node.names):
            continue
        if isinstance(node, ast.Import):
            new = [f"import {a}" for a in keep]
        else:
            new = render_from(_from_text(node), keep) if keep else []
        lines[node.lineno - 1 : node.end_lineno] = new
    return sort_imports("\n".join(lines) + "\n", keep_blank_lines=False)


def _names_in(*nodes) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _spans_using(node: ast.stmt, lines: list[str], names: set[str]) -> set:
    """The line spans to delete so that ``node`` no longer uses ``names``: the
    methods that use them, when the rest of a class does not; else all of it."""
    if isinstance(node, ast.ClassDef):
        methods = [
            m
            for m in node.body
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            and _names_in(m) & names
        ]
        rest = [n for n in node.body if n not in methods]
        if (
            any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in rest)
            and not _names_in(*rest, *node.decorator_list, *node.bases) & names
        ):
            return {(_first_line(lines, m), m.end_lineno) for m in methods}
    return {(_first_line(lines, node), node.end_lineno)}


def config_store_edits(project: Project) -> list[StoreEdit]:
    """:data:`CONFIG_STORE`: the contributed configs' ``cs.store`` calls."""
    rel, function = CONFIG_STORE["source"]
    module = ".".join([PACKAGE, *rel.removesuffix(".py").split("/")])
    contributed = {n for n, m in project.exports.items() if m == module}
    tree = project.tree(module_file(module))
    calls = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith(".store")
            and {k.arg for k in node.keywords} >= {"group", "name", "node"}
        ):
            kw = {k.arg: k.value for k in node.keywords}
            if ast.unparse(kw["node"]) in contributed:
                calls.append(
                    (
                        ast.literal_eval(kw["group"]),
                        ast.literal_eval(kw["name"]),
                        ast.unparse(kw["node"]),
                    )
                )
    if {c[2] for c in calls} != contributed:
        raise GenerationError(
            f"torchrl_acer/{rel}: {function} stores {sorted(c[2] for c in calls)}, "
            f"not every contributed config ({sorted(contributed)})"
        )
    path = CONFIG_STORE["path"]
    return [
        StoreEdit(
            path=path,
            module=posixpath.dirname(path).replace("/", "."),
            function=CONFIG_STORE["function"],
            calls=calls,
            part=project.part(module),
        )
    ]


def appended_edit(project: Project, module: str, text: str) -> PyEdit:
    """The part of ``module`` after its imports and ``__all__``, for the end of the
    TorchRL module it is appended to."""
    tree = ast.parse(text)
    body = [n for n in tree.body if not _is_header(n)]
    header = [n for n in tree.body if _is_header(n)]
    if not body:
        raise GenerationError(f"{module} has nothing to append")
    if any(n.lineno > body[0].lineno for n in header):
        raise GenerationError(
            f"{module}: imports and __all__ must come before the code to append it"
        )
    lines = text.splitlines()
    start = _first_line(lines, body[0])
    statements = [ast.unparse(n) for n in _top_imports(tree)]
    target = project.target(module)
    return PyEdit(
        path=target,
        module=target[: -len(".py")].replace("/", "."),
        all_names=literal_all(tree),
        sort_all=False,
        block="\n".join(lines[start - 1 :]) + "\n",
        block_imports=statements,
    )


def _is_header(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return isinstance(node.value.value, str)  # the docstring
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    )


def doc_edits(project: Project, warnings: list[str]) -> list[RstEdit]:
    edits: dict[tuple[str, int], RstEdit] = {}
    documented = set()
    for entry, path, after in DOC_ENTRIES:
        name = entry.split(".")[-1]
        module = project.exports.get(name)
        if module is None:
            warnings.append(f"docs: {name} is no longer exported; entry skipped")
            continue
        documented.add(name)
        dotted = f"{project.public_home(module, name)}.{name}"
        part = project.part(module)
        edit = edits.setdefault((path, part), RstEdit(path, part=part))
        edit.entries.append((entry, after, dotted))
    for name in sorted(set(project.exports) - documented - set(UNDOCUMENTED)):
        warnings.append(f"docs: no rst entry for {name} (add one to DOC_ENTRIES)")
    return [edits[key] for key in sorted(edits, key=lambda key: key[1])]


def test_modules(project: Project) -> tuple[dict[str, str], str]:
    """``({target: test module}, shared helper module)``: the tests with their
    helper imports pointed at :data:`TEST_COMMON`, which holds every helper they
    import, once."""
    tests, requested = {}, {}
    for source, target in TEST_TARGETS.items():
        text, names = take_helper_imports((ROOT / source).read_text(), source)
        for helper, helper_names in names.items():
            requested.setdefault(helper, []).extend(helper_names)
        tests[target] = text
    rewriter = Rewriter(project, "test")
    for target, text in tests.items():
        text = merge_imports(rewriter.imports(text, None, target))
        text = rewriter.references(text, target)
        tests[target] = sort_imports(text, keep_blank_lines=False)
    common = helper_module(requested)
    common = merge_imports(rewriter.imports(common, None, TEST_COMMON))
    common = rewriter.references(common, TEST_COMMON)
    return tests, sort_imports(common, keep_blank_lines=False)


def _definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    defs = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    defs[t.id] = node
    return defs


def _first_line(lines: list[str], node: ast.stmt) -> int:
    """The line a statement starts on, with its decorators and the comment lines
    right above it."""
    start = node.lineno
    if getattr(node, "decorator_list", None):
        start = min(d.lineno for d in node.decorator_list)
    while start > 1 and lines[start - 2].lstrip().startswith("#"):
        start -= 1
    return start


def _segment(lines: list[str], node: ast.stmt) -> str:
    return "\n".join(lines[_first_line(lines, node) - 1 : node.end_lineno])


def appended_test_edit(target: str, text: str, part: int) -> PyEdit:
    """The tests of ``text``, less its docstring and imports, for the end of
    TorchRL's test module ``target``; their imports join the module's. Its
    fragment (``--out``) is the tests with their imports, a test module of its own."""
    tree = ast.parse(text)
    body = [n for n in tree.body if not _is_header(n)]
    lines = text.splitlines()
    imports, statements = [], []
    for node in _top_imports(tree):
        if isinstance(node, ast.ImportFrom):
            imports.append((_from_text(node), [alias_text(a) for a in node.names]))
        else:
            statements.append(ast.unparse(node))
    edit = PyEdit(
        path=target,
        module=target.removesuffix(".py").replace("/", "."),
        imports=imports,
        block="\n".join(lines[_first_line(lines, body[0]) - 1 :]) + "\n",
        block_imports=statements,
        part=part,
    )
    edit.kind = "test"  # not a module of the installed torchrl to run it in
    return edit


def test_nodes(target: str) -> list[str]:
    """What pytest runs of a generated test module ``target``: all of a new one,
    the appended classes of one of TorchRL's (:data:`TEST_APPENDED`)."""
    if target not in TEST_APPENDED:
        return [target]
    source = next(s for s, t in TEST_TARGETS.items() if t == target)
    tree = ast.parse((ROOT / source).read_text())
    return [f"{target}::{n.name}" for n in tree.body if isinstance(n, ast.ClassDef)]


def take_helper_imports(text: str, where: str) -> tuple[str, dict[str, list[str]]]:
    """``text`` with its ``from builders import ...`` and ``from reference import
    ...`` replaced by one import of those names from :data:`TEST_COMMON`, and the
    names by helper module."""
    tree = ast.parse(text)
    requested: dict[str, list[str]] = {}
    removed = []
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        if not set(modules) & set(TEST_HELPERS):
            continue
        if not isinstance(node, ast.ImportFrom) or node not in tree.body:
            raise GenerationError(
                f"{where}:{node.lineno}: import the helpers at the top of the module, "
                f"as `from {modules[0]} import name`"
            )
        for alias in node.names:
            if alias.asname:
                raise GenerationError(f"{where}: `as` on a helper import")
            requested.setdefault(node.module, []).append(alias.name)
        # the import goes, with the comment lines right above it
        removed.append((_first_line(lines, node), node.end_lineno))
    if not requested:
        return text, requested
    clash = set(_definitions(tree)) & {n for names in requested.values() for n in names}
    if clash:
        raise GenerationError(f"{where} defines {sorted(clash)} that it imports")
    for start, end in sorted(removed, reverse=True):
        del lines[start - 1 : end]
    names = sorted({n for names in requested.values() for n in names}, key=_key)
    module = posixpath.basename(TEST_COMMON).removesuffix(".py")
    return add_import("\n".join(lines) + "\n", module, names), requested


def helper_module(requested: dict[str, list[str]]) -> str:
    """The text of :data:`TEST_COMMON`: the definitions ``requested`` by helper
    module (and those these use), in their modules' order, with their imports."""
    sections, needed = [], []
    for helper in TEST_HELPERS:
        names = requested.get(helper)
        if not names:
            continue
        path = ROOT / "tests" / f"{helper}.py"
        source = path.read_text()
        htree = ast.parse(source, str(path))
        defs = _definitions(htree)
        imports = {}
        for node in _top_imports(htree):
            for alias, bound in zip(node.names, bound_names(node), strict=True):
                imports[bound] = (node, alias)
        chosen, todo = set(), list(names)
        while todo:
            name = todo.pop()
            if name in chosen:
                continue
            if name not in defs:
                raise GenerationError(f"tests/{helper}.py has no {name}")
            chosen.add(name)
            for used in {n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)}:
                if used in defs and used not in chosen:
                    todo.append(used)
                elif used in imports and imports[used] not in needed:
                    needed.append(imports[used])
        hlines = source.splitlines()
        nodes = sorted(
            {id(defs[n]): defs[n] for n in chosen}.values(), key=lambda n: n.lineno
        )
        previous = None
        for node in nodes:
            segment = _segment(hlines, node)
            if previous and _first_line(hlines, node) == previous.end_lineno + 1:
                sections[-1] += "\n" + segment  # a block of definitions stays one
            else:
                sections.append(segment)
            previous = node
    statements = ["from __future__ import annotations"]
    for node, alias in needed:
        if isinstance(node, ast.Import):
            statements.append(f"import {alias_text(alias)}")
        else:
            statements.append(f"from {_from_text(node)} import {alias_text(alias)}")
    head = "\n".join([TEST_COMMON_DOC, "", *statements])
    return "\n\n\n".join([head, *sections]) + "\n"


def sota_files(project: Project) -> tuple[dict[str, str], list]:
    """``sota-implementations/acer/`` from :data:`SOTA_SOURCE`, the run scripts
    for ``sota-check/`` and the edits that list them and the test_sota entries."""
    source = ROOT / SOTA_SOURCE
    rewriter = Rewriter(project, "sota")
    part = len(SERIES)
    out, edits, scripts = {}, [], []
    entries_file, entries_name = SOTA_ENTRIES
    for path in sorted(source.iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        where = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if path.name == entries_file:
            edits.append(sota_entries_edit(text, entries_name, where, part))
            continue
        if path.suffix == ".py":
            text = merge_imports(rewriter.imports(text, None, where))
        text = rewriter.references(text, where)
        if fnmatch.fnmatch(path.name, "run_*.sh"):
            out[f"{SOTA_CHECK['dir']}/{path.name}"] = text
            scripts.append(path.name)
        else:
            out[f"{SOTA_DIR}/{path.name}"] = text
    if not scripts or not edits:
        raise GenerationError(
            f"{SOTA_SOURCE} needs run_*.sh scripts and {entries_file} "
            f"(see SOTA_ENTRIES)"
        )
    edits.append(LinesEdit(SOTA_CHECK["list"], SOTA_CHECK["after"], scripts, part))
    lines = sum(
        text.count("\n") for path, text in out.items() if path.startswith(SOTA_DIR)
    )
    if lines > SOTA_MAX_LINES:
        raise GenerationError(
            f"{SOTA_DIR} would hold {lines} lines, more than {SOTA_MAX_LINES}"
        )
    return out, edits


def sota_entries_edit(text: str, name: str, where: str, part: int) -> DictEntriesEdit:
    """The entries of the literal dict ``name`` of ``text``, as written, for the
    commands dict of TorchRL's test_sota.py."""
    tree = ast.parse(text, where)
    node = next((n for n in tree.body if name in _assigned_names(n)), None)
    if node is None or not isinstance(node.value, ast.Dict) or not node.value.keys:
        raise GenerationError(f"{where}: no literal dict {name} (see SOTA_ENTRIES)")
    lines = text.splitlines()
    first = node.value.keys[0].lineno
    last = node.value.values[-1].end_lineno
    entries = "\n".join(lines[first - 1 : last]) + "\n"
    return DictEntriesEdit(
        TEST_SOTA["path"], TEST_SOTA["dict"], TEST_SOTA["after"], entries, part
    )


# -- writing -----------------------------------------------------------------------


def write_out(generated: Generated, out: Path) -> list[str]:
    written = []
    for path, text in sorted(generated.new_files.items()):
        _write(out / path, text)
        written.append(path)
    manifest, used = [], set()
    for edit in generated.edits:
        fragment, n = edit.path, 1
        while fragment in used:  # a file edited more than once (by --series part)
            n += 1
            fragment = f"{edit.path}.{n}"
        used.add(fragment)
        _write(out / "_edits" / fragment, edit.fragment())
        manifest.append(
            {
                "path": edit.path,
                "fragment": fragment,
                "kind": edit.kind,
                "module": edit.module,
            }
        )
        written.append(f"_edits/{fragment}")
    _write(out / "_edits" / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return written


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Checkout:
    """A TorchRL checkout and the content of its files at ``commit``."""

    def __init__(self, root: Path, commit: str):
        self.root = root
        self.commit = commit
        self.git = (root / ".git").exists()
        found = self._git("rev-parse", "--verify", "-q", f"{commit}^{{commit}}")
        if self.git and found.returncode:
            raise GenerationError(
                f"{root} does not have the commit {commit}: fetch it, or pass "
                f"--commit HEAD to target the checked-out commit"
            )
        if not (root / "torchrl" / "objectives" / "__init__.py").is_file():
            raise GenerationError(f"{root} is not a TorchRL checkout")

    def _git(self, *args):
        return subprocess.run(
            ["git", "-C", str(self.root), *args], capture_output=True, text=True
        )

    def base(self, path: str) -> str | None:
        """The file at the commit (the working file without git), or ``None``."""
        if not self.git:
            file = self.root / path
            return file.read_text() if file.is_file() else None
        shown = self._git("show", f"{self.commit}:{path}")
        return shown.stdout if shown.returncode == 0 else None

    def current(self, path: str) -> str | None:
        file = self.root / path
        return file.read_text() if file.is_file() else None


def license_header(checkout: Checkout) -> str:
    """The comment block TorchRL's files start with, read from the checkout."""
    lines = []
    for line in (checkout.base("torchrl/__init__.py") or "").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n" if lines else ""


def changes(generated: Generated, checkout: Checkout, upto: int | None = None):
    """``(path, text at the commit or None, new text)`` for every file (``upto``:
    of the --series parts up to that one only)."""
    header = license_header(checkout)
    result = []
    for path, text in sorted(generated.new_files.items()):
        if upto is not None and generated.parts[path] > upto:
            continue
        if checkout.base(path) is not None:
            raise GenerationError(
                f"{path} already exists in TorchRL at {checkout.commit}"
            )
        for part, early in generated.early.get(path, ()):
            if upto is not None and upto <= part:
                text = early
                break
        if path.endswith(".py") and not text.startswith(header):
            text = header + text
        result.append((path, None, text))
    by_path: dict[str, list] = {}
    for edit in generated.edits:
        if upto is None or edit.part <= upto:
            by_path.setdefault(edit.path, []).append(edit)
    for path, edits in sorted(by_path.items()):
        base = checkout.base(path)
        if base is None:
            raise GenerationError(f"{path} is not in the checkout at {checkout.commit}")
        text = base
        for edit in edits:
            text = edit.apply(text)
        if path.endswith(".py"):
            text = sort_imports(text)  # TorchRL's own order, blank lines kept
        result.append((path, base, text))
    return result


def write_series(generated: Generated, checkout: Checkout, out: Path) -> list[Path]:
    """:data:`SERIES` as ``git format-patch`` files in ``out``: the parts committed
    one after the other on the commit, in a throwaway clone of the checkout."""
    if not checkout.git:
        raise GenerationError("--series needs a git checkout")

    def git(*args, cwd):
        done = subprocess.run(
            ["git", "-C", str(cwd), *args], capture_output=True, text=True
        )
        if done.returncode:
            raise GenerationError(f"git {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    identity = []
    for key, default in (
        ("user.name", "torchrl-acer"),
        ("user.email", "torchrl-acer@users.noreply.github.com"),
    ):
        value = subprocess.run(
            ["git", "-C", str(ROOT), "config", key], capture_output=True, text=True
        ).stdout.strip()
        identity += ["-c", f"{key}={value or default}"]
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "rl"
        git(
            "clone",
            "-q",
            "--shared",
            "--no-checkout",
            str(checkout.root),
            str(clone),
            cwd=tmp,
        )
        git("checkout", "-q", "--detach", checkout.commit, cwd=clone)
        for part, (subject, body) in enumerate(SERIES, 1):
            files = changes(generated, checkout, upto=part)
            for path, _, new in files:
                _write(clone / path, new)
            git("add", "--", *(path for path, _, _ in files), cwd=clone)
            git(*identity, "commit", "-q", "-m", subject, "-m", body, cwd=clone)
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.patch"):
            old.unlink()
        names = git(
            "format-patch",
            "--no-signature",
            "-o",
            str(out.resolve()),
            f"{checkout.commit}..HEAD",
            cwd=clone,
        ).split()
    return [Path(name) for name in names]


def unified_diff(path: str, old: str | None, new: str) -> str:
    if old == new:
        return ""
    out = [f"diff --git a/{path} b/{path}\n"]
    if old is None:
        out += ["new file mode 100644\n", "--- /dev/null\n", f"+++ b/{path}\n"]
    else:
        out += [f"--- a/{path}\n", f"+++ b/{path}\n"]
    a = old.splitlines(keepends=True) if old else []
    for line in list(difflib.unified_diff(a, new.splitlines(keepends=True)))[2:]:
        out.append(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        )
    return "".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Write torchrl-acer's core, tests, docs entries and sota folder "
        "into a TorchRL checkout (see tools/README.md)."
    )
    parser.add_argument("checkout", nargs="?", type=Path, help="a pytorch/rl checkout")
    parser.add_argument("--out", type=Path, help="write only the new files into OUT")
    parser.add_argument("--patch", help="write a unified diff to PATCH ('-': stdout)")
    parser.add_argument(
        "--no-write",
        action="store_true",
        help="with --patch: leave the checkout as it is",
    )
    parser.add_argument(
        "--commit",
        default=PINNED_COMMIT,
        help=f"the TorchRL commit the edits start from (default {PINNED_COMMIT[:12]})",
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite local changes in the checkout"
    )
    parser.add_argument(
        "--series",
        type=Path,
        metavar="DIR",
        help="write the contribution as ordered `git format-patch` files into DIR "
        "(Retrace; the ACER loss and network; the trainer and sota folder), "
        "leaving the checkout as it is",
    )
    args = parser.parse_args(argv)
    if (args.checkout is None) == (args.out is None):
        parser.error("give a TorchRL checkout or --out DIR (not both)")
    if (args.patch or args.series) and args.checkout is None:
        parser.error("--patch and --series need a checkout")
    if args.series and (args.patch or args.no_write or args.force):
        parser.error("--series writes nothing else: no --patch, --no-write, --force")
    if args.no_write and not args.patch:
        parser.error("--no-write needs --patch")
    log = sys.stderr if args.patch == "-" else sys.stdout
    try:
        generated = generate()
        for warning in generated.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if args.out:
            written = write_out(generated, args.out)
            print(f"wrote {len(written)} files into {args.out}", file=log)
            for path in written:
                print(f"  {path}", file=log)
            return 0
        checkout = Checkout(args.checkout.resolve(), args.commit)
        if args.series:
            written = write_series(generated, checkout, args.series)
            print(f"wrote {len(written)} patches into {args.series}:", file=log)
            for path in written:
                print(f"  {path.name}", file=log)
            return 0
        files = changes(generated, checkout)
        if not args.no_write:
            conflicts = [
                path
                for path, base, new in files
                if base is not None and checkout.current(path) not in (base, new)
            ]
            if conflicts and not args.force:
                raise GenerationError(
                    "local changes in the checkout (from an earlier run, or by hand); "
                    "restore them with `git checkout -- PATH`, or pass --force:\n  "
                    + "\n  ".join(conflicts)
                )
            for path, _, new in files:
                _write(checkout.root / path, new)
            print(f"wrote {len(files)} files into {checkout.root}:", file=log)
            for path, base, _ in files:
                print(f"  {'new   ' if base is None else 'edited'} {path}", file=log)
        if args.patch:
            diff = "".join(unified_diff(path, base, new) for path, base, new in files)
            if args.patch == "-":
                sys.stdout.write(diff)
            else:
                Path(args.patch).write_text(diff)
                print(f"wrote the patch to {args.patch}", file=log)
    except GenerationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
