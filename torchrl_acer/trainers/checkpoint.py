"""Checkpoints on :class:`torchrl.checkpoint.Checkpoint`, with torchrl-acer's
guarantees (:class:`ACERCheckpoint`), and the checkpoint pieces a run needs: a
replay's contents (:class:`ReplayContents`) and saves on a clock
(:class:`SaveEvery`).

Everything rides on TorchRL's extension points: a subclass, a state-dict
adapter that checks what it saves (:class:`FiniteStateDictAdapter`, whose payload
a plain :class:`~torchrl.checkpoint.Checkpoint` reads) and the manifest's
``metadata``, under the key ``"torchrl_acer"``. One is private: the adapter TorchRL
infers is swapped for the checked one in ``_resolve_adapter`` (TorchRL has no
public hook there, and choosing it at ``register`` ignored ``register_adapter``).
The gaps in TorchRL are written up as patches in ``upstream/torchrl/``.
"""

from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import os
import struct
import subprocess
import time
import uuid
import zipfile
from collections.abc import Collection, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl._utils import logger as torchrl_logger
from torchrl.checkpoint import (
    Checkpoint,
    CheckpointAdapter,
    CheckpointLoadResult,
    CheckpointOptions,
    StateDictCheckpointAdapter,
)
from torchrl.checkpoint import CheckpointError as _TorchRLCheckpointError
from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorStorage
from torchrl.trainers import Trainer, TrainerHookBase

from torchrl_acer.trainers.hooks import first_few, nonfinite_counts
from torchrl_acer.training.refusal import Refusal

__all__ = [
    "ACERCheckpoint",
    "ACERCheckpointError",
    "FORMAT_VERSION",
    "FiniteStateDictAdapter",
    "NonFiniteCheckpointError",
    "ReplayContents",
    "SAFE_CONFIG_CHANGES",
    "SaveEvery",
]

#: Version of what :class:`ACERCheckpoint` adds to TorchRL's manifest (the
#: ``"torchrl_acer"`` metadata). The single-file format was version 1 of another
#: format.
FORMAT_VERSION = 1
METADATA_KEY = "torchrl_acer"
MANIFEST_NAME = "manifest.json"
MANIFEST_DIGEST_NAME = "manifest.json.sha256"
_CHUNK = 1 << 22


class ACERCheckpointError(_TorchRLCheckpointError, Refusal, ValueError):
    """A checkpoint that cannot be saved or used; the message names the path.

    A :class:`~torchrl_acer.training.refusal.Refusal`: the examples end with its
    message alone.
    """


class NonFiniteCheckpointError(ACERCheckpointError):
    """A save refused because the state holds non-finite numbers."""


# -- state, checked -----------------------------------------------------------


class _Taken:
    """Takes the state dict TorchRL's adapter reads, instead of loading it."""

    state = None

    def load_state_dict(self, state):
        self.state = state


class FiniteStateDictAdapter(StateDictCheckpointAdapter):
    """TorchRL's state-dict adapter (same ``adapter_id``, same payload) that records
    the non-finite floating tensors of what it saves.

    :class:`ACERCheckpoint` refuses the save when one recorded any. Pass one
    explicitly for another payload, e.g.
    ``FiniteStateDictAdapter(payload_format="torch", weights_only=False)`` for an
    environment's state (:mod:`torchrl_acer.training.env_state`), which holds
    tensordicts: TorchRL's TensorDict payload takes plain containers only, and
    ``torch.load(weights_only=True)`` refuses them.

    Args:
        payload_format: as :class:`~torchrl.checkpoint.StateDictCheckpointAdapter`.
        weights_only: for a ``"torch"`` payload, the ``weights_only`` of this
            component's :func:`torch.load` (a load passes ``True``). ``False``
            unpickles: only for checkpoints you trust (:class:`ACERCheckpoint`
            has verified the file's sha256).
        check_finite: record the non-finite entries (refusing the save).
            ``False`` for state where they are legitimate: an environment's
            running episode return after a NaN reward that training dropped.
            Defaults to ``True``.
    """

    name: str | None = None
    nonfinite: list[str] | None = None

    def __init__(
        self,
        payload_format: str = "directory",
        *,
        weights_only: bool | None = None,
        check_finite: bool = True,
    ) -> None:
        super().__init__(payload_format)
        self.weights_only = weights_only
        self.check_finite = check_finite

    def bound(self, name: str, sink: list[str]) -> FiniteStateDictAdapter:
        """A copy that records the entries of component ``name`` in ``sink``."""
        adapter = copy.copy(self)
        adapter.name, adapter.nonfinite = name, sink
        return adapter

    def save(self, component, path, *, args, kwargs):
        state = super().save(component, path, args=args, kwargs=kwargs)
        if self.nonfinite is not None and self.check_finite:
            self.nonfinite += list(nonfinite_counts(state, self.name or ""))
        return state

    def load(self, component, path, *, tensor_load_kwargs, **rest):
        # (TorchRL's other payloads accept and ignore weights_only)
        if self.weights_only is not None:
            tensor_load_kwargs = {
                **tensor_load_kwargs,
                "weights_only": self.weights_only,
            }
        return super().load(
            component, path, tensor_load_kwargs=tensor_load_kwargs, **rest
        )

    def read(self, path: Path) -> Any:
        """The state dict saved below ``path``, on the CPU, loaded into nothing."""
        taken = _Taken()
        self.load(
            taken,
            path,
            map_location="cpu",
            tensor_load_kwargs={},
            args=(),
            kwargs={},
        )
        return taken.state


# -- files: hashed, synced, published -------------------------------------------


def _sha256(file) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := file.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _fsync(path: Path) -> None:
    """fsyncs a file, or a folder where the system allows it."""
    folder = path.is_dir()
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if folder:  # not possible everywhere (Windows); the rename is done
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not folder:
            raise
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsyncs every file and folder below ``root``, and ``root``: all of it is on
    disk before it is renamed into place."""
    for path in [*root.rglob("*"), root]:
        if path.is_file() or _is_folder(path):
            _fsync(path)


def _previous_name(destination: Path) -> str:
    return f".{destination.name}.previous-"


def _is_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _publish(source: Path, destination: Path) -> None:
    """Renames ``source`` to ``destination`` durably: a file over a file in one
    rename, over a folder after moving it aside to ``.NAME.previous-*`` (where a
    kill between the two renames leaves it, and :meth:`ACERCheckpoint.load` looks
    for it)."""
    parent = destination.parent
    if not destination.exists() or (source.is_file() and not _is_folder(destination)):
        os.replace(source, destination)
    else:
        previous = parent / f"{_previous_name(destination)}{uuid.uuid4().hex}"
        os.replace(destination, previous)
        try:
            os.replace(source, destination)
        except BaseException:
            os.replace(previous, destination)
            raise
        _fsync(parent)
        Checkpoint._remove_path(previous)
    _fsync(parent)


@contextmanager
def _opener(source: Path):
    """``open(relative_path)`` for the files of a checkpoint folder or archive."""
    if source.is_dir():
        yield lambda name: open(source / name, "rb")
        return
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError) as err:
        raise ACERCheckpointError(
            f"{source} is not a readable checkpoint archive (truncated or "
            f"corrupted?): {err}"
        ) from None
    with archive:
        yield archive.open


# -- the run's config, compared on load -----------------------------------------

#: Config keys (``fnmatch`` patterns) a resumed run may change freely: how long
#: to train, what is logged, evaluated and saved, and where and how fast the same
#: computation runs. Any other difference is refused unless allowed explicitly.
SAFE_CONFIG_CHANGES = (
    "collector.total_frames",
    "logger.*",
    "eval.*",
    "checkpoint.*",
    "health.*",
    "resume",
    "resume_*",
    "threads",
    "device",
    "compile",
    "loss.check_values",  # checks the batch, changes nothing it computes
    "model.initial_scale",  # initialization only: a resumed run loads its parameters
    "env.num_threads",
    # where the environments run; a resume then starts fresh episodes
    "collector.backend",
    "collector.num_workers",
    "collector.sync",
    "collector.worker_start_timeout",
    "ray.*",
)


def _flatten(tree, prefix="") -> dict:
    out = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.update(_flatten(value, name))
            else:
                out[name] = value
    return out


def _config_change(key: str, old, new) -> str:
    return f"  {key}: {old!r} in the checkpoint, {new!r} now"


def state_dict_mismatches(saved, current, prefix: str = "") -> list[str]:
    """What keeps ``saved`` (a flat state dict) from loading strictly into the
    object whose state dict is ``current``: ``missing KEY``, ``unexpected KEY``
    and ``KEY: SHAPE in the checkpoint, SHAPE here``, each key after ``prefix``."""
    problems = [f"missing {prefix}{k}" for k in current if k not in saved]
    problems += [f"unexpected {prefix}{k}" for k in saved if k not in current]
    problems += [
        f"{prefix}{k}: {tuple(saved[k].shape)} in the checkpoint, "
        f"{tuple(current[k].shape)} here"
        for k in current
        if k in saved
        and isinstance(current[k], torch.Tensor)
        and isinstance(saved[k], torch.Tensor)
        and saved[k].shape != current[k].shape
    ]
    return problems


# -- versions and the old format ------------------------------------------------


@cache
def _git_commit() -> str | None:
    """The commit of the checkout this package runs from, ``-dirty`` if it has
    uncommitted changes; ``None`` outside a git checkout (best effort)."""
    # --exclude=*: the commit itself, never a tag's name
    command = "git describe --always --dirty --abbrev=40 --exclude=*".split()
    try:
        here = Path(__file__).resolve().parent
        done = subprocess.run(
            command, capture_output=True, text=True, check=True, cwd=here, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


@cache
def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torchrl-acer", "torch", "torchrl", "tensordict"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


# The single-file format this one replaced: a marker, two little-endian uint64
# (header and payload lengths), a sha256, then the JSON header and the payload.
LEGACY_MAGIC = b"torchrl-acer checkpoint\n"
_LEGACY_FIXED = struct.Struct("<QQ32s")


def _single_file_refusal(path: Path) -> ACERCheckpointError | None:
    """The refusal of a file of the single-file format, naming its format version;
    ``None`` for any other path."""
    if not path.is_file():
        return None
    with open(path, "rb") as file:
        if file.read(len(LEGACY_MAGIC)) != LEGACY_MAGIC:
            return None
        fixed = file.read(_LEGACY_FIXED.size)
        try:
            if len(fixed) < _LEGACY_FIXED.size:
                raise ValueError("truncated before its header")
            header = json.loads(file.read(_LEGACY_FIXED.unpack(fixed)[0]))
            written = (
                f"checkpoint format {header.get('format_version')!r}, written by "
                f"torchrl-acer {header.get('library_version')} at "
                f"{header.get('frames')} frames"
            )
        except ValueError as err:
            written = f"an unreadable header ({err})"
    return ACERCheckpointError(
        f"{path} is a single-file torchrl-acer checkpoint ({written}). It cannot "
        f"be loaded by this version, which reads torchrl.checkpoint checkpoints "
        f"(format {FORMAT_VERSION} of torchrl-acer's manifest metadata): resume it "
        f"with a torchrl-acer before this format's, or start anew"
    )


# -- the checkpoint -------------------------------------------------------------


class ACERCheckpoint(Checkpoint):
    """A :class:`torchrl.checkpoint.Checkpoint` with torchrl-acer's guarantees.

    Pass it as ``Trainer(checkpoint=...)``, with or without a
    :class:`~torchrl.checkpoint.CheckpointRotation`.

    - **Atomic and durable.** A checkpoint is written under a temporary name,
      every file and folder fsynced, then renamed into place and its parent
      fsynced: a kill while it is written leaves the previous one. (TorchRL
      fsyncs nothing, and replaces a folder by moving the old one aside first:
      after a kill between the two renames, :meth:`load` names where the
      previous one is. An ``"archive"`` is replaced in one rename.)
    - **Verified before anything loads** (:meth:`verify`). The manifest records
      the size and sha256 of every component file, ``manifest.json.sha256`` the
      manifest's own: a truncated, corrupted or missing file is refused, named.
    - **The run's config**, stored and compared on load: settings that differ
      outside :data:`SAFE_CONFIG_CHANGES` are refused, listed, unless allowed
      (``allow_config_change``) or forced (``force``).
    - **Strict loading, named.** Each module's saved parameters are compared
      with its own, and each optimizer's state with its parameters: keys
      missing, unexpected or of another shape are refused, all at once, before
      anything loads.
    - **Nothing saved from non-finite numbers**: a save whose state-dict
      components hold a NaN or an infinity is refused, naming the entries.
    - **Versions**: of torchrl-acer, torch, torchrl and tensordict, and the git
      commit, in the manifest.
    - **The old format is named**: a ``last.pt`` of the single-file format is
      refused with its format version.

    Args:
        config: the run's resolved config (JSON-compatible, nested mappings), stored
            in every checkpoint and compared on load. ``None``: neither.
        allow_config_change: dotted config keys or ``fnmatch`` patterns that may
            differ on load beyond the safe ones.
        force: load whatever settings differ.
        metadata: JSON-compatible entries added to every save's manifest metadata
            (a save's own ``metadata`` wins), such as the run directory.
        format, strict, archive_compression, save_components, components: as
            :class:`~torchrl.checkpoint.Checkpoint`.

    A component with ``state_dict`` / ``load_state_dict`` (and no ``dump`` /
    ``load``) registered without an adapter, nor one for its type
    (``register_adapter``), gets a :class:`FiniteStateDictAdapter`; one given an
    explicit :class:`FiniteStateDictAdapter` is checked too.
    Components saved by other adapters (replay buffers' ``dump``, JSON values) are
    verified and loaded, but not checked for non-finite numbers.

    Examples:
        >>> import tempfile
        >>> import torch
        >>> from torchrl_acer.trainers.checkpoint import ACERCheckpoint
        >>> net = torch.nn.Linear(2, 1)
        >>> with tempfile.TemporaryDirectory() as tmpdir:
        ...     path = ACERCheckpoint(config={"lr": 1e-3}, net=net).save(f"{tmpdir}/c")
        ...     other = ACERCheckpoint(config={"lr": 1e-3}, net=torch.nn.Linear(2, 1))
        ...     sorted(other.load(path).loaded)
        ['net']
    """

    def __init__(
        self,
        *,
        config: Mapping[str, Any] | None = None,
        allow_config_change: Collection[str] = (),
        force: bool = False,
        metadata: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = None if config is None else _json_copy(config)
        self.metadata = _json_copy(dict(metadata or {}))
        self.allow_config_change = tuple(allow_config_change)
        self.force = force
        self._nonfinite: list[str] = []
        #: the config differences the last :meth:`load` let through
        self.config_changes: list = []
        super().__init__(**kwargs)

    def _resolve_adapter(self, component) -> CheckpointAdapter:
        """TorchRL's adapter for ``component``, a :class:`FiniteStateDictAdapter`
        where TorchRL infers its state-dict one (no adapter given at
        registration nor for the component's type by ``register_adapter``),
        bound to record the non-finite entries."""
        adapter = super()._resolve_adapter(component)
        chosen = component.adapter is not None or any(
            isinstance(component.value, kind) for kind, _ in self._adapter_registry
        )
        if not chosen and type(adapter) is StateDictCheckpointAdapter:
            adapter = FiniteStateDictAdapter()
        if isinstance(adapter, FiniteStateDictAdapter):
            name = next(n for n, c in self._components.items() if c is component)
            adapter = adapter.bound(name, self._nonfinite)
        return adapter

    # -- save ------------------------------------------------------------------

    def save(
        self,
        path: str | Path,
        *,
        components: Collection[str] | None = None,
        component_options: Mapping[str, CheckpointOptions] | None = None,
        format: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Path:
        """Saves as :meth:`Checkpoint.save` does, atomically and durably, with
        the files' sizes and sha256 in the manifest; non-finite state raises
        :class:`NonFiniteCheckpointError`, the previous checkpoint kept."""
        destination = self._local_path(path)
        output_format = self.format if format is None else format
        self._validate_format(output_format)
        metadata = {**self.metadata, **(metadata or {})}
        metadata[METADATA_KEY] = {
            "format_version": FORMAT_VERSION,
            "versions": _versions(),
            "git_commit": _git_commit(),
            "config": self.config,
        }
        stage = destination.parent / f".{destination.name}.acer-{uuid.uuid4().hex}"
        archive = stage.with_name(stage.name + ".zip")
        try:
            super().save(
                stage,
                components=components,
                component_options=component_options,
                format="directory",
                metadata=metadata,
            )
            if self._nonfinite:
                shown = first_few(self._nonfinite, 8)
                raise NonFiniteCheckpointError(
                    f"refusing to write a checkpoint to {destination}: {shown} "
                    f"hold non-finite values (the previous checkpoint there, if "
                    f"any, is kept)"
                )
            self._record_digests(stage, output_format)
            _fsync_tree(stage)
            if output_format == "directory":
                _publish(stage, destination)
            else:
                self._zip(stage, archive)
                _publish(archive, destination)
        finally:
            self._nonfinite.clear()
            Checkpoint._remove_path(stage)
            Checkpoint._remove_path(archive)
        return destination

    @staticmethod
    def _record_digests(stage: Path, container: str) -> None:
        manifest = json.loads((stage / MANIFEST_NAME).read_text(encoding="utf-8"))
        manifest["container"] = container  # staged as a directory either way
        files = {}
        for record in manifest["components"].values():
            for name in record["files"]:
                relative = f"{record['path']}/{name}"
                with open(stage / relative, "rb") as file:
                    digest, size = _sha256(file)
                files[relative] = {"sha256": digest, "bytes": size}
        manifest["metadata"][METADATA_KEY]["files"] = files
        data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        # fsynced with the whole stage (_fsync_tree)
        (stage / MANIFEST_NAME).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        (stage / MANIFEST_DIGEST_NAME).write_text(f"{digest}\n")

    def _zip(self, stage: Path, archive: Path) -> None:
        compression = (
            zipfile.ZIP_STORED
            if self.archive_compression == "stored"
            else zipfile.ZIP_DEFLATED
        )
        with zipfile.ZipFile(archive, "w", compression=compression) as file:
            for source in sorted(stage.rglob("*")):
                if source.is_file():
                    file.write(source, source.relative_to(stage).as_posix())
        _fsync(archive)

    # -- load ------------------------------------------------------------------

    @classmethod
    def is_checkpoint(cls, path: str | Path) -> bool:
        """Whether ``path`` is a checkpoint, or a file of the single-file format,
        which :meth:`load` refuses naming its version (a TorchRL with
        ``upstream/torchrl/0006`` asks a trainer's checkpoint, and so hands such a
        file to :meth:`load` instead of to its legacy ``torch.load`` path)."""
        source = cls._local_path(path)
        return _single_file_refusal(source) is not None or super().is_checkpoint(source)

    @classmethod
    def verify(
        cls, path: str | Path, *, components: Collection[str] | None = None
    ) -> dict[str, Any]:
        """The manifest of the checkpoint at ``path``, once the manifest's sha256
        and the size and sha256 of every file of ``components`` (all when
        ``None``) check. Raises :class:`ACERCheckpointError` naming the path and
        the file otherwise, and for a checkpoint of the single-file format, one
        not written by :class:`ACERCheckpoint`, or one of another format."""
        source = cls._local_path(path)
        if not source.exists():
            raise FileNotFoundError(_missing_message(source))
        if (refusal := _single_file_refusal(source)) is not None:
            raise refusal
        with _opener(source) as open_file:
            try:
                with open_file(MANIFEST_NAME) as file:
                    manifest_bytes = file.read()
            except (KeyError, FileNotFoundError):
                raise ACERCheckpointError(
                    f"{source} is not a checkpoint: it has no {MANIFEST_NAME}"
                ) from None
            try:
                with open_file(MANIFEST_DIGEST_NAME) as file:
                    expected = file.read().decode().strip()
            except (KeyError, FileNotFoundError):
                raise ACERCheckpointError(
                    f"{source} was not written by ACERCheckpoint: it has no "
                    f"{MANIFEST_DIGEST_NAME}, so its files cannot be verified "
                    f"(load it with torchrl.checkpoint.Checkpoint)"
                ) from None
            actual = hashlib.sha256(manifest_bytes).hexdigest()
            if actual != expected:
                raise ACERCheckpointError(
                    f"{source} is corrupted: the sha256 of its {MANIFEST_NAME} "
                    f"({actual[:16]}...) is not the one written with it "
                    f"({expected[:16]}...); nothing was loaded from it"
                )
            manifest = cls.manifest(source)
            ours = manifest.get("metadata", {}).get(METADATA_KEY)
            if not isinstance(ours, Mapping) or "files" not in ours:
                raise ACERCheckpointError(
                    f"{source} was not written by ACERCheckpoint: its manifest has "
                    f"no {METADATA_KEY!r} metadata"
                )
            if ours.get("format_version") != FORMAT_VERSION:
                raise ACERCheckpointError(
                    f"{source} has torchrl-acer checkpoint format "
                    f"{ours.get('format_version')!r}, written by torchrl-acer "
                    f"{ours.get('versions', {}).get('torchrl-acer')}; this version "
                    f"({_versions()['torchrl-acer']}) reads format "
                    f"{FORMAT_VERSION}"
                )
            records = manifest["components"]
            names = records if components is None else set(components) & set(records)
            for name in sorted(names):
                record = records[name]
                for file_name in record["files"]:
                    relative = f"{record['path']}/{file_name}"
                    _check_file(source, open_file, relative, ours["files"])
        return manifest

    def load(
        self,
        path: str | Path,
        *,
        components: Collection[str] | None = None,
        component_options: Mapping[str, CheckpointOptions] | None = None,
        map_location: Any = None,
        tensor_load_kwargs: Mapping[str, Any] | None = None,
        strict: str | None = None,
        allow_config_change: Collection[str] | None = None,
        force: bool | None = None,
    ) -> CheckpointLoadResult:
        """Loads as :meth:`Checkpoint.load` does, after :meth:`verify`, the config
        comparison and (``strict="error"``) the parameter and optimizer shapes,
        so that a refused checkpoint changes nothing.

        ``allow_config_change`` and ``force`` override the constructor's for this
        load. The config differences that passed are in
        ``result.comparison["config_changes"]`` as ``(key, saved, current)``.
        """
        source = self._local_path(path)
        requested = self._selection(components)
        manifest = self.verify(source, components=requested)
        allow = (
            self.allow_config_change
            if allow_config_change is None
            else tuple(allow_config_change)
        )
        changed = self._check_config(
            source, manifest, allow, self.force if force is None else force
        )
        load_strict = self.strict if strict is None else strict
        self._check_shapes(source, manifest, requested, load_strict)
        result = super().load(
            source,
            components=components,
            component_options=component_options,
            map_location=map_location,
            tensor_load_kwargs=tensor_load_kwargs,
            strict=strict,
        )
        result.comparison["config_changes"] = changed
        self.config_changes = changed  # for Trainer.load_from_file's callers
        return result

    def _check_config(self, source, manifest, allow, force) -> list:
        """The differences between the saved config and :attr:`config` outside
        :data:`SAFE_CONFIG_CHANGES`, as ``(dotted key, saved, current)`` (a key
        absent on one side included); those outside ``allow`` too are refused,
        listed, unless ``force``."""
        saved = manifest["metadata"][METADATA_KEY].get("config")
        if saved is None or self.config is None:
            return []
        old, new = _flatten(saved), _flatten(self.config)

        def matches(key, patterns):
            return any(fnmatch.fnmatchcase(key, p) for p in patterns)

        changed = [
            (key, old.get(key, "<absent>"), new.get(key, "<absent>"))
            for key in sorted(old.keys() | new.keys())
            if old.get(key, "<absent>") != new.get(key, "<absent>")
            and not matches(key, SAFE_CONFIG_CHANGES)
        ]
        refused = [d for d in changed if not matches(d[0], allow)]
        if refused and not force:
            keys = ",".join(key for key, _, _ in refused)
            lines = first_few([_config_change(*d) for d in refused], 20, "\n")
            raise ACERCheckpointError(
                f"{source} was written with another config; these settings differ:"
                f"\n{lines}\nResuming with them changed may fail or train something else. To "
                f"resume anyway, allow them: ACERCheckpoint.load(path, "
                f"allow_config_change=[{keys}]) or force=True (a run's "
                f"resume_allow_config_change=[{keys}] or resume_force=true). "
                f"Settings safe to change are not listed: "
                f"{', '.join(SAFE_CONFIG_CHANGES)}"
            )
        if changed:
            torchrl_logger.info(
                "%s: settings changed since the checkpoint, as allowed:\n%s",
                source,
                "\n".join(_config_change(*d) for d in changed),
            )
        return changed

    def _check_shapes(self, source, manifest, requested, strict) -> None:
        """Refuses, naming them all, the modules' keys missing, unexpected or of
        another shape, and optimizer states that do not fit their parameters."""
        if strict != "error":
            return
        problems = []
        records = manifest["components"]
        with self._materialize(
            source, manifest, {n: records[n] for n in requested if n in records}
        ) as root:
            for name in sorted(requested & set(records)):
                component = self._components[name]
                try:
                    adapter = self._resolve_adapter(component)
                except TypeError:
                    continue  # TorchRL's load names a component it cannot save
                target = component.value
                if not isinstance(adapter, FiniteStateDictAdapter) or not isinstance(
                    target, (torch.nn.Module, torch.optim.Optimizer)
                ):
                    continue
                if records[name]["adapter"] != adapter.adapter_id:
                    continue  # TorchRL's load names the adapter mismatch
                saved = adapter.read(root / records[name]["path"])
                if isinstance(target, torch.nn.Module):
                    problems += state_dict_mismatches(
                        saved, target.state_dict(), prefix=f"{name}."
                    )
                else:
                    problems += _optimizer_mismatches(saved, target, name)
        if problems:
            shown = first_few(problems, 20, sep="\n  ")
            raise ACERCheckpointError(
                f"{source} does not fit these components; nothing was loaded:"
                f"\n  {shown}"
            )


def _json_copy(value):
    return json.loads(json.dumps(value))


def _missing_message(source: Path) -> str:
    left = sorted(source.parent.glob(_previous_name(source) + "*"))
    if left:
        return (
            f"no checkpoint at {source}: a save that replaced it was interrupted, "
            f"and the previous checkpoint is at {left[-1]} (rename it to "
            f"{source.name} to resume from it)"
        )
    return f"no checkpoint at {source}"


def _check_file(source: Path, open_file, relative: str, files: Mapping) -> None:
    expected = files.get(relative)
    if expected is None:
        raise ACERCheckpointError(
            f"{source}: {relative} has no recorded sha256; nothing was loaded"
        )
    try:
        with open_file(relative) as file:
            digest, size = _sha256(file)
    except (KeyError, FileNotFoundError):
        raise ACERCheckpointError(
            f"{source} is incomplete: {relative} is missing; nothing was loaded"
        ) from None
    except (zipfile.BadZipFile, OSError) as err:
        raise ACERCheckpointError(
            f"{source}: {relative} cannot be read ({err}); nothing was loaded"
        ) from None
    if size != expected["bytes"]:
        raise ACERCheckpointError(
            f"{source} is truncated or incomplete: {relative} has {size} bytes "
            f"where {expected['bytes']} were written; nothing was loaded"
        )
    if digest != expected["sha256"]:
        raise ACERCheckpointError(
            f"{source} is corrupted: the sha256 of {relative} ({digest[:16]}...) "
            f"is not the one written with it ({expected['sha256'][:16]}...); "
            f"nothing was loaded"
        )


def _optimizer_mismatches(saved, optimizer: torch.optim.Optimizer, name: str):
    """What keeps ``saved`` (an optimizer's state dict) from fitting ``optimizer``:
    another number of groups or of parameters in a group, or a state tensor shaped
    as a parameter of another shape."""
    groups = saved.get("param_groups", [])
    if len(groups) != len(optimizer.param_groups):
        return [
            f"{name}: {len(groups)} parameter groups in the checkpoint, "
            f"{len(optimizer.param_groups)} here"
        ]
    problems = []
    for index, (group, current) in enumerate(
        zip(groups, optimizer.param_groups, strict=True)
    ):
        ids, params = group["params"], current["params"]
        if len(ids) != len(params):
            problems.append(
                f"{name}.param_groups[{index}]: {len(ids)} parameters in the "
                f"checkpoint, {len(params)} here"
            )
            continue
        for param_id, param in zip(ids, params, strict=True):
            state = saved.get("state", {}).get(param_id, {})
            for key, value in state.items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.dim() > 0
                    and value.shape != param.shape
                ):
                    problems.append(
                        f"{name}.state[{param_id}].{key}: {tuple(value.shape)} in "
                        f"the checkpoint, parameter {tuple(param.shape)} here"
                    )
    return problems


# -- a replay's contents ----------------------------------------------------------


class ReplayContents:
    """A TorchRL replay buffer as a checkpoint component that saves what it holds,
    not its capacity: register it under ``"replay_buffer"`` before the trainer
    registers the buffer itself (with its ``dump``, which writes the whole
    storage).

    A :class:`~torchrl.data.LazyTensorStorage` is allocated at full capacity on
    its first write, and its own ``state_dict`` holds all of it: a checkpoint then
    costs the capacity, however little is stored. Here its first ``len(storage)``
    entries are kept instead (a round-robin writer fills them in order; its cursor
    is in the writer's state), and :meth:`load_state_dict` writes them back into a
    freshly built buffer. Other buffers (``FrameStackReplayBuffer``, which saves
    its own filled part) give their ``state_dict`` unchanged.
    """

    def __init__(self, replay) -> None:
        self.replay = replay

    def state_dict(self) -> dict:
        state = self.replay.state_dict()
        storage = getattr(self.replay, "_storage", None)
        if (
            not isinstance(self.replay, ReplayBuffer)
            or type(storage) not in (TensorStorage, LazyTensorStorage)
            or not storage.initialized
            or storage.ndim != 1
        ):
            return state
        n = len(storage)
        data = storage._storage[:n].clone()
        is_td = isinstance(data, TensorDictBase)
        state["_storage"] = {
            "filled": data.to_dict() if is_td else data,
            "batch_size": list(data.batch_size) if is_td else None,
            "_len": n,
        }
        return state

    def load_state_dict(self, state: dict) -> None:
        """Loads :meth:`state_dict`'s state (or a plain ``state_dict``)."""
        stored = state.get("_storage") if isinstance(state, dict) else None
        if not isinstance(stored, dict) or "filled" not in stored:
            self.replay.load_state_dict(state)
            return
        n, capacity = stored["_len"], self.replay._storage.max_size
        if n > capacity:
            raise ValueError(
                f"the checkpoint's replay holds {n} entries, more than this buffer's "
                f"capacity of {capacity}"
            )
        filled = stored["filled"]
        if stored["batch_size"] is not None:
            filled = TensorDict(filled, batch_size=stored["batch_size"])
        full = filled.new_zeros((capacity, *filled.shape[1:]))
        full[:n] = filled
        if isinstance(full, TensorDictBase):
            full = full.state_dict()
        self.replay.load_state_dict(
            {**state, "_storage": {"_storage": full, "initialized": True, "_len": n}}
        )


class SaveEvery(TrainerHookBase):
    """Saves the trainer every ``minutes``, so that a crash loses bounded work.

    TorchRL's ``Trainer`` saves every ``save_trainer_interval`` frames; frames
    come at very different rates (a MinAtar step against an Atari one, a loaded
    machine), so the work a crash can lose is bounded in time here. Registered at
    ``post_steps`` (between batches, where the trainer's state is whole); the
    clock starts at registration and after each of its saves.

    Args:
        minutes (float): time between two saves.
    """

    def __init__(self, minutes: float) -> None:
        if not minutes > 0:
            raise ValueError(f"minutes must be > 0, got {minutes}")
        self.minutes = minutes
        self._last = time.monotonic()
        self._trainer: Trainer | None = None

    def __call__(self) -> None:
        if time.monotonic() - self._last >= 60 * self.minutes:
            self._trainer.save_trainer(force_save=True)
            self._last = time.monotonic()

    def register(self, trainer: Trainer, name: str = "save_every") -> None:
        self._trainer = trainer
        self._last = time.monotonic()
        trainer.register_op("post_steps", self)
