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
from builders import cartpole_states, snapshot
from omegaconf import OmegaConf
from test_frame_replay import collect, make_stacked_env
from test_trainer import assert_tree_equal, make_trainer, small_config
from torchrl.envs import GymWrapper

from torchrl_acer.training.checkpoint import read_checkpoint
from torchrl_acer.training.env_state import (
    collector_state_dict,
    env_state_dict,
    restart_episodes,
    resume_seed,
)
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import checkpoint_run_dir, resume, run_dir_for
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer

RUNS = {
    # total frames, and what differs from test_trainer's small config: replay
    # starts before the checkpoint at half time, and the checkpoint falls between
    # two training logs (the metrics gathered since the last one carry over)
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


def train_keeping_checkpoint(trainer, at_frames, copy_to):
    """Trains ``trainer``, keeping a copy of the checkpoint written at
    ``at_frames`` (a run stopped there would have written the same state)."""
    original = trainer.save_checkpoint

    def save_checkpoint(path=None):
        out = original(path)
        if trainer.frames == at_frames:
            shutil.copy(out, copy_to)
        return out

    trainer.save_checkpoint = save_checkpoint
    trainer.train()
    assert copy_to.is_file()


def csv_rows(run_dir):
    scalars = Path(run_dir) / "logs" / "scalars"
    return {
        str(f.relative_to(scalars)): [
            line.split(",") for line in f.read_text().splitlines()
        ]
        for f in scalars.rglob("*.csv")
    }


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
    whole = make_trainer(
        tmp_path / "whole", **overrides, **{"checkpoint.interval": half}
    )
    checkpoint = tmp_path / "half.pt"
    train_keeping_checkpoint(whole, half, checkpoint)
    whole.close()
    assert whole.frames == total and whole.replay_steps > whole.replay_start

    # a run killed after the checkpoint, having logged up to the end
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    # resumed by a trainer whose pieces all start elsewhere: another seed for the
    # networks and the environments, other global random states
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    resumed = make_trainer(tmp_path / "resumed", seed=7, **overrides)
    resume(resumed, checkpoint)
    out = capsys.readouterr().out
    assert f"resumed from {checkpoint} at {half} frames" in out
    assert "training environments: state restored" in out
    assert "evaluation environments: state restored" in out
    assert "log rows written after" in out
    resumed.train()
    resumed.close()

    assert resumed.frames == whole.frames and resumed.updates == whole.updates
    # parameters, the averaged policy and the value estimator's buffers
    mine, theirs = whole.loss_module.state_dict(), resumed.loss_module.state_dict()
    assert set(mine) == set(theirs)
    assert any("target_" in key for key in mine)
    for key, value in mine.items():
        assert torch.equal(value, theirs[key]), key
    assert_tree_equal(whole.optimizer.state_dict(), resumed.optimizer.state_dict())
    # the replay: the same segments in the same places
    a, b = whole.replay_buffer, resumed.replay_buffer
    assert len(a) == len(b) and a._writer._cursor == b._writer._cursor
    assert (a.storage[: len(a)] == b.storage[: len(b)]).all()
    assert whole.last_eval == resumed.last_eval
    assert list(whole.recent_returns) == list(resumed.recent_returns)
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


def test_environments_that_cannot_be_saved_restart_with_derived_seeds(tmp_path):
    # (AsyncVectorEnv's and the ALE's vector env's copies live elsewhere: the same)
    # envs that pickle by re-running their constructor (MuJoCo's) lose their state
    same_step = gym.vector.AutoresetMode.SAME_STEP
    ez = GymWrapper(
        gym.vector.SyncVectorEnv([RebuiltOnPickle] * 2, autoreset_mode=same_step)
    )
    state = env_state_dict(ez)
    assert not state["saved"] and "RebuiltOnPickle pickles by re-" in state["reason"]

    trainer = make_trainer(tmp_path, **{"collector.total_frames": 20})
    trainer.train()
    trainer.close()
    _, state = read_checkpoint(tmp_path / "checkpoints" / "last.pt")
    state["envs"]["collector"] = {"saved": False, "reason": "as Atari's"}
    fresh = make_trainer(tmp_path, **{"collector.total_frames": 40})
    fresh.load_state_dict(state)
    seed = resume_seed(0, 20)
    assert seed != resume_seed(0, 30) and seed != resume_seed(1, 20)
    assert seed not in range(0, 2)  # never the start's seeds again
    assert fresh.resume_notes[0] == (
        f"training environments: state not saved (as Atari's); fresh episodes "
        f"seeded with {seed}, derived from seed=0 and frames=20"
    )
    assert fresh.resume_notes[1].startswith("evaluation environments: state restored")
    # the collector carries the first observations of environments seeded so
    reference = make_env("CartPole-v1", num_envs=2, seed=seed)
    expected = reference.reset()["observation"]
    carrier = collector_state_dict(fresh.collector)["carrier"]
    assert torch.equal(carrier["observation"], expected)
    assert (carrier["episode_reward"] == 0).all()
    reference.close()
    fresh.train()  # and training goes on from there
    assert fresh.frames == 40
    fresh.close()


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
    trainer = make_trainer(
        run, **{"collector.total_frames": 30, "logger.backend": "csv"}
    )
    trainer.train()
    trainer.close()
    (run / "summary.json").write_text('{"final_eval": {"reward": 9.0}}\n')
    checkpoint = run / "checkpoints" / "last.pt"
    elsewhere = tmp_path / "elsewhere" / "copy.pt"
    elsewhere.parent.mkdir()
    shutil.copy(checkpoint, elsewhere)
    before = snapshot(tmp_path)

    again = make_trainer(run, **{"collector.total_frames": 30, "logger.backend": "csv"})
    with pytest.raises(SystemExit) as exit_:
        resume(again, elsewhere)
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "is a finished run (30 frames, collector.total_frames=30)" in out
    assert "nothing changed" in out
    assert snapshot(tmp_path) == before

    # the copied checkpoint knows its run; logger.run_dir overrides it
    assert checkpoint_run_dir(elsewhere) == run.resolve()
    cfg = small_config(resume=str(elsewhere))
    assert run_dir_for(cfg) == run.resolve()
    OmegaConf.update(cfg, "logger.run_dir", str(tmp_path / "other"))
    assert run_dir_for(cfg) == tmp_path / "other"
    # a run moved as a whole is found where its checkpoint now lies
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    assert checkpoint_run_dir(moved / "checkpoints") == moved
    # a lone copy whose run is gone still writes where its run was
    assert checkpoint_run_dir(elsewhere) == run.resolve()


def test_checkpoint_size_follows_the_replay_contents(tmp_path):
    capacity = 100_000
    trainer = make_trainer(
        tmp_path, **{"collector.total_frames": 60, "replay.capacity": capacity}
    )
    trainer.train()
    trainer.close()
    stored = len(trainer.replay_buffer) * trainer.segment_length
    assert stored == 60
    size = (tmp_path / "checkpoints" / "last.pt").stat().st_size
    whole = io.BytesIO()
    torch.save(trainer.replay_buffer.state_dict(), whole)  # the capacity's worth
    assert whole.tell() > 1_000_000 and size < whole.tell() / 50

    # a fresh buffer restored from it samples the same segments
    fresh = make_trainer(tmp_path, **{"replay.capacity": capacity})
    _, state = read_checkpoint(tmp_path / "checkpoints" / "last.pt")
    fresh.load_state_dict(state)
    assert len(fresh.replay_buffer) == len(trainer.replay_buffer)
    for _ in range(3):
        rng = torch.get_rng_state()
        sample = trainer.replay_buffer.sample()
        torch.set_rng_state(rng)
        assert (fresh.replay_buffer.sample() == sample).all()
    fresh.close()


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
