"""Helpers shared by the benchmarks: interleaved timing and result files."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
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
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        # a copy of the working tree without .git (a lent GPU machine's)
        return os.environ.get("ACER_COMMIT", "unknown")


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


def interleaved_samples(
    fns: dict, rounds: int, min_time: float = 0.02, sync=None
) -> dict:
    """Seconds per call of each function in each of ``rounds`` rounds, timed
    round-robin (``{name: [seconds of round 0, ...]}``).

    Each round times every function once, in turn, so that load from elsewhere on
    a shared machine hits all of them alike (so the same round's samples can be
    divided: per-round ratios). Each function is warmed up and its calls per
    sample set (at least ``min_time`` seconds) once, before the rounds. ``sync``
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
    for _ in range(rounds):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            for _ in range(calls[name]):
                fn()
            sync()
            samples[name].append((time.perf_counter() - start) / calls[name])
    return samples


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
