"""ACER's run guarantees as hooks, registered on TorchRL's own PPOTrainer.

Every test trains a real ``PPOTrainer`` (TorchRL's, unchanged) on CartPole with a
real collector, loss and optimizer, and breaks something real along the way: a
NaN in what the loss reads, a signal, an environment that raises, a logger whose
directory is gone, a run directory that holds another run.
"""

import copy
import functools
import os
import signal
import warnings

import pytest
import torch
from tensordict.nn import TensorDictModule
from torchrl.checkpoint import Checkpoint, CheckpointError
from torchrl.collectors import Collector, MultiAsyncCollector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv, Transform, TransformedEnv
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from torchrl.objectives import A2CLoss, ClipPPOLoss, SoftUpdate
from torchrl.record.loggers import CSVLogger
from torchrl.trainers import Trainer
from torchrl.trainers.algorithms import PPOTrainer

from torchrl_acer.trainers.hooks import (
    STOP_SIGNALS,
    FailureCheckpoint,
    GracefulStop,
    NonFiniteGuard,
    NonFiniteTrainingError,
    PolicyVersion,
    RunDirectoryLock,
    RunDirectoryOwnedError,
    RunDirInUseError,
    VersionedPolicy,
    _updates,
)
from torchrl_acer.trainers.progress import TrainingLog

FRAMES_PER_BATCH = 32


def cartpole_actor(env):
    """A categorical MLP policy for CartPole, writing its log-probabilities."""
    return ProbabilisticActor(
        TensorDictModule(MLP(4, 2, num_cells=[16]), ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        spec=env.action_spec,
        return_log_prob=True,
    )


def make_trainer(
    run_dir,
    *,
    batches=3,
    optim_steps=2,
    target=False,
    versioned=False,
    multiprocess=False,
    env=None,
    logger=None,
):
    """A PPOTrainer on CartPole saving to ``run_dir/checkpoint`` (only when it
    stops: no scheduled saves), one epoch of ``optim_steps`` updates per batch.

    ``target``: a delayed actor moved by a SoftUpdate after each update.
    ``versioned``: the collector acts with its own copy of the actor in a
    VersionedPolicy (as a worker process would), so pushes matter.
    ``multiprocess``: a MultiAsyncCollector with one worker process, to which
    PPOTrainer pushes weights through TorchRL's weight-sync scheme."""
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1") if env is None else env
    actor = cartpole_actor(env)
    critic = ValueOperator(MLP(4, 1, num_cells=[16]), in_keys=["observation"])
    policy = VersionedPolicy(copy.deepcopy(actor)) if versioned else actor
    loss = ClipPPOLoss(actor, critic, delay_actor=target)
    if multiprocess:
        collector = MultiAsyncCollector(
            [functools.partial(GymEnv, "CartPole-v1")],
            policy,
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=-1,
        )
    else:
        collector = Collector(
            env,
            policy,
            frames_per_batch=FRAMES_PER_BATCH,
            total_frames=-1,
            auto_register_policy_transforms=False,  # TorchRL 0.14 asks to choose
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PPOTrainer is a prototype
        return PPOTrainer(
            collector=collector,
            weight_update_map={"policy": "loss_module.actor_network"}
            if multiprocess
            else None,
            total_frames=batches * FRAMES_PER_BATCH,
            frame_skip=1,
            optim_steps_per_batch=optim_steps,
            num_epochs=1,
            loss_module=loss,
            optimizer=torch.optim.Adam(loss.parameters(), lr=1e-2),
            target_net_updater=SoftUpdate(loss, eps=0.5) if target else None,
            logger=logger,
            log_interval=0,
            progress_bar=False,
            seed=0,
            checkpoint=Checkpoint(),
            save_trainer_file=run_dir / "checkpoint",
            save_trainer_interval=10**9,
        )


def state(trainer):
    """The loss module's parameters and buffers (target network included)."""
    return {k: v.clone() for k, v in trainer.loss_module.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def snapshot(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def saved_frames(run_dir):
    """The frames of the trainer saved in ``run_dir``, loaded in a fresh one."""
    return make_trainer(run_dir).load_from_file(run_dir / "checkpoint").collected_frames


class NaNAdvantage:
    """A ``process_optim_batch`` hook: the updates numbered in ``poisoned``
    (from 1) read a NaN advantage; records the state before and after each."""

    def __init__(self, trainer, poisoned):
        self.trainer, self.poisoned, self.count = trainer, set(poisoned), 0
        self.before, self.after = {}, {}
        trainer.register_op("process_optim_batch", self.poison)
        trainer.register_op("post_optim_log", self.record)

    def poison(self, batch):
        self.count += 1
        self.before[self.count] = state(self.trainer)
        if self.count in self.poisoned:
            batch = batch.clone()
            batch["advantage"][0] = float("nan")
        return batch

    def record(self, batch):
        self.after[self.count] = state(self.trainer)


# -- NonFiniteGuard ---------------------------------------------------------------


def test_nonfinite_update_is_skipped_counted_and_moves_no_target(tmp_path):
    trainer = make_trainer(tmp_path, target=True)
    guard = NonFiniteGuard()
    guard.register(trainer)
    nan = NaNAdvantage(trainer, poisoned=[3])
    with pytest.warns(RuntimeWarning, match="first non-finite term loss_objective"):
        trainer.train()
    assert nan.count == 6
    # the skipped update changed nothing, the target network included; the
    # finite ones change the parameters and move the target
    assert same(nan.before[3], nan.after[3])
    for update in (2, 4):
        for key in ("actor_network_params", "target_actor_network_params"):
            moved = {k: v for k, v in nan.after[update].items() if k.startswith(key)}
            assert not same(moved, {k: nan.before[update][k] for k in moved})
    assert guard.nonfinite == {"updates": 1, "batches": 0}
    assert guard.optimizer_step_count == 5
    assert trainer._log_dict["train/nonfinite_updates"][-1] == 1
    assert all(torch.isfinite(v).all() for v in state(trainer).values())


def test_nonfinite_updates_in_a_row_stop_with_the_term_and_save_the_last_finite(
    tmp_path,
):
    trainer = make_trainer(tmp_path, batches=10)
    NonFiniteGuard(max_in_a_row=3).register(trainer)
    FailureCheckpoint().register(trainer)
    nan = NaNAdvantage(trainer, poisoned=range(3, 100))
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError) as err:
        trainer.train()
    message = str(err.value)
    assert "3 updates in a row were non-finite" in message
    # updates 1-2 on the batch at 32 frames, 3-4 at 64, 5 at 96: the third
    # non-finite one in a row stops
    assert "stopped at 96 frames" in message
    assert "the update at 64 frames, first non-finite term loss_objective" in message
    assert nan.count == 5
    assert same(state(trainer), nan.after[2])
    # FailureCheckpoint saved the parameters of the last finite update
    path = tmp_path / "checkpoint"
    assert f"saved to {path}" in "\n".join(err.value.__notes__)
    resumed = make_trainer(tmp_path)
    counts = NonFiniteGuard()
    counts.register(resumed)
    resumed.load_from_file(path)
    assert same(state(resumed), nan.after[2])
    assert counts.nonfinite == {"updates": 3, "batches": 0}  # survive a resume
    assert counts.optimizer_step_count == 2


def test_a_save_is_refused_while_parameters_are_nonfinite(tmp_path):
    trainer = make_trainer(tmp_path, batches=1)
    NonFiniteGuard().register(trainer)
    trainer.train()
    before = snapshot(tmp_path)
    assert (tmp_path / "checkpoint").is_dir()
    weight = trainer.loss_module.actor_network_params["module", "0", "module", "0"]
    weight["weight"].data[0, 0] = float("nan")
    with pytest.raises(NonFiniteTrainingError) as err:
        trainer.save_trainer(force_save=True)
    assert "refusing to write a checkpoint" in str(err.value)
    assert "loss_module.actor_network_params.module.0.module.0.weight" in str(err.value)
    assert snapshot(tmp_path) == before  # the previous checkpoint is kept


def test_nonfinite_batch_is_not_trained_on(tmp_path):
    trainer = make_trainer(tmp_path, batches=3)
    batches = []

    def nan_reward_in_second_batch(batch):
        batches.append(batch)
        if len(batches) == 2:
            batch["next", "reward"][5] = float("nan")
        return batch

    trainer.register_op("batch_process", nan_reward_in_second_batch)
    guard = NonFiniteGuard()
    guard.register(trainer)
    with pytest.warns(RuntimeWarning, match=r"1 non-finite rewards"):
        trainer.train()
    assert guard.nonfinite == {"updates": 0, "batches": 1}
    assert guard.optimizer_step_count == 4  # batches 1 and 3, two updates each
    assert trainer._optim_count == 4


# -- PolicyVersion ----------------------------------------------------------------


def test_policy_lag_is_measured_and_batches_beyond_the_bound_dropped(tmp_path):
    optim_steps, batches, push_every, max_lag = 2, 6, 2, 1
    trainer = make_trainer(
        tmp_path, batches=batches, optim_steps=optim_steps, versioned=True
    )
    seen = []
    trainer.register_op(
        "batch_process", lambda b: seen.append(b["policy_version"].unique().tolist())
    )
    hook = PolicyVersion(max_policy_lag=max_lag)
    hook.register(trainer)
    (update_weights,) = hook._update_weights  # PPOTrainer's own UpdateWeights
    update_weights.update_weights_interval = push_every
    trainer.train()

    # reference: version 0 at the start, a push every `push_every` batches
    updates, pushed_at, lags, versions, dropped = 0, [0], [], [], 0
    for i in range(1, batches + 1):
        versions.append([len(pushed_at) - 1])
        lags.append(updates - pushed_at[-1])
        if lags[-1] > max_lag:
            dropped += 1
        else:
            updates += optim_steps
        if i % push_every == 0:
            pushed_at.append(updates)
    assert lags == [0, 2, 0, 2, 0, 2]  # the reference itself, for a reader
    assert seen == versions
    assert trainer._log_dict["collector/policy_lag"] == lags
    assert hook.dropped_batches == dropped == 3
    assert trainer._optim_count == updates
    # the collector's copy holds the learner's weights as of the last push
    acting = trainer.collector.policy.policy
    for mine, theirs in zip(
        trainer.loss_module.actor_network.parameters(), acting.parameters(), strict=True
    ):
        assert torch.equal(mine, theirs)
    assert hook.state_dict() == {"pushed_at": [0, 2, 4, 6], "dropped_batches": 3}


def test_policy_versions_continue_after_a_resume(tmp_path):
    first = make_trainer(tmp_path, batches=2, versioned=True)
    PolicyVersion().register(first)
    first.train()  # pushes: at setup (0 updates), after each batch (2, 4)
    resumed = make_trainer(tmp_path, batches=3, versioned=True)
    hook = PolicyVersion()
    hook.register(resumed)
    resumed.load_from_file(tmp_path / "checkpoint")
    assert hook.state_dict()["pushed_at"] == [0, 2, 4]
    seen = []
    resumed.register_op(
        "batch_process", lambda b: seen.append(b["policy_version"].unique().tolist())
    )
    resumed.train()
    # the resumed run's setup pushes version 3, with which the batch is collected
    assert seen == [[3]]
    assert resumed._log_dict["collector/policy_lag"] == [0]
    assert hook.state_dict()["pushed_at"] == [0, 2, 4, 4, 6]


def test_policy_versions_reach_a_worker_process_and_bound_its_lag(tmp_path):
    optim_steps, max_lag = 2, 1
    trainer = make_trainer(
        tmp_path, batches=8, optim_steps=optim_steps, versioned=True, multiprocess=True
    )
    hook = PolicyVersion(max_policy_lag=max_lag)
    hook.register(trainer)  # PPOTrainer's UpdateWeights pushes by weight_update_map
    seen = []  # (the versions that acted, learner updates when the batch came)
    trainer.register_op(
        "batch_process",
        lambda b: seen.append(
            (b["policy_version"].unique().tolist(), _updates(trainer))
        ),
    )
    trainer.train()
    pushed_at = hook.state_dict()["pushed_at"]
    versions = [v for acted, _ in seen for v in acted]
    assert versions == sorted(versions)  # a worker acts with newer and newer
    assert max(versions) > 0  # the pushes reached the worker's VersionedPolicy
    lags = [updates - pushed_at[min(acted)] for acted, updates in seen]
    assert trainer._log_dict["collector/policy_lag"] == lags
    dropped = sum(lag > max_lag for lag in lags)
    assert hook.dropped_batches == dropped
    assert trainer._optim_count == optim_steps * (len(seen) - dropped)


def test_policy_version_needs_a_versioned_collector_policy(tmp_path):
    trainer = make_trainer(tmp_path, versioned=False)
    PolicyVersion().register(trainer)
    with pytest.raises(KeyError):  # the push of versioned weights cannot land
        trainer.train()


# -- GracefulStop -----------------------------------------------------------------


def kill_after(trainer, batches, *signums):
    """A ``post_steps`` hook sending ``signums`` to this process after
    ``batches`` collected batches."""
    count = [0]

    def kill():
        count[0] += 1
        if count[0] == batches:
            for signum in signums:
                os.kill(os.getpid(), signum)

    trainer.register_op("post_steps", kill)


# what ends a training process in ordinary use: Ctrl-C, kill and schedulers, a
# closed terminal, Ctrl-backslash, schedulers' warnings, a CPU-time limit
ENDING = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU")


def test_the_stop_signals_are_those_that_end_a_training_process():
    assert {signal.Signals(s).name for s in STOP_SIGNALS} == set(ENDING)


@pytest.mark.parametrize("name", ENDING)
def test_a_signal_stops_at_the_iteration_boundary_with_a_checkpoint(tmp_path, name):
    signum = getattr(signal, name)
    trainer = make_trainer(tmp_path, batches=10)
    stop = GracefulStop()
    stop.register(trainer)
    kill_after(trainer, 2, signum)
    previous = signal.getsignal(signum)
    trainer.train()
    assert trainer._stop_reason == f"received {name}"
    assert trainer.collected_frames == 2 * FRAMES_PER_BATCH
    assert stop.signum == signum and stop.exit_code == 128 + signum
    assert Checkpoint.is_checkpoint(tmp_path / "checkpoint")
    assert signal.getsignal(signum) == previous
    if signum == signal.SIGHUP:  # the case: the run was lost silently
        assert saved_frames(tmp_path) == 2 * FRAMES_PER_BATCH


def test_a_second_signal_while_saving_waits_for_the_checkpoint(tmp_path):
    trainer = make_trainer(tmp_path, batches=10)
    stop = GracefulStop()
    stop.register(trainer)
    kill_after(trainer, 2, signal.SIGINT)

    class SignalDuringSave:  # a component whose saving is interrupted
        def state_dict(self):
            os.kill(os.getpid(), signal.SIGTERM)
            return {"saved": 1}

        def load_state_dict(self, state_dict):
            pass

    trainer.register_module("signal_during_save", SignalDuringSave())
    try:
        trainer.train()
    except KeyboardInterrupt as err:
        pytest.fail(f"the second signal did not wait for the save: {err}")
    assert stop.signum == signal.SIGINT
    manifest = Checkpoint.manifest(tmp_path / "checkpoint")
    assert "trainer_module.signal_during_save" in manifest["components"]
    assert saved_frames(tmp_path) == 2 * FRAMES_PER_BATCH


def test_a_second_signal_outside_a_save_stops_at_once(tmp_path):
    trainer = make_trainer(tmp_path, batches=10)
    GracefulStop().register(trainer)
    kill_after(trainer, 2, signal.SIGTERM, signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="second signal"):
        trainer.train()
    assert not (tmp_path / "checkpoint").exists()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# -- FailureCheckpoint ------------------------------------------------------------


class FailingStep(Transform):
    """An environment that raises at its ``fail_at``-th step."""

    def __init__(self, fail_at):
        super().__init__()
        self.fail_at, self.steps = fail_at, 0

    def _step(self, tensordict, next_tensordict):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("the simulator crashed")
        return next_tensordict


def test_a_collector_error_saves_what_was_trained_then_goes_on(tmp_path):
    env = TransformedEnv(GymEnv("CartPole-v1"), FailingStep(2 * FRAMES_PER_BATCH + 5))
    trainer = make_trainer(tmp_path, batches=10, env=env)
    FailureCheckpoint().register(trainer)
    with pytest.raises(RuntimeError, match="the simulator crashed") as err:
        trainer.train()
    path = tmp_path / "checkpoint"
    note = "\n".join(err.value.__notes__)
    # the collector, whose environment failed, has closed it: left out
    assert f"failed after {2 * FRAMES_PER_BATCH} frames" in note
    assert "without collector" in note
    assert f"trainer.load_from_file('{path}', strict='warn')" in note
    resumed = make_trainer(tmp_path).load_from_file(path, strict="warn")
    assert resumed.collected_frames == 2 * FRAMES_PER_BATCH
    assert resumed._optim_count == trainer._optim_count == 4
    assert same(state(resumed), state(trainer))


def test_a_logger_io_error_saves_a_checkpoint_then_goes_on(tmp_path):
    logger = CSVLogger("run", log_dir=str(tmp_path / "logs"))
    trainer = make_trainer(tmp_path, logger=logger)
    FailureCheckpoint().register(trainer)
    # the logs' directory is gone (a full or unmounted disk): writing fails
    scalars = tmp_path / "logs" / "run" / "scalars"
    scalars.rmdir()
    scalars.write_text("not a directory")
    with pytest.raises(OSError) as err:
        trainer.train()
    path = tmp_path / "checkpoint"
    assert f"saved to {path}" in "\n".join(err.value.__notes__)
    assert Checkpoint.is_checkpoint(path)


# -- RunDirectoryLock -------------------------------------------------------------


def test_a_new_run_in_a_directory_holding_a_run_is_refused_and_resume_allowed(
    tmp_path,
):
    first = make_trainer(tmp_path, batches=1)
    lock = RunDirectoryLock()
    lock.register(first)
    first.train()
    before = snapshot(tmp_path)
    assert (tmp_path / "run_id").read_text().strip() == lock.run_id

    second = make_trainer(tmp_path, batches=1)
    with pytest.raises(RunDirectoryOwnedError) as err:
        RunDirectoryLock().register(second)
    assert f"run directory {tmp_path} already holds a run" in str(err.value)
    assert snapshot(tmp_path) == before  # nothing was written

    resumed = make_trainer(tmp_path, batches=2)
    again = RunDirectoryLock(resume=True)
    again.register(resumed)
    resumed.load_from_file(tmp_path / "checkpoint")
    resumed.train()
    assert again.run_id == lock.run_id
    assert saved_frames(tmp_path) == 2 * FRAMES_PER_BATCH


def test_a_checkpoint_of_another_run_is_not_loaded_into_a_run_directory(tmp_path):
    other = make_trainer(tmp_path / "other", batches=1)
    RunDirectoryLock().register(other)
    other.train()
    trainer = make_trainer(tmp_path / "mine", batches=1)
    RunDirectoryLock().register(trainer)
    # TorchRL's Checkpoint reports it as the component that failed to load
    with pytest.raises(CheckpointError, match="RunDirectoryOwnedError|written by run"):
        trainer.load_from_file(tmp_path / "other" / "checkpoint")


def test_a_copied_checkpoint_resumed_in_a_new_directory_takes_its_run(tmp_path):
    """A resume in a directory without a run (a checkpoint copied elsewhere) is
    that run: the directory takes the checkpoint's id, which later resumes and
    refusals of other runs there go by."""
    first = make_trainer(tmp_path / "first", batches=1)
    lock = RunDirectoryLock()
    lock.register(first)
    first.train()
    copy = make_trainer(tmp_path / "copy", batches=2)
    adopted = RunDirectoryLock(resume=True)
    adopted.register(copy)
    assert not (tmp_path / "copy" / "run_id").exists()  # nothing until it loads
    copy.load_from_file(tmp_path / "first" / "checkpoint")
    copy.train()
    assert adopted.run_id == lock.run_id
    assert (tmp_path / "copy" / "run_id").read_text().strip() == lock.run_id
    with pytest.raises(RunDirectoryOwnedError):
        RunDirectoryLock().register(make_trainer(tmp_path / "copy", batches=1))


def test_a_run_directory_another_process_trains_in_is_refused(tmp_path):
    import fcntl

    fd = os.open(tmp_path, os.O_RDONLY)  # another open file: as another process
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirInUseError, match="in use by another"):
            RunDirectoryLock().register(make_trainer(tmp_path))
        assert not any(tmp_path.iterdir())
    finally:
        os.close(fd)


# -- TrainingLog ------------------------------------------------------------------


def test_training_log_with_a_collector_writing_to_a_replay_buffer():
    # TorchRL's Trainer hands its hooks no batch (None) when the collector writes
    # to a replay buffer itself: the pace is logged, no episodes
    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    actor = cartpole_actor(env)
    loss = A2CLoss(actor, ValueOperator(MLP(4, 1, num_cells=[16]), ["observation"]))
    replay = TensorDictReplayBuffer(storage=LazyTensorStorage(256), batch_size=16)
    collector = Collector(
        env,
        actor,
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=-1,
        replay_buffer=replay,
        auto_register_policy_transforms=False,
    )
    trainer = Trainer(
        collector=collector,
        total_frames=3 * FRAMES_PER_BATCH,
        frame_skip=1,
        optim_steps_per_batch=1,
        loss_module=loss,
        optimizer=torch.optim.Adam(loss.parameters()),
        replay_buffer=replay,
        log_interval=0,
        progress_bar=False,
    )
    trainer.register_op("process_optim_batch", lambda batch: replay.sample())
    TrainingLog().register(trainer)
    trainer.train()
    assert trainer.collected_frames == 3 * FRAMES_PER_BATCH
    assert len(trainer._log_dict["time/fps"]) == 3
    assert "train/reward" not in trainer._log_dict


def test_a_loss_without_reduction_is_refused_naming_its_terms(tmp_path):
    trainer = make_trainer(tmp_path, batches=1)
    trainer.loss_module.reduction = "none"  # per-sample terms
    NonFiniteGuard().register(trainer)
    with pytest.raises(RuntimeError, match="not reduced to one number.*'loss_obj"):
        trainer.train()
