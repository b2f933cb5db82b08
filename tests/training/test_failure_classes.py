"""Failures a new user meets that used to lose a run, each as it is met: a new run
pointed at another run's directory, a logger that cannot write, a signal other
than Ctrl-C or SIGTERM (issue #31's classes 1-3; the fault tests cover the rest)."""

import os
import signal
import subprocess
import sys

import pytest
from _faults_helpers import (
    EXAMPLE_ARGS,
    ROOT,
    build,
    close,
    failure_note,
    frames_in,
    last,
    signal_when_there,
    start_example,
)
from builders import snapshot

from torchrl_acer.trainers import hooks
from torchrl_acer.training import experiment


class FailingLogger:
    """A logger whose disk fills up after ``ok`` scalars."""

    def __init__(self, ok):
        self.ok = ok

    def log_scalar(self, name, value, step):
        if self.ok == 0:
            raise OSError(28, "No space left on device")
        self.ok -= 1


def test_a_logger_failure_keeps_what_was_trained(tmp_path, capsys):
    overrides = {"checkpoint.interval": None, "logger.log_interval": 9}
    trainer = build(tmp_path, **overrides)
    trainer.logger = FailingLogger(ok=5)
    with pytest.raises(OSError, match="No space left on device") as err:
        trainer.train()
    checkpoint = last(tmp_path)
    frames = trainer.collected_frames
    # not a failure of the environments: saved with them
    assert len(err.value.__notes__) == 1
    assert f"training failed after {frames} frames" in err.value.__notes__[0]
    assert failure_note(checkpoint) in err.value.__notes__[0]
    assert frames_in(checkpoint) == frames > 0
    close(trainer)

    resumed = build(tmp_path, resume=checkpoint, **overrides)
    resumed.total_frames = frames + 20
    capsys.readouterr()
    experiment.resume(resumed, checkpoint)
    # the environments were saved too: their episodes go on
    assert "training environments: state restored" in capsys.readouterr().out
    resumed.train()
    assert resumed.collected_frames == frames + 20
    close(resumed)


def test_sighup_stops_with_a_checkpoint_and_the_resume_hint(tmp_path):
    """A closed terminal (SIGHUP) stops the run as Ctrl-C does: a checkpoint of
    what was trained, the hint, status 128 + 1 (it used to kill the run)."""
    checkpoint = last(tmp_path / "run")
    process = start_example(tmp_path, "plain", "checkpoint.interval=50")
    started, out, err = signal_when_there(
        process, checkpoint, signal.SIGHUP, timeout=240
    )
    assert started, err[-3000:]
    assert process.returncode == 128 + signal.SIGHUP, err[-3000:]
    frames = frames_in(checkpoint)
    assert f"interrupted (SIGHUP) at {frames} frames" in out
    assert f"resume with: resume={checkpoint}" in out


# multiprocess: the refusal comes after the collector's worker processes started,
# and the exit used to wait for them forever
@pytest.mark.parametrize(
    "backend",
    [(), ("collector.backend=multiprocess", "collector.num_workers=2")],
    ids=["single", "multiprocess"],
)
def test_a_new_run_in_another_runs_directory_is_refused_touching_nothing(
    tmp_path, backend
):
    trainer = build(
        tmp_path / "run",
        **{"checkpoint.interval": None, "collector.total_frames": 20},
    )
    trainer.train()
    close(trainer)
    # this process's run is over: its lock goes (the process would have ended)
    os.close(hooks._RUN_DIR_LOCKS.pop((tmp_path / "run").resolve()))
    before = snapshot(tmp_path / "run")
    args = [
        sys.executable,
        str(ROOT / "examples" / "acer_gym.py"),
        *[a for a in EXAMPLE_ARGS if not a.startswith("collector.total")],
        "collector.total_frames=100",  # unrefused, it would end in seconds
        f"logger.run_dir={tmp_path / 'run'}",
        *backend,
    ]
    new = subprocess.run(
        args, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert new.returncode == 1
    checkpoint = last(tmp_path / "run")
    assert f"run directory {(tmp_path / 'run').resolve()} already holds a run" in (
        new.stderr
    )
    assert str(checkpoint) in new.stderr
    assert f"resume={checkpoint}" in new.stderr
    assert snapshot(tmp_path / "run") == before
