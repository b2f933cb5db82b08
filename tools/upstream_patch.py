#!/usr/bin/env python
"""Write torchrl-acer's core into a TorchRL checkout, as an upstream contribution.

    python tools/upstream_patch.py PATH_TO_TORCHRL                 # edit the checkout
    python tools/upstream_patch.py PATH_TO_TORCHRL --patch acer.patch [--no-write]
    python tools/upstream_patch.py --out DIR                       # new files only

Everything is read from this project at run time: the core modules (those that the
``__all__`` of ``torchrl_acer/objectives``, ``objectives/value`` and ``modules``
reach, with every module they import), the upstream tests in ``tests/upstream/``
(with the helpers they import from ``tests/builders.py`` and ``tests/reference.py``
inlined) and the example scripts, their configs and local modules for
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
CORE_FLOORS = ("objectives", "modules")
PACKAGE_TARGETS = {
    "torchrl_acer.objectives": "torchrl.objectives",
    "torchrl_acer.objectives.value": "torchrl.objectives.value",
    "torchrl_acer.modules": "torchrl.modules",
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
)

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
    "tests/upstream/test_retrace_upstream.py": "test/objectives/test_retrace.py",
}
TEST_HELPERS = ("builders", "reference")  # tests/<name>.py, inlined where imported

# sota-implementations: the example scripts (with their Hydra configs and the local
# modules they import); the application modules they use (trainer, environments,
# model builders, ...) are copied into a package of the folder.
SOTA_DIR = "sota-implementations/acer"
SOTA_SCRIPTS = ("examples/acer_atari.py", "examples/acer_mujoco.py")
VENDOR_PACKAGE = "acer_utils"

LINE_LENGTH = 88
REFERENCE = re.compile(r"\btorchrl_acer(?:\.[A-Za-z_]\w*)*")
# this project's folders that have no counterpart upstream
LOCAL_PATH = re.compile(r"(?<![\w/.-])(?:bench|examples|tests|tools)/[\w./*-]*\w")
# words that speak of this project as a package of its own
PROJECT_WORDS = re.compile(r"\bthis (?:package|project)\b|\(README\b[^)]*\)")
# in the sota scripts' prose: asides that point at this project's README sections,
# benchmarks or tests, which the scripts do not carry upstream (the sentence reads
# whole without them)
PROJECT_ASIDES = (
    (re.compile(r' ?\(README, "[^"]*"\)'), ""),
    (re.compile(r" ?\(``(?:bench|tests|tools)/[\w./-]+``\)"), ""),
    (re.compile(r",\s*``(?:bench|tests|tools)/[\w./-]+``\)"), ")"),
    (re.compile(r"\bthis package\b"), "this code"),
)


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
        self.core = self.closure(set(self.exports.values()), core=True)

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
        modules defining them), at any depth of its code."""
        path = module_file(module)
        package = path.name == "__init__.py"
        found = set()
        for node in ast.walk(self.tree(path)):
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

    # -- the sota folder's copies of application modules ----------------------------

    def vendored_names(self, modules: set[str]) -> dict[str, str]:
        names = {}
        for module in sorted(modules):
            short = module.split(".")[-1]
            if short in names.values():
                short = "_".join(module.split(".")[1:])
            names[module] = short
        return names


# -- rewriting ---------------------------------------------------------------------


class Rewriter:
    """Rewrites ``torchrl_acer`` imports and dotted references for one kind of file:
    ``"core"`` (a contributed module: imports from defining modules), ``"test"``
    (imports from the public homes) or ``"sota"`` (as tests, and application
    modules from the folder's package ``VENDOR_PACKAGE``)."""

    def __init__(self, project: Project, kind: str, vendored: dict[str, str] = None):
        self.project = project
        self.kind = kind
        self.vendored = vendored or {}

    def vendored_module(self, module: str) -> str | None:
        if module in self.vendored:
            return f"{VENDOR_PACKAGE}.{self.vendored[module]}"
        return None

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
            if self.kind == "core" and not public:
                return self.project.target_module(module), defined
            return self.project.public_home(module, defined), defined
        vendored = self.vendored_module(module)
        if vendored:
            return vendored, defined
        raise GenerationError(
            f"{where}: imports {source}.{name}, which is not part of the contribution"
        )

    def map_module(self, module: str, where: str) -> str:
        if module in self.project.core:
            return self.project.target_module(module)
        if module in PACKAGE_TARGETS:
            return PACKAGE_TARGETS[module]
        vendored = self.vendored_module(module)
        if vendored:
            return vendored
        if self.kind == "sota" and module == f"{PACKAGE}.training":
            return VENDOR_PACKAGE
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

    def apply(self, text: str) -> str:
        for entry, after, dotted in self.entries:
            text = add_rst_entry(text, entry, after, dotted, self.path)
        return text

    def fragment(self) -> str:
        lines = [f".. Entries added to the autosummary lists of {self.path}:", ""]
        lines += [f"    {entry}  (after {after})" for entry, after, _ in self.entries]
        return "\n".join(lines) + "\n"


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
    last = _top_imports(tree)[-1]
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
    edits: list[EnumMemberEdit | PyEdit | RstEdit] = field(
        default_factory=list
    )  # in order
    warnings: list[str] = field(default_factory=list)


def generate() -> Generated:
    project = Project()
    out = Generated()
    core = Rewriter(project, "core")
    # first: the modules written below import the member it adds
    out.edits.append(value_estimator_edit())

    appended: list[PyEdit] = []
    for module in sorted(project.core):
        path = module_file(module)
        where = path.relative_to(ROOT).as_posix()
        text = core.references(core.imports(path.read_text(), module, where), where)
        if project.appended(module):
            appended.append(appended_edit(project, module, text))
        else:
            out.new_files[project.target(module)] = text
    out.edits += appended

    # exports: each new module's public names, from its folder's __init__ files
    # (the outer ones import them from the subpackage, as TorchRL's do)
    exports: dict[str, dict[str, list[str]]] = {}  # __init__ -> source -> names
    for name, module in sorted(project.exports.items()):
        if project.appended(module):
            continue
        target = project.target(module)
        for init in EXPORT_INITS.get(posixpath.dirname(target), ()):
            package = posixpath.dirname(init)
            child = target[len(package) + 1 :].split("/")[0].removesuffix(".py")
            exports.setdefault(init, {}).setdefault(f".{child}", []).append(name)
    for init in sorted(exports, key=lambda path: -path.count("/")):  # inner first
        out.edits.append(
            PyEdit(
                init,
                posixpath.dirname(init).replace("/", "."),
                imports=list(exports[init].items()),
                all_names=[n for names in exports[init].values() for n in names],
            )
        )
    out.edits += doc_edits(project, out.warnings)

    for source, target in TEST_TARGETS.items():
        out.new_files[target] = test_module(project, source)
    out.new_files.update(sota_files(project))
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
    edits: dict[str, RstEdit] = {}
    documented = set()
    for entry, path, after in DOC_ENTRIES:
        name = entry.split(".")[-1]
        module = project.exports.get(name)
        if module is None:
            warnings.append(f"docs: {name} is no longer exported; entry skipped")
            continue
        documented.add(name)
        dotted = f"{project.public_home(module, name)}.{name}"
        edits.setdefault(path, RstEdit(path)).entries.append((entry, after, dotted))
    for name in sorted(set(project.exports) - documented):
        warnings.append(f"docs: no rst entry for {name} (add one to DOC_ENTRIES)")
    return list(edits.values())


def test_module(project: Project, source: str) -> str:
    text = inline_helpers((ROOT / source).read_text(), source)
    rewriter = Rewriter(project, "test")
    text = merge_imports(rewriter.imports(text, None, source))
    return rewriter.references(text, source)


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


def inline_helpers(text: str, where: str) -> str:
    """Replaces ``from builders import ...`` and ``from reference import ...`` with
    the definitions they name (and those these use), and the imports those need."""
    tree = ast.parse(text, where)
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
        return text
    local = set(_definitions(tree)) | {
        name
        for node in _top_imports(tree)
        if getattr(node, "module", None) not in TEST_HELPERS
        for name in bound_names(node)
    }
    sections, needed = [], []
    for helper, names in requested.items():
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
                raise GenerationError(f"{where}: tests/{helper}.py has no {name}")
            chosen.add(name)
            for used in {n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)}:
                if used in defs and used not in chosen:
                    todo.append(used)
                elif used in imports and imports[used] not in needed:
                    needed.append(imports[used])
        clash = chosen & local
        if clash:
            raise GenerationError(
                f"{where} defines {sorted(clash)} as tests/{helper}.py does"
            )
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
    for start, end in sorted(removed, reverse=True):
        del lines[start - 1 : end]
    text = "\n".join(lines) + "\n"
    for node, alias in needed:
        if isinstance(node, ast.Import):
            statement = f"import {alias_text(alias)}"
            text = add_import_statement(text, statement)
        elif (alias.asname or alias.name) not in _bound_at_top(ast.parse(text)):
            text = add_import(text, _from_text(node), [alias_text(alias)])
    lines = text.splitlines()
    last = _top_imports(ast.parse(text))[-1].end_lineno
    while last < len(lines) and not lines[last].strip():
        del lines[last]
    helpers = "\n\n\n".join(sections)
    lines[last:last] = ["", "", helpers, "", ""]
    return "\n".join(lines) + "\n"


def sota_files(project: Project) -> dict[str, str]:
    """The example scripts, their configs and local modules, and the application
    modules they use, for ``sota-implementations/acer/``."""
    examples = ROOT / "examples"
    files: dict[Path, str] = {}  # file under examples/ -> its name in the folder
    todo = [ROOT / s for s in SOTA_SCRIPTS]
    used: set[str] = set()
    while todo:
        path = todo.pop()
        if path in files:
            continue
        if not path.is_file():
            raise GenerationError(f"no {path.relative_to(ROOT)} (see SOTA_SCRIPTS)")
        files[path] = path.name
        tree = ast.parse(path.read_text(), str(path))
        config = hydra_config(tree, path)
        if config:
            files[config] = config.name
            for group in config_groups(config):
                files[group] = group.relative_to(examples).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                if is_ours(node.module):
                    used |= {
                        project.resolve(node.module, a.name)[0] for a in node.names
                    }
                elif (examples / f"{node.module}.py").is_file():
                    todo.append(examples / f"{node.module}.py")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if (examples / f"{alias.name}.py").is_file():
                        todo.append(examples / f"{alias.name}.py")
    application = project.closure({m for m in used if m not in project.core}, False)
    application -= project.core
    vendored = project.vendored_names(application)
    rewriter = Rewriter(project, "sota", vendored)
    copied = {p.name for p in files}

    def rewrite(text, current, where):
        if where.endswith(".py"):
            text = merge_imports(rewriter.imports(text, current, where))
        text = rewriter.references(text, where)
        for pattern, replacement in PROJECT_ASIDES:
            text = pattern.sub(replacement, text)
        return re.sub(
            r"\bexamples/([\w.*?-]+)",
            lambda m: (
                f"{SOTA_DIR}/{m.group(1)}"
                if fnmatch.filter(copied, m.group(1))
                else m.group(0)
            ),
            text,
        )

    out = {}
    for path, name in files.items():
        where = path.relative_to(ROOT).as_posix()
        out[f"{SOTA_DIR}/{name}"] = rewrite(path.read_text(), None, where)
    for module, short in sorted(vendored.items()):
        path = module_file(module)
        if path.name == "__init__.py":
            continue
        where = path.relative_to(ROOT).as_posix()
        text = rewrite(path.read_text(), module, where)
        out[f"{SOTA_DIR}/{VENDOR_PACKAGE}/{short}.py"] = text
    out[f"{SOTA_DIR}/{VENDOR_PACKAGE}/__init__.py"] = (
        '"""The training loop, environments and networks the ACER scripts use."""\n'
    )
    out[f"{SOTA_DIR}/README.md"] = sota_readme(files)
    return out


def config_groups(config: Path) -> list[Path]:
    """The config-group files a Hydra config's ``defaults`` list composes from its
    own folder (``- run: default`` -> ``run/default.yaml``; ``override`` entries
    name Hydra's own groups)."""
    defaults = re.search(
        r"^defaults:\n((?:[ \t]+-[^\n]*\n?)+)", config.read_text(), re.M
    )
    if defaults is None:
        return []
    found = []
    for group, name in re.findall(
        r"^\s+-\s+([\w/]+):\s*(\w+)", defaults.group(1), re.M
    ):
        path = config.parent / group / f"{name}.yaml"
        if path.is_file():
            found.append(path)
    return found


def hydra_config(tree: ast.Module, script: Path) -> Path | None:
    for node in ast.walk(tree):
        for decorator in getattr(node, "decorator_list", []):
            if (
                isinstance(decorator, ast.Call)
                and ast.unparse(decorator.func) == "hydra.main"
            ):
                kwargs = {k.arg: ast.literal_eval(k.value) for k in decorator.keywords}
                folder = script.parent / (kwargs.get("config_path") or ".")
                config = (folder / f"{kwargs['config_name']}.yaml").resolve()
                if not config.is_file():
                    raise GenerationError(f"{script.name}: no config {config}")
                return config
    return None


def sota_readme(files: dict[Path, str]) -> str:
    scripts = [
        name for path, name in files.items() if path in {ROOT / s for s in SOTA_SCRIPTS}
    ]
    lines = [
        "## ACER: Actor-Critic with Experience Replay",
        "",
        "Scripts that train ACER ([Wang et al. 2017](https://arxiv.org/abs/1611.01224)) "
        "with `torchrl.objectives.ACERLoss` and the Retrace estimator "
        "(`torchrl.objectives.value.RetraceEstimator`).",
        "",
        "Each script reads its settings from the `config_*.yaml` file next to it "
        "(Hydra: any setting can be overridden on the command line); the environments "
        f"and networks are in the `utils_*.py` files, the training loop in `{VENDOR_PACKAGE}/`.",
        "",
        "```bash",
        *(f"python {name}" for name in scripts),
        "```",
        "",
    ]
    return "\n".join(lines)


# -- writing -----------------------------------------------------------------------


def write_out(generated: Generated, out: Path) -> list[str]:
    written = []
    for path, text in sorted(generated.new_files.items()):
        _write(out / path, text)
        written.append(path)
    manifest = []
    for edit in generated.edits:
        _write(out / "_edits" / edit.path, edit.fragment())
        manifest.append(
            {
                "path": edit.path,
                "kind": "rst" if isinstance(edit, RstEdit) else "python",
                "module": None if isinstance(edit, RstEdit) else edit.module,
            }
        )
        written.append(f"_edits/{edit.path}")
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


def changes(generated: Generated, checkout: Checkout):
    """``(path, text at the commit or None, new text)`` for every file."""
    header = license_header(checkout)
    result = []
    for path, text in sorted(generated.new_files.items()):
        if checkout.base(path) is not None:
            raise GenerationError(
                f"{path} already exists in TorchRL at {checkout.commit}"
            )
        result.append((path, None, header + text if path.endswith(".py") else text))
    by_path: dict[str, list] = {}
    for edit in generated.edits:
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
    args = parser.parse_args(argv)
    if (args.checkout is None) == (args.out is None):
        parser.error("give a TorchRL checkout or --out DIR (not both)")
    if args.patch and args.checkout is None:
        parser.error("--patch needs a checkout")
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
