"""Checkpoint files: a header and the trainer's payload, checked on load.

A checkpoint file is::

    b"torchrl-acer checkpoint\\n"          the format's marker
    header length, payload length     two little-endian uint64
    sha256 digest                     32 bytes, of the header and payload bytes
    header                            JSON: format version, library, torch and
                                      torchrl versions, git commit, the resolved
                                      config, frames and updates
    payload                           the trainer's state, as torch.save writes it

:func:`write_checkpoint` streams the payload into a temporary file next to the
target, fills in the lengths and the digest, flushes and fsyncs it and only then
renames it over the target (``os.replace``): at every moment the target is either
the previous complete checkpoint or the new one, whatever kills the process.
:func:`read_header` refuses, naming the file, one that is not a checkpoint, is
truncated, fails the checksum or has a newer format; :func:`config_differences`
compares its config with the current one.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import struct
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import torch

from torchrl_acer.training.refusal import Refusal

__all__ = [
    "FORMAT_VERSION",
    "SAFE_CONFIG_CHANGES",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointInfo",
    "check_config",
    "config_differences",
    "load_payload",
    "read_checkpoint",
    "read_header",
    "state_dict_mismatches",
    "write_checkpoint",
]

MAGIC = b"torchrl-acer checkpoint\n"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<QQ32s")  # header length, payload length, sha256
_CHUNK = 1 << 22

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


class CheckpointError(Refusal, ValueError):
    """A checkpoint file that cannot be used; the message names the file."""


class CheckpointNotFoundError(Refusal, FileNotFoundError):
    """No checkpoint file where ``resume`` points."""


@dataclass
class CheckpointInfo:
    """A checked checkpoint file: its header, and where its payload lies."""

    path: Path
    header: dict
    payload_offset: int
    payload_bytes: int


@cache
def _git_commit() -> str | None:
    """The commit of the checkout this package runs from, ``-dirty`` if it has
    uncommitted changes; ``None`` outside a git checkout (best effort)."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=here,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=here,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "") if commit else None


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


class _HashingWriter:
    """Writes to ``file`` and hashes what it writes (torch.save's target)."""

    def __init__(self, file, digest):
        self.file, self.digest, self.size = file, digest, 0

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        self.digest.update(data)
        self.file.write(data)
        self.size += n
        return n

    def flush(self) -> None:
        self.file.flush()


class _Window(io.RawIOBase):
    """A read-only view of ``length`` bytes of ``file`` from ``offset``, which
    torch.load reads as if it were the whole file (no copy in memory)."""

    def __init__(self, file, offset: int, length: int):
        self.file, self.offset, self.length, self.pos = file, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}
        self.pos = max(0, base[whence] + pos)
        return self.pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(memoryview(buffer).cast("B")), self.length - self.pos))
        if n == 0:
            return 0
        self.file.seek(self.offset + self.pos)
        got = self.file.readinto(memoryview(buffer).cast("B")[:n])
        self.pos += got
        return got


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not possible everywhere (Windows); the rename is done
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_checkpoint(path: str | os.PathLike, state, header: dict) -> Path:
    """Writes ``state`` (torch.save-able) under ``header`` (JSON-able) to ``path``.

    The file is written as ``<path>.tmp``, flushed and fsynced, then renamed over
    ``path``: a crash or ``kill -9`` at any point leaves the previous ``path``
    whole. The header gets the format version, the library, torch and torchrl
    versions, the git commit (when running from a checkout) and the time.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    versions = _versions()
    header = {
        "format_version": FORMAT_VERSION,
        "library_version": versions["torchrl-acer"],
        "versions": versions,
        "git_commit": _git_commit(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **header,
    }
    header_bytes = json.dumps(header, default=str).encode()
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(_FIXED.pack(0, 0, bytes(32)))  # filled in once known
            f.write(header_bytes)
            digest = hashlib.sha256(header_bytes)
            writer = _HashingWriter(f, digest)
            torch.save(state, writer)
            f.seek(len(MAGIC))
            f.write(_FIXED.pack(len(header_bytes), writer.size, digest.digest()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def read_header(path: str | os.PathLike, *, verify: bool = True) -> CheckpointInfo:
    """Opens a checkpoint file and checks it: the marker, the lengths against the
    file's size, the format version and (``verify``) the sha256 of its header and
    payload. Raises :class:`CheckpointError` naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFoundError(f"resume: no checkpoint at {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise CheckpointError(
                f"{path} is not a torchrl-acer checkpoint: it does not start with "
                f"the format's marker (a file from torch.save, from a version "
                f"before checkpoint format 1, or another file)"
            )
        fixed = f.read(_FIXED.size)
        if len(fixed) < _FIXED.size:
            raise CheckpointError(f"{path} is truncated: {size} bytes, no header")
        header_len, payload_len, expected = _FIXED.unpack(fixed)
        offset = len(MAGIC) + _FIXED.size + header_len
        if payload_len == 0 or size != offset + payload_len:
            raise CheckpointError(
                f"{path} is truncated or incomplete: {size} bytes where its header "
                f"says {offset + payload_len}"
            )
        header_bytes = f.read(header_len)
        if verify:
            digest = hashlib.sha256(header_bytes)
            remaining = payload_len
            while remaining:
                chunk = f.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                digest.update(chunk)
                remaining -= len(chunk)
            if digest.digest() != expected:
                raise CheckpointError(
                    f"{path} is corrupted: the sha256 of its contents "
                    f"({digest.hexdigest()[:16]}...) is not the one written with it "
                    f"({expected.hex()[:16]}...); nothing was loaded from it"
                )
    try:
        header = json.loads(header_bytes)
    except ValueError as err:
        raise CheckpointError(f"{path} has an unreadable header: {err}") from None
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {version!r}, written by torchrl-acer "
            f"{header.get('library_version')}; this version "
            f"({_versions()['torchrl-acer']}) reads format {FORMAT_VERSION}"
        )
    return CheckpointInfo(path, header, offset, payload_len)


def load_payload(info: CheckpointInfo):
    """The state stored in a checkpoint :func:`read_header` checked (on the CPU)."""
    with open(info.path, "rb") as f:
        window = _Window(f, info.payload_offset, info.payload_bytes)
        try:
            return torch.load(window, map_location="cpu", weights_only=False)
        except Exception as err:  # the checksum passed: written by another build?
            raise CheckpointError(
                f"{info.path}: its payload could not be read: {err}"
            ) from err


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, object]:
    """``(header, state)`` of a checkpoint file, checked as :func:`read_header`
    does."""
    info = read_header(path)
    return info.header, load_payload(info)


_MISSING = "<absent>"


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


def _matches(key: str, patterns) -> bool:
    return any(key == p or fnmatch.fnmatchcase(key, p) for p in patterns)


def config_differences(
    saved: dict | None, current: dict | None, *, ignore=SAFE_CONFIG_CHANGES
) -> list[tuple[str, object, object]]:
    """``(key, saved value, current value)`` for each dotted config key that
    differs (absent on one side included), except those matching ``ignore``."""
    if saved is None or current is None:
        return []
    old, new = _flatten(saved), _flatten(current)
    out = []
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key, _MISSING), new.get(key, _MISSING)
        if a != b and not _matches(key, ignore):
            out.append((key, a, b))
    return out


def check_config(
    source,
    saved: dict | None,
    current: dict | None,
    *,
    allow=(),
    force: bool = False,
    how_to_allow: str = "",
) -> list[tuple[str, object, object]]:
    """Refuses a checkpoint (``source``, named in the message) whose ``saved``
    config differs from ``current`` outside :data:`SAFE_CONFIG_CHANGES` and
    ``allow`` (dotted keys or ``fnmatch`` patterns), listing the settings; with
    ``force`` any difference passes. ``how_to_allow`` (given the refused keys,
    comma-separated, as ``{keys}``) tells the caller's way to allow them. Returns
    the differences outside the safe list that passed (allowed or forced), for the
    caller to report."""
    changed = config_differences(saved, current)
    refused = config_differences(
        saved, current, ignore=SAFE_CONFIG_CHANGES + tuple(allow)
    )
    if refused and not force:
        lines = [show_config_change(*d) for d in refused[:20]]
        if len(refused) > 20:
            lines.append(f"  ... and {len(refused) - 20} more")
        keys = ",".join(key for key, _, _ in refused)
        raise CheckpointError(
            f"{source} was written with another config; these settings differ:\n"
            + "\n".join(lines)
            + "\nResuming with them changed may fail or train something else. "
            f"To resume anyway, allow them: {how_to_allow.format(keys=keys)}. "
            f"Settings safe to change are not listed: "
            f"{', '.join(SAFE_CONFIG_CHANGES)}"
        )
    return changed


def show_config_change(key: str, old, new) -> str:
    """One line of :func:`check_config`'s report."""
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
