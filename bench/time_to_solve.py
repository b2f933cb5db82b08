"""Time to solve, side by side: ours against the libraries users would pick instead.

    bash bench/peers_setup.sh                     # once: .venv-bench with SB3 and DI-engine
    python bench/time_to_solve.py                 # both tasks, 5 seeds, every candidate
    python bench/time_to_solve.py --tasks CartPole-v1 --seeds 0 --budget 20000  # smoke

Each run trains one candidate on one task from one seed, in a process of its own on
one thread (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=MKL_NUM_THREADS=1``),
until the greedy evaluation first reaches the task's threshold (CartPole-v1 500,
Acrobot-v1 -100) or the env-step budget runs out (not reached). With ``--settle N``
a run that reached goes on for ``N`` env steps more (or to the budget), and
``late_mean``, the mean of its last ``--late`` evaluations, says whether it stayed
solved (``solved_for_good``: at or above the threshold): a setting that solves once
and collapses is no win. Runs go one at a
time, round-robin over candidate x seed, the candidates of each round in a shuffled
order, so that load from elsewhere on the machine hits all of them alike.

The evaluation protocol is the same for every candidate (``PROTOCOL``): the mean
return of ``episodes`` greedy episodes (the policy's mode: argmax over actions),
one per environment copy, each copy seeded once from ``seed + 10_000`` and reset
unseeded afterwards, after the first update (batch of collection and its updates)
that takes the run's env steps to a multiple of ``interval`` or past it. The
seconds reported are those of the training loop only (from the call that starts
training to the start of the evaluation that reached the threshold) less every
evaluation before it: setup (imports, building networks and environments) and
evaluation are excluded alike.

Candidates:

- ``ours``: ``examples/acer_gym.py`` at its defaults (``env.name`` switched), in the
  project's venv; the bench only sets
  the budget, the protocol, one thread, no progress bar and no mid-run checkpoints.
  Timed from wrappers around the trainer's ``train`` and its ``Evaluation``
  hook's ``evaluate`` (``experiment.make_trainer`` wrapped to put them on the
  trainer the example builds); a run that reached the threshold stops with
  ``trainer.request_stop``.
- ``ours_tuned``: the same with the task family's preset (``PRESETS``:
  ``preset=cartpole`` and ``preset=acrobot``, ``examples/preset/``, tuned by
  ``bench/tune.py``).
- ``sb3_ppo``, ``sb3_a2c``, ``sb3_dqn``: Stable-Baselines3 with rl-baselines3-zoo's tuned
  hyperparameters (``ZOO``, from rl_zoo3 2.9.2's ``hyperparams/ppo.yml``,
  ``a2c.yml`` and ``dqn.yml``), in ``.venv-bench``. A learning-rate or clip schedule runs over the
  zoo's ``n_timesteps``, which also ends a run if it is below the budget.
- ``torchrl_ppo``: TorchRL's own PPO (``ClipPPOLoss``, ``GAE``, ``Collector``, the
  loop of TorchRL's ``sota-implementations/ppo/``) with the zoo's PPO settings of
  ``sb3_ppo`` (TorchRL's sota configs are for MuJoCo and Atari, none for these
  tasks), in the project's venv (TorchRL is its dependency; nothing else is
  needed); see :func:`train_torchrl_ppo` for where it differs from SB3's PPO.
- ``di_acer``: DI-engine 0.5.3's ACER with dizoo's CartPole config
  (``dizoo/classic_control/cartpole/config/cartpole_acer_config.py``), its serial
  off-policy loop (collect ``n_sample`` sequences, push, ``update_per_collect``
  updates); the environment is gymnasium's task through DI-engine's
  ``DingEnvWrapper`` (dizoo's own CartPole env is gym's CartPole-v0). DI-engine has
  no Acrobot ACER config: the CartPole one is used with the observation and action
  sizes changed, nothing else.

Writes ``bench/results/time_to_solve-<UTC stamp>.json`` after every run (commit,
machine, settings, protocol, every run with its evaluations, and per candidate and
task the medians and ranges over the seeds that reached); ``--continue FILE`` adds
the missing runs to an earlier file. ``bench/lunar_lander.py`` reuses its training
loops (``train_ours``, ``train_sb3``, ``train_di_acer``) and evaluation on
LunarLander-v3, and it and ``bench/minatar_peers.py`` run ``train_sb3`` resumable
(``run_dir``: saved every ``save_interval`` env steps, resumed from the latest
save, with a :class:`ResumableRecorder`) for runs longer than a session.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).parents[1]
RUNS = ROOT / "bench" / "runs" / "time_to_solve"
# each invocation runs in a folder of its own: a run directory that holds an earlier
# run is refused (RunDirectoryLock), as it should be
INVOCATION = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")

THRESHOLDS = {"CartPole-v1": 500.0, "Acrobot-v1": -100.0}
CANDIDATES = (
    "ours",
    "ours_tuned",
    "sb3_ppo",
    "sb3_a2c",
    "sb3_dqn",
    "di_acer",
    "torchrl_ppo",
)
# ours_tuned: examples/acer_gym.py with preset=PRESETS[task] (examples/preset/)
PRESETS = {"CartPole-v1": "cartpole", "Acrobot-v1": "acrobot"}
PROTOCOL = {
    # env steps between greedy evaluations; Acrobot's first episodes run 500 steps
    # each, so its evaluations cost more
    "interval": {"CartPole-v1": 1_000, "Acrobot-v1": 2_000},
    "episodes": 10,  # greedy episodes per evaluation, one per environment copy
    "max_steps": 500,  # both tasks' own time limit
}
DEFAULT_BUDGET = 500_000  # env steps per run; not reached after it
LATE = 5  # with --settle: evaluations averaged in late_mean

# rl-baselines3-zoo 2.9.2 (rl_zoo3/hyperparams/ppo.yml and a2c.yml); anything not
# listed is SB3's default. ("linear", x): x times the remaining fraction of
# n_timesteps (the zoo's lin_x); normalize: VecNormalize of observations and rewards.
ZOO = {
    ("sb3_ppo", "CartPole-v1"): {
        "n_envs": 8,
        "n_timesteps": 100_000,
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": ("linear", 1e-3),
        "clip_range": ("linear", 0.2),
    },
    ("sb3_ppo", "Acrobot-v1"): {
        "normalize": True,
        "n_envs": 16,
        "n_timesteps": 1_000_000,
        "n_steps": 256,
        "gae_lambda": 0.94,
        "gamma": 0.99,
        "n_epochs": 4,
        "ent_coef": 0.0,
    },
    ("sb3_a2c", "CartPole-v1"): {
        "n_envs": 8,
        "n_timesteps": 500_000,
        "ent_coef": 0.0,
    },
    ("sb3_a2c", "Acrobot-v1"): {
        "normalize": True,
        "n_envs": 16,
        "n_timesteps": 500_000,
        "ent_coef": 0.0,
    },
}

# rl_zoo3 2.9.2's hyperparams/dqn.yml: one env (SB3's default)
ZOO[("sb3_dqn", "CartPole-v1")] = {
    "n_timesteps": 50_000,
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}
ZOO[("sb3_dqn", "Acrobot-v1")] = {
    "n_timesteps": 100_000,
    "learning_rate": 6.3e-4,
    "batch_size": 128,
    "buffer_size": 50_000,
    "learning_starts": 0,
    "gamma": 0.99,
    "target_update_interval": 250,
    "train_freq": 4,
    "gradient_steps": -1,
    "exploration_fraction": 0.12,
    "exploration_final_eps": 0.1,
    "policy_kwargs": {"net_arch": [256, 256]},
}

# DI-engine's ACER: what dizoo's cartpole_acer_config.py sets (the rest is
# ACERPolicy's default config); for Acrobot only the two sizes differ.
DI_ACER = {
    "collector_env_num": 8,
    "encoder_hidden_size_list": [64, 64],
    "unroll_len": 32,
    "update_per_collect": 4,
    "batch_size": 16,
    "learning_rate_actor": 0.0005,
    "learning_rate_critic": 0.0005,
    "entropy_weight": 0.0,
    "discount_factor": 0.9,
    "trust_region": True,
    "c_clip_ratio": 10,
    "n_sample": 16,
    "replay_buffer_size": 10_000,
}
DI_SIZES = {"CartPole-v1": (4, 2), "Acrobot-v1": (6, 3)}


# -- the worker: one run, in the candidate's venv ------------------------------------


class Recorder:
    """Evaluations of one run with the training loop's clock: ``train_s`` of an
    evaluation is the time since training started, less every evaluation before.
    ``interval`` schedules the evaluations of the peers (ours keeps its trainer's).
    The run stops at the first evaluation at the threshold or, with ``settle``, once
    it has run ``settle`` env steps past it (``late_mean``: the mean of its last
    ``late`` evaluations)."""

    def timer(self):
        """train_s's clock (looked up at each call, so that it can be faked)."""
        return time.perf_counter()

    def __init__(
        self, threshold, interval, budget, max_minutes=None, settle=None, late=LATE
    ):
        self.threshold, self.budget = threshold, budget
        self.settle, self.late = settle, late
        self.max_s = None if max_minutes is None else 60 * max_minutes
        self.start = None
        self.eval_s = 0.0
        self.evals = []
        self.reached = None
        self.interval = interval
        self.next_eval = self.interval

    def begin(self):
        self.start = self.timer()
        self.cpu_start, self.cpu_eval_s = time.process_time(), 0.0

    def due(self, steps):
        return steps >= self.next_eval

    def evaluate(self, steps, fn):
        tick, cpu_tick = self.timer(), time.process_time()
        value = float(fn())
        tock, cpu_tock = self.timer(), time.process_time()
        entry = {
            "env_steps": int(steps),
            "return": value,
            "train_s": tick - self.start - self.eval_s,
            "eval_s": tock - tick,
            # the same on the process's CPU clock: a one-thread run's work, which
            # other load on the machine does not stretch as it does train_s
            "train_cpu_s": cpu_tick - self.cpu_start - self.cpu_eval_s,
        }
        self.eval_s += tock - tick
        self.cpu_eval_s += cpu_tock - cpu_tick
        self.evals.append(entry)
        if self.reached is None and value >= self.threshold:
            self.reached = entry
        self.next_eval = (steps // self.interval + 1) * self.interval
        return value

    def stop_reason(self, steps):
        if self.reached is not None and self.settle is None:
            return "threshold"
        if (
            self.reached is not None
            and steps >= self.reached["env_steps"] + self.settle
        ):
            return "settled"
        if steps >= self.budget:
            return "budget"
        if (
            self.max_s is not None
            and self.evals
            and self.evals[-1]["train_s"] > self.max_s
        ):
            return "time cap"
        return None

    def ran_out(self, steps, evaluate_at):
        """Why a run whose ``total_timesteps`` (the zoo's ``n_timesteps``) ran out
        before the recorder stopped it ended, after one last evaluation at
        ``steps`` (``evaluate_at(steps)``) unless the last one was there."""
        if not self.evals or self.evals[-1]["env_steps"] != steps:
            evaluate_at(steps)
        return self.stop_reason(steps) or "zoo n_timesteps"

    def result(self, steps, stopped):
        reached = self.reached
        eval_before = (
            sum(e["eval_s"] for e in self.evals[: self.evals.index(reached)])
            if reached
            else None
        )
        late = [e["return"] for e in self.evals[-self.late :]]
        late_mean = sum(late) / len(late) if self.settle is not None and late else None
        return {
            "reached": reached is not None,
            "env_steps_to_threshold": reached["env_steps"] if reached else None,
            "train_s_to_threshold": reached["train_s"] if reached else None,
            "train_cpu_s_to_threshold": reached["train_cpu_s"] if reached else None,
            "eval_s_before_threshold": eval_before,
            "eval_s_total": self.eval_s,
            "final_eval": self.evals[-1]["return"] if self.evals else None,
            "final_env_steps": int(steps),
            "stopped": stopped,
            # with settle only (None: the run stopped at the first reach)
            "settle_env_steps": self.settle,
            "late_mean": late_mean,
            "solved_for_good": None
            if late_mean is None
            else bool(reached and late_mean >= self.threshold),
            "evals": self.evals,
        }


def recorder(task, budget, max_minutes, settle=None, late=LATE):
    return Recorder(
        THRESHOLDS[task],
        PROTOCOL["interval"][task],
        budget,
        max_minutes,
        settle=settle,
        late=late,
    )


class ResumableRecorder(Recorder):
    """A :class:`Recorder` that lets the run go on to its budget (reaching the
    threshold does not stop it), whose evaluations and training clock go into each
    checkpoint (``state``) and come back from it (``restore``), so that a run
    resumed in a new process goes on with them (``resumed_at``: where)."""

    def __init__(self, threshold, interval, budget):
        super().__init__(threshold, interval, budget)
        self.train_s_before = 0.0
        self.resumed_at = []

    def stop_reason(self, steps):
        return "budget" if steps >= self.budget else None

    def begin(self):
        super().begin()  # the CPU clock (train_cpu_s) starts over on resume
        # a resumed run's clock goes on from its checkpoint's
        self.start = self.timer() - self.train_s_before - self.eval_s

    def train_s(self):
        return self.timer() - self.start - self.eval_s

    def state(self, steps):
        return {"env_steps": steps, "train_s": self.train_s(), "evals": self.evals}

    def restore(self, state):
        """Goes on from ``state`` (:meth:`state` at a checkpoint): its evaluations
        up to the checkpoint, and its training clock; call before :meth:`begin`."""
        steps = state["env_steps"]
        self.evals = [e for e in state["evals"] if e["env_steps"] <= steps]
        self.eval_s = sum(e["eval_s"] for e in self.evals)
        self.train_s_before = state["train_s"]
        self.reached = next(
            (e for e in self.evals if e["return"] >= self.threshold), None
        )
        self.next_eval = (steps // self.interval + 1) * self.interval
        self.resumed_at.append(steps)

    def result(self, steps, stopped):
        return {**super().result(steps, stopped), "resumed_at": self.resumed_at}


def greedy_return(envs, act, seed, first, max_steps=PROTOCOL["max_steps"]):
    """Mean return of one greedy episode per environment copy, stepped together;
    the copies are seeded on the first call only (as the trainer's evaluator)."""
    import numpy as np

    obs = np.stack(
        [
            env.reset(seed=seed + 10_000 + i if first else None)[0]
            for i, env in enumerate(envs)
        ]
    )
    returns = np.zeros(len(envs))
    done = np.zeros(len(envs), dtype=bool)
    for _ in range(max_steps):
        actions = act(obs)
        for i, env in enumerate(envs):
            if done[i]:
                continue
            obs[i], reward, terminated, truncated, _ = env.step(int(actions[i]))
            returns[i] += reward
            done[i] = terminated or truncated
        if done.all():
            break
    return returns.mean()


def eval_envs(task, episodes=PROTOCOL["episodes"]):
    import gymnasium as gym

    return [gym.make(task) for _ in range(episodes)]


def train_ours(overrides, rec, tree=ROOT, patch=None):
    """Runs ``examples/acer_gym.py`` from ``tree`` with ``overrides`` in this
    process, ``rec`` timing its training loop and recording its evaluations (the
    loop ends after the batch whose evaluation ``rec`` stops at:
    ``trainer.request_stop``); ``patch(trainer)`` may wrap more of the trainer
    the example builds. Returns the torchrl version."""
    import runpy

    tree = Path(tree)
    sys.path.insert(0, str(tree))  # before the venv's editable install of ROOT
    import torchrl

    import torchrl_acer
    from torchrl_acer.training import experiment

    if Path(torchrl_acer.__file__).parents[1] != tree:
        raise RuntimeError(
            f"torchrl_acer came from {torchrl_acer.__file__}, not {tree}"
        )

    make_trainer = experiment.make_trainer

    @functools.wraps(make_trainer)
    def timed_make_trainer(*args, **kwargs):
        trainer = make_trainer(*args, **kwargs)
        train = trainer.train  # the instance's, its hooks' wrappers included
        evaluation = trainer.evaluation  # the Evaluation hook
        evaluate = evaluation.evaluate

        def timed_train():
            rec.begin()
            return train()

        def timed_evaluate():
            result = {}

            def once():
                result.update(evaluate())
                return result["reward"]

            frames = trainer.collected_frames
            rec.evaluate(frames, once)
            reason = rec.stop_reason(frames)
            if reason:  # the loop ends after this batch, with a checkpoint
                trainer.request_stop(f"time_to_solve: {reason}")
            return result

        trainer.train, evaluation.evaluate = timed_train, timed_evaluate
        if patch is not None:
            patch(trainer)
        return trainer

    experiment.make_trainer = timed_make_trainer
    sys.path.insert(0, str(tree / "examples"))
    sys.argv = [str(tree / "examples" / "acer_gym.py"), *overrides]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as err:  # hydra's exit after main returns
        if err.code not in (None, 0):
            raise
    finally:
        experiment.make_trainer = make_trainer
    return torchrl.__version__


def run_ours(
    task,
    seed,
    budget,
    max_minutes,
    run_dir,
    tree=ROOT,
    preset=None,
    settle=None,
    patch=None,
):
    rec = recorder(task, budget, max_minutes, settle)
    overrides = [
        *([] if preset is None else [f"preset={preset}"]),
        f"env.name={task}",
        f"seed={seed}",
        "threads=1",
        f"collector.total_frames={budget}",
        f"eval.interval={PROTOCOL['interval'][task]}",
        f"eval.episodes={PROTOCOL['episodes']}",
        f"eval.max_steps={PROTOCOL['max_steps']}",
        "logger.progress_bar=false",
        f"logger.run_dir={run_dir}",
        "checkpoint.every_minutes=null",
    ]
    torchrl_version = train_ours(overrides, rec, tree, patch)
    # the trainer evaluates last at the steps it stopped at
    frames = rec.evals[-1]["env_steps"] if rec.evals else 0
    out = rec.result(frames, rec.stop_reason(frames) or "budget")
    out["settings"] = {"overrides": overrides, "tree": str(tree)}
    out["versions"] = {"torchrl": torchrl_version}
    return out


def _schedule(value):
    if isinstance(value, tuple):
        _, start = value
        return lambda remaining: remaining * start
    return value


def latest_checkpoint(run_dir):
    """``latest.json`` of ``run_dir`` (``env_steps``, ``dir``, the recorder's
    state), ``None`` before its first save."""
    path = Path(run_dir) / "latest.json"
    return json.loads(path.read_text()) if path.exists() else None


def save_checkpoint(run_dir, model, state):
    """Saves ``model`` (and a DQN's replay) into ``checkpoint-<steps>/``, then points
    ``latest.json`` at it (replaced atomically: a save cut short leaves the previous
    one in place), then deletes the older ones."""
    name = f"checkpoint-{state['env_steps']}"
    folder = run_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    model.save(folder / "model.zip")
    if hasattr(model, "replay_buffer"):
        model.save_replay_buffer(folder / "replay.pkl")
    tmp = run_dir / "latest.tmp"
    tmp.write_text(json.dumps({**state, "dir": name}) + "\n")
    os.replace(tmp, run_dir / "latest.json")
    for old in run_dir.glob("checkpoint-*"):
        if old.name != name:
            shutil.rmtree(old)


def tidy(run_dir):
    """Deletes a finished run's checkpoints (a DQN's replay can be 100 MB), its
    record and final model kept."""
    for old in run_dir.glob("checkpoint-*"):
        shutil.rmtree(old)
    (run_dir / "latest.json").unlink(missing_ok=True)


def train_sb3(
    algo,
    task,
    hp,
    seed,
    rec,
    total_timesteps,
    episodes=PROTOCOL["episodes"],
    max_steps=PROTOCOL["max_steps"],
    run_dir=None,
    save_interval=None,
):
    """Stable-Baselines3's ``algo`` (``sb3_ppo``, ``sb3_a2c`` or ``sb3_dqn``) with
    the zoo's hyperparameters ``hp`` (as in ``ZOO``) on ``task`` in this process
    for ``total_timesteps`` (which its schedules run over), ``rec`` timing it and
    evaluating the greedy policy on ``episodes`` environment copies (seeded at their
    first use in this process) at the start of each rollout that is due, and once
    more at the end. Returns the env steps, why the run stopped, the algorithm's
    class name and SB3's version.

    With ``run_dir`` and ``save_interval`` (and a :class:`ResumableRecorder`) the
    run is resumable: at the first rollout start at or past each multiple of
    ``save_interval`` env steps it saves its model, a DQN's replay and ``rec``'s
    state (:func:`save_checkpoint`), and it starts from the latest save if there is
    one (``load``, then ``learn`` with ``reset_num_timesteps=False`` up to
    ``total_timesteps``, on fresh episodes seeded ``seed + steps``: the episodes in
    progress and the RNG states are not saved, so a resumed run is not bit for bit
    the one that was stopped); the final model goes to ``run_dir/model.zip``."""
    import stable_baselines3
    from stable_baselines3 import A2C, DQN, PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    if (run_dir is None) != (save_interval is None):
        raise ValueError(
            f"train_sb3: run_dir={run_dir} and save_interval={save_interval}: "
            "give both (a resumable run) or neither"
        )
    hp = dict(hp)
    hp.pop("n_timesteps", None)  # the caller's total_timesteps governs
    n_envs = hp.pop("n_envs", 1)
    normalize = hp.pop("normalize", False)
    if normalize and run_dir is not None:
        raise ValueError(
            f"train_sb3: hp of {algo} on {task} has normalize=True, and the "
            "checkpoints do not keep VecNormalize's statistics: pass run_dir=None"
        )
    kwargs = {key: _schedule(value) for key, value in hp.items()}
    cls = {"sb3_ppo": PPO, "sb3_a2c": A2C, "sb3_dqn": DQN}[algo]
    latest = None if run_dir is None else latest_checkpoint(run_dir)
    if latest is None:
        env = make_vec_env(task, n_envs=n_envs, seed=seed)
        if normalize:
            env = VecNormalize(env, gamma=hp.get("gamma", 0.99))
        model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    else:
        steps = latest["env_steps"]
        # fresh episodes (the ones in progress were not saved), seeded apart
        env = make_vec_env(task, n_envs=n_envs, seed=seed + steps)
        folder = run_dir / latest["dir"]
        model = cls.load(folder / "model.zip", env=env, device="cpu")
        if model.num_timesteps != steps:
            raise RuntimeError(
                f"{folder / 'model.zip'} holds {model.num_timesteps} env steps, "
                f"latest.json says {steps}: delete {run_dir} to run this seed again"
            )
        if hasattr(model, "replay_buffer"):
            model.load_replay_buffer(folder / "replay.pkl")
        model.set_random_seed(seed + steps)
        model._last_obs = None  # learn() resets the new envs
        rec.restore(latest["recorder"])
        replay = getattr(model, "replay_buffer", None)
        print(
            f"resumed at {steps} env steps"
            + (f", {replay.size()} transitions in replay" if replay else ""),
            flush=True,
        )
    envs = eval_envs(task, episodes)
    seeded = []  # the evaluation copies are seeded at their first use only

    def act(obs):
        norm = model.get_vec_normalize_env()
        if norm is not None:  # the training statistics, frozen
            obs = norm.normalize_obs(obs)
        return model.predict(obs, deterministic=True)[0]

    def evaluate():
        first = not seeded
        seeded.append(True)
        return greedy_return(envs, act, seed, first, max_steps)

    def evaluate_at(steps):
        value = rec.evaluate(steps, evaluate)
        print(
            f"{steps} env steps: greedy return {value:.2f}, "
            f"train {rec.evals[-1]['train_s']:.0f} s",
            flush=True,
        )

    class Progress(BaseCallback):
        """Evaluates and saves at the start of a rollout: after the previous one's
        update."""

        stop = None
        # the first multiple of save_interval past the start (None: no saves)
        next_save = (
            None
            if save_interval is None
            else (model.num_timesteps // save_interval + 1) * save_interval
        )

        def _on_training_start(self):
            rec.begin()

        def _on_rollout_start(self):
            steps = self.model.num_timesteps
            if rec.due(steps) or steps >= rec.budget:
                evaluate_at(steps)
            self.stop = rec.stop_reason(steps)
            if self.next_save is not None and steps >= self.next_save:
                tick = rec.timer()
                state = {"env_steps": steps, "recorder": rec.state(steps)}
                save_checkpoint(run_dir, self.model, state)
                rec.start += rec.timer() - tick  # not training time
                print(f"saved at {steps} env steps", flush=True)
                self.next_save = (steps // save_interval + 1) * save_interval

        def _on_step(self):
            return self.stop is None

    progress = Progress()
    model.learn(
        total_timesteps=total_timesteps - model.num_timesteps,
        callback=progress,
        reset_num_timesteps=latest is None,
    )
    steps = model.num_timesteps
    stop = progress.stop
    if stop is None:
        stop = rec.ran_out(steps, evaluate_at)
    if run_dir is not None:  # the checkpoints go once the record is kept (tidy)
        model.save(run_dir / "model.zip")
    return steps, stop, cls.__name__, stable_baselines3.__version__


def run_sb3(algo, task, seed, budget, max_minutes, run_dir, settle=None):
    hp = ZOO[(algo, task)]
    rec = recorder(task, budget, max_minutes, settle)
    # the zoo's n_timesteps ends a run below the budget, as in the zoo
    steps, stop, name, version = train_sb3(algo, task, hp, seed, rec, hp["n_timesteps"])
    out = rec.result(steps, stop)
    out["settings"] = {
        "algo": name,
        "zoo": hp,
        "source": f"rl_zoo3 2.9.2 hyperparams/{name.lower()}.yml, {task}",
    }
    out["versions"] = {"stable_baselines3": version}
    return out


# Stable-Baselines3 2.9's PPO defaults, for what the zoo's entries leave out:
# torchrl_ppo takes the zoo's PPO settings (ZOO's sb3_ppo entries) over these, as
# SB3 does
SB3_PPO_DEFAULTS = {
    "n_envs": 1,
    "learning_rate": 3e-4,
    "n_steps": 2048,
    "batch_size": 64,
    "n_epochs": 10,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_range": 0.2,
    "ent_coef": 0.0,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "normalize": False,
}


def train_torchrl_ppo(
    task,
    hp,
    seed,
    rec,
    total_timesteps,
    episodes=PROTOCOL["episodes"],
    max_steps=PROTOCOL["max_steps"],
):
    """TorchRL's own PPO on ``task`` with the zoo's PPO hyperparameters ``hp`` (as
    ``ZOO``'s ``sb3_ppo`` entries, over :data:`SB3_PPO_DEFAULTS`), in this process,
    ``rec`` timing it and evaluating the greedy policy as :func:`train_sb3` does.

    The loop of TorchRL's ``sota-implementations/ppo/``: a ``Collector`` batch of
    ``n_envs x n_steps`` env steps (a gymnasium ``SyncVectorEnv`` under
    ``GymWrapper``, in this process as SB3's ``DummyVecEnv``), then for each epoch
    ``GAE`` on the whole batch and minibatches of it without replacement through
    ``ClipPPOLoss`` (normalized advantages, an L2 critic loss weighted ``vf_coef``),
    Adam with eps 1e-5, the gradient's norm clipped at ``max_grad_norm`` (SB3's).
    The policy and the value are tanh ``[64, 64]`` MLPs (SB3's ``MlpPolicy``) with
    TorchRL's default initialization, as its discrete-action (Atari) PPO has (with
    the MuJoCo script's orthogonal weights of gain 1, Acrobot-v1's greedy return
    stayed at -500 for 60k env steps, seed 0). A ``("linear", x)`` learning rate or
    clip range is ``x`` times the fraction of ``total_timesteps`` left after each
    batch (SB3's schedule). ``normalize`` normalizes the observations with
    TorchRL's ``VecNorm`` (statistics over every copy), as TorchRL's PPO scripts
    do; SB3's ``VecNormalize`` also scales the rewards by the running std of the
    discounted return, which no TorchRL transform does, and ``VecNorm`` on the
    rewards too (standardized, not scaled) left Acrobot-v1 at -394 after 60k env
    steps (seed 0), so the rewards stay as they are. Returns the env steps, why the
    run stopped, and TorchRL's version."""
    import gymnasium as gym
    import torch
    import torchrl
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
    from torchrl.envs import GymWrapper, VecNorm
    from torchrl.modules import (
        MLP,
        OneHotCategorical,
        ProbabilisticActor,
        ValueOperator,
    )
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    hp = {**SB3_PPO_DEFAULTS, **hp}
    torch.manual_seed(seed)
    n_envs = hp["n_envs"]
    env = GymWrapper(
        gym.vector.SyncVectorEnv(
            [lambda: gym.make(task)] * n_envs,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
    )
    vecnorm = None
    if hp["normalize"]:
        vecnorm = VecNorm(in_keys=["observation"], new_api=True, reduce_batch_dims=True)
        env = env.append_transform(vecnorm)
    env.set_seed(seed)
    obs_dim = env.observation_spec["observation"].shape[-1]
    spec = env.full_action_spec_unbatched

    def mlp(out):
        return MLP(
            in_features=obs_dim,
            out_features=out,
            num_cells=[64, 64],
            activation_class=torch.nn.Tanh,
        )

    policy = mlp(spec["action"].space.n)
    actor = ProbabilisticActor(
        TensorDictModule(policy, ["observation"], ["logits"]),
        in_keys=["logits"],
        spec=spec,
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    critic = ValueOperator(mlp(1), in_keys=["observation"])
    frames = n_envs * hp["n_steps"]
    collector = Collector(
        env,
        actor,
        frames_per_batch=frames,
        total_frames=-1,
        auto_register_policy_transforms=False,  # feed-forward: no InitTracker
    )
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(frames),
        sampler=SamplerWithoutReplacement(),
        batch_size=hp["batch_size"],
    )
    gae = GAE(
        gamma=hp["gamma"],
        lmbda=hp["gae_lambda"],
        value_network=critic,
        average_gae=False,
    )
    lr, clip = (_schedule(hp[k]) for k in ("learning_rate", "clip_range"))
    loss = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=clip(1.0) if callable(clip) else clip,
        entropy_coeff=hp["ent_coef"],
        critic_coeff=hp["vf_coef"],
        loss_critic_type="l2",
        normalize_advantage=True,
    )
    optim = torch.optim.Adam(
        loss.parameters(), lr=lr(1.0) if callable(lr) else lr, eps=1e-5
    )
    envs = eval_envs(task, episodes)

    @torch.no_grad()
    def act(obs):
        x = torch.as_tensor(obs, dtype=torch.float32)
        if vecnorm is not None:  # the training statistics as they are
            x = (x - vecnorm.loc["observation"]) / vecnorm.scale["observation"]
        return policy(x).argmax(-1).numpy()

    def evaluate():
        return greedy_return(envs, act, seed, not rec.evals, max_steps)

    rec.begin()
    steps, stop = 0, None
    for data in collector:
        steps += data.numel()
        remaining = max(0.0, 1.0 - steps / total_timesteps)
        if callable(lr):
            for group in optim.param_groups:
                group["lr"] = lr(remaining)
        if callable(clip):
            loss.clip_epsilon.copy_(clip(remaining))
        for _ in range(hp["n_epochs"]):
            with torch.no_grad():
                data = gae(data)
            buffer.extend(data.reshape(-1))
            for batch in buffer:
                out = loss(batch)
                total = sum(v for k, v in out.items() if k.startswith("loss_"))
                optim.zero_grad()
                total.backward()
                torch.nn.utils.clip_grad_norm_(loss.parameters(), hp["max_grad_norm"])
                optim.step()
        if rec.due(steps) or steps >= rec.budget:
            rec.evaluate(steps, evaluate)
        stop = rec.stop_reason(steps)
        if stop is not None or steps >= total_timesteps:
            break
    collector.shutdown()
    if stop is None:
        stop = rec.ran_out(steps, lambda steps: rec.evaluate(steps, evaluate))
    return steps, stop, torchrl.__version__


def run_torchrl_ppo(task, seed, budget, max_minutes, run_dir, settle=None):
    hp = ZOO[("sb3_ppo", task)]
    rec = recorder(task, budget, max_minutes, settle)
    # the zoo's n_timesteps ends a run below the budget, as sb3_ppo's
    steps, stop, version = train_torchrl_ppo(task, hp, seed, rec, hp["n_timesteps"])
    out = rec.result(steps, stop)
    out["settings"] = {
        "algo": "ClipPPOLoss + GAE (TorchRL)",
        "zoo": hp,
        "defaults": SB3_PPO_DEFAULTS,
        "source": f"rl_zoo3 2.9.2 hyperparams/ppo.yml, {task}, over SB3 2.9's PPO "
        "defaults; the loop of TorchRL's sota-implementations/ppo/ppo_mujoco.py",
    }
    out["versions"] = {"torchrl": version}
    return out


def train_di_acer(
    config,
    create_config,
    task,
    seed,
    rec,
    episodes=PROTOCOL["episodes"],
    max_steps=PROTOCOL["max_steps"],
):
    """DI-engine's serial off-policy loop (collect ``n_sample`` sequences, push,
    ``update_per_collect`` updates) with a dizoo ``config`` (:func:`di_config`'s
    copy) on gymnasium's ``task`` through DI-engine's ``DingEnvWrapper``, in this
    process, ``rec`` timing it and evaluating the greedy policy on ``episodes``
    environment copies. Returns the env steps collected, why the loop stopped and
    the config it ran with (dizoo's settings over the policy's defaults)."""
    from functools import partial

    import gymnasium as gym
    import numpy as np
    import torch
    from ding.config import compile_config
    from ding.envs import BaseEnvManager, DingEnvWrapper
    from ding.policy import create_policy
    from ding.utils import set_pkg_seed
    from ding.worker import BaseLearner, create_buffer, create_serial_collector

    cfg = compile_config(
        config, seed=seed, auto=True, create_cfg=create_config, save_cfg=False
    )

    def make(_=None):
        return DingEnvWrapper(gym.make(task))

    n = cfg.env.collector_env_num
    collector_env = BaseEnvManager([partial(make) for _ in range(n)], cfg.env.manager)
    collector_env.seed(seed, dynamic_seed=True)
    set_pkg_seed(seed, use_cuda=False)
    torch.set_num_threads(1)
    policy = create_policy(cfg.policy, enable_field=["learn", "collect", "eval"])
    learner = BaseLearner(
        cfg.policy.learn.learner, policy.learn_mode, None, exp_name=cfg.exp_name
    )
    collector = create_serial_collector(
        cfg.policy.collect.collector,
        env=collector_env,
        policy=policy.collect_mode,
        tb_logger=None,
        exp_name=cfg.exp_name,
    )
    buffer = create_buffer(
        cfg.policy.other.replay_buffer, tb_logger=None, exp_name=cfg.exp_name
    )
    envs = eval_envs(task, episodes)

    def act(obs):
        out = policy.eval_mode.forward(
            {i: torch.as_tensor(o, dtype=torch.float32) for i, o in enumerate(obs)}
        )
        return np.array([int(out[i]["action"]) for i in range(len(obs))])

    def evaluate():
        return greedy_return(envs, act, seed, not rec.evals, max_steps)

    learner.call_hook("before_run")
    rec.begin()
    stop = None
    while stop is None:
        data = collector.collect(train_iter=learner.train_iter)
        buffer.push(data, cur_collector_envstep=collector.envstep)
        for _ in range(cfg.policy.learn.update_per_collect):
            batch = buffer.sample(cfg.policy.learn.batch_size, learner.train_iter)
            if batch is None:
                break
            learner.train(batch, collector.envstep)
        steps = collector.envstep
        if rec.due(steps) or steps >= rec.budget:
            rec.evaluate(steps, evaluate)
        stop = rec.stop_reason(steps)
    collector_env.close()
    return collector.envstep, stop, cfg


def run_di_acer(task, seed, budget, max_minutes, run_dir, settle=None):
    import ding
    from dizoo.classic_control.cartpole.config.cartpole_acer_config import (
        create_config,
        main_config,
    )

    config = di_config(main_config, run_dir)
    config.policy.model.obs_shape, config.policy.model.action_shape = DI_SIZES[task]
    # the bench's protocol replaces dizoo's evaluator; this only names the task
    config.env.stop_value = THRESHOLDS[task]
    rec = recorder(task, budget, max_minutes, settle)
    steps, stop, _ = train_di_acer(config, create_config, task, seed, rec)
    out = rec.result(steps, stop)
    out["settings"] = {
        "config": DI_ACER,
        "obs_and_action_sizes": DI_SIZES[task],
        "source": "DI-engine 0.5.3 dizoo/classic_control/cartpole/config/"
        "cartpole_acer_config.py"
        + ("" if task == "CartPole-v1" else ", sizes changed for Acrobot-v1"),
    }
    out["versions"] = {"di_engine": ding.__version__}
    return out


def di_config(config, run_dir):
    """A deep copy of dizoo's ``config`` (an EasyDict) that writes to ``run_dir``."""
    from easydict import EasyDict

    config = EasyDict(json.loads(json.dumps(config)))
    # DI-engine prefixes "./" to it: relative to the working directory (ROOT)
    config.exp_name = os.path.relpath(run_dir, ROOT)
    return config


def add_run_arguments(parser, candidates, ours_commit):
    """The driver's options for which runs to make and where ours' code and the
    peers' venv are; ``ours_commit`` ends the help of ``--ours-commit``."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--candidates", nargs="+", default=list(candidates), choices=candidates
    )
    parser.add_argument("--order-seed", type=int, default=0, help="seeds the shuffle")
    parser.add_argument(
        "--ours-commit",
        default=None,
        metavar="REV",
        help="run ours from this commit (git archive into bench/runs/time_to_solve/), "
        + ours_commit,
    )
    parser.add_argument("--bench-venv", default=str(ROOT / ".venv-bench"))


def add_worker_arguments(parser, candidates):
    """The arguments :func:`run_one` gives a worker, hidden from ``--help``."""
    hidden = argparse.SUPPRESS
    parser.add_argument("--worker", default=None, choices=candidates, help=hidden)
    parser.add_argument("--task", help=hidden)
    parser.add_argument("--seed", type=int, help=hidden)
    parser.add_argument("--run-dir", help=hidden)
    parser.add_argument("--out", help=hidden)
    parser.add_argument("--ours-tree", default=None, help=hidden)


def worker(args, runners):
    """One run in this process, the driver's child in the candidate's venv:
    ``runners[candidate](task, seed, budget, max_minutes, run_dir)`` (ours with
    ``tree=``), its result and the versions written to ``args.out``."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    runner = runners[args.worker]
    if args.worker.startswith("ours"):
        runner = functools.partial(runner, tree=args.ours_tree or ROOT)
    out = runner(args.task, args.seed, args.budget, args.max_minutes, run_dir)
    import gymnasium

    out["versions"].update(
        {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "gymnasium": gymnasium.__version__,
            "numpy": np.__version__,
            "torch_threads": torch.get_num_threads(),
        }
    )
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


# -- the driver: every run, interleaved, one at a time ---------------------------------


def python_for(candidate, bench_venv):
    # TorchRL's PPO needs nothing but TorchRL, the project's own dependency
    if candidate.startswith("ours") or candidate == "torchrl_ppo":
        return sys.executable
    python = Path(bench_venv) / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run bash bench/peers_setup.sh first")
    return str(python)


def run_one(candidate, task, seed, args, script=__file__, run_dir=None):
    """Runs ``script --worker candidate`` for one seed in a process of its own
    (``run_dir/log.txt`` has its output, each attempt's appended); its record."""
    run_dir = run_dir or RUNS / INVOCATION / f"{candidate}-{task}-seed{seed}"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "PYTHONHASHSEED": str(seed),
    }
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [
        python_for(candidate, args.bench_venv),
        str(Path(script).resolve()),
        "--worker",
        candidate,
        "--task",
        task,
        "--seed",
        str(seed),
        "--budget",
        str(args.budget[task]),
        "--run-dir",
        str(run_dir),
        "--out",
        str(out),
    ]
    if args.max_minutes is not None:
        cmd += ["--max-minutes", str(args.max_minutes)]
    if getattr(args, "settle", None) is not None:
        cmd += ["--settle", str(args.settle)]
    if candidate.startswith("ours") and args.ours_tree:
        cmd += ["--ours-tree", str(args.ours_tree)]
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with open(run_dir / "log.txt", "a") as log:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"-- {stamp}: {' '.join(cmd)}", file=log, flush=True)
        proc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
    record = {
        "candidate": candidate,
        "task": task,
        "seed": seed,
        "budget": args.budget[task],
        "returncode": proc.returncode,
        "process_wall_s": time.time() - start,
    }
    if proc.returncode == 0:
        record.update(json.loads(out.read_text()))
    else:
        record["error"] = f"failed: see {run_dir / 'log.txt'}"
    out.unlink(missing_ok=True)
    return record


def pinned(run_dir) -> dict:
    """The settings of ``run_dir``'s runs directory (``settings.json``, written by
    :func:`pin_settings`)."""
    return json.loads((Path(run_dir).parent / "settings.json").read_text())


def pin_settings(runs_dir, settings: dict, earlier: dict | None) -> dict:
    """Writes ``settings`` to ``runs_dir``'s ``settings.json``, whose every entry an
    earlier invocation's (``earlier``, or a restored result's) must equal: a runs
    directory holds one setting."""
    earlier = settings if earlier is None else earlier
    diff = {k: (earlier.get(k), v) for k, v in settings.items() if earlier.get(k) != v}
    if diff:
        raise SystemExit(
            f"{runs_dir} holds runs of another setting ((there, here): {diff}); "
            "pass the same settings, or another --runs-dir"
        )
    runs_dir.mkdir(parents=True, exist_ok=True)
    (runs_dir / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")
    return settings


def add_continue_argument(parser):
    """``--continue JSON`` of the resumable benches (:func:`restore_runs`)."""
    parser.add_argument(
        "--continue",
        dest="resume",
        type=Path,
        metavar="JSON",
        help="a committed result of these settings: its finished runs are restored "
        "into the (empty) --runs-dir and kept, the missing ones run",
    )


def restore_runs(result: Path, runs_dir: Path, folder) -> None:
    """A committed result's finished runs back in an empty ``runs_dir``, so that
    a fresh checkout (run directories are not committed) goes on with the runs it
    lacks: the result's settings as ``settings.json`` (which :func:`pin_settings`
    then holds the invocation to), each run as ``runs_dir / folder(run) /
    record.json``."""
    if runs_dir.exists() and any(runs_dir.iterdir()):
        raise SystemExit(
            f"--continue: {runs_dir} already holds runs; continue there without "
            "--continue, or pass another --runs-dir"
        )
    payload = json.loads(Path(result).read_text())
    runs_dir.mkdir(parents=True)
    settings = json.dumps(payload["settings"], indent=1)
    (runs_dir / "settings.json").write_text(settings + "\n")
    for run in payload["runs"]:
        run_dir = runs_dir / folder(run)
        run_dir.mkdir()
        (run_dir / "record.json").write_text(json.dumps(run, indent=1) + "\n")
    print(f"restored {len(payload['runs'])} finished runs from {result}", flush=True)


def stats(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return {"median": median, "min": values[0], "max": values[-1], "n": len(values)}


def summary(runs):
    out = {}
    for run in runs:
        key = f"{run['candidate']} {run['task']}"
        out.setdefault(
            key, {"candidate": run["candidate"], "task": run["task"], "runs": []}
        )
        out[key]["runs"].append(run)
    for group in out.values():
        every = group.pop("runs")
        done = [r for r in every if r["returncode"] == 0]
        group["seeds"] = len(done)
        group["reached"] = sum(r["reached"] for r in done)
        group["env_steps_to_threshold"] = stats(
            [r["env_steps_to_threshold"] for r in done]
        )
        group["train_s_to_threshold"] = stats([r["train_s_to_threshold"] for r in done])
        # absent from runs recorded before the CPU clock was
        group["train_cpu_s_to_threshold"] = stats(
            [r.get("train_cpu_s_to_threshold") for r in done]
        )
        group["final_eval"] = stats([r["final_eval"] for r in done])
        settled = [r for r in done if r.get("late_mean") is not None]
        # None where the runs stopped at the first reach (no --settle)
        group["solved_for_good"] = (
            sum(r["solved_for_good"] for r in settled) if settled else None
        )
        group["late_mean"] = stats([r["late_mean"] for r in settled])
        group["failed"] = len(every) - len(done)
    return list(out.values())


def export_commit(rev):
    """A clean copy of commit ``rev`` (its full hash and the copy's path)."""
    sha = subprocess.run(
        ["git", "rev-parse", rev], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    tree = RUNS / f"tree-{sha[:12]}"
    if not (tree / "examples" / "acer_gym.py").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", sha], capture_output=True, check=True, cwd=ROOT
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return sha, tree


def machine_info():
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import git_commit, machine

    return git_commit(), machine()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks", nargs="+", default=list(THRESHOLDS), choices=list(THRESHOLDS)
    )
    add_run_arguments(
        parser,
        CANDIDATES,
        ours_commit="not from the working tree, which others may be editing meanwhile",
    )
    parser.add_argument(
        "--budget",
        type=int,
        default=DEFAULT_BUDGET,
        help="env steps per run (every task); not reached after it",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="also stop a run (not reached) once its training loop has taken this long",
    )
    parser.add_argument(
        "--settle",
        type=int,
        default=None,
        metavar="N",
        help="after the first evaluation at the threshold go on for N env steps (or "
        "to the budget) and record late_mean and solved_for_good; default: stop there",
    )
    parser.add_argument(
        "--continue",
        dest="resume",
        default=None,
        metavar="JSON",
        help="an earlier result: its runs are kept, the missing ones run and the "
        "file is rewritten",
    )
    add_worker_arguments(parser, CANDIDATES)
    args = parser.parse_args()
    if args.worker:
        settle = {"settle": args.settle}
        return worker(
            args,
            {
                "ours": functools.partial(run_ours, **settle),
                "ours_tuned": functools.partial(
                    run_ours, preset=PRESETS[args.task], **settle
                ),
                "sb3_ppo": functools.partial(run_sb3, "sb3_ppo", **settle),
                "sb3_a2c": functools.partial(run_sb3, "sb3_a2c", **settle),
                "sb3_dqn": functools.partial(run_sb3, "sb3_dqn", **settle),
                "di_acer": functools.partial(run_di_acer, **settle),
                "torchrl_ppo": functools.partial(run_torchrl_ppo, **settle),
            },
        )

    budget = args.budget
    args.budget = {task: budget for task in args.tasks}
    ours_commit = None
    has_ours = any(c.startswith("ours") for c in args.candidates)
    if args.ours_commit and has_ours:
        ours_commit, args.ours_tree = export_commit(args.ours_commit)
    if args.resume:
        path = Path(args.resume)
        payload = json.loads(path.read_text())
        runs = [r for r in payload["runs"] if r["returncode"] == 0]
    else:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = ROOT / "bench" / "results" / f"time_to_solve-{stamp}.json"
        runs = []
        payload = {"benchmark": "time_to_solve", "date": stamp}
    commit, info = machine_info()
    ours_code = (
        f"commit {ours_commit} (a clean copy)"
        if ours_commit
        else f"working tree at {commit}"
    )
    if payload.get("ours_code", ours_code) != ours_code and has_ours:
        raise SystemExit(
            f"--continue: the file's runs of ours are of {payload['ours_code']}, these "
            f"would be of {ours_code} (--ours-commit)"
        )
    if "command" in payload:  # a file written before commands were kept
        payload["commands"] = [payload.pop("command")]
    payload.update(
        {
            "commit": commit,
            # every invocation that added runs to this file (--continue)
            "commands": [
                *payload.get("commands", []),
                " ".join([Path(sys.executable).name, *sys.argv]),
            ],
            "machine": info,
            "ours_code": ours_code,
            "settings": {
                "thresholds": THRESHOLDS,
                "budget_env_steps": {
                    **payload.get("settings", {}).get("budget_env_steps", {}),
                    **args.budget,
                },
                "max_minutes": args.max_minutes,
                # per invocation of the file's commands (each run also has its own)
                "settle_env_steps": [
                    *payload.get("settings", {}).get("settle_env_steps", []),
                    args.settle,
                ],
                "late": LATE,
                "ours_tuned_presets": PRESETS,
                "protocol": {
                    **PROTOCOL,
                    "text": "greedy (argmax) evaluation: mean return of "
                    f"{PROTOCOL['episodes']} episodes, one per environment copy "
                    "(seeded once from seed + 10000), after the first update that "
                    "takes the env steps to a multiple of the task's interval or "
                    "past it (ours, on its trainer's schedule, also after its first "
                    "batch); train seconds: the training loop's time to the start of "
                    "the evaluation that reached the threshold, less every evaluation "
                    "before it; setup excluded",
                },
                "threads": "torch.set_num_threads(1), OMP/MKL/OPENBLAS_NUM_THREADS=1, "
                "one run at a time",
                "order": "round-robin over seeds; in each round every candidate once, "
                f"in an order shuffled by random.Random({args.order_seed})",
                "zoo": {f"{a} {t}": hp for (a, t), hp in ZOO.items()},
                "zoo_source": "rl_zoo3 2.9.2 (rl-baselines3-zoo), rl_zoo3/hyperparams/"
                "ppo.yml, a2c.yml and dqn.yml",
                "di_acer": DI_ACER,
                "di_acer_source": "DI-engine 0.5.3, dizoo/classic_control/cartpole/"
                "config/cartpole_acer_config.py; Acrobot-v1: the same with obs_shape 6, "
                "action_shape 3 (DI-engine has no Acrobot ACER config)",
            },
        }
    )
    done = {(r["candidate"], r["task"], r["seed"]) for r in runs}
    order = random.Random(args.order_seed)
    plan = []
    for task in args.tasks:
        for seed in args.seeds:
            candidates = list(args.candidates)
            order.shuffle(candidates)
            plan += [(c, task, seed) for c in candidates if (c, task, seed) not in done]
    path.parent.mkdir(parents=True, exist_ok=True)
    for i, (candidate, task, seed) in enumerate(plan):
        print(f"[{i + 1}/{len(plan)}] {candidate} {task} seed {seed}", flush=True)
        run = run_one(candidate, task, seed, args)
        runs.append(run)
        if run["returncode"] == 0:
            steps, secs = run["env_steps_to_threshold"], run["train_s_to_threshold"]
            reached = (
                f"reached at {steps} env steps, {secs:.1f} s"
                if run["reached"]
                else "not reached"
            )
            print(
                f"    {reached} (stopped: {run['stopped']}, final eval "
                f"{run['final_eval']:.1f}, {run['process_wall_s']:.0f} s in all)",
                flush=True,
            )
        else:
            print(f"    {run['error']}", flush=True)
        write(path, payload, runs)
    write(path, payload, runs)
    print(f"saved {path}")


def write(path, payload, runs):
    payload["runs"] = runs
    payload["summary"] = summary(runs)
    path.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
