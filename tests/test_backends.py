"""Collection backends (``collector.backend``): TorchRL's multi-process and Ray
collectors feeding the trainer, policy versions and lag, a dead worker."""

import functools
import os
import queue
import signal
import time
from pathlib import Path

import pytest
import torch
from builders import gym_config, run_example
from omegaconf import OmegaConf
from tensordict import TensorDict

from torchrl_acer.modules.models import mlp_actor_critic
from torchrl_acer.training.checkpoint import read_checkpoint
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import (
    check_config,
    make_collector,
    make_loss,
    make_optimizer,
)
from torchrl_acer.training.trainer import (
    ACERTrainer,
    CollectorWorkerError,
    make_segment_replay_buffer,
)

SMALL = {
    "env.num_envs": 2,
    "collector.T": 5,
    "collector.total_frames": 200,
    "collector.backend": "multiprocess",
    "collector.num_workers": 2,
    "collector.sync": False,
    "collector.max_policy_lag": None,
    "replay.ratio": 2.0,
    "replay.start": 0,
    "replay.capacity": 400,
    "logger.backend": None,
    "logger.progress_bar": False,
    "logger.log_interval": 10_000,
    "model.num_cells": [16],
    "threads": 1,
}


def small_config(**overrides):
    cfg = gym_config(SMALL, **overrides)
    check_config(cfg)
    return cfg


def cartpole(env_id, num_envs, seed):
    """``make_collector``'s ``make_env(num_envs, seed=...)`` (it must pickle)."""
    return make_env(env_id, num_envs=num_envs, seed=seed)


def make_trainer(cfg, run_dir):
    torch.manual_seed(cfg.seed)
    env_maker = functools.partial(cartpole, cfg.env.name)
    env = env_maker(cfg.env.num_envs, seed=cfg.seed)
    spec = env.action_spec[(0,) * env.batch_dims]
    actor, critic = mlp_actor_critic(
        env.observation_spec["observation"].shape[-1],
        spec.shape[-1],
        num_cells=cfg.model.num_cells,
        action_spec=spec,
    )
    loss = make_loss(cfg.loss, actor, critic)
    collector = make_collector(cfg, env_maker, actor, device="cpu", env=env)
    return ACERTrainer(
        collector=collector,
        loss_module=loss,
        optimizer=make_optimizer(cfg.optim, loss.parameters()),
        total_frames=cfg.collector.total_frames,
        replay_buffer=make_segment_replay_buffer(
            cfg.replay.capacity, cfg.collector.T, cfg.env.num_envs
        ),
        replay_ratio=cfg.replay.ratio,
        replay_start=cfg.replay.start,
        log_interval=cfg.logger.log_interval,
        checkpoint_dir=Path(run_dir) / "checkpoints",
        progress_bar=False,
        seed=cfg.seed,
        config=OmegaConf.to_container(cfg, resolve=True),
        weight_update_interval=cfg.collector.weight_update_interval,
        max_policy_lag=cfg.collector.max_policy_lag,
    )


class Recorder:
    """Records, around a trainer, every batch with the learner's weights when it
    arrived, and the weights of every version pushed to the workers."""

    def __init__(self, trainer):
        self.trainer = trainer
        actor = trainer.loss_module.actor_network
        self.snapshot = lambda: TensorDict.from_module(actor).data.clone()
        self.versions = [self.snapshot()]  # version 0: what the workers got
        self.batches = []  # (batch, the learner's weights then, lag)
        push, train_on_batch = trainer._push_policy_weights, trainer.train_on_batch

        def recorded_push():
            push()
            self.versions.append(self.snapshot())

        def recorded_train_on_batch(batch):
            lag = None
            if "policy_version" in batch.keys(True):
                oldest = int(batch["policy_version"].min())
                lag = trainer.updates - trainer._pushed_at[oldest]
            self.batches.append((batch.clone(), self.snapshot(), lag))
            train_on_batch(batch)

        trainer._push_policy_weights = recorded_push
        trainer.train_on_batch = recorded_train_on_batch


def log_probs(actor, weights, batch):
    """The log-probabilities of the stored actions under ``weights``."""
    with torch.no_grad(), weights.to_module(actor):
        dist = actor.get_dist(batch.select(*actor.in_keys).clone())
        return dist.log_prob(batch["action"])


def check_behaviour_is_acting_policy(recorder):
    """Each step's stored log-probability is that of the weights its worker acted
    with (the pushed version its "policy_version" names), and, where
    the batch lagged, not that of the learner's weights when it arrived.

    Returns the number of lagged batches whose learner log-probabilities differ
    from the stored ones by more than 1e-3: those where the equality above
    tells acting weights from the learner's by a wide margin (a batch that
    lagged by one small update can differ by barely more than that)."""
    actor = recorder.trainer.loss_module.actor_network
    discriminating = 0
    for batch, learner_weights, lag in recorder.batches:
        batch = batch.reshape(-1, batch.shape[-1]) if batch.ndim > 2 else batch
        stored = batch["action_log_prob"]
        versions = batch["policy_version"]
        for version in versions.unique().tolist():
            steps = versions == version
            acting = log_probs(actor, recorder.versions[version], batch)
            torch.testing.assert_close(stored[steps], acting[steps])
        if lag:
            current = log_probs(actor, learner_weights, batch)
            # Never the learner's: they differ beyond the equality's tolerance.
            assert not torch.allclose(current, stored, rtol=1.3e-6, atol=1e-5)
            discriminating += bool((current - stored).abs().max() > 1e-3)
    return discriminating


def test_config_refuses_bad_collector_settings():
    for key, value, message in [
        (
            "collector.backend",
            "mp",
            "collector.backend='mp' must be 'auto', 'single', 'lean', 'multiprocess' "
            "or 'ray'",
        ),
        ("collector.num_workers", 0, "collector.num_workers=0 must be an integer"),
        ("collector.sync", "yes", "collector.sync='yes' must be true or false"),
        ("collector.weight_update_interval", 0, "weight_update_interval=0 must be"),
        ("collector.max_policy_lag", -1, "collector.max_policy_lag=-1 must be"),
        ("ray.address", 6379, "ray.address=6379 must be a Ray address"),
    ]:
        with pytest.raises(ValueError, match=message):
            small_config(**{key: value})


def test_async_workers_store_the_log_probs_of_the_weights_that_acted(tmp_path):
    """Asynchronous workers, weights pushed every 3 batches: between pushes the
    workers act with stale weights. The stored log-probabilities are those of
    the acting weights, each step tagged with their version, never those of the
    learner; the lag is measured, bounded (batches beyond it dropped, counted)
    and logged with the importance ratios against it."""
    cfg = small_config(
        **{
            "collector.weight_update_interval": 3,
            "collector.max_policy_lag": 12,
            "collector.total_frames": 300,
            "logger.log_interval": 300,
        }
    )
    trainer = make_trainer(cfg, tmp_path)
    recorder = Recorder(trainer)
    try:
        trainer.train()
    finally:
        trainer.close()
    assert len(recorder.versions) >= 5  # weights were pushed, versions went up
    # stale batches seen, acting weights well apart from the learner's
    assert check_behaviour_is_acting_policy(recorder) >= 3
    lags = [lag for _, _, lag in recorder.batches]
    dropped = sum(lag > 12 for lag in lags)
    assert dropped > 0 and trainer.dropped_batches == dropped
    assert len(trainer.replay_buffer) == cfg.env.num_envs * (len(lags) - dropped)
    log = trainer.last_train_log
    assert log["collector/dropped_batches"] == dropped
    assert log["collector/policy_lag_max"] == max(lags)
    assert any(k.startswith("collector/rho_mean_lag") for k in log)


def test_a_killed_worker_stops_the_run_with_a_checkpoint_that_resumes(tmp_path):
    """SIGKILL one of two workers mid-run: the run stops naming it, after writing
    a checkpoint that holds the whole replay; the checkpoint resumes with one
    worker (and synchronous collection), starting fresh episodes."""
    cfg = small_config(**{"collector.total_frames": 10_000})
    trainer = make_trainer(cfg, tmp_path)
    train_on_batch, seen = trainer.train_on_batch, []

    def kill_after_three(batch):
        train_on_batch(batch)
        seen.append(len(trainer.replay_buffer))
        if len(seen) == 3:
            os.kill(trainer.collector.procs[1].pid, signal.SIGKILL)

    trainer.train_on_batch = kill_after_three
    pid = trainer.collector.procs[1].pid
    try:
        with pytest.raises(CollectorWorkerError) as raised:
            trainer.train()
    finally:
        trainer.close()
    message = str(raised.value) + "".join(getattr(raised.value, "__notes__", []))
    assert (
        f"collector worker 1 (MultiAsyncCollector, pid {pid}, killed by SIGKILL)"
        in (message)
    )
    assert "resume=" in message and "collector.num_workers may change" in message
    checkpoint = tmp_path / "checkpoints" / "last.pt"
    state = read_checkpoint(checkpoint)[1]
    assert state["replay_buffer"]["_storage"]["_len"] == seen[-1] > 0
    assert state["envs"]["collector"]["saved"] is False

    resumed_cfg = small_config(
        **{
            "collector.total_frames": trainer.frames + 40,
            "collector.num_workers": 1,
            "collector.sync": True,
        }
    )
    resumed = make_trainer(resumed_cfg, tmp_path)
    try:
        resumed.load_checkpoint(checkpoint)
        assert len(resumed.replay_buffer) == seen[-1]
        assert any("fresh episodes seeded" in n for n in resumed.resume_notes)
        recorder = Recorder(resumed)
        resumed.train()
    finally:
        resumed.close()
    assert resumed.frames >= trainer.frames + 40
    # resumed: the worker was sent the checkpoint's weights before collecting
    assert len(recorder.versions) >= 2 and resumed._pushed_at[1] == trainer.updates
    assert len(resumed.replay_buffer) > seen[-1]


def test_ray_collectors_train_the_gym_example(tmp_path):
    """``collector.backend=ray``: the example on a local two-worker Ray cluster."""
    pytest.importorskip("ray", reason="Ray is an extra: pip install -e .[ray]")
    proc = run_example(
        "acer_gym.py",
        "collector.backend=ray",
        "collector.num_workers=2",
        "ray.num_cpus=2",
        "env.num_envs=2",
        "collector.T=5",
        "collector.total_frames=200",
        "replay.start=0",
        "eval.episodes=2",
        "eval.interval=null",
        "eval.max_steps=20",
        "model.num_cells=[16]",
        "logger.log_interval=100",
        "logger.progress_bar=false",
        f"logger.run_dir={tmp_path}",
        "threads=1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lags = (tmp_path / "logs" / "scalars" / "collector" / "policy_lag.csv").read_text()
    assert len(lags.splitlines()) >= 3  # the header, then two rows at least
    assert "final greedy evaluation" in proc.stdout


def test_workers_wait_for_weights_sent_late(tmp_path, monkeypatch):
    """The learner sends the workers' first weights 25 s after starting them (as
    on a loaded machine, where a run died at its start with a worker's
    ``_queue.Empty``: TorchRL's transport waits 10 s). Workers wait up to
    ``collector.worker_start_timeout``: with 3 s they give up and the collector
    fails to start; with the default the run trains."""
    from torchrl.weight_update import MultiProcessWeightSyncScheme

    send = MultiProcessWeightSyncScheme._setup_connection_and_weights_on_sender_impl

    def late(self, *args, **kwargs):
        time.sleep(25)
        return send(self, *args, **kwargs)

    # the learner's side only: the spawned workers import the original
    monkeypatch.setattr(
        MultiProcessWeightSyncScheme,
        "_setup_connection_and_weights_on_sender_impl",
        late,
    )
    settings = {"collector.total_frames": 20, "replay.ratio": 0.0}
    impatient = small_config(**settings, **{"collector.worker_start_timeout": 3})
    with pytest.raises(queue.Empty):  # the worker's error, raised again here
        make_trainer(impatient, tmp_path / "impatient").close()
    trainer = make_trainer(small_config(**settings), tmp_path / "patient")
    try:
        trainer.train()
    finally:
        trainer.close()
    assert trainer.frames >= 20
