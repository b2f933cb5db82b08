"""Failures a new user meets that used to lose a run, each as it is met: a new run
pointed at another run's directory, a logger that cannot write, a signal other
than Ctrl-C or SIGTERM (issue #31's classes 1-3; the fault tests cover the rest)."""

import signal
import subprocess
import sys

import pytest
from builders import snapshot
from test_faults import (
    EXAMPLE_ARGS,
    ROOT,
    batches,
    build,
    signal_when_there,
    start_example,
)

from torchrl_acer.training.checkpoint import read_checkpoint


class FailingLogger:
    """A logger whose disk fills up after ``ok`` scalars."""

    def __init__(self, ok):
        self.ok = ok

    def log_scalar(self, name, value, step):
        if self.ok == 0:
            raise OSError(28, "No space left on device")
        self.ok -= 1


def test_a_logger_failure_keeps_what_was_trained(tmp_path):
    trainer = build(
        tmp_path,
        trainer_kwargs={"logger": FailingLogger(ok=5), "log_interval": 10},
        **{"checkpoint.interval": None},
    )
    with pytest.raises(OSError, match="No space left on device") as err:
        trainer.train()
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    assert err.value.__notes__ == [
        f"training stopped while training on a batch; a checkpoint of the "
        f"{trainer.frames} frames trained on was written. Resume with: "
        f"resume={checkpoint}"
    ]
    assert read_checkpoint(checkpoint)[0]["frames"] == trainer.frames > 0
    trainer.close()

    resumed = build(tmp_path, **{"checkpoint.interval": None})
    resumed.load_checkpoint(checkpoint)
    batches(resumed, 2)  # the environments were saved too: training goes on
    resumed.close()


def test_sighup_stops_with_a_checkpoint_and_the_resume_hint(tmp_path):
    """A closed terminal (SIGHUP) stops the run as Ctrl-C does: a checkpoint of
    what was trained, the hint, status 128 + 1 (it used to kill the run)."""
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    process = start_example(tmp_path, "plain", "checkpoint.interval=50")
    started, out, err = signal_when_there(
        process, checkpoint, signal.SIGHUP, timeout=240
    )
    assert started, err[-3000:]
    assert process.returncode == 128 + signal.SIGHUP, err[-3000:]
    frames = read_checkpoint(checkpoint)[0]["frames"]
    assert f"interrupted (SIGHUP) at {frames} frames" in out
    assert f"resume with: resume={checkpoint}" in out


def test_a_new_run_in_another_runs_directory_is_refused_touching_nothing(tmp_path):
    trainer = build(tmp_path / "run", **{"checkpoint.interval": None})
    batches(trainer, 2)
    trainer.save_checkpoint()
    trainer.close()
    before = snapshot(tmp_path / "run")
    args = [
        sys.executable,
        str(ROOT / "examples" / "acer_gym.py"),
        *[a for a in EXAMPLE_ARGS if not a.startswith("collector.total")],
        "collector.total_frames=100",  # unrefused, it would end in seconds
        f"logger.run_dir={tmp_path / 'run'}",
    ]
    new = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True)
    assert new.returncode != 0
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    assert f"holds another run's checkpoint {checkpoint} (20 frames)" in new.stderr
    assert f"resume={checkpoint}" in new.stderr
    assert snapshot(tmp_path / "run") == before
