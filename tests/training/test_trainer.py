"""ACER's training run as the gym example builds it (``experiment.make_trainer``:
the ACERTrainer and its hooks), its greedy evaluator, its config checks and the
example itself."""

import json
import os
import shutil
import signal

import pytest
import torch
from builders import (
    cartpole_states,
    close_trainer,
    load_example_module,
    resume_small_trainer,
    run_example,
    small_gym_config,
    small_trainer,
)
from tensordict import TensorDict

from torchrl_acer.modules.models import mlp_actor_critic
from torchrl_acer.trainers import (
    ACERTrainer,
    GreedyEvaluator,
    make_segment_replay_buffer,
)
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.experiment import check_config, get_device


def updates(trainer) -> int:
    """The optimizer steps taken (skipped non-finite updates left out)."""
    return trainer.optimization_stepper.optimizer_step_count


def record_losses(trainer) -> list:
    """Each batch's loss terms (the average over its updates), as the trainer
    hands them to its log, appended to the returned list as training goes."""
    seen = []

    def record(optim_steps, average_losses):
        seen.append(
            {k: v.clone() for k, v in average_losses.items() if k.startswith("loss")}
        )

    trainer.register_op("post_optim_complete_log", record)
    return seen


def test_two_runs_give_identical_first_losses(tmp_path):
    logs = []
    for i in range(2):
        trainer = small_trainer(tmp_path / str(i), **{"collector.total_frames": 30})
        losses = record_losses(trainer)
        trainer.train()
        close_trainer(trainer)
        logs.append(losses)
    assert len(logs[0]) == 3 and logs[0] == logs[1]
    # and another seed differs
    trainer = small_trainer(
        tmp_path / "seed1", seed=1, **{"collector.total_frames": 30}
    )
    losses = record_losses(trainer)
    trainer.train()
    close_trainer(trainer)
    assert losses != logs[0]


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


def component_states(trainer) -> dict:
    """The state dict of each component of the trainer's checkpoint (the replay
    buffer's apart: it dumps files)."""
    components = trainer._sync_checkpoint_components().components
    return {
        name: component.state_dict()
        for name, component in components.items()
        if name != "replay_buffer"
    }


def test_checkpoint_restores_every_piece(tmp_path):
    trainer = small_trainer(tmp_path / "a", **{"collector.total_frames": 40})
    trainer.train()
    assert updates(trainer) > 4  # replayed updates happened
    trainer.save_trainer(force_save=True)  # after the final evaluation too
    saved = component_states(trainer)
    # a copy of the run (a run directory takes checkpoints of its own run only),
    # resumed with another seed: everything it builds starts elsewhere
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    other = small_trainer(
        tmp_path / "b",
        seed=7,
        resume=str(tmp_path / "b" / "checkpoints" / "last"),
        resume_allow_config_change=["seed"],
    )
    other.load_from_file(tmp_path / "b" / "checkpoints" / "last")
    restored = component_states(other)
    # the pieces, one by one: parameters, averaged policy, optimizer, counters,
    # schedules, the environments and every random state
    assert set(saved) == set(restored)
    assert {"loss_module", "optimizer", "target_updater", "rng", "collector"} <= set(
        saved
    )
    for name in saved:
        if name in ("collector", "eval_envs"):
            # pickled environments, whose bytes are not canonical: that they go
            # on with the same episodes is test_gym_collector's and the bit-exact
            # resume's (test_acer_trainer)
            continue
        assert_tree_equal(saved[name], restored[name], name)
    replay, other_replay = trainer.schedule.replay_buffer, other.schedule.replay_buffer
    assert len(replay) == len(other_replay) == 4 * 2
    assert (replay.storage[:8] == other_replay.storage[:8]).all()
    assert replay._writer._cursor == other_replay._writer._cursor
    for name in ("actor_network_params", "target_actor_network_params"):
        for key, value in getattr(trainer.loss_module, name).items(True, True):
            assert torch.equal(value, getattr(other.loss_module, name)[key]), name
    assert other.collected_frames == trainer.collected_frames == 40
    assert updates(other) == updates(trainer) == other._optim_count
    # the optimizer state is the saved one (Adam moments)
    moments = [s["exp_avg"] for s in other.optimizer.state_dict()["state"].values()]
    assert moments and all(m.abs().sum() > 0 for m in moments)
    close_trainer(trainer)
    close_trainer(other)


def test_resumed_run_continues_from_saved_frames(tmp_path):
    trainer = small_trainer(tmp_path, **{"collector.total_frames": 40})
    trainer.train()
    assert trainer.collected_frames == 40
    close_trainer(trainer)
    resumed = resume_small_trainer(tmp_path, **{"collector.total_frames": 80})
    assert resumed.collected_frames == 40
    seen = []
    resumed.register_op("post_steps", lambda: seen.append(resumed.collected_frames))
    resumed.train()
    assert seen[0] == 50 and seen[-1] == 80
    close_trainer(resumed)


def first_episode_returns(env, policy, max_steps):
    """Plainly: a full rollout, then each environment's first episode's return."""
    from torchrl.envs import ExplorationType, set_exploration_type

    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        rollout = env.rollout(
            max_steps, policy, break_when_any_done=False, break_when_all_done=True
        )
    done = rollout["next", "done"].squeeze(-1)
    rewards = rollout["next", "reward"].squeeze(-1)
    returns = []
    for i in range(done.shape[0]):
        total = 0.0
        for t in range(done.shape[1]):
            total += float(rewards[i, t])
            if done[i, t]:
                break
        returns.append(total)
    return returns


@pytest.mark.parametrize("max_steps", [400, 10])
def test_greedy_evaluator_scores_each_environments_first_episode(max_steps):
    torch.manual_seed(0)
    env = make_env("CartPole-v1", num_envs=4, seed=3)
    actor, _ = mlp_actor_critic(4, 2, num_cells=[8], action_spec=env.action_spec[0])
    # perturb the greedy policy so that episodes differ in length
    with torch.no_grad():
        for p in actor.parameters():
            p.mul_(3.0)
    expected = first_episode_returns(env, actor, max_steps)
    env.set_seed(3)
    got = GreedyEvaluator(env, actor, max_steps=max_steps)()
    assert got["reward"] == pytest.approx(sum(expected) / len(expected))
    assert got["reward_min"] == min(expected) and got["reward_max"] == max(expected)
    if max_steps == 400:
        assert len(set(expected)) > 1, "episodes of one length test too little"
    else:
        assert max(expected) == max_steps  # some episode was cut off
    env.close()


def serial_cartpole_summing_returns():
    """Two CartPoles in a TorchRL SerialEnv (not started) under one RewardSum, and
    a small policy for them (seeded)."""
    from torchrl.envs import GymEnv, RewardSum, SerialEnv, TransformedEnv

    torch.manual_seed(0)
    env = TransformedEnv(
        SerialEnv(2, lambda: GymEnv("CartPole-v1")),
        RewardSum(in_keys=["reward"], out_keys=["episode_reward"]),
    )
    actor, _ = mlp_actor_critic(4, 2, num_cells=[8], action_spec=env.action_spec[0])
    return env, actor


def test_greedy_evaluator_on_an_env_under_one_transform():
    # TorchRL's own idiom: TransformedEnv(env, RewardSum(...)) holds the transform
    # alone, not a Compose
    env, actor = serial_cartpole_summing_returns()
    with torch.no_grad():
        for p in actor.parameters():
            p.mul_(3.0)
    env.set_seed(3)
    expected = first_episode_returns(env, actor, 400)
    env.set_seed(3)
    got = GreedyEvaluator(env, actor, max_steps=400)()
    assert got["reward"] == pytest.approx(sum(expected) / len(expected))
    assert got["reward_min"] == min(expected) and got["reward_max"] == max(expected)
    env.close()


def test_greedy_evaluator_on_a_serial_env_not_started_yet():
    # a SerialEnv forwards attribute lookups to copies it builds when it starts
    from torchrl.envs import GymEnv, RewardSum, SerialEnv, TransformedEnv

    env, actor = serial_cartpole_summing_returns()
    evaluator = GreedyEvaluator(env, actor, max_steps=20)
    assert evaluator._vector is None  # TorchRL's steps
    assert 1 <= evaluator()["reward"] <= 20
    env.close()
    # the returns summed in each copy: a SerialEnv with no transform of its own
    env = SerialEnv(
        2,
        lambda: TransformedEnv(
            GymEnv("CartPole-v1"),
            RewardSum(in_keys=["reward"], out_keys=["episode_reward"]),
        ),
    )
    assert 1 <= GreedyEvaluator(env, actor, max_steps=20)()["reward"] <= 20
    env.close()


def test_greedy_evaluator_on_an_env_without_returns_names_what_is_missing():
    from torchrl.envs import GymEnv, SerialEnv

    env = SerialEnv(2, lambda: GymEnv("CartPole-v1"))  # no RewardSum
    actor, _ = mlp_actor_critic(4, 2, num_cells=[8], action_spec=env.action_spec[0])
    with pytest.raises(KeyError, match=r"no return under \('next', 'episode_rew"):
        GreedyEvaluator(env, actor, max_steps=20)()
    env.close()


class _StateCheckingPolicy:
    """The actor, keeping at each call the observation it is given and the state
    CartPole's copies are in (its observation is its state)."""

    def __init__(self, actor, env):
        self.actor, self.env, self.seen = actor, env, []

    def __call__(self, td):
        self.seen.append((td["observation"].clone(), cartpole_states(self.env)))
        return self.actor(td)


def test_greedy_evaluator_acts_on_the_states_its_episodes_are_in():
    # TorchRL 0.14's env.reset() after a step where some copies ended returns the
    # observations saved at that step (upstream/torchrl/0002-*.patch): a second
    # evaluation on the same env would act first on the last one's observations,
    # not on the states its new episodes start from.
    torch.manual_seed(0)
    env = make_env("CartPole-v1", num_envs=4, seed=3)
    actor, _ = mlp_actor_critic(4, 2, num_cells=[8], action_spec=env.action_spec[0])
    with torch.no_grad():  # episodes of different lengths: the last step ends some
        for p in actor.parameters():
            p.mul_(3.0)
    policy = _StateCheckingPolicy(actor, env)
    evaluator = GreedyEvaluator(env, policy, max_steps=400)
    for _ in range(3):
        evaluator()
    env.close()
    assert len(policy.seen) > 30
    for step, (observation, state) in enumerate(policy.seen):
        assert torch.equal(observation, state.to(observation.dtype)), step


def test_checkpoint_holds_the_next_checkpoint_to_write(tmp_path):
    trainer = small_trainer(
        tmp_path, **{"collector.total_frames": 40, "checkpoint.interval": 20}
    )
    saves = []
    original = trainer.checkpoint.save

    def spy(*args, **kwargs):
        saves.append((trainer.collected_frames, dict(trainer._get_state())))
        return original(*args, **kwargs)

    trainer.checkpoint.save = spy
    trainer.train()
    close_trainer(trainer)
    assert [frames for frames, _ in saves] == [20, 40]  # interval, end
    for frames, state in saves:
        # the save is counted in what it saves: a run resumed from it saves next
        # checkpoint.interval frames later, not at once
        assert state["_last_save"] == frames


class SignalBefore:
    """A collector that sends ``signum`` to this process before yielding its
    ``n``-th batch (from 0): Ctrl-C while collecting."""

    init_random_frames = 0

    def __init__(self, collector, n, signum=signal.SIGINT):
        self.collector, self.n, self.signum = collector, n, signum

    def __iter__(self):
        for i, batch in enumerate(self.collector):
            if i == self.n:
                os.kill(os.getpid(), self.signum)
            yield batch

    def shutdown(self):
        self.collector.shutdown()


def test_ctrl_c_writes_a_checkpoint(tmp_path):
    trainer = small_trainer(tmp_path)
    trainer.collector = SignalBefore(trainer.collector, 2)
    trainer.train()
    # the batch under way is trained on, then the trainer saves and returns
    assert trainer.stop.signum == signal.SIGINT and trainer.stop.exit_code == 130
    assert trainer.collected_frames == 30
    close_trainer(trainer)
    resumed = resume_small_trainer(tmp_path)
    assert resumed.collected_frames == 30
    close_trainer(resumed)


def test_replay_segments_never_mix_environments():
    rb = make_segment_replay_buffer(
        capacity_steps=60, segment_length=5, batch_segments=50
    )
    for it in range(5):  # wraps around: 5 x 3 segments > 12
        step = torch.arange(it * 5, it * 5 + 5).expand(3, 5)
        env = torch.arange(3)[:, None].expand(3, 5)
        rb.extend(TensorDict({"step": step, "env": env}, [3, 5]))
    sample = rb.sample()
    assert sample.batch_size == (50, 5)
    assert (sample["env"] == sample["env"][:, :1]).all()
    assert (sample["step"].diff(dim=-1) == 1).all()
    # the oldest segments were overwritten
    assert sample["step"].min() >= 5


def test_poisson_number_of_replayed_updates(tmp_path):
    trainer = small_trainer(
        tmp_path,
        **{"replay.ratio": 3.0, "collector.total_frames": 600, "eval.interval": None},
    )
    trainer.train()
    off_policy = updates(trainer) - 60
    # mean 3 per batch; 60 batches: standard deviation of the total is sqrt(180)
    assert abs(off_policy - 180) < 4 * 180**0.5
    close_trainer(trainer)


def test_on_policy_only(tmp_path):
    trainer = small_trainer(
        tmp_path, **{"replay.ratio": 0.0, "collector.total_frames": 30}
    )
    assert trainer.replay_buffer is None and trainer.schedule.replay_buffer is None
    trainer.train()
    assert updates(trainer) == trainer._optim_count == 3
    close_trainer(trainer)


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_learning_rate_schedule(tmp_path, schedule):
    trainer = small_trainer(
        tmp_path,
        **{"optim.schedule": schedule, "collector.total_frames": 60, "optim.lr": 0.01},
    )
    seen = []  # (frames, lr) after each batch, past the schedule's own hook
    trainer.register_op(
        "post_steps",
        lambda: seen.append(
            (trainer.collected_frames, trainer.optimizer.param_groups[0]["lr"])
        ),
    )
    lrs = []  # the lr of each update, as the optimizer steps with it
    trainer.register_op(
        "post_optim", lambda: lrs.append(trainer.optimizer.param_groups[0]["lr"])
    )
    trainer.train()
    close_trainer(trainer)
    assert [frames for frames, _ in seen] == list(range(10, 70, 10))
    if schedule == "constant":
        assert {lr for _, lr in seen} | set(lrs) == {0.01}
        return
    # linear: from 0.01 at the start to 0 at the end of the run, set after each
    # batch from the frames collected, so each batch's updates run at one lr
    for frames, lr in seen:
        assert lr == pytest.approx(0.01 * (1 - frames / 60))
    assert lrs[0] == 0.01 and seen[-1][1] == 0.0
    expected = [0.01] + [lr for _, lr in seen[:-1]]
    assert sorted(set(lrs), reverse=True) == pytest.approx(expected)


def test_evaluation_and_logging(tmp_path):
    trainer = small_trainer(
        tmp_path, **{"logger.backend": "csv", "logger.log_interval": 10}
    )
    trainer.train()
    scalars = tmp_path / "logs" / "scalars"
    for metric in (
        "eval/reward",
        "train/reward",
        "loss_objective",
        "loss_critic",
        "loss_entropy",
        "entropy",
        "kl_avg",
        "train/trust_region_active_fraction",
        "train/trust_region_k_norm",
        "replay/steps",
        "time/fps",
    ):
        assert (scalars / f"{metric}.csv").is_file(), metric
    header, *rows = (scalars / "eval" / "reward.csv").read_text().split()
    steps = [int(r.split(",")[0]) for r in rows]
    # on schedule, and once at the end (not twice when the schedule ends there)
    assert steps == sorted(set(steps)) and steps[-1] == 100
    close_trainer(trainer)


@pytest.mark.parametrize(
    "override, match",
    [
        ({"replay.ratio": -1.0}, "replay.ratio=-1.0"),
        ({"replay.capacity": 3}, "replay.capacity=3 steps is shorter than one segment"),
        ({"env.num_envs": 0}, "env.num_envs=0"),
        ({"collector.T": 0}, "collector.T=0"),
        ({"optim.name": "sgd"}, "optim.name='sgd'"),
        ({"optim.schedule": "cosine"}, "optim.schedule='cosine'"),
        ({"loss.gamma": 1.5}, "loss.gamma=1.5"),
        ({"replay.start": 10_000}, "replay.start=10000 exceeds replay.capacity"),
        ({"device": "gpu"}, "device='gpu' must be cpu, cuda or auto"),
        ({"compile": "yes"}, "compile='yes' must be true or false"),
        ({"loss.check_values": "no"}, "loss.check_values='no' must be true or"),
        ({"env.reward_scale": 0.0}, "env.reward_scale=0.0 must be a finite number > 0"),
    ],
)
def test_bad_config_fails_at_start(override, match):
    with pytest.raises(ValueError, match=match):
        check_config(small_gym_config(**override))


@pytest.mark.parametrize("check_values", [True, False])
def test_check_values_setting_reaches_the_estimator(tmp_path, check_values):
    trainer = small_trainer(tmp_path, **{"loss.check_values": check_values})
    assert trainer.loss_module.value_estimator.check_values is check_values
    close_trainer(trainer)


def test_reward_scale_scales_what_the_loss_sees_not_the_logged_return():
    """``env.reward_scale`` multiplies the stored rewards; each episode's logged
    return (``episode_reward``) is still its number of CartPole steps."""
    env = load_example_module("utils_gym").make_env(
        small_gym_config(**{"env.reward_scale": 0.1}), 2, seed=0
    )
    steps = env.rollout(300, break_when_any_done=False)
    torch.testing.assert_close(
        steps["next", "reward"], torch.full_like(steps["next", "reward"], 0.1)
    )
    done = steps["next", "done"].squeeze(-1)
    assert done.sum() >= 2  # a random policy ends several episodes in 300 steps
    for row in range(2):
        ends = done[row].nonzero().squeeze(-1).tolist()
        lengths = [b - a for a, b in zip([-1] + ends[:-1], ends, strict=True)]
        returns = steps["next", "episode_reward"][row, ends].squeeze(-1)
        assert returns.tolist() == [float(n) for n in lengths]


def test_device_setting(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert get_device("cpu") == get_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="device='cuda' but CUDA is not available"):
        get_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_device("auto") == torch.device("cuda")
    assert get_device("cuda:1") == torch.device("cuda", 1)


def test_unknown_env_id_is_named():
    with pytest.raises(
        ValueError, match="'CartPole-v9' is not a registered.*CartPole-v1"
    ):
        make_env("CartPole-v9")


def test_trainer_argument_checks(tmp_path):
    trainer = small_trainer(tmp_path)
    kwargs = dict(
        collector=trainer.collector,
        loss_module=trainer.loss_module,
        optimizer=trainer.optimizer,
        total_frames=10,
    )
    with pytest.raises(ValueError, match="replay_ratio=4.0 needs a replay_buffer"):
        ACERTrainer(**kwargs, replay_ratio=4.0)
    with pytest.raises(ValueError, match="replay_ratio must be >= 0"):
        ACERTrainer(**kwargs, replay_ratio=-0.5)
    close_trainer(trainer)


def test_minatar_runs(tmp_path):
    trainer = small_trainer(
        tmp_path,
        **{"env.name": "MinAtar/Breakout-v1", "collector.total_frames": 30},
    )
    trainer.train()
    assert trainer.collected_frames == 30 and trainer.evaluation.last is not None
    close_trainer(trainer)


def test_example_trains_resumes_and_reports(tmp_path):
    common = [
        "env.num_envs=2",
        "collector.T=10",
        "replay.start=0",
        "eval.interval=100",
        "eval.episodes=2",
        "logger.progress_bar=false",
        "logger.log_interval=20",
    ]
    out = run_example(
        "acer_gym.py",
        *common,
        "collector.total_frames=200",
        f"logger.run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final greedy evaluation (2 episodes) after 200 env steps" in out.stdout
    assert (tmp_path / "run" / "eval_reward.png").is_file()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["frames"] == 200
    checkpoint = tmp_path / "run" / "checkpoints" / "last"
    out = run_example(
        "acer_gym.py",
        *common,
        "collector.total_frames=300",
        f"resume={checkpoint}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stdout and "at 200 frames" in out.stdout
    assert "after 300 env steps" in out.stdout
    out = run_example("acer_gym.py", "env.name=NoSuchEnv-v0", cwd=tmp_path)
    assert out.returncode != 0 and "'NoSuchEnv-v0' is not a registered" in out.stderr
    out = run_example("acer_gym.py", "device=gpu", cwd=tmp_path)
    assert out.returncode != 0 and "device='gpu' must be" in out.stderr


@pytest.mark.slow  # compiling the loss takes minutes on a small CPU
def test_example_compiled_trains_and_resumes_uncompiled(tmp_path):
    common = [
        "env.num_envs=2",
        "collector.T=10",
        "replay.start=0",
        "eval.interval=100",
        "eval.episodes=2",
        "logger.progress_bar=false",
        "logger.log_interval=20",
        "device=auto",
    ]
    out = run_example(
        "acer_gym.py",
        *common,
        "compile=true",
        "collector.total_frames=200",
        f"logger.run_dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final greedy evaluation (2 episodes) after 200 env steps" in out.stdout
    # the compiled loss's checkpoint has the plain parameter names
    checkpoint = tmp_path / "run" / "checkpoints" / "last"
    out = run_example(
        "acer_gym.py",
        *common,
        "collector.total_frames=240",
        f"resume={checkpoint}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "at 200 frames" in out.stdout and "after 240 env steps" in out.stdout


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """``acer_gym.py`` as a new user runs it, small: 50 frames asked of batches of
    2 envs x 10 steps, the CSV logger and the progress bar on."""
    tmp_path = tmp_path_factory.mktemp("first_run")
    run = tmp_path / "run"
    out = run_example(
        "acer_gym.py",
        "env.num_envs=2",
        "collector.T=10",
        "collector.total_frames=50",
        "replay.ratio=0",
        "eval.interval=null",
        "eval.episodes=1",
        "eval.max_steps=20",
        "logger.log_interval=20",
        "logger.progress_bar=true",
        "model.num_cells=[8]",
        f"logger.run_dir={run}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out, run


def test_a_run_prints_no_torchrl_info_lines(first_run):
    out, _ = first_run
    assert "[INFO]" not in out.stdout + out.stderr, out.stdout[:3000]


def test_total_frames_is_what_runs_and_a_rounding_is_said(first_run):
    out, run = first_run
    assert (
        "collector.total_frames=50 is not a whole number of batches of 20 steps "
        "(env.num_envs=2 x collector.T=10): training runs 3 batches, 60 steps"
    ) in out.stdout
    assert "after 60 env steps" in out.stdout
    assert json.loads((run / "summary.json").read_text())["frames"] == 60


def test_csv_logs_have_a_header_and_read_back(first_run):
    from torchrl_acer.training.plot import read_scalar

    _, run = first_run
    files = sorted((run / "logs" / "scalars").rglob("*.csv"))
    assert len(files) > 5
    for path in files:
        header, *rows = path.read_text().splitlines()
        assert header == "step,value", path
        assert rows and all(len(r.split(",")) == 2 for r in rows), path
    steps, values = read_scalar(run, "eval/reward")
    assert list(steps) == [60.0] and len(values) == 1


def test_the_progress_bar_ends_once_and_shows_no_nan(first_run):
    out, _ = first_run
    lines = [line for line in out.stderr.replace("\r", "\n").splitlines() if line]
    assert sum("60/60" in line for line in lines) == 1, lines
    assert "nan" not in out.stderr
    # no episode ended in the first batch of 10 steps (CartPole lasts longer):
    # no return shown yet, then the mean return once episodes ended
    assert "20/60" in lines[1] and "train/reward" not in lines[1], lines
    assert "train/reward: " in lines[-1], lines


def test_quieting_torchrl_keeps_its_warnings_and_its_own_setting(monkeypatch):
    import logging

    from torchrl_acer.training.experiment import quiet_torchrl_info

    logger = logging.getLogger("torchrl")
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.delenv("RL_LOGGING_LEVEL", raising=False)
    quiet_torchrl_info()
    assert logger.isEnabledFor(logging.WARNING) and not logger.isEnabledFor(
        logging.INFO
    )
    monkeypatch.setenv("RL_LOGGING_LEVEL", "INFO")
    quiet_torchrl_info()
    assert logger.isEnabledFor(logging.INFO)


def test_a_synchronous_batch_counts_every_workers_steps(capsys):
    from torchrl_acer.training.experiment import frames_to_run

    sync = small_gym_config(
        **{
            "collector.backend": "multiprocess",
            "collector.sync": True,
            "collector.num_workers": 3,
            "collector.total_frames": 31,
        }
    )
    assert frames_to_run(sync) == 60  # batches of 3 x 2 envs x 5 steps
    assert "x collector.num_workers=3): training runs 2 batches" in (
        capsys.readouterr().out
    )
    exact = small_gym_config(**{"collector.total_frames": 100})
    assert frames_to_run(exact) == 100 and capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "num_envs, max_steps, seed",
    # 1 copy: every end resets all; max_steps=9 cuts some episodes short
    [(5, 500, 0), (1, 500, 1), (4, 9, 2), (3, 500, 3)],
)
def test_greedy_evaluation_stepping_gymnasium_equals_torchrls_steps(
    num_envs, max_steps, seed
):
    """The evaluator's direct steps of the gymnasium vector env give the returns
    TorchRL's steps give, call after call (the environments' random streams
    included), episodes cut at ``max_steps`` included."""
    torch.manual_seed(seed)
    env = make_env("CartPole-v1", num_envs=num_envs, seed=seed)
    spec = env.action_spec[(0,) * env.batch_dims]
    actor, _ = mlp_actor_critic(4, 2, num_cells=[16], action_spec=spec)
    env.close()
    direct, torchrl = (
        GreedyEvaluator(
            make_env("CartPole-v1", num_envs=num_envs, seed=seed + 10),
            actor,
            max_steps=max_steps,
        )
        for _ in range(2)
    )
    assert direct._vector is not None
    torchrl._vector = None  # TorchRL's own steps
    results = [(direct(), torchrl()) for _ in range(4)]
    for mine, theirs in results:
        assert mine == theirs
    assert len({r["reward"] for r, _ in results}) > 1  # not one episode replayed
    direct.close()
    torchrl.close()


def test_greedy_evaluation_takes_torchrls_steps_where_more_happens_there():
    from torchrl.envs import InitTracker, RewardScaling

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    spec = env.action_spec[(0,) * env.batch_dims]
    actor, _ = mlp_actor_critic(4, 2, num_cells=[8], action_spec=spec)
    assert GreedyEvaluator(env, actor, max_steps=5)._vector is not None
    env.append_transform(RewardScaling(loc=0.0, scale=2.0))  # after the sum: fine
    assert GreedyEvaluator(env, actor, max_steps=5)._vector is not None
    env.append_transform(InitTracker())  # a recurrent model's
    assert GreedyEvaluator(env, actor, max_steps=5)._vector is None
    env.close()
