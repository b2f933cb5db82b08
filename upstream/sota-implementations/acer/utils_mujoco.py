# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
from __future__ import annotations

import torch
import torch.nn
from tensordict.nn import TensorDictModule
from torchrl.envs import (
    ClipTransform,
    DoubleToFloat,
    ExplorationType,
    RewardSum,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)
from torchrl.envs.libs.gym import GymEnv
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor

from torchrl_acer.modules import StochasticDuelingNetwork

# ====================================================================
# Environment utils
# --------------------------------------------------------------------


def make_env(env_name="HalfCheetah-v5", num_envs=1):
    # MuJoCo steps are cheap next to a worker process's round trip: the envs
    # step one after the other in this process
    env = SerialEnv(num_envs, lambda: GymEnv(env_name))
    env = TransformedEnv(env)
    env.append_transform(RewardSum())
    env.append_transform(StepCounter())
    env.append_transform(DoubleToFloat())
    # The policy's Gaussian is not squashed, so that its log-probabilities (and
    # ACER's importance ratios) stay exact: the env clips the actions it
    # receives, while the collector stores the actions the policy sampled.
    # (MuJoCo tasks have the same bounds on every action dimension.)
    space = env.action_spec_unbatched.space
    env.append_transform(
        ClipTransform(
            in_keys_inv=["action"],
            low=space.low.min().item(),
            high=space.high.max().item(),
        )
    )
    return env


# ====================================================================
# Model utils
# --------------------------------------------------------------------


class BoundedGaussianHead(torch.nn.Module):
    """Gaussian parameters: the mean squashed into the action bounds, a fixed
    scale.

    Beyond the bounds the clipped env cannot tell actions apart, so an
    unbounded mean can drift there without limit; a fixed scale is the paper's
    continuous-control setting.
    """

    def __init__(self, low, high, scale):
        super().__init__()
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)
        self.scale = scale

    def forward(self, x):
        loc = self.center + self.half_range * x.tanh()
        return loc, torch.full_like(loc, self.scale)


def make_acer_models_state(proof_environment, cfg, device):
    obs_dim = proof_environment.observation_spec["observation"].shape[-1]
    action_spec = proof_environment.action_spec_unbatched
    action_dim = action_spec.shape[-1]

    def mlp(in_features, out_features):
        return MLP(
            in_features=in_features,
            out_features=out_features,
            num_cells=list(cfg.model.num_cells),
            activation_class=torch.nn.ReLU,
            device=device,
        )

    # The collector stores loc, scale and the log-probability of each action:
    # the loss reads the behaviour policy back from replay.
    policy_module = ProbabilisticActor(
        TensorDictModule(
            torch.nn.Sequential(
                mlp(obs_dim, action_dim),
                BoundedGaussianHead(
                    action_spec.space.low.to(device),
                    action_spec.space.high.to(device),
                    cfg.model.policy_scale,
                ),
            ),
            in_keys=["observation"],
            out_keys=["loc", "scale"],
        ),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
        default_interaction_type=ExplorationType.RANDOM,
    )

    # Stochastic dueling network: V(s) and A(s, a), with
    # Q(s, a) = V(s) + A(s, a) - mean_i A(s, u_i), u_i ~ pi(.|s)
    value_module = TensorDictModule(
        mlp(obs_dim, 1), in_keys=["observation"], out_keys=["state_value"]
    )
    advantage_module = TensorDictModule(
        mlp(obs_dim + action_dim, 1),
        in_keys=["observation", "action"],
        out_keys=["advantage"],
    )
    critic = StochasticDuelingNetwork(
        value_module, advantage_module, num_samples=cfg.model.num_samples
    )
    return policy_module, critic


def make_acer_models(cfg, device):
    proof_environment = make_env(cfg.env.env_name)
    actor, critic = make_acer_models_state(proof_environment, cfg, device)
    del proof_environment
    return actor, critic


# ====================================================================
# Evaluation utils
# --------------------------------------------------------------------


def eval_model(actor, test_env, num_episodes=3):
    test_rewards = []
    for _ in range(num_episodes):
        td_test = test_env.rollout(
            policy=actor,
            auto_reset=True,
            auto_cast_to_device=True,
            break_when_any_done=True,
            max_steps=10_000_000,
        )
        test_rewards.append(td_test["next", "episode_reward"][..., -1, :].item())
    del td_test
    return sum(test_rewards) / len(test_rewards)
