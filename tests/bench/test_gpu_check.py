"""bench/gpu_check.sh, the check prepared for a lent GPU machine, runs end to end
on the CPU (``--dry-run``: tiny sizes, ACER_TEST_DEVICE=cpu), and the benchmark
helpers it relies on keep their CPU behaviour."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def clean_env(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHON": sys.executable}
    for name in ("OUT", "RESULTS_DIR", "ACER_TEST_DEVICE", "ACER_COMMIT"):
        env.pop(name, None)
    return env


def test_gpu_check_refuses_unknown_arguments(tmp_path):
    out = subprocess.run(
        ["bash", str(SCRIPT), "--dryrun"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path),
        timeout=60,
    )
    assert out.returncode == 2 and "usage" in out.stderr
    assert not list(tmp_path.iterdir())  # nothing ran


def test_save_writes_to_results_dir_and_timers_wait_for_sync(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import _common
    finally:
        sys.path.remove(str(ROOT / "bench"))
    monkeypatch.delenv("RESULTS_DIR", raising=False)
    assert _common.results_dir() == ROOT / "bench" / "results"
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path / "out"))
    path = _common.save("unit", {"rows": [1]})
    assert path.parent == tmp_path / "out"
    assert json.loads(path.read_text())["rows"] == [1]
    calls = []
    medians = _common.interleaved_medians(
        {"a": lambda: calls.append("a")}, rounds=2, sync=lambda: calls.append("sync")
    )
    assert set(medians) == {"a"}
    # every timed round starts and ends with a sync
    assert calls[-1] == "sync" and calls.count("sync") >= 2 * 2


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    """About 5 minutes on the 2 shared cores this was written on."""
    results = ROOT / "bench" / "results"
    start = time.time()
    out = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path),
        timeout=1200,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
    assert "gpu_check: all steps passed" in out.stdout
    (run_dir,) = [d for d in tmp_path.glob("gpu_check.*") if d.is_dir()]
    names = sorted(p.name for p in run_dir.iterdir())
    # the device tool returns at most 8 files from $OUT
    assert len(names) == 5, names
    for prefix in ("gpu_check-", "loss-", "throughput-", "test_device-"):
        assert any(n.startswith(prefix) for n in names), (prefix, names)
    (summary_path,) = run_dir.glob("gpu_check-*.json")
    summary = json.loads(summary_path.read_text())
    assert summary["ok"] and summary["dry_run"] and summary["device"] == "cpu"
    assert summary["failed_steps"] == []
    examples = {
        "example_gym_multiprocess",
        "example_atari_single",
        "example_atari_multiprocess",
    }
    assert set(summary["steps"]) == {"tests", "loss", "throughput", *examples}
    # each example trained to its end on the "device", with its collector
    assert set(summary["examples"]) == examples
    assert all(
        e["frames"] > 0 and e["updates"] > 0 for e in summary["examples"].values()
    )
    tests = summary["tests"]
    assert tests["tests"] >= 9 and tests["passed"] == tests["tests"]  # none skipped
    assert len(summary["loss_over_bare"]) == 3
    assert all(r["loss_over_bare"] > 0 for r in summary["loss_over_bare"].values())
    assert summary["throughput"]["median_ratio_loop_over_bound"] > 0
    assert summary["commit"] != "unknown"
    # the dry run leaves bench/results alone
    new = [
        p.name
        for p in results.iterdir()
        if p.stat().st_mtime >= start
        and p.name.startswith(("loss", "throughput", "gpu_check", "test_device"))
    ]
    assert not new, new
