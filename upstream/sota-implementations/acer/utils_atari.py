# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
from __future__ import annotations

import torch
import torch.nn
from tensordict.nn import TensorDictModule
from torchrl.envs import (
    CatFrames,
    EndOfLifeTransform,
    EnvCreator,
    ExplorationType,
    GrayScale,
    GymEnv,
    NoopResetEnv,
    ParallelEnv,
    Resize,
    RewardSum,
    SignTransform,
    StepCounter,
    ToTensorImage,
    TransformedEnv,
    set_gym_backend,
)
from torchrl.modules import (
    MLP,
    ActorValueOperator,
    ConvNet,
    OneHotCategorical,
    ProbabilisticActor,
)

# ====================================================================
# Environment utils
# --------------------------------------------------------------------


def make_base_env(env_name, gym_backend, repeat_action_probability, is_test=False):
    # ALE v5 games skip 4 frames per agent step themselves
    with set_gym_backend(gym_backend):
        env = GymEnv(env_name, repeat_action_probability=repeat_action_probability)
    env = TransformedEnv(env)
    env.append_transform(NoopResetEnv(noops=30, random=True))
    if not is_test:
        # A lost life ends the value bootstrap ("end-of-life" is terminated or a
        # life lost) but not the game: the trajectory goes on, so "done" stays
        # the game's own and time limits stay truncations for the loss.
        env.append_transform(EndOfLifeTransform(done_key="terminated"))
    return env


def make_parallel_env(
    env_name,
    num_envs,
    gym_backend="gymnasium",
    repeat_action_probability=0.0,
    max_steps=27_000,
    is_test=False,
):
    env = ParallelEnv(
        num_envs,
        EnvCreator(
            lambda: make_base_env(
                env_name, gym_backend, repeat_action_probability, is_test
            )
        ),
        serial_for_single=True,
    )
    env = TransformedEnv(env)
    # Frames stay uint8 end to end: the replay memory holds stacks of 4 84x84
    # bytes per observation, and the network scales them to [0, 1] itself.
    env.append_transform(ToTensorImage(from_int=False, dtype=torch.uint8))
    env.append_transform(GrayScale())
    env.append_transform(Resize(84, 84))
    env.append_transform(CatFrames(N=4, dim=-3))
    env.append_transform(RewardSum())
    env.append_transform(StepCounter(max_steps=max_steps))
    if not is_test:
        # the loss trains on rewards clipped to their sign; "episode_reward"
        # (summed above) keeps the game's score
        env.append_transform(SignTransform(in_keys=["reward"]))
    return env


# ====================================================================
# Model utils
# --------------------------------------------------------------------


class PixelScale(torch.nn.Module):
    """Casts uint8 frames to float in [0, 1]."""

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels.float() / 255


def make_acer_modules_pixels(proof_environment, device):
    input_shape = proof_environment.observation_spec["pixels"].shape
    num_actions = proof_environment.action_spec_unbatched.space.n

    # The DQN (Nature) trunk, shared by the policy and the Q heads as in the
    # paper's Atari agent
    common_cnn = ConvNet(
        in_features=input_shape[-3],
        activation_class=torch.nn.ReLU,
        num_cells=[32, 64, 64],
        kernel_sizes=[8, 4, 3],
        strides=[4, 2, 1],
        device=device,
    )
    with torch.no_grad():
        cnn_output = common_cnn(torch.zeros(input_shape[-3:], device=device))
    common_mlp = MLP(
        in_features=cnn_output.shape[-1],
        activation_class=torch.nn.ReLU,
        activate_last_layer=True,
        out_features=512,
        num_cells=[],
        device=device,
    )
    common_module = TensorDictModule(
        module=torch.nn.Sequential(PixelScale(), common_cnn, common_mlp),
        in_keys=["pixels"],
        out_keys=["common_features"],
    )

    # The collector stores the behaviour policy's logits and the log-probability
    # of each action: ACER's importance ratios read them back from replay.
    policy_module = ProbabilisticActor(
        TensorDictModule(
            torch.nn.Linear(512, num_actions, device=device),
            in_keys=["common_features"],
            out_keys=["logits"],
        ),
        in_keys=["logits"],
        spec=proof_environment.full_action_spec_unbatched.to(device),
        distribution_class=OneHotCategorical,
        return_log_prob=True,
        default_interaction_type=ExplorationType.RANDOM,
    )

    # The critic is a Q head: one value per action, under "action_value"
    qvalue_module = TensorDictModule(
        torch.nn.Linear(512, num_actions, device=device),
        in_keys=["common_features"],
        out_keys=["action_value"],
    )
    return common_module, policy_module, qvalue_module


def make_acer_models(env_name, device, gym_backend="gymnasium"):
    proof_environment = make_parallel_env(env_name, 1, gym_backend=gym_backend)
    common_module, policy_module, qvalue_module = make_acer_modules_pixels(
        proof_environment, device=device
    )
    # ACERLoss runs a trunk shared through an ActorValueOperator once per update
    actor_critic = ActorValueOperator(
        common_operator=common_module,
        policy_operator=policy_module,
        value_operator=qvalue_module,
    )
    actor = actor_critic.get_policy_operator()
    critic = actor_critic.get_value_operator()
    del proof_environment
    return actor, critic


# ====================================================================
# Evaluation utils
# --------------------------------------------------------------------


def eval_model(actor, test_env, num_episodes=3, max_steps=27_000):
    test_rewards = []
    for _ in range(num_episodes):
        td_test = test_env.rollout(
            policy=actor,
            auto_reset=True,
            auto_cast_to_device=True,
            break_when_any_done=True,
            max_steps=max_steps,
        )
        # the score so far, also for a game cut by max_steps
        test_rewards.append(td_test["next", "episode_reward"][..., -1, :].item())
    del td_test
    return sum(test_rewards) / len(test_rewards)
