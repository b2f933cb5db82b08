"""ACERTrainer, TorchRL's Trainer wired for ACER: its schedule and its hooks."""

import os
import signal
from types import SimpleNamespace

import pytest
import torch
from builders import load_example_module, small_gym_config
from tensordict import TensorDict
from torchrl.checkpoint import GlobalRNGState
from torchrl.trainers import Trainer

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
from torchrl_acer.training.experiment import (
    check_config,
    make_collector,
    make_loss,
    make_optimizer,
)


def make_pieces(**overrides):
    """The pieces ``examples/acer_gym.py`` builds (collector, loss, optimizer,
    replay, greedy evaluator) from the small gym config, with its settings."""
    cfg = small_gym_config(**overrides)
    check_config(cfg)
    torch.manual_seed(cfg.seed)
    utils_gym = load_example_module("utils_gym")
    env = utils_gym.make_env(cfg, cfg.env.num_envs, seed=cfg.seed)
    actor, critic = utils_gym.make_models(cfg, env)
    loss = make_loss(cfg.loss, actor, critic)
    eval_env = utils_gym.make_env(cfg, cfg.eval.episodes, seed=cfg.seed + 10_000)
    return SimpleNamespace(
        cfg=cfg,
        collector=make_collector(cfg, None, actor, device="cpu", env=env),
        loss_module=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        replay_buffer=make_segment_replay_buffer(
            cfg.replay.capacity, cfg.collector.T, cfg.env.num_envs
        ),
        evaluator=GreedyEvaluator(eval_env, actor, max_steps=cfg.eval.max_steps),
    )


def close(pieces):
    pieces.collector.shutdown()
    pieces.evaluator.close()


def new_trainer_like(pieces, **kwargs):
    """An ACERTrainer over ``pieces``, with the small config's settings."""
    cfg = pieces.cfg
    return ACERTrainer(
        collector=pieces.collector,
        total_frames=cfg.collector.total_frames,
        loss_module=pieces.loss_module,
        optimizer=pieces.optimizer,
        replay_buffer=pieces.replay_buffer,
        replay_ratio=cfg.replay.ratio,
        replay_start=cfg.replay.start,
        alpha=cfg.loss.alpha,
        clip_norm=cfg.optim.max_grad_norm,
        progress_bar=False,
        seed=None,
        **kwargs,
    )


def test_is_a_torchrl_trainer_that_a_user_extends_with_register_op(tmp_path):
    pieces = make_pieces(**{"collector.total_frames": 30})
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
    close(pieces)


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
    pieces = make_pieces(**{"collector.backend": "single"})
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
    close(pieces)
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
    pieces = make_pieces(**{"collector.total_frames": 30})
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
    close(pieces)


def test_the_updates_logged_for_each_batch_are_those_taken(tmp_path):
    # a batch the guard refuses gets no update at all (the trainer skips its
    # optim_steps): none is logged for it
    pieces = make_pieces(**{"collector.total_frames": 30, "replay.start": 0})
    trainer = new_trainer_like(pieces, log_interval=0)
    trainer.collector = NaNRewardOnce(pieces.collector, nan_at=1)
    counts = [0]
    trainer.register_op("post_steps", lambda: counts.append(trainer._optim_count))
    with pytest.warns(RuntimeWarning, match="non-finite batch not trained on"):
        trainer.train()
    taken = [b - a for a, b in zip(counts[:-1], counts[1:], strict=True)]
    logged = [
        on + off
        for on, off in zip(
            trainer._log_dict["train/on_policy_updates"],
            trainer._log_dict["train/off_policy_updates"],
            strict=True,
        )
    ]
    assert taken[1] == 0 and logged == taken
    close(pieces)


def test_greedy_evaluation_on_a_frame_schedule_and_at_the_end(tmp_path):
    from torchrl.record.loggers import CSVLogger

    from torchrl_acer.trainers.evaluation import Evaluation

    pieces = make_pieces(**{"collector.total_frames": 50})
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
    close(pieces)


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


def test_ratios_by_policy_lag_are_logged_for_batches_made_segments(tmp_path):
    """One environment with no batch dims: its [T] batches become [1, T] segments
    (a new tensordict, as a learner on another device gets a copy). The fresh
    batch's update is still known, and its importance ratios logged by lag."""
    import copy

    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv

    from torchrl_acer.trainers.hooks import PolicyVersion, VersionedPolicy

    pieces = make_pieces(**{"collector.total_frames": 15, "replay.ratio": 0.0})
    actor = pieces.loss_module.actor_network
    acting = VersionedPolicy(copy.deepcopy(actor).requires_grad_(False))
    pieces.collector.shutdown()
    pieces.collector = Collector(
        GymEnv("CartPole-v1"),
        acting,
        frames_per_batch=5,
        total_frames=-1,
        auto_register_policy_transforms=False,
    )
    trainer = new_trainer_like(pieces)
    PolicyVersion().register(trainer)
    trainer.train()
    log = trainer._log_dict
    assert log["collector/policy_lag"] == [0, 0, 0]
    assert len(log["collector/rho_mean_lag0"]) == 3
    close(pieces)


@pytest.mark.parametrize("how", ["collector_replay_buffer", "async_collection"])
def test_a_collector_that_hands_out_no_batch_is_refused(how):
    """A collector writing to its own replay buffer (or TorchRL's async collection)
    gives the trainer no batch: ACER's schedule would store and update nothing,
    and training never ended. Refused at construction, saying what to do."""
    from torchrl.collectors import Collector

    pieces = make_pieces()
    kwargs = {}
    if how == "async_collection":
        kwargs["async_collection"] = True
    else:
        env = pieces.collector.env
        pieces.collector.shutdown()
        pieces.collector = Collector(
            env,
            pieces.loss_module.actor_network,
            frames_per_batch=10,
            total_frames=-1,
            replay_buffer=make_segment_replay_buffer(100, 5, 2),
            auto_register_policy_transforms=False,
        )
    with pytest.raises(ValueError, match="hands it no batch"):
        new_trainer_like(pieces, **kwargs)
    close(pieces)
