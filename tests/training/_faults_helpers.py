"""What the fault tests share (``test_faults.py``, ``test_failure_classes.py``): tiny
CartPole trainers at :data:`SMALL`'s sizes, reading their checkpoints back, and the gym
example in a subprocess, with ``torch.save`` made slow or broken on demand, signalled
once a file appears."""

import os
import subprocess
import sys
import time
from pathlib import Path

from builders import INJECTED, small_trainer

from torchrl_acer.trainers.checkpoint import ACERCheckpoint, FiniteStateDictAdapter
from torchrl_acer.training import experiment

ROOT = Path(__file__).parents[2]
# on top of builders.SMALL_GYM: the sizes these tests always ran at
SMALL = {
    "collector.total_frames": 200,
    "replay.ratio": 1.0,
    "eval.interval": None,
}


def build(run_dir, *, inject=False, resume=None, **overrides):
    """What ``examples/acer_gym.py`` builds, at :data:`SMALL`'s sizes; with
    ``inject`` its environments are :class:`Inject`'s; ``resume`` sets the run's
    ``resume`` (the checkpoint is loaded by :func:`experiment.resume`)."""
    settings = {**SMALL, **overrides}
    if inject:
        settings["env.name"] = INJECTED
    if resume is not None:
        settings["resume"] = str(resume)
    return small_trainer(run_dir, **settings)


def last(run_dir):
    return Path(run_dir) / "checkpoints" / "last"


def saved(path, name):
    """Component ``name`` of the checkpoint at ``path`` as saved (verified first),
    loaded into nothing."""
    record = ACERCheckpoint.verify(path)["components"][name]
    adapter = FiniteStateDictAdapter(payload_format="torch", weights_only=False)
    return adapter.read(Path(path) / record["path"])


def frames_in(path):
    return saved(path, "trainer_state")["collected_frames"]


def failure_note(path):
    """:class:`FailureCheckpoint`'s note on an error it saved after."""
    return f"what was trained was saved to {path}. Resume with"


def close(trainer):
    experiment.close(trainer)


# The example's process, with torch.save (which writes the environments' state
# into each checkpoint) made slow ("slow": once the flag file exists, each call
# touches the marker and takes 3 s) or broken ("hang": the second checkpoint's
# first file is half written, then the process hangs)
DRIVER = """
import io, os, runpy, sys, time
from pathlib import Path
import torch
from torchrl_acer.trainers import checkpoint

mode, flag, marker, script = sys.argv[1:5]
original, saves = torch.save, []
original_save = checkpoint.ACERCheckpoint.save

def count(self, *args, **kwargs):
    saves.append(1)
    return original_save(self, *args, **kwargs)

def save(obj, f, *args, **kwargs):
    if mode == "slow" and Path(flag).exists():
        Path(marker).touch()
        time.sleep(3)
    if mode == "hang" and len(saves) == 2:  # half the second checkpoint, then hang
        buffer = io.BytesIO()
        original(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        out = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f
        out.write(data[: len(data) // 2])
        out.flush()
        Path(marker).touch()
        time.sleep(600)
    return original(obj, f, *args, **kwargs)

torch.save = save
checkpoint.ACERCheckpoint.save = count
sys.argv = [script, *sys.argv[5:]]
sys.path.insert(0, str(Path(script).parent))
runpy.run_path(script, run_name="__main__")
"""

EXAMPLE_ARGS = [
    "env.num_envs=2",
    "collector.T=5",
    "collector.total_frames=1000000",
    "replay.start=0",
    "eval.interval=null",
    "eval.episodes=1",
    "eval.max_steps=10",
    "logger.backend=null",
    "logger.progress_bar=false",
    "model.num_cells=[16]",
]


def start_example(tmp_path, mode, *args):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return subprocess.Popen(
        [
            sys.executable,
            str(driver),
            mode,
            str(tmp_path / "flag"),
            str(tmp_path / "marker"),
            str(ROOT / "examples" / "acer_gym.py"),
            *EXAMPLE_ARGS,
            f"logger.run_dir={tmp_path / 'run'}",
            *args,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
    )


def wait_for(path, process, timeout=240):
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def signal_when_there(process, path, signum, timeout):
    """Sends ``signum`` to ``process`` once ``path`` exists and waits for it to
    end (``timeout`` seconds); a process left running is killed. Returns whether
    ``path`` appeared, and the process's stdout and stderr."""
    try:
        reached = wait_for(path, process)
        if reached:
            process.send_signal(signum)
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return reached, out, err
