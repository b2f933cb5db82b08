"""A resumed run continues the same run.

Stopped at a checkpoint and resumed by a trainer built afresh (another seed for
everything it builds, scrambled global random states), a run ends bit for bit
where the uninterrupted run ends, on the CPU, where the environments' state can be
saved; its CSV logs lose the rows written past the checkpoint; a finished run is
left alone; a checkpoint finds its run directory wherever it was copied; and a
checkpoint costs what the replay holds, not its capacity.
"""

import io
import random
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from _frame_replay_helpers import collect, make_stacked_env
from builders import cartpole_states, small_gym_config, small_trainer, snapshot
from omegaconf import OmegaConf
from torchrl.envs import GymWrapper

from torchrl_acer.training.env_state import (
    CollectorState,
    collector_state_dict,
    env_state_dict,
    load_env_state_dict,
    restart_episodes,
    resume_seed,
)
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import (
    CSV_HEADER,
    checkpoint_run_dir,
    resume,
    run_dir_for,
)
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer

RUNS = {
    # total frames, and what differs from builders' small gym config: replay
    # starts before the checkpoint at half time, and the checkpoint falls between
    # two training logs
    "CartPole-v1": (
        100,
        {"replay.start": 20, "eval.interval": 30, "logger.log_interval": 30},
    ),
    "MinAtar/Breakout-v1": (
        40,
        {
            "replay.start": 10,
            "eval.interval": 20,
            "eval.max_steps": 10,
            "logger.log_interval": 25,
        },
    ),
    # the learning rate falling linearly: its schedule resumes where it was
    "CartPole-v1 (linear lr)": (
        100,
        {
            "replay.start": 20,
            "eval.interval": 30,
            "logger.log_interval": 30,
            "optim.schedule": "linear",
        },
    ),
    # a recurrent policy on CartPole without velocities: the hidden states the
    # collector carries between batches are in the checkpoint, and a burn-in
    "CartPole-v1 (LSTM)": (
        100,
        {
            "replay.start": 20,
            "eval.interval": 30,
            "logger.log_interval": 30,
            "model.recurrent": "lstm",
            "model.recurrent_size": 8,
            "env.observation_indices": [0, 2],
            "loss.burn_in": 2,
        },
    ),
}


def last_checkpoint(run_dir) -> Path:
    return Path(run_dir) / "checkpoints" / "last"


def close(trainer):
    """Shuts the trainer's collector and evaluation environments."""
    trainer.collector.shutdown()
    evaluate = trainer.evaluation.evaluate
    if hasattr(evaluate, "close"):
        evaluate.close()


def train_keeping_checkpoint(trainer, at_frames, copy_to):
    """Trains ``trainer``, saving at ``at_frames`` (where the trainer's own saves
    happen: after the batch's updates and logs, as a stopped run saves) and keeping
    a copy of that checkpoint at ``copy_to``."""
    original = trainer.save_trainer

    def save_trainer(force_save=False):
        due = trainer.collected_frames == at_frames
        original(force_save=force_save or due)
        if due:
            shutil.copytree(trainer.save_trainer_file, copy_to)

    trainer.save_trainer = save_trainer
    trainer.train()
    assert (copy_to / "manifest.json").is_file()


def csv_rows(run_dir):
    scalars = Path(run_dir) / "logs" / "scalars"
    return {
        str(f.relative_to(scalars)): [
            line.split(",")
            for line in f.read_text().splitlines(keepends=True)
            if line != CSV_HEADER
        ]
        for f in scalars.rglob("*.csv")
    }


def training_log(trainer):
    return trainer._modules["training_log"]


@pytest.mark.parametrize("env_name", list(RUNS))
def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, env_name, capsys):
    total, extra = RUNS[env_name]
    half = total // 2
    overrides = {
        "env.name": env_name.split(" ")[0],
        "collector.total_frames": total,
        "logger.backend": "csv",
        **extra,
    }
    # the uninterrupted run, which checkpoints at half time on the way
    whole = small_trainer(tmp_path / "whole", **overrides)
    checkpoint = tmp_path / "half"
    train_keeping_checkpoint(whole, half, checkpoint)
    close(whole)
    schedule = whole.schedule
    assert whole.collected_frames == total
    assert schedule.replay_steps > schedule.replay_start

    # a run killed after the checkpoint, having logged up to the end
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    # resumed by a trainer whose pieces all start elsewhere: another seed for the
    # networks and the environments, other global random states
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    resumed = small_trainer(
        tmp_path / "resumed",
        seed=7,
        resume=str(checkpoint),
        resume_allow_config_change=["seed"],
        **overrides,
    )
    resume(resumed, checkpoint)
    out = capsys.readouterr().out
    assert f"resumed from {checkpoint} at {half} frames" in out
    assert "training environments: state restored" in out
    assert "evaluation environments: state restored" in out
    assert "log rows written after" in out
    resumed.train()
    close(resumed)

    assert resumed.collected_frames == whole.collected_frames
    assert resumed._optim_count == whole._optim_count
    steps = [t.optimization_stepper.optimizer_step_count for t in (whole, resumed)]
    assert steps[0] == steps[1]
    # parameters, the averaged policy and the value estimator's buffers
    mine, theirs = whole.loss_module.state_dict(), resumed.loss_module.state_dict()
    assert set(mine) == set(theirs)
    assert any("target_" in key for key in mine)
    for key, value in mine.items():
        assert torch.equal(value, theirs[key]), key
    assert_tree_equal(whole.optimizer.state_dict(), resumed.optimizer.state_dict())
    # the replay: the same segments in the same places
    a, b = whole.schedule.replay_buffer, resumed.schedule.replay_buffer
    assert len(a) == len(b) and a._writer._cursor == b._writer._cursor
    assert (a.storage[: len(a)] == b.storage[: len(b)]).all()
    assert whole.evaluation.last == resumed.evaluation.last
    assert list(training_log(whole).recent) == list(training_log(resumed).recent)
    # the logs: the same rows, steps going up, except the measured speed's value
    logged, relogged = csv_rows(tmp_path / "whole"), csv_rows(tmp_path / "resumed")
    assert set(logged) == set(relogged) and "eval/reward.csv" in logged
    for name, rows in logged.items():
        steps = [int(step) for step, _ in relogged[name]]
        assert steps == sorted(set(steps)), name
        if name.startswith("time/"):
            assert steps == [int(step) for step, _ in rows], name
        else:
            assert relogged[name] == rows, name


def assert_tree_equal(a, b, path="state"):
    if isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ"
        for key in a:
            assert_tree_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif hasattr(a, "shape") and hasattr(a, "dtype"):  # numpy
        assert (a == b).all(), path
    else:
        assert a == b, path


class RebuiltOnPickle(gym.Env, gym.utils.EzPickle):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        gym.utils.EzPickle.__init__(self)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_environments_that_cannot_be_saved_restart_with_derived_seeds(tmp_path, capsys):
    # (AsyncVectorEnv's and the ALE's vector env's copies live elsewhere: the same)
    # envs that pickle by re-running their constructor (MuJoCo's) lose their state
    same_step = gym.vector.AutoresetMode.SAME_STEP
    ez = GymWrapper(
        gym.vector.SyncVectorEnv([RebuiltOnPickle] * 2, autoreset_mode=same_step)
    )
    state = env_state_dict(ez)
    assert not state["saved"] and "RebuiltOnPickle pickles by re-" in state["reason"]

    trainer = small_trainer(tmp_path, **{"collector.total_frames": 20})
    # the training environments' state could not be saved, as Atari's cannot
    trainer.environments[0].state_dict = lambda: {
        "saved": False,
        "reason": "as Atari's",
        "at_frames": trainer.collected_frames,
    }
    trainer.train()
    close(trainer)
    checkpoint = last_checkpoint(tmp_path)
    fresh = small_trainer(
        tmp_path, resume=str(checkpoint), **{"collector.total_frames": 40}
    )
    resume(fresh, checkpoint)
    seed = resume_seed(0, 20)
    assert seed != resume_seed(0, 30) and seed != resume_seed(1, 20)
    assert seed not in range(0, 2)  # never the start's seeds again
    training, evaluation = (state.notes for state in fresh.environments)
    assert training == [
        f"training environments: state not saved (as Atari's); fresh episodes "
        f"seeded with {seed}, derived from seed=0 and frames=20"
    ]
    assert evaluation[0].startswith("evaluation environments: state restored")
    assert f"resume: {training[0]}" in capsys.readouterr().out
    # the collector carries the first observations of environments seeded so
    reference = make_env("CartPole-v1", num_envs=2, seed=seed)
    expected = reference.reset()["observation"]
    carrier = collector_state_dict(fresh.collector)["carrier"]
    assert torch.equal(carrier["observation"], expected)
    assert (carrier["episode_reward"] == 0).all()
    reference.close()
    fresh.train()  # and training goes on from there
    assert fresh.collected_frames == 40
    close(fresh)


def test_a_restarted_collector_starts_from_the_states_its_copies_are_in():
    # restart_episodes after a step where some copies ended (a checkpoint loaded
    # into a trainer that has run): TorchRL 0.14's bare reset would hand the
    # collector the observations saved at that step (upstream/torchrl/0002-*.patch)
    from torchrl.collectors import Collector
    from torchrl.modules import RandomPolicy

    env = make_env("CartPole-v1", num_envs=4, seed=0)
    torch.manual_seed(0)
    collector = Collector(
        env, RandomPolicy(env.action_spec), frames_per_batch=4, total_frames=-1
    )
    for batch in collector:  # one step per batch
        done = batch["next", "done"].reshape(-1)
        if done.any() and not done.all():
            break
    restart_episodes(collector, seed=5)
    observation = collector_state_dict(collector)["carrier"]["observation"]
    assert torch.equal(observation, cartpole_states(env).to(observation.dtype))
    collector.shutdown()


def test_a_finished_run_is_left_alone_and_copies_find_their_run(tmp_path, capsys):
    run = tmp_path / "run"
    settings = {"collector.total_frames": 30, "logger.backend": "csv"}
    trainer = small_trainer(run, **settings)
    trainer.train()
    close(trainer)
    (run / "summary.json").write_text('{"final_eval": {"reward": 9.0}}\n')
    checkpoint = last_checkpoint(run)
    elsewhere = tmp_path / "elsewhere" / "copy"
    shutil.copytree(checkpoint, elsewhere)
    before = snapshot(tmp_path)

    again = small_trainer(run, resume=str(elsewhere), **settings)
    with pytest.raises(SystemExit) as exit_:
        resume(again, elsewhere)
    close(again)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "is a finished run (30 frames, collector.total_frames=30)" in out
    assert "nothing changed" in out
    assert snapshot(tmp_path) == before

    # the copied checkpoint knows its run; logger.run_dir overrides it
    assert checkpoint_run_dir(elsewhere) == run.resolve()
    cfg = small_gym_config(resume=str(elsewhere))
    assert run_dir_for(cfg) == run.resolve()
    OmegaConf.update(cfg, "logger.run_dir", str(tmp_path / "other"))
    assert run_dir_for(cfg) == tmp_path / "other"
    # a run moved as a whole is found where its checkpoint now lies
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    assert checkpoint_run_dir(last_checkpoint(moved)) == moved
    # a lone copy whose run is gone still writes where its run was
    assert checkpoint_run_dir(elsewhere) == run.resolve()


def test_checkpoint_size_follows_the_replay_contents(tmp_path):
    capacity = 100_000
    settings = {"collector.total_frames": 60, "replay.capacity": capacity}
    trainer = small_trainer(tmp_path, **settings)
    trainer.train()
    close(trainer)
    replay = trainer.schedule.replay_buffer
    stored = len(replay) * trainer.schedule.segment_length
    assert stored == 60
    checkpoint = last_checkpoint(tmp_path)
    size = sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file())
    whole = io.BytesIO()
    torch.save(replay.state_dict(), whole)  # the capacity's worth
    assert whole.tell() > 1_000_000 and size < whole.tell() / 50

    # a fresh buffer restored from it samples the same segments
    fresh = small_trainer(tmp_path, resume=str(checkpoint), **settings)
    fresh.load_from_file(checkpoint)
    restored = fresh.schedule.replay_buffer
    assert restored is not replay and len(restored) == len(replay)
    for _ in range(3):
        rng = torch.get_rng_state()
        sample = replay.sample()
        torch.set_rng_state(rng)
        assert (restored.sample() == sample).all()
    close(fresh)


def test_frame_stack_replay_saves_what_it_holds():
    N, T = 2, 6
    batches = collect(make_stacked_env(N, seed=5), T, 4)

    def make():
        return FrameStackReplayBuffer(
            N,
            6_000,
            T,
            4,
            pixels_key="observation",
            padding="first",
            generator=torch.Generator().manual_seed(3),
        )

    rb = make()
    for b in batches[:3]:
        rb.extend(b)
    rb.sample()  # the generator moves on
    state = rb.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    held = 3 * N * T * 84 * 84
    assert rb.nbytes() > 100 * held and buffer.tell() < 1.5 * held
    other = make()
    other.load_state_dict(state)
    for _ in range(3):
        assert (other.sample() == rb.sample()).all()
    # and both go on alike
    rb.extend(batches[3])
    other.extend(batches[3])
    for key in FrameStackReplayBuffer._STATE:
        mine, theirs = getattr(rb, key), getattr(other, key)
        assert (mine == theirs).all() if hasattr(mine, "shape") else mine == theirs


def test_env_state_of_a_bare_gym_wrapper_round_trips():
    """A GymWrapper around a SyncVectorEnv, without transforms of our own (its
    auto-reset transform is its TransformedEnv's only one, not a Compose): its
    state is saved and restored, and the copy steps as the original does."""
    same_step = gym.vector.AutoresetMode.SAME_STEP

    def make():
        vector = gym.make_vec(
            "CartPole-v1",
            num_envs=2,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": same_step},
        )
        return GymWrapper(vector)

    env, copy = make(), make()
    env.set_seed(0)
    env.rollout(7, break_when_any_done=False)
    state = env_state_dict(env)
    assert state["saved"]
    load_env_state_dict(copy, state)
    action = env.full_action_spec.zero()
    for _ in range(3):
        ours, theirs = env.step(action.clone()), copy.step(action.clone())
        torch.testing.assert_close(ours["next"], theirs["next"])


def test_torchrls_own_environments_are_refused_saying_why():
    # TorchRL's GymEnv (one gymnasium env) and SerialEnv (started or not yet: a
    # SerialEnv's attribute lookup forwards to copies it has not built) are
    # refused, so a resume starts fresh episodes, naming what they are
    from torchrl.envs import GymEnv, SerialEnv

    def reason(env):
        return CollectorState(env).state_dict()["reason"]

    assert (
        reason(GymEnv("CartPole-v1")) == "GymEnv does not wrap a gymnasium vector env"
    )
    serial = SerialEnv(2, lambda: GymEnv("CartPole-v1"))
    assert reason(serial) == "SerialEnv does not wrap a gymnasium vector env"
    serial.reset()
    assert reason(serial) == "SerialEnv does not wrap a gymnasium vector env"
    serial.close()
