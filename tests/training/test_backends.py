"""Collection backends (``collector.backend``): TorchRL's multi-process and Ray
collectors feeding the trainer, policy versions and lag, a dead worker."""

import os
import queue
import signal
import sys
import time

import pytest
import torch
from builders import (
    checkpoint_component,
    run_example,
    small_gym_config,
    small_trainer,
)
from tensordict import TensorDict

from torchrl_acer.training.experiment import check_config, resume

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
    "eval.interval": None,  # the final evaluation only
    "logger.backend": None,
    "logger.progress_bar": False,
    "logger.log_interval": 10_000,
    "model.num_cells": [16],
    "threads": 1,
}


def small_config(**overrides):
    cfg = small_gym_config(**{**SMALL, **overrides})
    check_config(cfg)
    return cfg


def make_trainer(cfg, run_dir):
    """The gym example's pieces on the new ACERTrainer, from ``cfg``."""
    return small_trainer(run_dir, cfg)


def close(trainer):
    """Shuts the trainer's collector (its workers) and evaluation environments."""
    trainer.collector.shutdown()
    trainer.evaluation.evaluate.close()


class Recorder:
    """Records, around a trainer, every batch with the learner's weights when it
    arrived and its lag, and the weights of every version pushed to the workers
    (from the trainer's next push on)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.policy_version = trainer._modules["policy_version"]
        actor = trainer.loss_module.actor_network
        self.snapshot = lambda: TensorDict.from_module(actor).data.clone()
        self.versions = {}  # {version: the learner's weights pushed as it}
        self.batches = []  # (batch, the learner's weights then, lag)
        collector = trainer.collector
        push = collector.update_policy_weights_  # PolicyVersion's, versioning

        def recorded_push(*args, **kwargs):
            weights = self.snapshot()
            pushed = len(self.policy_version._pushed_at)
            push(*args, **kwargs)
            if len(self.policy_version._pushed_at) > pushed:
                self.versions[pushed] = weights

        def record(batch):
            lag = self.policy_version.lag
            self.batches.append((batch.clone(), self.snapshot(), lag))

        collector.update_policy_weights_ = recorded_push
        # after PolicyVersion measured the batch's lag
        trainer.register_op("batch_process", record)


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
        close(trainer)
    policy_version = recorder.policy_version
    assert len(recorder.versions) == len(policy_version._pushed_at)
    assert len(recorder.versions) >= 5  # weights were pushed, versions went up
    # stale batches seen, acting weights well apart from the learner's
    assert check_behaviour_is_acting_policy(recorder) >= 3
    lags = [lag for _, _, lag in recorder.batches]
    dropped = sum(lag > 12 for lag in lags)
    assert dropped > 0 and policy_version.dropped_batches == dropped
    replay = trainer.schedule.replay_buffer
    assert len(replay) == cfg.env.num_envs * (len(lags) - dropped)
    log = trainer._log_dict  # every value handed to the trainer's log
    assert log["collector/dropped_batches"][-1] == dropped
    assert log["collector/policy_lag"] == lags
    assert any(k.startswith("collector/rho_mean_lag") for k in log)


def test_a_killed_worker_stops_the_run_with_a_checkpoint_that_resumes(tmp_path, capsys):
    """SIGKILL one of two workers mid-run: the run stops naming it, after writing
    a checkpoint that holds the whole replay; the checkpoint resumes with one
    worker (and synchronous collection), starting fresh episodes."""
    cfg = small_config(**{"collector.total_frames": 10_000})
    trainer = make_trainer(cfg, tmp_path)
    replay, seen = trainer.schedule.replay_buffer, []

    def kill_after_three():
        seen.append(len(replay))
        if len(seen) == 3:
            os.kill(trainer.collector.procs[1].pid, signal.SIGKILL)

    trainer.register_op("post_steps", kill_after_three)
    pid = trainer.collector.procs[1].pid
    try:
        with pytest.raises(Exception) as raised:
            trainer.train()
    finally:
        close(trainer)
    message = str(raised.value) + "".join(getattr(raised.value, "__notes__", []))
    assert (
        f"collector worker 1 (MultiAsyncCollector, pid {pid}, killed by SIGKILL)"
        in (message)
    )
    assert "resume=" in message and "collector.num_workers may change" in message
    checkpoint = tmp_path / "checkpoints" / "last"
    assert f"resume={checkpoint}" in message
    saved_replay = checkpoint_component(checkpoint, "replay_buffer")
    assert saved_replay["_storage"]["_len"] == seen[-1] > 0
    assert checkpoint_component(checkpoint, "collector")["saved"] is False
    frames = trainer.collected_frames
    updates = trainer.optimization_stepper.optimizer_step_count
    pushed = len(recorder_of(trainer)._pushed_at)

    resumed_cfg = small_config(
        **{
            "collector.total_frames": frames + 40,
            "collector.num_workers": 1,
            "collector.sync": True,
            "resume": str(checkpoint),
        }
    )
    resumed = make_trainer(resumed_cfg, tmp_path)
    try:
        resume(resumed, checkpoint)
        assert len(resumed.schedule.replay_buffer) == seen[-1]
        assert "fresh episodes seeded" in capsys.readouterr().out
        loaded = TensorDict.from_module(resumed.loss_module.actor_network)
        loaded = loaded.data.clone()
        recorder = Recorder(resumed)
        resumed.train()
    finally:
        close(resumed)
    assert resumed.collected_frames >= frames + 40
    # resumed: the worker was sent the checkpoint's weights before collecting
    pushed_at = recorder.policy_version._pushed_at
    first = min(recorder.versions)
    assert len(recorder.versions) >= 2 and first >= pushed
    assert pushed_at[first] == updates
    assert (recorder.versions[first] == loaded).all()
    assert len(resumed.schedule.replay_buffer) > seen[-1]


def recorder_of(trainer):
    """The trainer's PolicyVersion hook."""
    return trainer._modules["policy_version"]


def test_a_broken_pipe_waits_for_the_killed_workers_exit_code():
    """A killed worker's pipe can break before its exit is reaped (seen under
    load): the failure still names the worker once its exit code shows."""
    from types import SimpleNamespace

    from torchrl_acer.trainers.hooks import _worker_failure

    class Reaped:
        """A worker whose exit code shows ``delay`` seconds after the pipe broke."""

        def __init__(self, code, delay):
            self.code, self.at = code, time.monotonic() + delay

        @property
        def exitcode(self):
            return self.code if time.monotonic() >= self.at else None

    alive = SimpleNamespace(exitcode=None)
    collector = SimpleNamespace(procs=[alive, Reaped(-signal.SIGKILL, 0.3)])
    found = _worker_failure(BrokenPipeError(32, "Broken pipe"), collector, [11, 12])
    assert found == "collector worker 1 (SimpleNamespace, pid 12, killed by SIGKILL)"
    # another error with every worker alive, or a broken pipe in a collector
    # without worker processes: nobody is blamed, after no wait
    start = time.monotonic()
    assert (
        _worker_failure(RuntimeError("boom"), SimpleNamespace(procs=[alive]), [])
        is None
    )
    pipe = BrokenPipeError(32, "Broken pipe")
    assert _worker_failure(pipe, SimpleNamespace(), []) is None
    assert time.monotonic() - start < 0.5


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
        # TorchRL's trainer logs once more than log_interval frames have passed
        # since the last row: at 100 and 200 frames
        "logger.log_interval=90",
        "logger.progress_bar=false",
        f"logger.run_dir={tmp_path}",
        "threads=1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lags = (tmp_path / "logs" / "scalars" / "collector" / "policy_lag.csv").read_text()
    assert len(lags.splitlines()) >= 3  # the header, then two rows at least
    assert "final greedy evaluation" in proc.stdout
    # Ray prints each actor's repr as it starts: one line, not a Collector's ~90
    assert "td_out=TensorDict(" not in proc.stdout + proc.stderr


def test_workers_wait_for_weights_sent_late(tmp_path, monkeypatch):
    """The learner sends the workers' first weights late (as on a loaded
    machine, where a run died at its start with a worker's ``_queue.Empty``:
    TorchRL's transport waits 10 s). Workers wait up to
    ``collector.worker_start_timeout``: with 3 s they give up and the collector
    fails to start; with the default the run trains.

    The order is made certain, not raced against the clock: for the impatient
    workers the learner sends only once every worker has reported its failure
    (a worker slow to start, on a loaded machine, would otherwise find weights
    sent 25 s after its start already waiting, and not fail); for the patient
    ones it sends after 25 s, more than TorchRL's 10, unless a worker reported
    (failed) before."""
    from torchrl.weight_update import MultiProcessWeightSyncScheme

    send = MultiProcessWeightSyncScheme._setup_connection_and_weights_on_sender_impl

    def late(self, *args, **kwargs):
        # the collector starting the workers (its _run_processes, further up the
        # stack) holds the pipes each worker reports on: "instantiated", or the
        # error it failed with
        frame = sys._getframe(1)
        while not hasattr(frame.f_locals.get("self"), "pipes"):
            frame = frame.f_back
        pipes = frame.f_locals["self"].pipes
        if self.start_timeout < 10:  # impatient: until every worker gave up
            assert all(pipe.poll(timeout=600) for pipe in pipes)
        else:  # patient: 25 s, or until a worker reported (failed)
            deadline = time.monotonic() + 25
            for pipe in pipes:
                pipe.poll(timeout=max(0.0, deadline - time.monotonic()))
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
        make_trainer(impatient, tmp_path / "impatient")
    trainer = make_trainer(small_config(**settings), tmp_path / "patient")
    try:
        trainer.train()
    finally:
        close(trainer)
    assert trainer.collected_frames >= 20


def unseedable_env(make_env, num_envs, *, seed):
    """``make_env``'s environments, whose ``set_seed`` raises afterwards (module-level:
    collector workers unpickle it)."""
    env = make_env(num_envs, seed=seed)

    def refuse(*args, **kwargs):
        raise RuntimeError("this environment refuses the seed")

    env.set_seed = refuse
    return env


def test_a_worker_dying_while_seeded_is_named(tmp_path):
    """A collector worker that dies as the trainer seeds the collector (the ALE
    once refused TorchRL's seeds over 2**31 - 1 so) is named, with its exit code,
    where TorchRL raises a bare EOFError from the worker's pipe."""
    from builders import small_pieces

    from torchrl_acer.training import experiment

    cfg = small_gym_config(**SMALL)
    pieces = small_pieces(cfg, worker_env=unseedable_env)
    try:
        with pytest.raises(RuntimeError) as err:
            experiment.make_trainer(cfg, tmp_path, **pieces, logger=None)
    finally:
        experiment.shut_down(pieces["collector"])
    assert str(err.value).startswith("collector worker 0 (")
    assert "exit code 1) died while the trainer seeded the collector" in str(err.value)
    assert isinstance(err.value.__cause__, (EOFError, ConnectionError))
