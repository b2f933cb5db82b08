"""ACERTrainer, TorchRL's Trainer wired for ACER: its schedule, its hooks, and the
old trainer's parameters reached at the same seed."""

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from builders import gym_config
from tensordict import TensorDict
from torchrl.checkpoint import GlobalRNGState
from torchrl.record.loggers import get_logger
from torchrl.trainers import Trainer

from torchrl_acer.modules.models import minatar_actor_critic, mlp_actor_critic
from torchrl_acer.trainers.acer import (
    ACERTrainer,
    ACERUpdateSchedule,
    as_segments,
    make_segment_replay_buffer,
)
from torchrl_acer.trainers.checkpoint import ACERCheckpoint, FiniteStateDictAdapter
from torchrl_acer.trainers.evaluation import GreedyEvaluator
from torchrl_acer.trainers.hooks import GracefulStop
from torchrl_acer.training.env_state import CollectorState
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import (
    check_config,
    make_collector,
    make_loss,
    make_optimizer,
)
from torchrl_acer.training.trainer import ACERTrainer as OldACERTrainer

OLD_SMALL = {
    "env.num_envs": 2,
    "collector.T": 5,
    "collector.total_frames": 100,
    "replay.ratio": 2.0,
    "replay.start": 0,
    "replay.capacity": 200,
    "eval.interval": 50,
    "eval.episodes": 2,
    "eval.max_steps": 30,
    "logger.backend": None,
    "logger.progress_bar": False,
    "model.num_cells": [16],
}


def old_small_config(**overrides):
    return gym_config(OLD_SMALL, **overrides)


def import_utils_gym():
    """``examples/utils_gym.py``, the gym example's environments and networks."""
    examples = str(Path(__file__).parent.parent / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import utils_gym

    return utils_gym


def make_old_trainer(run_dir, **overrides):
    """The old trainer (``torchrl_acer.training.trainer``) over the pieces
    ``examples/acer_gym.py`` builds, from the small config (moved unchanged from
    tests/test_trainer.py, for the parity tests until the old trainer goes)."""
    cfg = old_small_config(**overrides)
    check_config(cfg)
    torch.manual_seed(cfg.seed)
    if cfg.model.recurrent or cfg.env.observation_indices:
        # the example's own builders: env transforms and models made for each other
        utils_gym = import_utils_gym()

        def build_env(name, num_envs, seed):
            return utils_gym.make_env(cfg, num_envs, seed)

        env = build_env(cfg.env.name, num_envs=cfg.env.num_envs, seed=cfg.seed)
        actor, critic = utils_gym.make_models(cfg, env)
    else:
        build_env = make_env
        env = build_env(cfg.env.name, num_envs=cfg.env.num_envs, seed=cfg.seed)
        spec = env.action_spec[(0,) * env.batch_dims]
        obs = env.observation_spec["observation"].shape[-1]
        if cfg.env.name.startswith("MinAtar/"):
            actor, critic = minatar_actor_critic(obs, spec.shape[-1], action_spec=spec)
        else:
            actor, critic = mlp_actor_critic(
                obs, spec.shape[-1], num_cells=cfg.model.num_cells, action_spec=spec
            )
    loss = make_loss(cfg.loss, actor, critic)
    T, num_envs = cfg.collector.T, cfg.env.num_envs
    collector = make_collector(cfg, None, actor, device="cpu", env=env)
    replay = None
    if cfg.replay.ratio > 0:
        replay = make_segment_replay_buffer(
            cfg.replay.capacity, T, cfg.replay.batch_segments or num_envs
        )
    eval_env = build_env(
        cfg.env.name, num_envs=cfg.eval.episodes, seed=cfg.seed + 10_000
    )
    logger = None
    if cfg.logger.backend:
        logger = get_logger(
            cfg.logger.backend, logger_name=str(run_dir), experiment_name="logs"
        )
    return OldACERTrainer(
        collector=collector,
        loss_module=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        total_frames=cfg.collector.total_frames,
        replay_buffer=replay,
        replay_ratio=cfg.replay.ratio,
        replay_start=cfg.replay.start,
        target_eps=cfg.loss.alpha,
        max_grad_norm=cfg.optim.max_grad_norm,
        evaluator=GreedyEvaluator(eval_env, actor, max_steps=cfg.eval.max_steps),
        eval_interval=cfg.eval.interval,
        logger=logger,
        log_interval=cfg.logger.log_interval,
        checkpoint_dir=Path(run_dir) / "checkpoints",
        checkpoint_interval=cfg.checkpoint.interval,
        progress_bar=False,
        seed=cfg.seed,
    )


def new_trainer_like(old, **kwargs):
    """An ACERTrainer over the old trainer's own pieces (collector, loss, optimizer,
    replay), with its settings."""
    return ACERTrainer(
        collector=old.collector,
        total_frames=old.total_frames,
        loss_module=old.loss_module,
        optimizer=old.optimizer,
        replay_buffer=old.replay_buffer,
        replay_ratio=old.replay_ratio,
        replay_start=old.replay_start,
        target_net_updater=old.target_updater,
        clip_norm=old.max_grad_norm,
        progress_bar=False,
        seed=None,
        **kwargs,
    )


@pytest.mark.parametrize("backend", ["lean", "single"])
def test_reaches_the_old_trainers_parameters_after_three_iterations(tmp_path, backend):
    settings = {"collector.backend": backend, "collector.total_frames": 30}
    old = make_old_trainer(tmp_path / "old", **settings)
    it = iter(old.collector)
    for _ in range(3):
        old.train_on_batch(next(it))
    expected = old.loss_module.state_dict()
    assert old.updates > 3  # replayed updates happened too
    old.close()

    pieces = make_old_trainer(tmp_path / "new", **settings)  # same seed, fresh pieces
    trainer = new_trainer_like(pieces)
    trainer.schedule.generator.manual_seed(0)  # the old trainer's Poisson stream
    trainer.train()
    assert trainer.collected_frames == 30
    got = pieces.loss_module.state_dict()
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    pieces.close()


def test_is_a_torchrl_trainer_that_a_user_extends_with_register_op(tmp_path):
    pieces = make_old_trainer(tmp_path, **{"collector.total_frames": 30})
    trainer = new_trainer_like(pieces)
    assert isinstance(trainer, Trainer)
    seen = {"batches": [], "updates": 0}
    trainer.register_op("pre_steps_log", lambda batch: seen["batches"].append(batch))

    def count_update():
        seen["updates"] += 1

    trainer.register_op("post_optim", count_update)
    trainer.train()
    # the user's hooks saw every collected batch, as [num_envs, T] segments, and
    # every optimizer step: the on-policy ones and the replayed ones
    assert [b.shape for b in seen["batches"]] == [torch.Size([2, 5])] * 3
    assert seen["updates"] > 3
    assert len(trainer.schedule.replay_buffer) == 6  # 3 batches of 2 segments
    pieces.close()


def segments(n, T=5):
    return TensorDict({"x": torch.arange(n * T).reshape(n, T)}, [n, T])


def test_schedule_hands_out_fresh_then_poisson_replayed_batches_then_stops():
    replay = make_segment_replay_buffer(1000, 5, 3)
    schedule = ACERUpdateSchedule(replay, replay_ratio=2.5, seed=1)
    counts = []
    for _ in range(400):
        fresh = segments(2)
        handed = handed_by(schedule, fresh)
        assert handed[0] is fresh  # the on-policy update comes first
        assert all(b.shape == (3, 5) for b in handed[1:])  # sampled segments
        counts.append(len(handed) - 1)
    counts = torch.tensor(counts, dtype=torch.float)
    # Poisson(2.5): mean and variance 2.5 (400 draws: standard error ~0.08)
    assert abs(counts.mean() - 2.5) < 0.3 and abs(counts.var() - 2.5) < 0.8


def test_schedule_replay_start_off_policy_only_and_refused_batches():
    replay = make_segment_replay_buffer(1000, 5, 1)
    schedule = ACERUpdateSchedule(
        replay, replay_ratio=50.0, replay_start=20, on_policy_updates=False
    )

    assert handed_by(schedule, segments(2)) == []  # 10 steps < replay_start
    assert len(handed_by(schedule, segments(2))) > 20  # 20 steps: replay only
    refusing = ACERUpdateSchedule(replay, replay_ratio=0.0, accept=[lambda b: False])
    stored = len(replay)
    assert handed_by(refusing, segments(2)) == []  # no on-policy update
    assert len(replay) == stored  # and not stored


def handed_by(schedule, batch):
    schedule.store(batch)
    out = []
    while True:
        try:
            out.append(schedule(batch))
        except StopIteration:
            return out


def test_batches_become_segments():
    assert as_segments(segments(1)[0]).shape == (1, 5)
    three = TensorDict({"x": torch.zeros(2, 3, 5)}, [2, 3, 5])
    assert as_segments(three).shape == (6, 5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"replay_ratio": float("inf")}, "finite"),
        ({"replay_ratio": -1.0}, ">= 0"),
        ({"replay_ratio": 1.0, "replay_buffer": None}, "needs a replay_buffer"),
        ({"replay_ratio": 0.0, "on_policy_updates": False}, "nothing would train"),
        ({"replay_start": -1}, "replay_start"),
    ],
)
def test_schedule_refuses_settings_that_cannot_work(kwargs, match):
    kwargs = {"replay_buffer": make_segment_replay_buffer(100, 5, 1), **kwargs}
    with pytest.raises(ValueError, match=match):
        ACERUpdateSchedule(**kwargs)


def run_resumable(tmp_path, frames, *, save=None, load=None, hooks=()):
    """ACERTrainer over fresh pieces (a new process's), checkpointing to ``save``
    through ACERCheckpoint with the environments and the random state, from
    ``load`` if given, with ``hooks(trainer)`` registered; returns the parameters,
    the averaged policy, the optimizer state and the trainer."""
    pieces = make_old_trainer(tmp_path / "pieces", **{"collector.backend": "single"})
    checkpoint = (
        ACERCheckpoint(config={"seed": 0})
        .register(
            "envs",
            CollectorState(pieces.collector),
            adapter=FiniteStateDictAdapter(payload_format="torch", weights_only=False),
        )
        .register("rng", GlobalRNGState())  # actions and replay samples
    )
    # with a file, the trainer saves when it reaches total_frames or is stopped
    trainer = new_trainer_like(pieces, checkpoint=checkpoint, save_trainer_file=save)
    trainer.total_frames = frames
    for hook in hooks:
        hook(trainer)
    if load is not None:
        checkpoint.load(load)
    trainer.train()
    state = {
        "loss": pieces.loss_module.state_dict(),
        "optim": pieces.optimizer.state_dict()["state"],
        "trainer": trainer,
    }
    pieces.close()
    return state


def assert_same_training_state(got, expected):
    for key, value in expected["loss"].items():
        assert torch.equal(got["loss"][key], value), key
    for index, state in expected["optim"].items():
        for name, value in state.items():
            assert torch.equal(got["optim"][index][name], value), (index, name)


def test_stopped_and_resumed_through_acer_checkpoint_ends_bit_for_bit(tmp_path):
    """3 batches, a checkpoint, a fresh process's pieces loading it, 3 more batches:
    the parameters, averaged policy and optimizer of 6 uninterrupted batches."""
    expected = run_resumable(tmp_path, 60)
    run_resumable(tmp_path, 30, save=tmp_path / "ckpt")
    got = run_resumable(tmp_path, 60, load=tmp_path / "ckpt")
    assert got["trainer"].collected_frames == 60
    assert_same_training_state(got, expected)


def test_a_signal_stops_with_a_checkpoint_that_resumes_bit_for_bit(tmp_path):
    """GracefulStop on ACERTrainer: SIGTERM during the third batch's updates ends
    the iteration, the trainer saves, ``train`` returns with the exit code; fresh
    pieces resume from the file to the uninterrupted run's state."""
    stop = GracefulStop()

    def send_sigterm_in_the_third_batch(trainer):
        def maybe_signal():
            if trainer.collected_frames == 30 and not stop.signum:
                os.kill(os.getpid(), signal.SIGTERM)

        trainer.register_op("post_optim", maybe_signal)
        stop.register(trainer)

    expected = run_resumable(tmp_path, 60)
    stopped = run_resumable(
        tmp_path, 60, save=tmp_path / "ckpt", hooks=[send_sigterm_in_the_third_batch]
    )
    assert stopped["trainer"].collected_frames == 30
    assert stop.exit_code == 128 + signal.SIGTERM
    got = run_resumable(tmp_path, 60, load=tmp_path / "ckpt")
    assert_same_training_state(got, expected)


class NaNRewardOnce:
    """A collector whose ``nan_at``-th batch comes from a broken environment."""

    init_random_frames = 0

    def __init__(self, collector, nan_at):
        self.collector, self.nan_at = collector, nan_at

    def __iter__(self):
        for i, batch in enumerate(self.collector):
            if i == self.nan_at:
                batch["next", "reward"][0, 2] = float("nan")
            yield batch

    def shutdown(self):
        self.collector.shutdown()


def test_a_non_finite_batch_is_neither_trained_on_nor_stored(tmp_path):
    pieces = make_old_trainer(tmp_path, **{"collector.total_frames": 30})
    trainer = new_trainer_like(pieces)
    trainer.collector = NaNRewardOnce(pieces.collector, nan_at=1)
    with pytest.warns(RuntimeWarning, match="non-finite batch not trained on"):
        trainer.train()
    assert trainer.optimization_stepper.nonfinite == {"updates": 0, "batches": 1}
    replay = trainer.schedule.replay_buffer
    assert len(replay) == 4  # the segments of 2 of the 3 batches
    assert torch.isfinite(replay[:]["next", "reward"]).all()
    for value in pieces.loss_module.state_dict().values():
        assert torch.isfinite(value).all()
    pieces.close()


def test_greedy_evaluation_on_a_frame_schedule_and_at_the_end(tmp_path):
    from torchrl.record.loggers import CSVLogger

    from torchrl_acer.trainers.evaluation import Evaluation

    pieces = make_old_trainer(tmp_path, **{"collector.total_frames": 50})
    logger = CSVLogger("eval", log_dir=str(tmp_path / "logs"))
    trainer = new_trainer_like(pieces, logger=logger)
    calls = []

    def evaluate():
        calls.append(trainer.collected_frames)
        return pieces.evaluator()

    hook = Evaluation(evaluate, interval=20)
    hook.register(trainer)
    trainer.train()
    # batches of 10 frames: due at 0 (the first batch), 20 and 40, then the end
    assert calls == [10, 20, 40, 50]
    assert hook.last["frames"] == 50 and "reward" in hook.last
    rows = (tmp_path / "logs" / "eval" / "scalars" / "eval" / "reward.csv").read_text()
    assert [int(float(line.split(",")[0])) for line in rows.split()] == calls
    pieces.close()


def test_save_every_minutes_saves_between_batches(tmp_path, monkeypatch):
    """With a clock that moves a minute a batch, a save every 2 minutes lands
    after every second batch, each holding the frames trained so far."""
    from torchrl_acer.trainers import checkpoint as module

    clock = [0.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    saved = []

    def run(trainer):
        module.SaveEvery(2).register(trainer)
        trainer.register_op(
            "pre_steps_log", lambda batch: clock.__setitem__(0, clock[0] + 60)
        )
        original = trainer.checkpoint.save

        def save(*args, **kwargs):
            saved.append(trainer.collected_frames)
            return original(*args, **kwargs)

        trainer.checkpoint.save = save

    run_resumable(tmp_path, 50, save=tmp_path / "ckpt", hooks=[run])
    # batches of 10 frames: due at 20 and 40 frames, and the end's own save at 50
    assert saved == [20, 40, 50]
