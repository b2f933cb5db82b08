"""Helpers shared by the benchmarks: interleaved timing and result files."""

from __future__ import annotations

import atexit
import importlib
import importlib.metadata
import io
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
EXAMPLES = Path(__file__).parents[1] / "examples"


def example_config(name: str):
    """``examples/<name>.yaml`` as Hydra composes it for the example's script (with
    the run settings it shares with the other examples, ``examples/run/``), open to
    new keys."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(EXAMPLES), version_base="1.3"):
        cfg = compose(name)
    OmegaConf.set_struct(cfg, False)
    return cfg


def results_dir() -> Path:
    """Where ``save`` writes: ``$RESULTS_DIR`` if set (``bench/gpu_check.sh`` points
    it at the device tool's ``$OUT``), else ``bench/results``."""
    return Path(os.environ.get("RESULTS_DIR") or RESULTS)


def git_commit() -> str:
    # ACER_COMMIT first: a lent GPU machine's copy of the working tree may carry a
    # .git at another commit (it named the session's first commit, "-dirty")
    if os.environ.get("ACER_COMMIT"):
        return os.environ["ACER_COMMIT"]
    try:
        out = resolved_commit("HEAD")
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):  # a copy without .git
        return "unknown"


def _version(package: str) -> str | None:
    """``package``'s version, ``None`` where it is not installed (the peers' venv
    has no torchrl)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torchrl": _version("torchrl"),
        "tensordict": _version("tensordict"),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cuda_runtime": torch.version.cuda,
    }


def interleaved_medians(
    fns: dict, rounds: int, min_time: float = 0.02, sync=None
) -> dict:
    """Median seconds per call of each function over :func:`interleaved_samples`'
    rounds; ratios of the medians are what most benchmarks report."""
    samples = interleaved_samples(fns, rounds, min_time, sync)
    return {name: statistics.median(s) for name, s in samples.items()}


def per_round_ratios(numerators, denominators) -> dict:
    """The ratio of two candidates' samples round by round (each round's pair saw the
    same load from elsewhere, which cancels in the ratio), with their median, min and
    max: what the benchmarks report as "the median of the per-round ratios"."""
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return {
        "ratios": ratios,
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def interleaved_samples(
    fns: dict, rounds: int, min_time: float = 0.02, sync=None
) -> dict:
    """Seconds per call of each function in each of ``rounds`` rounds, timed
    round-robin (``{name: [seconds of round 0, ...]}``).

    Each round times every function once, in turn, so that load from elsewhere on
    a shared machine hits all of them alike (so the same round's samples can be
    divided: per-round ratios). Round ``r`` starts at the ``r``-th function (in
    ``fns``' order, cyclically): no function always runs right after the same one
    (the one after the bare networks' work measured about 2% slow in an Atari-sized
    loss case, which timed equal in both orders alone). Each function is warmed up
    and its calls per sample set (at least ``min_time`` seconds) once, before the
    rounds. ``sync``
    (``torch.cuda.synchronize`` for work on a GPU) is called before each timer
    starts and before it stops, so that the time counts the work the calls queued
    and not only its launch.
    """
    sync = sync or (lambda: None)
    calls = {}
    for name, fn in fns.items():
        fn()  # warm-up
        sync()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < min_time:
            fn()
            sync()
            n += 1
        calls[name] = max(n, 1)
    samples = {name: [] for name in fns}
    order = list(fns.items())
    for r in range(rounds):
        first = r % len(order)
        for name, fn in order[first:] + order[:first]:
            sync()
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            sync()
            samples[name].append((time.perf_counter() - start) / calls[name])
    return samples


def resolved_commit(rev: str) -> str:
    """The full hash of git revision ``rev``, for result files."""
    return subprocess.run(
        ["git", "rev-parse", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()


def package_at(rev: str, name: str = "torchrl_acer"):
    """The package ``name`` as it was at git revision ``rev``, imported beside today's.

    Its files come out of ``git archive`` into a temporary folder under another
    name (``{name}_at_{rev}``, its own imports renamed alike), so that both
    versions run in one process, in the same interleaved rounds.
    """
    alias = name + "_at_" + re.sub(r"\W", "_", rev)
    if alias not in sys.modules:
        archive = subprocess.run(
            ["git", "archive", rev, name],
            capture_output=True,
            check=True,
            cwd=Path(__file__).parents[1],
        ).stdout
        folder = Path(tempfile.mkdtemp(prefix="package-at-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        (folder / name).rename(folder / alias)
        for path in (folder / alias).rglob("*.py"):
            path.write_text(re.sub(rf"\b{name}\b", alias, path.read_text()))
        sys.path.insert(0, str(folder))
    return importlib.import_module(alias)


def save(name: str, payload: dict) -> Path:
    results = results_dir()
    results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = results / f"{name}-{stamp}.json"
    payload = {
        "benchmark": name,
        "date": stamp,
        "commit": git_commit(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


# driving an ACERTrainer (a torchrl.trainers.Trainer) batch by batch: the benchmarks
# time windows of a few batches, interleaved between trainers, where Trainer.train
# runs to total_frames and shuts the collector down when it returns


class _StepCount:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1


def start(trainer):
    """Runs ``trainer``'s ``setup`` hooks (``PolicyVersion`` pushes the first
    versioned weights there), as ``Trainer.train`` does before its loop, and
    returns an iterator over its collector's batches. A trainer whose stepper
    keeps no count of its optimizer steps (``check_health=False``) gets a
    ``post_optim`` hook counting them, for :func:`updates`."""
    stepper = trainer.optimization_stepper
    if not hasattr(stepper, "optimizer_step_count") and not hasattr(
        trainer, "_bench_steps"
    ):
        trainer._bench_steps = _StepCount()
        trainer.register_op("post_optim", trainer._bench_steps)
    trainer._setup_hook()
    return iter(trainer.collector)


def train_on_batch(trainer, batch) -> None:
    """The body of ``Trainer.train``'s loop for one collected ``batch``: the
    ``batch_process`` hooks (replay storage, the non-finite and policy-lag
    checks), the frame count, the batch's updates (``optim_steps``: the on-policy
    one, then the replayed ones) and the ``post_steps`` hooks (weight pushes,
    evaluation) with their logging stages. No checkpoint, no progress bar."""
    batch = trainer._process_batch_hook(batch)
    trainer.collected_frames += batch.numel() * trainer.frame_skip
    trainer._pre_steps_log_hook(batch)
    if trainer.collected_frames >= trainer.collector.init_random_frames:
        trainer.optim_steps(batch)
    trainer._post_steps_hook()
    trainer._post_steps_log_hook(batch)


def updates(trainer) -> int:
    """Optimizer steps the trainer took: its stepper's count where it keeps one
    (the non-finite guard's, which leaves skipped updates out), else the count
    :func:`start` registered. Not ``trainer._optim_count``: TorchRL's loop counts
    one more per collected batch there (the iteration that ends the batch's
    updates, with ``optim_steps_per_batch=None``)."""
    count = getattr(trainer.optimization_stepper, "optimizer_step_count", None)
    if count is not None:
        return count
    counted = getattr(trainer, "_bench_steps", None)
    return trainer._optim_count if counted is None else counted.n


def update(trainer, batch) -> None:
    """One update on ``batch`` as the trainer makes it: its optimization stepper
    (the loss's forward and backward, clipping, the non-finite checks, the
    optimizer step) and its ``post_optim`` hooks (the averaged policy's
    ``SoftUpdate``)."""
    trainer.optimization_stepper.step(trainer, batch)
    trainer._post_optim_hook()


class UpdateTimer:
    """Seconds spent in ``trainer``'s updates (:func:`update`'s parts: the
    stepper's ``step`` and the ``post_optim`` hooks), wrapped on the instances
    while the ``with`` block runs. ``sync`` (``torch.cuda.synchronize``) is called
    at both edges of each timed call."""

    def __init__(self, trainer, sync=None):
        self.trainer, self.sync = trainer, sync or (lambda: None)
        self.seconds = 0.0

    def _timed(self, fn):
        def timed(*args, **kwargs):
            self.sync()
            tick = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.sync()
                self.seconds += time.perf_counter() - tick

        return timed

    def __enter__(self):
        stepper = self.trainer.optimization_stepper
        self._undo = [
            (owner, name, owner.__dict__.get(name))
            for owner, name in ((stepper, "step"), (self.trainer, "_post_optim_hook"))
        ]
        for owner, name, _ in self._undo:
            setattr(owner, name, self._timed(getattr(owner, name)))
        return self

    def __exit__(self, *exc):
        for owner, name, before in self._undo:
            if before is None:  # the class's method
                delattr(owner, name)
            else:
                setattr(owner, name, before)


def bare_trainer(cfg, *, collector, loss, optimizer, replay, **overrides):
    """The :class:`~torchrl_acer.trainers.ACERTrainer` that
    ``experiment.make_trainer`` builds from the run config ``cfg`` (replay ratio
    and start, averaged policy, clipping, health checks, weight pushes, and the
    policy versions and lag bound of a multi-process or Ray collector), without
    its checkpoint, run directory, logging or evaluation: the bare loop the
    benchmarks time. ``overrides`` replace the trainer's keyword arguments."""
    from torchrl_acer.trainers import ACERTrainer, PolicyVersion

    kwargs = {
        "collector": collector,
        "total_frames": 10**12,
        "loss_module": loss,
        "optimizer": optimizer,
        "replay_buffer": replay,
        "replay_ratio": cfg.replay.ratio,
        "replay_start": cfg.replay.start,
        "on_policy_updates": cfg.replay.on_policy_updates,
        "alpha": cfg.loss.alpha,
        "weight_update_interval": cfg.collector.weight_update_interval,
        "check_health": cfg.health.check,
        "max_nonfinite_in_a_row": cfg.health.max_nonfinite_in_a_row,
        "clip_grad_norm": cfg.optim.max_grad_norm is not None,
        "clip_norm": cfg.optim.max_grad_norm,
        "progress_bar": False,
        "seed": cfg.seed,
        "save_trainer_interval": 2**62,
        "log_interval": 2**62,
        **overrides,
    }
    trainer = ACERTrainer(**kwargs)
    if cfg.collector.get("backend", "single") in ("multiprocess", "ray"):
        trainer.policy_version = PolicyVersion(cfg.collector.max_policy_lag)
        trainer.policy_version.register(trainer)
    return trainer


def close(trainer) -> None:
    """Shuts the trainer's collector down (its workers, its environments)."""
    trainer.collector.shutdown()


# reading a run's checkpoint (an ACERCheckpoint directory, <run>/checkpoints/last)


def checkpoint_path(run_dir) -> Path:
    """Where ``experiment.make_trainer`` saves ``run_dir``'s checkpoint."""
    return Path(run_dir) / "checkpoints" / "last"


def read_checkpoint(path, *components: str) -> tuple[dict, dict]:
    """The manifest of the checkpoint at ``path`` (``ACERCheckpoint.verify``: all
    its files' sizes and sha256 checked) and ``{name: state dict}`` of ``components``
    (``"loss_module"``, ``"trainer_state"``, ...), read on the CPU into nothing.
    The run's resolved config and the commit that wrote it are in
    ``manifest["metadata"]["torchrl_acer"]`` (``"config"``, ``"git_commit"``)."""
    from torchrl_acer.trainers.checkpoint import ACERCheckpoint, FiniteStateDictAdapter

    path = Path(path)
    manifest = ACERCheckpoint.verify(path)  # every file's size and sha256
    adapter = FiniteStateDictAdapter(payload_format="torch", weights_only=False)
    states = {
        name: adapter.read(path / manifest["components"][name]["path"])
        for name in components
    }
    return manifest, states


def checkpoint_frames(path) -> int:
    """The frames collected when the checkpoint at ``path`` was written: the
    manifest's ``collected_frames`` where the trainer wrote it there (a
    checkpoint rotation's saves), else the trainer's state's."""
    manifest, _ = read_checkpoint(path)
    frames = manifest.get("metadata", {}).get("collected_frames")
    if frames is None:
        _, states = read_checkpoint(path, "trainer_state")
        frames = states["trainer_state"]["collected_frames"]
    return int(frames)
