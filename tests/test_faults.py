"""Faults a long run meets: non-finite rewards, observations and losses, signals,
a kill during a save, damaged checkpoint files, and resuming with another config.

Tiny CartPole runs (2 envs, T = 5, no evaluation); the trainer's API directly,
except for the signals, which are sent to ``examples/acer_gym.py`` in a subprocess.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from builders import gym_config, snapshot
from omegaconf import OmegaConf
from torchrl.collectors import Collector

from torchrl_acer.modules.models import mlp_actor_critic
from torchrl_acer.objectives.acer import ACERLoss
from torchrl_acer.training.checkpoint import (
    CheckpointError,
    read_checkpoint,
    read_header,
)
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import make_optimizer
from torchrl_acer.training.trainer import (
    ACERTrainer,
    GreedyEvaluator,
    NonFiniteTrainingError,
    make_segment_replay_buffer,
)

ROOT = Path(__file__).parents[1]
SMALL = {
    "env.num_envs": 2,
    "collector.T": 5,
    "collector.total_frames": 200,
    "replay.ratio": 1.0,
    "replay.start": 0,
    "replay.capacity": 200,
    "eval.interval": None,
    "logger.backend": None,
    "logger.progress_bar": False,
    "model.num_cells": [16],
}


def small_config(**overrides):
    return gym_config(SMALL, **overrides)


class Inject(gym.Wrapper):
    """Returns NaN where ``Inject.what`` says, once ``Inject.armed`` (shared by the
    copies): ``"reward"`` once, ``"rewards"`` on every step of every copy,
    ``"final_observation"`` at the next episode end (the policy never sees it),
    ``"observation"`` once mid-episode (the policy acts on it); ``"raise"``
    raises (an environment that crashes)."""

    armed = False
    what = "reward"

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if Inject.armed:
            if Inject.what in ("reward", "rewards"):
                reward = float("nan")
                Inject.armed = Inject.what == "rewards"
            elif Inject.what == "final_observation" and (terminated or truncated):
                obs = np.full_like(obs, np.nan)
                Inject.armed = False
            elif Inject.what == "observation" and not (terminated or truncated):
                obs = np.full_like(obs, np.nan)
                Inject.armed = False
            elif Inject.what == "raise":
                Inject.armed = False
                raise RuntimeError("the simulator crashed")
            elif Inject.what in ("sigint", "sigint_twice"):
                # Ctrl-C arriving in the middle of an environment's step
                Inject.armed = Inject.what == "sigint_twice"
                Inject.what = "sigint"
                os.kill(os.getpid(), signal.SIGINT)
        return obs, reward, terminated, truncated, info


@pytest.fixture(autouse=True)
def disarm():
    Inject.armed, Inject.what = False, "reward"
    yield
    Inject.armed = False


class Recorder:
    def __init__(self):
        self.scalars = []

    def log_scalar(self, name, value, step):
        self.scalars.append((name, value, step))


def build(run_dir, *, wrappers=(), with_config=True, trainer_kwargs=None, **overrides):
    """The pieces ``examples/acer_gym.py`` builds, from the small config."""
    cfg = small_config(**overrides)
    torch.manual_seed(cfg.seed)
    env = make_env(
        cfg.env.name, num_envs=cfg.env.num_envs, seed=cfg.seed, wrappers=wrappers
    )
    spec = env.action_spec[(0,) * env.batch_dims]
    actor, critic = mlp_actor_critic(
        env.observation_spec["observation"].shape[-1],
        spec.shape[-1],
        num_cells=cfg.model.num_cells,
        shared=cfg.model.shared,
        activation=cfg.model.activation,
        action_spec=spec,
    )
    loss = ACERLoss(actor, critic, trust_region_delta=cfg.loss.trust_region_delta)
    loss.make_value_estimator(gamma=cfg.loss.gamma, lmbda=1.0, c_thresh=1.0)
    T, num_envs = cfg.collector.T, cfg.env.num_envs
    collector = Collector(
        env,
        actor,
        frames_per_batch=T * num_envs,
        total_frames=-1,
        auto_register_policy_transforms=False,
    )
    kwargs = dict(
        collector=collector,
        loss_module=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        total_frames=cfg.collector.total_frames,
        replay_buffer=make_segment_replay_buffer(
            cfg.replay.capacity, T, cfg.replay.batch_segments or num_envs
        ),
        replay_ratio=cfg.replay.ratio,
        target_eps=cfg.loss.alpha,
        max_grad_norm=cfg.optim.max_grad_norm,
        checkpoint_dir=Path(run_dir) / "checkpoints",
        progress_bar=False,
        seed=cfg.seed,
        check_health=cfg.health.check,
        max_nonfinite_in_a_row=cfg.health.max_nonfinite_in_a_row,
        config=OmegaConf.to_container(cfg, resolve=True) if with_config else None,
    )
    kwargs.update(trainer_kwargs or {})
    return ACERTrainer(**kwargs)


def batches(trainer, n):
    it = iter(trainer.collector)
    for _ in range(n):
        trainer.train_on_batch(next(it))


def all_finite(trainer):
    return all(bool(torch.isfinite(p).all()) for p in trainer.loss_module.parameters())


# -- numerical health ----------------------------------------------------------------


def test_a_nan_reward_batch_is_dropped_counted_and_logged(tmp_path):
    trainer = build(tmp_path, wrappers=[Inject], **{"logger.log_interval": 10})
    trainer.logger = Recorder()
    batches(trainer, 3)
    updates = trainer.updates
    Inject.armed = True
    with pytest.warns(RuntimeWarning, match="non-finite batch not trained on"):
        batches(trainer, 6)
    assert trainer.nonfinite_batches == 1 and trainer.nonfinite_updates == 0
    assert trainer.updates > updates  # training went on
    assert all_finite(trainer)
    stored = trainer.replay_buffer.storage[: len(trainer.replay_buffer)]
    assert torch.isfinite(stored["next", "reward"]).all()
    logged = [v for k, v, _ in trainer.logger.scalars if k == "train/nonfinite_batches"]
    assert sum(logged) == 1 and len(logged) == 9  # logged every time, 0 or 1
    assert not any(
        np.isnan(v) for k, v, _ in trainer.logger.scalars if k.startswith("train/loss")
    )
    trainer.close()


def test_nan_rewards_in_a_row_stop_naming_the_batch_and_frames(tmp_path):
    trainer = build(tmp_path, wrappers=[Inject], **{"health.max_nonfinite_in_a_row": 3})
    batches(trainer, 2)
    Inject.what, Inject.armed = "rewards", True
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError) as err:
        trainer.train()
    message = str(err.value)
    assert "3 collected batches in a row were non-finite" in message
    assert f"stopped at {trainer.frames} frames" in message
    assert "batch collected at 30 frames held 10 non-finite rewards" in message
    assert "0 non-finite observations" in message
    assert all_finite(trainer)
    # what was trained before the streak is kept: a checkpoint of the last
    # finite parameters, at the frames where it stopped
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    assert err.value.__notes__ == [
        f"training stopped while updating; a checkpoint of the {trainer.frames} "
        f"frames trained on was written. Resume with: resume={checkpoint}"
    ]
    header, state = read_checkpoint(checkpoint)
    assert header["frames"] == trainer.frames
    saved = state["loss_module"]
    current = trainer.loss_module.state_dict()
    assert all(torch.equal(saved[k], current[k]) for k in current)
    assert state["counters"]["nonfinite"]["streaks"]["batches"] == 3
    trainer.close()


def test_nan_observation_is_caught_before_it_is_stored(tmp_path):
    # at an episode's end: the policy never sees it (the next step starts from the
    # reset observation), so only the loss and the replay would
    trainer = build(tmp_path, wrappers=[Inject], **{"health.max_nonfinite_in_a_row": 1})
    batches(trainer, 1)
    Inject.what, Inject.armed = "final_observation", True
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError) as err:
        trainer.train()
    message = str(err.value)
    assert "1 collected batches in a row" in message
    assert "0 non-finite rewards and 4 non-finite observations" in message
    assert "('next', 'observation'): 4" in message
    assert f"at {trainer.frames} frames" in message
    stored = trainer.replay_buffer.storage[: len(trainer.replay_buffer)]
    assert torch.isfinite(stored["next", "observation"]).all()
    assert all_finite(trainer)
    trainer.close()


def _frames_in(path):
    return read_checkpoint(path)[0]["frames"]


@pytest.mark.parametrize("what", ["observation", "raise"])
def test_a_failure_while_collecting_keeps_what_was_trained(tmp_path, what):
    """A non-finite observation the policy would act on stops the run naming it
    (it used to fail inside the action distribution: "probability tensor contains
    either inf, nan or element < 0"); an environment that raises stops it with its
    own error. Either way a checkpoint of the batches trained on is written, and
    resumes with fresh episodes."""
    trainer = build(tmp_path, wrappers=[Inject], **{"checkpoint.interval": None})
    batches(trainer, 2)
    frames = trainer.frames
    Inject.what, Inject.armed = what, True
    expected = NonFiniteTrainingError if what == "observation" else RuntimeError
    with pytest.raises(expected) as err:
        trainer.train()
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    if what == "observation":
        assert str(err.value).startswith(
            f"the policy was given non-finite observations while collecting after "
            f"{frames} frames ('observation': 4 non-finite values)"
        )
    else:
        assert str(err.value) == "the simulator crashed"
    assert err.value.__notes__ == [
        f"training stopped while collecting; a checkpoint of the {frames} frames "
        f"trained on was written (without the environments' state: a resume starts "
        f"fresh episodes). Resume with: resume={checkpoint}"
    ]
    assert _frames_in(checkpoint) == frames
    trainer.close()

    resumed = build(tmp_path, wrappers=[Inject], **{"checkpoint.interval": None})
    resumed.load_checkpoint(checkpoint)
    assert resumed.frames == frames
    assert any(
        f"state not saved (collecting failed with {expected.__name__} after "
        f"{frames} frames); fresh episodes" in note
        for note in resumed.resume_notes
    ), resumed.resume_notes
    batches(resumed, 2)
    assert resumed.frames == frames + 20 and all_finite(resumed)
    resumed.close()


def test_a_nan_observation_while_evaluating_is_named(tmp_path):
    trainer = build(tmp_path, **{"checkpoint.interval": None})
    batches(trainer, 1)
    trainer.evaluator = GreedyEvaluator(
        make_env("CartPole-v1", num_envs=1, seed=1, wrappers=[Inject]),
        trainer.loss_module.actor_network,
        max_steps=50,
    )
    Inject.what, Inject.armed = "observation", True
    with pytest.raises(
        NonFiniteTrainingError, match="while evaluating after 10 frames"
    ):
        trainer._evaluate()
    assert _frames_in(tmp_path / "checkpoints" / "last.pt") == 10
    trainer.evaluator.close()
    trainer.close()


def test_a_non_finite_streak_goes_on_after_a_resume(tmp_path):
    overrides = {"health.max_nonfinite_in_a_row": 3, "checkpoint.interval": None}
    trainer = build(tmp_path, wrappers=[Inject], **overrides)
    batches(trainer, 1)
    Inject.what, Inject.armed = "rewards", True
    with pytest.warns(RuntimeWarning, match="non-finite batch not trained on"):
        batches(trainer, 2)
    path = trainer.save_checkpoint()
    trainer.close()

    resumed = build(tmp_path, wrappers=[Inject], **overrides)
    resumed.load_checkpoint(path)
    assert resumed.nonfinite_batches == 2
    with pytest.raises(NonFiniteTrainingError) as err:  # the third in a row
        batches(resumed, 1)
    assert "3 collected batches in a row were non-finite" in str(err.value)
    assert "batch collected at 20 frames held 10 non-finite rewards" in str(err.value)
    assert resumed.nonfinite_batches == 3
    resumed.close()


def blow_up(trainer):
    """Parameters so large that the critic's outputs overflow: finite batches,
    non-finite losses."""
    with torch.no_grad():
        for name, p in trainer.loss_module.named_parameters():
            if "critic" in name:
                p.mul_(1e30)


def test_non_finite_updates_are_skipped_then_stop_naming_the_term(tmp_path):
    trainer = build(tmp_path, **{"health.max_nonfinite_in_a_row": 4})
    batches(trainer, 2)
    blow_up(trainer)
    before = {k: v.clone() for k, v in trainer.loss_module.state_dict().items()}
    updates = trainer.updates
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError) as err:
        batches(trainer, 10)
    message = str(err.value)
    assert "4 updates in a row were non-finite" in message
    assert "first non-finite term loss_" in message
    assert "0 non-finite rewards and 0 non-finite observations" in message
    assert f"stopped at {trainer.frames} frames" in message
    assert trainer.nonfinite_updates == 4 and trainer.updates == updates
    after = trainer.loss_module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no step
    trainer.close()


def test_no_checkpoint_from_non_finite_parameters(tmp_path):
    # with the checks off, a non-finite update is applied; the save refuses it
    trainer = build(tmp_path, **{"health.check": False})
    batches(trainer, 2)
    path = trainer.save_checkpoint()
    previous = path.read_bytes()
    blow_up(trainer)
    batches(trainer, 1)
    assert not all_finite(trainer)
    with pytest.raises(NonFiniteTrainingError, match="refusing to write a checkpoint"):
        trainer.save_checkpoint()
    assert path.read_bytes() == previous
    assert not path.with_name("last.pt.tmp").exists()
    trainer.close()


# -- checkpoint files ----------------------------------------------------------------


def test_damaged_checkpoints_are_refused_naming_the_file(tmp_path):
    trainer = build(tmp_path / "a")
    batches(trainer, 2)
    path = trainer.save_checkpoint()
    header, state = read_checkpoint(path)
    assert header["format_version"] == 1 and header["frames"] == 20
    assert header["library_version"] and "git_commit" in header
    assert header["config"]["model"]["num_cells"] == [16]
    data = path.read_bytes()
    other = build(tmp_path / "b", seed=1)
    params = {k: v.clone() for k, v in other.loss_module.state_dict().items()}
    flipped = tmp_path / "flipped.pt"
    middle = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + 8):
        middle[i] ^= 0xFF
    flipped.write_bytes(bytes(middle))
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) - 1000])
    plain = tmp_path / "plain.pt"
    torch.save(state, plain)
    for bad, why in [
        (flipped, "is corrupted"),
        (truncated, "is truncated"),
        (plain, "is not a torchrl-acer checkpoint"),
    ]:
        with pytest.raises(CheckpointError, match=why) as err:
            other.load_checkpoint(bad)
        assert str(bad) in str(err.value)
    after = other.loss_module.state_dict()
    assert all(torch.equal(params[k], after[k]) for k in params)  # nothing loaded
    other.load_checkpoint(path, allow_config_change=["seed"])
    assert other.frames == 20
    trainer.close()
    other.close()


def test_resuming_with_another_config(tmp_path):
    trainer = build(tmp_path)
    batches(trainer, 2)
    path = trainer.save_checkpoint()
    trainer.close()
    # the same shapes, another network: loads without error unless refused
    tanh = build(tmp_path, **{"model.activation": "tanh"})
    with pytest.raises(CheckpointError) as err:
        tanh.load_checkpoint(path)
    message = str(err.value)
    assert "model.activation: 'relu' in the checkpoint, 'tanh' now" in message
    assert "resume_allow_config_change=[model.activation]" in message
    assert tanh.frames == 0
    tanh.load_checkpoint(path, allow_config_change=["model.activation"])
    assert tanh.frames == 20
    tanh.close()
    wider = build(tmp_path, **{"model.num_cells": [32]})
    with pytest.raises(CheckpointError, match=r"model.num_cells: \[16\] in the"):
        wider.load_checkpoint(path)
    # forced, the parameters still load strictly, naming the keys
    with pytest.raises(CheckpointError, match=r"weight: \(16, 4\) in the checkpoint"):
        wider.load_checkpoint(path, force=True)
    wider.close()
    # settings safe to change
    longer = build(
        tmp_path, **{"collector.total_frames": 1_000, "checkpoint.every_minutes": 1}
    )
    longer.load_checkpoint(path)
    assert longer.frames == 20 and longer.total_frames == 1_000
    longer.close()


class StoppedOnce:
    """An evaluator whose ``stop_at``-th call is stopped by Ctrl-C (a signal
    arriving while the run evaluates)."""

    def __init__(self, stop_at=None):
        self.calls, self.stop_at = 0, stop_at

    def __call__(self):
        self.calls += 1
        if self.calls == self.stop_at:
            os.kill(os.getpid(), signal.SIGINT)
        return {"reward": 0.0}


def _evaluated_frames(recorder):
    return [step for name, _, step in recorder.scalars if name == "eval/reward"]


def test_an_evaluation_stopped_by_a_signal_runs_first_on_resume(tmp_path):
    """No evaluation point is lost to a signal: the one it stopped is due in the
    checkpoint and runs before the resumed run collects, as it would have."""
    overrides = {"checkpoint.interval": None, "collector.total_frames": 60}

    def run(evaluator, run_dir, resume=None):
        recorder = Recorder()
        trainer = build(
            run_dir,
            trainer_kwargs=dict(evaluator=evaluator, eval_interval=20, logger=recorder),
            **overrides,
        )
        if resume is not None:
            trainer.load_checkpoint(resume)
        trainer.train()
        trainer.close()
        return trainer, _evaluated_frames(recorder)

    _, uninterrupted = run(StoppedOnce(), tmp_path / "a")
    assert uninterrupted == [10, 20, 40, 60]
    stopped, before = run(StoppedOnce(stop_at=2), tmp_path / "b")
    assert stopped.interrupted and stopped.frames == 20
    assert before == [10]  # the second evaluation (at 20) was stopped
    _, after = run(StoppedOnce(), tmp_path / "c", stopped.checkpoint_dir / "last.pt")
    assert before + after == uninterrupted


# -- signals and kills, on the example -----------------------------------------------

DRIVER = """
import io, os, runpy, sys, time
from pathlib import Path
import torch

mode, flag, marker, script = sys.argv[1:5]
original, calls = torch.save, []

def save(obj, f, *args, **kwargs):
    calls.append(1)
    if mode == "slow" and Path(flag).exists():
        Path(marker).touch()
        time.sleep(3)
    if mode == "hang" and len(calls) == 2:  # half the second checkpoint, then hang
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


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """The example stopped by SIGTERM, with a second signal (SIGINT) arriving
    while its final checkpoint is being written (slowly)."""
    tmp = tmp_path_factory.mktemp("sigterm")
    checkpoint = tmp / "run" / "checkpoints" / "last.pt"
    process = start_example(tmp, "slow", "checkpoint.interval=50")
    try:
        started = wait_for(checkpoint, process)
        previous = read_header(checkpoint).header["frames"] if started else None
        (tmp / "flag").touch()  # from now on each save takes 3 s
        if started:
            process.send_signal(signal.SIGTERM)
        if wait_for(tmp / "marker", process, timeout=60):
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return {
        "rc": process.returncode,
        "out": out,
        "err": err,
        "checkpoint": checkpoint,
        "previous": previous,
    }


def test_sigterm_writes_a_checkpoint_that_resumes(stopped_run, tmp_path):
    run = stopped_run
    assert run["previous"] is not None, run["err"][-3000:]
    assert run["rc"] == 128 + signal.SIGTERM, run["err"][-3000:]
    assert f"resume with: resume={run['checkpoint']}" in run["out"]
    header, _ = read_checkpoint(run["checkpoint"])
    frames = header["frames"]
    # written at the signal: it holds the frames the run stopped at
    assert f"interrupted (SIGTERM) at {frames} frames" in run["out"]
    trainer = build(
        tmp_path,
        **{
            "collector.total_frames": frames + 20,
            "replay.ratio": 4.0,  # the example's settings
            "replay.capacity": 100_000,
        },
    )
    trainer.load_checkpoint(run["checkpoint"])
    assert trainer.frames == frames
    trainer.train()
    assert trainer.frames == frames + 20 and not trainer.interrupted
    trainer.close()


def test_a_second_signal_during_the_save_waits_for_it(stopped_run):
    run = stopped_run
    assert "SIGINT: already stopping" in run["err"], run["err"][-3000:]
    header, _ = read_checkpoint(run["checkpoint"])
    # the final checkpoint, complete: it holds the frames the run stopped at
    assert f"at {header['frames']} frames" in run["out"]
    assert header["frames"] >= run["previous"]
    assert not run["checkpoint"].with_name("last.pt.tmp").exists()


def test_kill_9_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    # checkpoints every 0.3 s (by time: no frame interval); the second is killed
    # half-written
    process = start_example(tmp_path, "hang", "checkpoint.every_minutes=0.005")
    reached, out, err = signal_when_there(
        process, tmp_path / "marker", signal.SIGKILL, timeout=60
    )
    assert reached, err[-3000:]
    assert process.returncode == -signal.SIGKILL
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    header, state = read_checkpoint(checkpoint)
    assert header["frames"] > 0 and state["counters"]["frames"] == header["frames"]
    partial = checkpoint.with_name("last.pt.tmp")
    assert partial.exists()
    with pytest.raises(CheckpointError, match="truncated or incomplete"):
        read_header(partial)


def test_signal_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    trainer = build(tmp_path, **{"collector.total_frames": 20})
    seen = []
    original = trainer.train_on_batch

    def spy(batch):
        seen.append(signal.getsignal(signal.SIGTERM))
        original(batch)

    trainer.train_on_batch = spy
    trainer.train()
    assert seen and all(h == trainer._on_signal for h in seen)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    trainer.close()


def test_copies_of_the_actor_do_not_carry_the_trainer(tmp_path):
    """The policy-input check is a hook on the actor: a deepcopy or a pickle of the
    actor (what a multiprocess collector sends its workers) must not copy the
    trainer, its collector and its replay with it."""
    import copy
    import pickle

    trainer = build(tmp_path)
    actor = trainer.loss_module.actor_network
    hooks = list(actor._forward_pre_hooks.values())
    assert any(getattr(h, "trainer", None) is trainer for h in hooks)
    for clone in (copy.deepcopy(actor), pickle.loads(pickle.dumps(actor))):
        copied = list(clone._forward_pre_hooks.values())
        assert len(copied) == len(hooks)
        assert all(getattr(h, "trainer", None) is None for h in copied)
    assert len(pickle.dumps(actor)) < 100_000
    trainer.close()


@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_while_collecting(tmp_path, signals):
    """A first Ctrl-C in the middle of collecting waits for the batch, which is
    trained on before the stop (interrupted inside a step, a vector environment
    of worker processes was left mid-step: closing it hung or broke its pipes);
    a second one stops the collection at once."""
    trainer = build(tmp_path, wrappers=[Inject], **{"checkpoint.interval": None})
    batches(trainer, 2)
    frames = trainer.frames
    Inject.what = "sigint" if signals == 1 else "sigint_twice"
    Inject.armed = True
    trainer.train()
    assert trainer.interrupted and trainer.stop_signal == signal.SIGINT
    # one signal: the batch it arrived in is trained on; two: it is dropped
    assert trainer.frames == (frames + 10 if signals == 1 else frames)
    assert _frames_in(tmp_path / "checkpoints" / "last.pt") == trainer.frames
    trainer.close()


def test_a_second_process_on_a_running_run_is_refused_touching_nothing(tmp_path):
    # the mistake this guards: resuming a run while its first process still trains
    # (the resume cut the first's logs back to its checkpoint)
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    first = start_example(tmp_path, "plain", "checkpoint.interval=50")
    try:
        assert wait_for(checkpoint, first), first.communicate()[1][-3000:]
        first.send_signal(signal.SIGSTOP)  # holds still while the second tries
        before = snapshot(tmp_path / "run")
        second = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "acer_gym.py"),
                # a short budget: unrefused, it would end in seconds, status 0
                *[a for a in EXAMPLE_ARGS if not a.startswith("collector.total")],
                "collector.total_frames=100",
                f"logger.run_dir={tmp_path / 'run'}",
                f"resume={checkpoint}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert second.returncode != 0
        assert "is in use by another training process" in second.stderr
        assert str((tmp_path / "run").resolve()) in second.stderr
        assert snapshot(tmp_path / "run") == before
    finally:
        first.kill()  # SIGKILL: the lock goes with the process, nothing to clear
        first.communicate()
    # the directory is free again, here and in another process
    from torchrl_acer.training import experiment

    experiment.lock_run_dir(tmp_path / "run")
    experiment.lock_run_dir(tmp_path / "run")  # again in the holder: nothing happens
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from torchrl_acer.training.experiment import lock_run_dir; "
            "lock_run_dir(sys.argv[1])",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "RunDirInUseError" in probe.stderr
    from torchrl_acer.trainers import hooks  # where the lock registry lives

    os.close(hooks._RUN_DIR_LOCKS.pop((tmp_path / "run").resolve()))
