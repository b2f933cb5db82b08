"""Small networks, batches and losses the tests build on.

``tools/upstream_patch.py`` gathers what ``tests/upstream/`` imports from here (and
what that uses) into the one helper module the upstream copies of those tests import.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import distributions as D
from torch import nn
from torch.overrides import TorchFunctionMode
from torchrl.modules import (
    MLP,
    ActorValueOperator,
    IndependentNormal,
    OneHotCategorical,
    ProbabilisticActor,
)
from torchrl.objectives import SoftUpdate

from torchrl_acer import ACERLoss, retrace_lambda_return_estimate
from torchrl_acer.modules import PlainQCritic, StochasticDuelingNetwork


def discrete_actor_critic(
    obs_dim=3,
    num_actions=4,
    *,
    one_hot=False,
    shared=False,
    dtype=torch.float64,
    seed=0,
):
    """A categorical actor and a Q critic, as TorchRL modules.

    With ``shared=True`` they come from an ``ActorValueOperator`` and share a trunk.
    """
    torch.manual_seed(seed)
    dist = OneHotCategorical if one_hot else D.Categorical
    if shared:
        trunk = TensorDictModule(
            nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh()), ["observation"], ["hidden"]
        )
        policy_head = ProbabilisticActor(
            TensorDictModule(nn.Linear(8, num_actions), ["hidden"], ["logits"]),
            in_keys=["logits"],
            distribution_class=dist,
            return_log_prob=True,
        )
        q_head = TensorDictModule(
            nn.Linear(8, num_actions), ["hidden"], ["action_value"]
        )
        op = ActorValueOperator(trunk, policy_head, q_head).to(dtype)
        return op.get_policy_operator(), op.get_value_operator()
    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), nn.Linear(8, num_actions)),
            ["observation"],
            ["logits"],
        ),
        in_keys=["logits"],
        distribution_class=dist,
        return_log_prob=True,
    ).to(dtype)
    critic = TensorDictModule(
        nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), nn.Linear(8, num_actions)),
        ["observation"],
        ["action_value"],
    ).to(dtype)
    return actor, critic


def random_batch(
    B,
    T,
    *,
    obs_dim=3,
    num_actions=4,
    one_hot=False,
    dones=(),
    terminations=(),
    dtype=torch.float64,
    seed=0,
):
    """A ``[B, T]`` batch laid out as a collector writes it.

    Inside an episode ``("next", "observation")[t] == observation[t + 1]``; after each
    ``(b, t)`` in ``dones`` (truncations) or ``terminations`` the row continues with a
    fresh observation. The behaviour logits are stored under ``"logits"``.
    """
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(B, T + 1, obs_dim, generator=g, dtype=dtype)
    next_obs = obs[:, 1:].clone()
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    terminated = torch.zeros(B, T, 1, dtype=torch.bool)
    for b, t in (*dones, *terminations):
        done[b, t] = True
        # the real next observation differs from the reset that follows it
        next_obs[b, t] = torch.randn(obs_dim, generator=g, dtype=dtype) + 10.0
    for b, t in terminations:
        terminated[b, t] = True
    logits = torch.randn(B, T, num_actions, generator=g, dtype=dtype)
    action = torch.multinomial(
        logits.softmax(-1).reshape(-1, num_actions), 1, generator=g
    ).reshape(logits.shape[:-1])
    log_prob = torch.log_softmax(logits, -1).gather(-1, action[..., None])[..., 0]
    if one_hot:
        action = nn.functional.one_hot(action, num_actions)
    return TensorDict(
        {
            "observation": obs[:, :T],
            "action": action,
            "logits": logits,
            "action_log_prob": log_prob,
            "next": {
                "observation": next_obs,
                "reward": torch.randn(B, T, 1, generator=g, dtype=dtype),
                "done": done,
                "terminated": terminated,
            },
        },
        [B, T],
    )


class CallCounter:
    """Records the batch size of every call of an ``nn.Module``."""

    def __init__(self, module: nn.Module):
        self.sizes = []
        module.register_forward_hook(
            lambda m, args, out: self.sizes.append(len(args[0]))
        )


def table_actor_critic(num_states, num_actions, *, one_hot=False, seed=0):
    """Actor and critic that look up one row of a table per state (float64).

    Observations are one-hot state indicators, so the gradient of a loss with respect
    to ``weight[:, s]`` of each network is its gradient at the logits (or the Q
    values) of state ``s``.
    """
    torch.manual_seed(seed)
    dist = OneHotCategorical if one_hot else D.Categorical
    policy = nn.Linear(num_states, num_actions, bias=False).double()
    q = nn.Linear(num_states, num_actions, bias=False).double()
    actor = ProbabilisticActor(
        TensorDictModule(policy, ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=dist,
        return_log_prob=True,
    )
    critic = TensorDictModule(q, ["observation"], ["action_value"])
    return actor, critic, policy, q


def table_batch(B, T, num_actions, *, dones=(), terminations=(), seed=0):
    """A ``[B, T]`` batch over one-hot states, every observation its own state.

    Returns the batch and ``(state_ids, next_state_ids)``, each ``[B, T]``: the row
    of the tables each step's ``s_t`` and ``s'_t`` read. The number of states is
    ``B * (T + 1) + len(dones) + len(terminations)``.
    """
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(B * (T + 1)).reshape(B, T + 1)
    state_ids, next_ids = ids[:, :T], ids[:, 1:].clone()
    fresh = B * (T + 1)
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    terminated = torch.zeros(B, T, 1, dtype=torch.bool)
    for b, t in (*dones, *terminations):
        done[b, t] = True
        next_ids[b, t] = fresh
        fresh += 1
    for b, t in terminations:
        terminated[b, t] = True
    num_states = fresh
    eye = torch.eye(num_states, dtype=torch.float64)
    logits = torch.randn(B, T, num_actions, generator=g, dtype=torch.float64)
    action = torch.multinomial(
        logits.softmax(-1).reshape(-1, num_actions), 1, generator=g
    ).reshape(logits.shape[:-1])
    batch = TensorDict(
        {
            "observation": eye[state_ids],
            "action": action,
            "logits": logits,
            "action_log_prob": logits.log_softmax(-1).gather(-1, action[..., None])[
                ..., 0
            ],
            "next": {
                "observation": eye[next_ids],
                "reward": torch.randn(B, T, 1, generator=g, dtype=torch.float64),
                "done": done,
                "terminated": terminated,
            },
        },
        [B, T],
    )
    return batch, (state_ids, next_ids), num_states


def cartpole_states(env) -> torch.Tensor:
    """The states of the CartPole copies in ``make_env``'s env (a ``GymWrapper``
    around a gymnasium ``SyncVectorEnv``; CartPole's observation is its state)."""
    copies = env.base_env._env.envs
    return torch.as_tensor(np.stack([copy.unwrapped.state for copy in copies]))


def run_example(script, *args, cwd, env=None):
    """Runs ``examples/<script>`` with Hydra overrides (and ``env``'s variables
    added to this process's); returns the finished process. The script imports
    this checkout's ``torchrl_acer`` (first on ``PYTHONPATH``), not whichever one is
    installed."""
    root = str(Path(__file__).parents[1])
    path = [root, *filter(None, [os.environ.get("PYTHONPATH")])]
    return subprocess.run(
        [sys.executable, str(Path(root) / "examples" / script), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path), **(env or {})},
    )


class TableGaussian(nn.Module):
    """loc = weight[:, s] for a one-hot state s; scale fixed or exp(log_scale)."""

    def __init__(self, num_states, action_dim, fixed_scale=None):
        super().__init__()
        self.loc = nn.Linear(num_states, action_dim, bias=False).double()
        self.fixed_scale = fixed_scale
        if fixed_scale is None:
            self.log_scale = nn.Parameter(torch.full((action_dim,), -0.5).double())

    def forward(self, observation):
        loc = self.loc(observation)
        if self.fixed_scale is not None:
            return loc, torch.full_like(loc, self.fixed_scale)
        return loc, self.log_scale.exp().expand_as(loc)


def table_gaussian_sdn(
    num_states, action_dim, *, fixed_scale=None, seed=0, n=3, dueling=True
):
    """A table Gaussian policy and a dueling critic with a table V and an MLP A.

    With ``dueling=False`` the critic is a ``PlainQCritic`` whose Q is the MLP
    (returned in A's place; V is then unused).
    """
    torch.manual_seed(seed)
    policy = TableGaussian(num_states, action_dim, fixed_scale)
    actor = ProbabilisticActor(
        TensorDictModule(policy, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    v = nn.Linear(num_states, 1, bias=False).double()
    a = MLP(
        in_features=num_states + action_dim,
        out_features=1,
        num_cells=[8],
        activation_class=nn.Tanh,
    ).double()
    if not dueling:
        q = TensorDictModule(a, ["observation", "action"], ["q"])
        return actor, PlainQCritic(q, num_samples=n), policy, v, a
    critic = StochasticDuelingNetwork(
        TensorDictModule(v, ["observation"], ["state_value"]),
        TensorDictModule(a, ["observation", "action"], ["advantage"]),
        num_samples=n,
    )
    return actor, critic, policy, v, a


def gaussian_table_batch(B, T, action_dim, *, dones=(), terminations=(), seed=0):
    """A [B, T] batch over one-hot states with behaviour Gaussians stored."""
    g = torch.Generator().manual_seed(seed)
    batch, ids, num_states = table_batch(
        B, T, 2, dones=dones, terminations=terminations, seed=seed
    )
    return with_gaussian_behaviour(batch, action_dim, g), ids, num_states


def with_gaussian_behaviour(batch, action_dim, generator):
    """``batch`` (``[B, T]``) with a behaviour Gaussian stored at each step
    (``loc``, ``scale``) in place of the logits, an action drawn from it and its
    log-probability."""
    B, T = batch.batch_size
    loc = torch.randn(B, T, action_dim, generator=generator, dtype=torch.float64) * 0.5
    scale = 0.3 + torch.rand(B, T, action_dim, generator=generator, dtype=torch.float64)
    action = loc + scale * torch.randn(
        B, T, action_dim, generator=generator, dtype=torch.float64
    )
    log_prob = D.Normal(loc, scale).log_prob(action).sum(-1)
    del batch["logits"]
    batch.set("action", action)
    batch.set("loc", loc)
    batch.set("scale", scale)
    batch.set("action_log_prob", log_prob)
    return batch


def make_loss(actor, critic, *, gamma=0.9, **kwargs):
    """An ACER loss with its averaged policy kept by ``SoftUpdate``."""
    loss = ACERLoss(actor, critic, **kwargs)
    loss.make_value_estimator(gamma=gamma)
    SoftUpdate(loss, eps=0.99)
    return loss


def move_average(loss, scale, seed=0):
    """Moves the averaged policy away from the policy (so that the KL gradient of
    the trust region is not zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        loss.target_actor_network_params.apply(
            lambda p: p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
        )


def average_table(loss):
    """The averaged policy's table (one row per state) of a table actor."""
    return next(iter(loss.target_actor_network_params.values(True, True))).T


def backward(loss, batch, terms=("loss_objective", "loss_entropy", "loss_critic")):
    """Runs the loss and back-propagates the sum of ``terms`` (summed over steps
    with ``reduction="none"``); returns the loss's output."""
    out = loss(batch)
    total = sum(out[t] for t in terms)
    (total.sum() if total.ndim else total).backward()
    return out


def discrete_setup(
    *, delta, space="logits", reduction="mean", ratio_clip=1.5, B=2, T=6, A=3
):
    """Discrete ACER on a table batch (a truncation at (0, 2), a termination at
    (1, 4)) with table networks and the averaged policy moved away.

    Returns ``(loss, batch, (state_ids, next_ids), policy table, Q table)``.
    """
    batch, ids, S = table_batch(B, T, A, dones=[(0, 2)], terminations=[(1, 4)])
    actor, critic, policy, q = table_actor_critic(S, A)
    loss = make_loss(
        actor,
        critic,
        trust_region_delta=delta,
        trust_region_space=space,
        reduction=reduction,
        ratio_clip=ratio_clip,
    )
    move_average(loss, 1.5)
    return loss, batch, ids, policy, q


def gaussian_setup(
    *, fixed_scale=None, delta=None, reduction="mean", B=2, T=5, d=2, seed=0
):
    """Continuous ACER (gamma 0.9, ratio_clip 1.2, entropy_coeff 0.05) on a table
    batch (a truncation at (0, 2), a termination at (1, 3)) with a table Gaussian
    policy, the dueling critic of ``table_gaussian_sdn`` and the averaged policy
    moved away; the loss's draws are replayed from ``noise``.

    Returns ``(loss, batch, ids, policy, V table, A MLP, noise)``.
    """
    batch, ids, S = gaussian_table_batch(
        B, T, d, dones=[(0, 2)], terminations=[(1, 3)], seed=seed
    )
    actor, critic, policy, v, a = table_gaussian_sdn(
        S, d, fixed_scale=fixed_scale, seed=seed
    )
    loss = make_loss(
        actor,
        critic,
        ratio_clip=1.2,
        trust_region_delta=delta,
        reduction=reduction,
        entropy_coeff=0.05,
    )
    move_average(loss, 0.7, seed=seed)
    # the draws a'_t (bias correction) and u_i (dueling baseline), replayed
    noise = torch.randn(1 + critic.num_samples, B, T, d, dtype=torch.float64)
    replay_draws(loss, noise)
    return loss, batch, ids, policy, v, a, noise


class ReplayDraws(TorchFunctionMode):
    """Answers the loss's one ``torch.randn(1 + n, *loc.shape)`` per forward (the
    draws its docstring documents) with the first ``1 + n`` rows of ``draws``."""

    def __init__(self, draws):
        super().__init__()
        self.draws = draws

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.randn:
            n, *shape = args
            assert tuple(shape) == tuple(self.draws.shape[1:]), (args, self.draws.shape)
            return self.draws[:n].to(kwargs.get("device"), kwargs.get("dtype"))
        return func(*args, **kwargs)


def replay_draws(loss, draws) -> None:
    """Makes every forward of ``loss`` draw ``draws`` (public hooks, no seam)."""
    mode = ReplayDraws(draws)

    def enter(*_):
        mode.__enter__()  # a hook's return value would replace the inputs

    def leave(*_):
        mode.__exit__(None, None, None)

    loss.register_forward_pre_hook(enter)
    loss.register_forward_hook(leave, always_call=True)  # also after an error


def bandit_loss(actor, critic, ratio_clip):
    """ACER on one-step bandits: the policy gradient alone (no trust region, no
    entropy bonus), summed over the samples."""
    return make_loss(
        actor,
        critic,
        ratio_clip=ratio_clip,
        trust_region_delta=None,
        entropy_coeff=0.0,
        reduction="sum",
    )


# A one-step bandit: the Q values, the policy's and the behaviour policy's logits.
BANDIT_Q = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
BANDIT_PI_LOGITS = torch.tensor([0.2, -1.0, 0.5, 1.5], dtype=torch.float64)
BANDIT_MU_LOGITS = torch.tensor([1.5, 0.0, -2.0, 0.3], dtype=torch.float64)


def bandit_per_action_gradients(ratio_clip):
    """Ascent direction at the logits of the one-step bandit, for each sampled
    action.

    Row ``a`` is the gradient of J when the behaviour policy sampled ``a``. The
    critic knows Q exactly and the episode ends after one step, so G = Q(a). Each
    action is its own sample (in its own state: its own table column) in one batch.
    """
    A = len(BANDIT_Q)
    actor, critic, policy, q = table_actor_critic(A, A)
    with torch.no_grad():
        policy.weight.copy_(BANDIT_PI_LOGITS[:, None].expand(A, A))
        q.weight.copy_(BANDIT_Q[:, None].expand(A, A))
    loss = bandit_loss(actor, critic, ratio_clip)
    action = torch.arange(A)[:, None]
    eye = torch.eye(A, dtype=torch.float64)[:, None]
    ones = torch.ones(A, 1, 1, dtype=torch.bool)
    batch = TensorDict(
        {
            "observation": eye,
            "action": action,
            "logits": BANDIT_MU_LOGITS.expand(A, 1, A),
            "action_log_prob": BANDIT_MU_LOGITS.log_softmax(-1)[action],
            ("next", "observation"): eye,
            ("next", "reward"): BANDIT_Q[action][..., None],
            ("next", "done"): ones,
            ("next", "terminated"): ones,
        },
        [A, 1],
    )
    loss(batch)["loss_objective"].backward()
    return -policy.weight.grad.T  # [sampled action, logit]


def retrace_inputs(*shape, p_done=0.2, p_term=0.5, dtype=torch.float64, seed=0):
    """Random ``[*B, T, F]`` inputs of the Retrace functional form, keyed by the
    argument names of the references (``reference.retrace_backward_loop(gamma,
    lmbda, **x)``), with dones and terminations inside the rows."""
    g = torch.Generator().manual_seed(seed)

    def randn():
        return torch.randn(*shape, generator=g, dtype=dtype)

    done = torch.rand(*shape, generator=g) < p_done
    terminated = done & (torch.rand(*shape, generator=g) < p_term)
    # log-ratios spread around 0: some traces are clipped and some are not
    return {
        "log_pi": randn() * 0.7,
        "log_mu": randn() * 0.7,
        "q": randn(),
        "next_v": randn(),
        "reward": randn(),
        "done": done,
        "terminated": terminated,
    }


def retrace(gamma, lmbda, x, **kwargs):
    """``retrace_lambda_return_estimate`` on the inputs of ``retrace_inputs``."""
    return retrace_lambda_return_estimate(
        gamma,
        lmbda,
        x["log_pi"],
        x["log_mu"],
        x["q"],
        x["next_v"],
        x["reward"],
        x["done"],
        x["terminated"],
        **kwargs,
    )


def gym_config(settings: dict, **overrides):
    """``examples/config_gym.yaml`` as Hydra composes it, with ``settings`` and then
    ``overrides`` (dotted keys) applied."""
    from omegaconf import OmegaConf

    cfg = example_config("config_gym")
    for key, value in {**settings, **overrides}.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def snapshot(directory) -> dict:
    """``{relative path: (bytes, mtime_ns)}`` of every file under ``directory``: equal
    snapshots mean nothing there was written."""
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(Path(directory).rglob("*"))
        if p.is_file()
    }


def example_config(name: str):
    """``examples/<name>.yaml`` as Hydra composes it (``bench/_common.py``'s, its
    module loaded once)."""
    return _bench_common().example_config(name)


@functools.cache
def _bench_common():
    return load_script("bench/_common.py")


def load_script(path: str):
    """The repository's script at ``path`` (``"bench/lunar_lander.py"``), imported
    as a module named after its file and registered in ``sys.modules`` (where
    dataclasses look their module up): the benchmarks and tools are not a package."""
    file = Path(__file__).resolve().parents[1] / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def torchrl_checkout_or_skip(commit: str) -> Path:
    """The pytorch/rl clone at ``TORCHRL_CHECKOUT`` (else /work/torchrl_checkout),
    or a skip naming what is missing (the clone, git, or ``commit`` in it)."""
    source = Path(os.environ.get("TORCHRL_CHECKOUT", "/work/torchrl_checkout"))
    if not (source / ".git").exists():
        pytest.skip(
            f"no TorchRL checkout at {source}: set TORCHRL_CHECKOUT to a clone of "
            f"pytorch/rl that has the commit {commit}"
        )
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    has = subprocess.run(
        ["git", "-C", str(source), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
    )
    if has.returncode:
        pytest.skip(f"{source} does not have the commit {commit}")
    return source


def run_patched_torchrl_tests(tmp_path, files, *pytest_args):
    """TorchRL's test ``files`` (paths in pytorch/rl, copied side by side) from a
    clone at the patches' base commit with every patch of upstream/torchrl/ applied
    (``git am``), run with pytest against the installed torchrl patched the same way
    (the checkout's own torchrl is a newer development version than the installed
    tensordict); returns the finished process."""
    fixes = load_script("tools/torchrl_fixes.py")
    source = torchrl_checkout_or_skip(fixes.BASE_COMMIT)
    clone = tmp_path / "rl"
    subprocess.run(
        ["git", "clone", "-q", "--shared", "--no-checkout", str(source), str(clone)],
        check=True,
    )
    identity = ["-c", "user.name=check", "-c", "user.email=check@example.com"]
    for args in (
        ["checkout", "-q", "--detach", fixes.BASE_COMMIT],
        [*identity, "am", "-q", *map(str, fixes.PATCHES)],
    ):
        subprocess.run(
            ["git", "-C", str(clone), *args], check=True, capture_output=True
        )
    copy = fixes.patched_copy(tmp_path / "patched")
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in files:
        shutil.copy(clone / name, tests / Path(name).name)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        cwd=tests, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


# the gym example's config, scaled down to seconds: 2 envs, T=5, 100 frames
SMALL_GYM = {
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
    "checkpoint.every_minutes": None,
    "model.num_cells": [16],
}


def small_gym_config(**overrides):
    """``examples/config_gym.yaml`` with :data:`SMALL_GYM` and ``overrides``."""
    return gym_config(SMALL_GYM, **overrides)


def small_pieces(cfg, *, device="cpu", worker_env=None) -> dict:
    """What ``examples/acer_gym.py`` hands ``experiment.make_trainer`` besides the
    run directory and the logger, from ``cfg``: the example's own builders
    (``examples/utils_gym.py``) make the environments and networks, the networks
    on ``device``. ``worker_env(make_env, num_envs, seed=...)``, if given, makes
    the collector's environments in place of ``make_env``."""
    from torchrl_acer.training import experiment

    experiment.check_config(cfg)
    torch.manual_seed(cfg.seed)
    utils_gym = load_example_module("utils_gym")
    make = functools.partial(utils_gym.make_env, cfg)
    env = make(cfg.env.num_envs, seed=cfg.seed)
    actor, critic = (net.to(device) for net in utils_gym.make_models(cfg, env))
    loss = experiment.make_loss(cfg.loss, actor, critic)
    collected = make if worker_env is None else functools.partial(worker_env, make)
    return {
        "collector": experiment.make_collector(
            cfg, collected, actor, device=device, env=env
        ),
        "loss": loss,
        "optimizer": experiment.make_optimizer(cfg.optim, loss.parameters()),
        "replay": experiment.make_replay(cfg),
        "evaluator": experiment.make_evaluator(cfg, make, actor),
    }


def small_trainer(run_dir, cfg=None, **overrides):
    """What ``examples/acer_gym.py`` builds, from :func:`small_gym_config` (or
    ``cfg``): the new ``ACERTrainer`` with the run settings' hooks
    (``experiment.make_trainer``) over :func:`small_pieces`, writing to
    ``run_dir``."""
    from torchrl_acer.training import experiment

    cfg = small_gym_config(**overrides) if cfg is None else cfg
    pieces = small_pieces(cfg)
    run_dir = Path(run_dir)
    logger = experiment.make_logger(cfg.logger.backend, run_dir)
    return experiment.make_trainer(cfg, run_dir, **pieces, logger=logger)


def load_example_module(name: str):
    """``examples/<name>.py`` imported as a module (the examples' ``utils_*``)."""
    examples = str(Path(__file__).parents[1] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    return importlib.import_module(name)


def resume_small_trainer(run_dir, **overrides):
    """:func:`small_trainer` resuming the run in ``run_dir`` from its
    ``checkpoints/last``, as ``examples/acer_gym.py resume=...`` does
    (``experiment.resume``)."""
    from torchrl_acer.training import experiment

    checkpoint = Path(run_dir) / "checkpoints" / "last"
    trainer = small_trainer(run_dir, resume=str(checkpoint), **overrides)
    experiment.resume(trainer, checkpoint)
    return trainer


def close_trainer(trainer) -> None:
    """Shuts down what a :func:`small_trainer` holds open (``experiment.close``)."""
    from torchrl_acer.training import experiment

    experiment.close(trainer)


def checkpoint_component(checkpoint, name):
    """The state dict saved as component ``name`` of the checkpoint directory at
    ``checkpoint`` (an ``ACERCheckpoint``'s, e.g. ``<run>/checkpoints/last``),
    read on the CPU into nothing (environments' states unpickled: trusted)."""
    from torchrl_acer.trainers.checkpoint import (
        ACERCheckpoint,
        FiniteStateDictAdapter,
    )

    record = ACERCheckpoint.verify(checkpoint)["components"][name]
    adapter = FiniteStateDictAdapter(payload_format="torch", weights_only=False)
    return adapter.read(Path(checkpoint) / record["path"])


# An environment whose faults a test switches on. It lives here, not in a test
# module: pytest imports test modules under names of its own
# (--import-mode=importlib), so a test module imported by another one too would
# be two modules, and the registered environment would read the other's switches.
INJECTED = "InjectedCartPole-v1"


class Inject(gym.Wrapper):
    """Returns NaN where ``Inject.what`` says, once ``Inject.armed`` (shared by the
    copies): ``"reward"`` once, ``"rewards"`` on every step of every copy,
    ``"final_observation"`` at the next episode end (the policy never sees it),
    ``"observation"`` once mid-episode (the policy acts on it); ``"raise"``
    raises (an environment that crashes)."""

    armed = False
    what = "reward"

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if Inject.armed:
            if Inject.what in ("reward", "rewards"):
                reward = float("nan")
                Inject.armed = Inject.what == "rewards"
            elif Inject.what == "final_observation" and (terminated or truncated):
                obs = np.full_like(obs, np.nan)
                Inject.armed = False
            elif Inject.what == "observation" and not (terminated or truncated):
                obs = np.full_like(obs, np.nan)
                Inject.armed = False
            elif Inject.what == "raise":
                Inject.armed = False
                raise RuntimeError("the simulator crashed")
            elif Inject.what in ("sigint", "sigint_twice"):
                # Ctrl-C arriving in the middle of an environment's step
                Inject.armed = Inject.what == "sigint_twice"
                Inject.what = "sigint"
                os.kill(os.getpid(), signal.SIGINT)
        return obs, reward, terminated, truncated, info


def _injected_cartpole(**kwargs):
    return Inject(gym.make("CartPole-v1", **kwargs))


# by name: pytest's doctest collection imports this file too, under a name of its
# own, and the environment must read the switches of the module tests import
if INJECTED not in gym.registry:
    gym.register(
        INJECTED, entry_point="builders:_injected_cartpole", disable_env_checker=True
    )
