"""Faults a long run meets: non-finite rewards, observations and losses, signals,
a kill during a save, damaged checkpoints, and resuming with another config.

Tiny CartPole runs (2 envs, T = 5, no evaluation) of the gym example's pieces on
the new trainer (``builders.small_trainer``: ``experiment.make_trainer``'s
hooks), except for the signals, which are sent to ``examples/acer_gym.py`` in a
subprocess. Faults come from :class:`Inject`, a wrapper of each CartPole copy
(the environment ``InjectedCartPole-v1``), armed after a given number of frames.
"""

import copy
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from _faults_helpers import (
    EXAMPLE_ARGS,
    ROOT,
    build,
    close,
    failure_note,
    frames_in,
    last,
    saved,
    signal_when_there,
    start_example,
    wait_for,
)
from builders import Inject, snapshot

from torchrl_acer.trainers.checkpoint import (
    ACERCheckpoint,
    ACERCheckpointError,
    NonFiniteCheckpointError,
)
from torchrl_acer.trainers.hooks import NonFiniteTrainingError, lock_run_dir
from torchrl_acer.training import experiment


@pytest.fixture(autouse=True)
def disarm():
    Inject.armed, Inject.what = False, "reward"
    yield
    Inject.armed = False


class Recorder:
    def __init__(self):
        self.scalars = []

    def log_scalar(self, name, value, step):
        self.scalars.append((name, float(value), step))


def at_frames(trainer, frames, action):
    """Calls ``action()`` once, after the updates of the batch that brings the
    trainer to ``frames`` collected frames (``post_steps``)."""

    def maybe():
        if trainer.collected_frames == frames:
            action()

    trainer.register_op("post_steps", maybe)


def arm(what):
    def action():
        Inject.what, Inject.armed = what, True

    return action


def all_finite(trainer):
    return all(bool(torch.isfinite(p).all()) for p in trainer.loss_module.parameters())


def stored(trainer):
    replay = trainer.schedule.replay_buffer
    return replay[: len(replay)]


# -- numerical health ----------------------------------------------------------------


def test_a_nan_reward_batch_is_dropped_counted_and_logged(tmp_path):
    # logger.log_interval=9: TorchRL's trainer logs a key once more than that many
    # frames passed, so every 10-frame batch
    trainer = build(
        tmp_path,
        inject=True,
        **{"collector.total_frames": 90, "logger.log_interval": 9},
    )
    trainer.logger = Recorder()
    steps = {}

    def nan_reward():
        steps["before"] = trainer.optimization_stepper.optimizer_step_count
        arm("reward")()

    at_frames(trainer, 30, nan_reward)
    with pytest.warns(RuntimeWarning, match="non-finite batch not trained on"):
        trainer.train()
    guard = trainer.optimization_stepper
    assert guard.nonfinite == {"updates": 0, "batches": 1}
    assert guard.optimizer_step_count > steps["before"]  # training went on
    assert trainer.collected_frames == 90
    assert all_finite(trainer)
    assert torch.isfinite(stored(trainer)["next", "reward"]).all()
    scalars = trainer.logger.scalars
    logged = [v for k, v, _ in scalars if k == "train/nonfinite_batches"]
    # logged every time: the count so far, 1 from the fourth batch on
    assert logged == [0] * 3 + [1] * 6
    losses = [v for k, v, _ in scalars if k.startswith("loss")]
    assert losses and not any(np.isnan(v) for v in losses)
    close(trainer)


def test_nan_rewards_in_a_row_stop_naming_the_batch_and_frames(tmp_path):
    trainer = build(tmp_path, inject=True, **{"health.max_nonfinite_in_a_row": 3})
    at_frames(trainer, 20, arm("rewards"))
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError) as err:
        trainer.train()
    message = str(err.value)
    frames = trainer.collected_frames
    assert "3 collected batches in a row were non-finite" in message
    assert f"stopped at {frames} frames" in message
    assert "the batch collected after 20 frames held 10 non-finite rewards" in message
    assert "0 non-finite observations" in message
    assert all_finite(trainer)
    # what was trained before the streak is kept: a checkpoint of the last
    # finite parameters, at the frames where it stopped
    checkpoint = last(tmp_path)
    assert len(err.value.__notes__) == 1
    assert f"training failed after {frames} frames" in err.value.__notes__[0]
    assert failure_note(checkpoint) in err.value.__notes__[0]
    assert frames_in(checkpoint) == frames
    params = saved(checkpoint, "loss_module")
    current = trainer.loss_module.state_dict()
    assert all(torch.equal(params[k], current[k]) for k in current)
    streak = saved(checkpoint, "trainer_module.optimization_stepper")["streak"]
    assert streak["batches"] == 3
    close(trainer)


def test_nan_observation_is_caught_before_it_is_stored(tmp_path):
    # at an episode's end: the policy never sees it (the next step starts from the
    # reset observation), so only the loss and the replay would
    trainer = build(tmp_path, inject=True, **{"health.max_nonfinite_in_a_row": 1})
    at_frames(trainer, 10, arm("final_observation"))
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError) as err:
        trainer.train()
    message = str(err.value)
    assert "1 collected batches in a row" in message
    assert "0 non-finite rewards and 4 non-finite observations" in message
    assert "('next', 'observation'): 4" in message
    assert f"at {trainer.collected_frames} frames" in message
    assert torch.isfinite(stored(trainer)["next", "observation"]).all()
    assert all_finite(trainer)
    close(trainer)


@pytest.mark.parametrize("what", ["observation", "raise"])
def test_a_failure_while_collecting_keeps_what_was_trained(tmp_path, what, capsys):
    """A non-finite observation the policy would act on stops the run naming it
    (it used to fail inside the action distribution: "probability tensor contains
    either inf, nan or element < 0"); an environment that raises stops it with its
    own error. Either way a checkpoint of the batches trained on is written, and
    resumes with fresh episodes."""
    overrides = {"checkpoint.interval": None}
    trainer = build(tmp_path, inject=True, **overrides)
    at_frames(trainer, 20, arm(what))
    expected = NonFiniteTrainingError if what == "observation" else RuntimeError
    with pytest.raises(expected) as err:
        trainer.train()
    frames = trainer.collected_frames
    assert frames == 20
    checkpoint = last(tmp_path)
    if what == "observation":
        assert str(err.value).startswith(
            f"the policy was given non-finite observations while collecting after "
            f"{frames} frames ('observation': 4 non-finite values)"
        )
    else:
        assert str(err.value) == "the simulator crashed"
    notes = err.value.__notes__
    assert notes[0] == (
        "training stopped while collecting; the training environments' state is "
        "left out of the checkpoint: a resume starts fresh episodes"
    )
    assert f"training failed after {frames} frames" in notes[1]
    assert failure_note(checkpoint) in notes[1]
    assert frames_in(checkpoint) == frames
    trainer.evaluation.evaluate.close()

    resumed = build(tmp_path, inject=True, resume=checkpoint, **overrides)
    resumed.total_frames = frames + 20
    capsys.readouterr()
    experiment.resume(resumed, checkpoint)
    assert resumed.collected_frames == frames
    assert (
        f"state not saved (collecting failed with {expected.__name__} after "
        f"{frames} frames); fresh episodes" in capsys.readouterr().out
    )
    resumed.train()
    assert resumed.collected_frames == frames + 20 and all_finite(resumed)
    resumed.evaluation.evaluate.close()


def test_a_nan_observation_while_evaluating_is_named(tmp_path):
    trainer = build(
        tmp_path, inject=True, **{"checkpoint.interval": None, "eval.interval": 20}
    )
    # evaluated after the first batch's updates (10 frames): armed before
    at_frames(trainer, 10, arm("observation"))
    with pytest.raises(NonFiniteTrainingError, match="while evaluating after 10 fr"):
        trainer.train()
    assert frames_in(last(tmp_path)) == 10
    close(trainer)


def test_a_non_finite_streak_goes_on_after_a_resume(tmp_path):
    overrides = {"health.max_nonfinite_in_a_row": 3, "checkpoint.interval": None}
    trainer = build(
        tmp_path, inject=True, **{**overrides, "collector.total_frames": 30}
    )
    at_frames(trainer, 10, arm("rewards"))
    with pytest.warns(RuntimeWarning, match="non-finite batch not trained on"):
        trainer.train()  # 2 batches of NaN rewards, then the end's checkpoint
    path = last(tmp_path)
    close(trainer)

    resumed = build(tmp_path, inject=True, resume=path, **overrides)
    experiment.resume(resumed, path)
    guard = resumed.optimization_stepper
    assert guard.nonfinite["batches"] == 2
    with pytest.raises(NonFiniteTrainingError) as err:  # the third in a row
        resumed.train()
    assert "3 collected batches in a row were non-finite" in str(err.value)
    assert "batch collected after 10 frames held 10 non-finite rewards" in str(
        err.value
    )
    assert guard.nonfinite["batches"] == 3
    close(resumed)


def blow_up(trainer):
    """Parameters so large that the critic's outputs overflow: finite batches,
    non-finite losses."""
    with torch.no_grad():
        for name, p in trainer.loss_module.named_parameters():
            if "critic" in name:
                p.mul_(1e30)


def test_non_finite_updates_are_skipped_then_stop_naming_the_term(tmp_path):
    trainer = build(tmp_path, **{"health.max_nonfinite_in_a_row": 4})
    guard = trainer.optimization_stepper
    at_blow_up = {}

    def blow():
        blow_up(trainer)
        at_blow_up["state"] = {
            k: v.clone() for k, v in trainer.loss_module.state_dict().items()
        }
        at_blow_up["steps"] = guard.optimizer_step_count

    at_frames(trainer, 20, blow)
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteTrainingError) as err:
        trainer.train()
    message = str(err.value)
    assert "4 updates in a row were non-finite" in message
    assert "first non-finite term loss_" in message
    assert "0 non-finite rewards and 0 non-finite observations" in message
    assert f"stopped at {trainer.collected_frames} frames" in message
    assert guard.nonfinite["updates"] == 4
    assert guard.optimizer_step_count == at_blow_up["steps"]
    before, after = at_blow_up["state"], trainer.loss_module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no step
    close(trainer)


def test_no_checkpoint_from_non_finite_parameters(tmp_path):
    # with the checks off, a non-finite update is applied; the save refuses it
    trainer = build(
        tmp_path,
        **{
            "health.check": False,
            "checkpoint.interval": None,
            "collector.total_frames": 30,
        },
    )
    previous = {}

    def save_then_blow_up():
        trainer.save_trainer(force_save=True)
        previous["files"] = snapshot(tmp_path / "checkpoints")
        blow_up(trainer)

    at_frames(trainer, 20, save_then_blow_up)
    # the end's save refuses; the failure's save too
    with pytest.raises(NonFiniteCheckpointError, match="refusing to write a check"):
        trainer.train()
    assert not all_finite(trainer)
    assert previous["files"] and snapshot(tmp_path / "checkpoints") == previous["files"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["last"]
    close(trainer)


# -- checkpoint files ----------------------------------------------------------------


def _flip_middle(path):
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _largest_file(checkpoint):
    files = (p for p in (checkpoint / "components").rglob("*") if p.is_file())
    return max(files, key=lambda p: p.stat().st_size)


def test_damaged_checkpoints_are_refused_naming_the_file(tmp_path):
    trainer = build(tmp_path / "a", **{"collector.total_frames": 20})
    trainer.train()
    close(trainer)
    path = last(tmp_path / "a")
    ours = ACERCheckpoint.verify(path)["metadata"]["torchrl_acer"]
    assert ours["format_version"] == 1 and frames_in(path) == 20
    assert ours["versions"]["torchrl-acer"] and "git_commit" in ours
    assert ours["config"]["model"]["num_cells"] == [16]
    # the run's directory, with damaged copies of its checkpoint beside it
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    checkpoints = tmp_path / "b" / "checkpoints"
    flipped = checkpoints / "flipped"
    shutil.copytree(path, flipped)
    _flip_middle(_largest_file(flipped))
    truncated = checkpoints / "truncated"
    shutil.copytree(path, truncated)
    data = _largest_file(truncated).read_bytes()
    _largest_file(truncated).write_bytes(data[: len(data) - 100])
    manifest = checkpoints / "manifest"
    shutil.copytree(path, manifest)
    _flip_middle(manifest / "manifest.json")
    plain = checkpoints / "plain"  # what torchrl's own Checkpoint writes
    shutil.copytree(path, plain)
    (plain / "manifest.json.sha256").unlink()
    torch_file = checkpoints / "torch.pt"
    torch.save(saved(path, "loss_module"), torch_file)
    other = build(
        tmp_path / "b", seed=1, resume=path, resume_allow_config_change=["seed"]
    )
    params = {k: v.clone() for k, v in other.loss_module.state_dict().items()}
    for bad, why in [
        (flipped, "is corrupted"),
        (manifest, "is corrupted"),
        (truncated, "is truncated"),
        (plain, "was not written by ACERCheckpoint"),
        (torch_file, "is not a torchrl-acer checkpoint"),
    ]:
        with pytest.raises(ACERCheckpointError, match=why) as err:
            experiment.resume(other, bad)
        assert str(bad) in str(err.value)
    after = other.loss_module.state_dict()
    assert all(torch.equal(params[k], after[k]) for k in params)  # nothing loaded
    assert other.collected_frames == 0
    experiment.resume(other, last(tmp_path / "b"))
    assert other.collected_frames == 20
    close(other)


def test_resuming_with_another_config(tmp_path):
    trainer = build(tmp_path, **{"collector.total_frames": 20})
    trainer.train()
    close(trainer)
    path = last(tmp_path)
    # the same shapes, another network: loads without error unless refused
    tanh = build(tmp_path, resume=path, **{"model.activation": "tanh"})
    with pytest.raises(ACERCheckpointError) as err:
        experiment.resume(tanh, path)
    message = str(err.value)
    assert "model.activation: 'relu' in the checkpoint, 'tanh' now" in message
    assert "resume_allow_config_change=[model.activation]" in message
    assert tanh.collected_frames == 0
    tanh.checkpoint.allow_config_change = ("model.activation",)
    experiment.resume(tanh, path)
    assert tanh.collected_frames == 20
    close(tanh)
    wider = build(tmp_path, resume=path, **{"model.num_cells": [32]})
    with pytest.raises(ACERCheckpointError, match=r"model.num_cells: \[16\] in the"):
        experiment.resume(wider, path)
    # forced, the parameters still load strictly, naming the keys
    wider.checkpoint.force = True
    with pytest.raises(
        ACERCheckpointError, match=r"weight: \(16, 4\) in the checkpoint"
    ):
        experiment.resume(wider, path)
    close(wider)
    # settings safe to change
    longer = build(
        tmp_path,
        resume=path,
        **{"collector.total_frames": 1_000, "checkpoint.every_minutes": 1},
    )
    experiment.resume(longer, path)
    assert longer.collected_frames == 20 and longer.total_frames == 1_000
    close(longer)


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


def test_an_evaluation_stopped_by_a_signal_is_not_lost(tmp_path):
    """No evaluation point is lost to a signal: the one it arrives in completes
    and is logged, the checkpoint written at the stop has the next one due, and
    the resumed run evaluates from there as the uninterrupted run did."""
    overrides = {
        "checkpoint.interval": None,
        "collector.total_frames": 60,
        "eval.interval": 20,
    }

    def run(evaluator, run_dir, resume=None):
        trainer = build(run_dir, resume=resume, **overrides)
        trainer.logger = recorder = Recorder()
        trainer.evaluation.evaluate = evaluator
        if resume is not None:
            experiment.resume(trainer, resume)
        trainer.train()
        trainer.collector.shutdown()
        return trainer, _evaluated_frames(recorder)

    _, uninterrupted = run(StoppedOnce(), tmp_path / "a")
    assert uninterrupted == [10, 20, 40, 60]
    stopped, before = run(StoppedOnce(stop_at=2), tmp_path / "b")
    assert stopped.stop.signum == signal.SIGINT and stopped.collected_frames == 20
    assert before == [10, 20]  # the second evaluation (at 20) completed
    _, after = run(StoppedOnce(), tmp_path / "b", last(tmp_path / "b"))
    assert before + after == uninterrupted


# -- signals and kills, on the example -----------------------------------------------


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """The example stopped by SIGTERM, with a second signal (SIGINT) arriving
    while its final checkpoint is being written (slowly)."""
    tmp = tmp_path_factory.mktemp("sigterm")
    checkpoint = last(tmp / "run")
    process = start_example(tmp, "slow", "checkpoint.interval=50")
    try:
        started = wait_for(checkpoint, process)
        previous = frames_in(checkpoint) if started else None
        (tmp / "flag").touch()  # from now on each save takes 3 s or more
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
    frames = frames_in(run["checkpoint"])
    # written at the signal: it holds the frames the run stopped at
    assert f"interrupted (SIGTERM) at {frames} frames" in run["out"]
    # resumed in a copy of the run (the fixture's is read by the next test)
    run_dir = tmp_path / "run"
    shutil.copytree(run["checkpoint"].parent.parent, run_dir)
    trainer = build(
        run_dir,
        resume=last(run_dir),
        **{
            "collector.total_frames": frames + 20,
            "replay.ratio": 4.0,  # the example's settings
            "replay.capacity": 100_000,
            "eval.episodes": 1,
            "eval.max_steps": 10,
            "checkpoint.every_minutes": 5,
        },
    )
    experiment.resume(trainer, last(run_dir))
    assert trainer.collected_frames == frames
    trainer.train()
    assert trainer.collected_frames == frames + 20 and trainer.stop.signum is None
    close(trainer)


def test_a_second_signal_during_the_save_waits_for_it(stopped_run):
    run = stopped_run
    output = run["out"] + run["err"]
    assert "SIGINT: a checkpoint is being written" in output, output[-3000:]
    frames = frames_in(run["checkpoint"])  # the final checkpoint, complete
    assert f"at {frames} frames" in run["out"], run["out"][-3000:]
    assert frames >= run["previous"]
    leftovers = [p.name for p in run["checkpoint"].parent.iterdir()]
    assert leftovers == ["last"]  # no staged or half-replaced checkpoint


def test_kill_9_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    # checkpoints every 0.3 s (by time: no frame interval); the second is killed
    # half-written
    process = start_example(tmp_path, "hang", "checkpoint.every_minutes=0.005")
    reached, out, err = signal_when_there(
        process, tmp_path / "marker", signal.SIGKILL, timeout=60
    )
    assert reached, err[-3000:]
    assert process.returncode == -signal.SIGKILL
    checkpoint = last(tmp_path / "run")
    frames = frames_in(checkpoint)  # verified: every file whole
    assert frames > 0 and saved(checkpoint, "collector")["at_frames"] == frames
    (partial,) = [p for p in checkpoint.parent.iterdir() if p.name != "last"]
    with pytest.raises(ACERCheckpointError, match="not a checkpoint|not written by"):
        ACERCheckpoint.verify(partial)


def test_signal_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    trainer = build(tmp_path, **{"collector.total_frames": 20})
    seen = []
    trainer.register_op(
        "post_steps", lambda: seen.append(signal.getsignal(signal.SIGTERM))
    )
    trainer.train()
    assert seen and all(h == trainer.stop._on_signal for h in seen)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    close(trainer)


def test_copies_of_the_actor_do_not_carry_the_trainer(tmp_path):
    """The policy-input check is a hook on the actor: a deepcopy or a pickle of the
    actor (what a multiprocess collector sends its workers) must not copy the
    trainer, its collector and its replay with it."""
    trainer = build(tmp_path)
    actor = trainer.loss_module.actor_network
    hooks = list(actor._forward_pre_hooks.values())
    assert any(getattr(h, "owner", None) is trainer.policy_check for h in hooks)
    for clone in (copy.deepcopy(actor), pickle.loads(pickle.dumps(actor))):
        copied = list(clone._forward_pre_hooks.values())
        assert len(copied) == len(hooks)
        assert all(getattr(h, "owner", None) is None for h in copied)
    assert len(pickle.dumps(actor)) < 100_000
    close(trainer)


@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_while_collecting(tmp_path, signals):
    """A first Ctrl-C in the middle of collecting waits for the batch, which is
    trained on before the stop (interrupted inside a step, a vector environment
    of worker processes was left mid-step: closing it hung or broke its pipes);
    a second one stops the collection at once, and what was trained before it
    is saved."""
    trainer = build(tmp_path, inject=True, **{"checkpoint.interval": None})
    at_frames(trainer, 20, arm("sigint" if signals == 1 else "sigint_twice"))
    trainer.train()
    assert trainer.stop.signum == signal.SIGINT
    # one signal: the batch it arrived in is trained on; two: it is dropped
    assert trainer.collected_frames == (30 if signals == 1 else 20)
    assert frames_in(last(tmp_path)) == trainer.collected_frames
    close(trainer)


def test_a_second_process_on_a_running_run_is_refused_touching_nothing(tmp_path):
    # the mistake this guards: resuming a run while its first process still trains
    # (the resume cut the first's logs back to its checkpoint)
    checkpoint = last(tmp_path / "run")
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
    lock_run_dir(tmp_path / "run")
    lock_run_dir(tmp_path / "run")  # again in the holder: nothing happens
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from torchrl_acer.trainers.hooks import lock_run_dir; "
            "lock_run_dir(sys.argv[1])",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
    )
    assert probe.returncode != 0 and "RunDirInUseError" in probe.stderr
    from torchrl_acer.trainers import hooks  # where the lock registry lives

    os.close(hooks._RUN_DIR_LOCKS.pop((tmp_path / "run").resolve()))
