"""ACER on an accelerator against the CPU.

    ACER_TEST_DEVICE=cuda python -m pytest tests/training/test_device.py

Every test here runs on the device that ``ACER_TEST_DEVICE`` names and is skipped
when it is unset (``bench/gpu_check.sh`` sets it on a lent GPU machine;
``ACER_TEST_DEVICE=cpu`` runs the same comparisons CPU against CPU, which is what
``bench/gpu_check.sh --dry-run`` does). The loss's forward and backward, the
trust-region projection and Retrace on the device equal the same on the CPU in
float32 (TF32 off, so that both sides compute in full float32), replay kept in
host memory feeds a loss on the device (the learner's layout), GymVectorCollector acts
with a policy on the device as TorchRL's Collector does, and a short
training run with the learner on the device completes.
"""

from __future__ import annotations

import os

import pytest
import torch
from builders import random_batch, replay_draws
from torch import distributions as D
from torchrl.collectors import Collector
from torchrl.data import ReplayBuffer

from torchrl_acer import ACERLoss, RetraceEstimator
from torchrl_acer.modules.models import (
    atari_actor_critic,
    gaussian_actor_sdn,
    mlp_actor_critic,
)
from torchrl_acer.trainers import (
    ACERCheckpoint,
    ACERTrainer,
    Evaluation,
    GreedyEvaluator,
    make_segment_replay_buffer,
)
from torchrl_acer.trainers.checkpoint import FiniteStateDictAdapter
from torchrl_acer.training.envs import make_env
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer
from torchrl_acer.training.gym_collector import GymVectorCollector

DEVICE = os.environ.get("ACER_TEST_DEVICE")

pytestmark = pytest.mark.skipif(
    not DEVICE,
    reason="ACER_TEST_DEVICE is unset: set it to a device (cuda) to compare the "
    "loss, Retrace and training there with the CPU",
)

# examples/utils_atari.py's: clipped rewards, a lost life ends the training episode
ATARI_KEYS = {
    "reward": "reward_clipped",
    "done": "train_done",
    "terminated": "train_terminated",
}
TERMS = ("loss_objective", "loss_entropy", "loss_critic")


@pytest.fixture(scope="module")
def device():
    device = torch.device(DEVICE)
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.fail(f"ACER_TEST_DEVICE={DEVICE} but CUDA is not available")
    return device


@pytest.fixture(autouse=True)
def full_float32():
    """TF32 off (cuDNN convolutions use it by default): float32 on both sides."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def assert_close(got, expected, what, rtol=1e-4):
    """Equal within float32 rounding: elementwise ``rtol``, and an absolute slack
    of ``rtol / 10`` of the largest entry (sums over many terms, in another order
    on the device, leave errors of that size on entries near zero)."""
    got, expected = got.detach().cpu(), expected.detach().cpu()
    assert got.dtype == expected.dtype, what
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(
        got,
        expected,
        rtol=rtol,
        atol=rtol / 10 * scale + 1e-7,
        msg=lambda m: f"{what}: {m}",
    )


def assert_tensordicts_close(got, expected, what):
    keys = set(expected.keys(True, True))
    assert set(got.keys(True, True)) == keys, what
    for key in sorted(keys, key=str):
        if expected.get(key).is_floating_point():
            assert_close(got.get(key), expected.get(key), f"{what} {key!r}")
        else:
            assert torch.equal(got.get(key).cpu(), expected.get(key)), f"{what} {key!r}"


def perturb_average(loss, scale=0.3, seed=0):
    """Moves the averaged policy away from the policy (on the CPU), so that the
    trust region's KL gradient is not zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in loss.target_actor_network_params.values(True, True):
            spread = p.std() if p.numel() > 1 else torch.ones(())
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale * spread)


def loss_pair(build, device, **kwargs):
    """The same ACER loss (parameters, averaged policy) on the CPU and on
    ``device``: ``build()`` makes ``(actor, critic)`` from the seed."""
    losses = []
    for where in (torch.device("cpu"), device):
        torch.manual_seed(0)
        actor, critic = build()
        loss = ACERLoss(actor.to(where), critic.to(where), **kwargs)
        loss.make_value_estimator(gamma=0.9)
        losses.append(loss)
    cpu, dev = losses
    perturb_average(cpu)
    dev.load_state_dict(cpu.state_dict())
    for p in dev.parameters():
        assert p.device.type == device.type
    return cpu, dev


def forward_backward(loss, batch):
    out = loss(batch)
    sum(out[t] for t in TERMS).backward()
    grads = {name: p.grad for name, p in loss.named_parameters() if p.grad is not None}
    return out.detach(), grads


def assert_same_update(cpu_loss, dev_loss, batch, device, projected=True):
    """Forward and backward of both losses on ``batch`` (moved to ``device`` for
    the device's): the outputs, every parameter's gradient and the trust region's
    statistics agree; with ``projected``, the projection acted on some steps."""
    # each its own copy: nothing one loss might write into it reaches the other
    out_cpu, grads_cpu = forward_backward(cpu_loss, batch.clone())
    out_dev, grads_dev = forward_backward(dev_loss, batch.clone().to(device))
    assert out_dev["loss_objective"].device.type == device.type
    assert_tensordicts_close(out_dev, out_cpu, "loss output")
    assert set(grads_dev) == set(grads_cpu)
    # the actor's and the critic's parameters all get a gradient
    assert any(n.startswith("actor_network_params") for n in grads_cpu)
    assert any(n.startswith("critic_network_params") for n in grads_cpu)
    for name, grad in grads_cpu.items():
        assert grads_dev[name].device.type == device.type
        assert_close(grads_dev[name], grad, f"gradient of {name}")
    stats_cpu, stats_dev = cpu_loss.trust_region_stats, dev_loss.trust_region_stats
    assert stats_cpu is not None and stats_dev is not None
    assert_tensordicts_close(stats_dev, stats_cpu, "trust-region statistics")
    if projected:
        assert float(stats_cpu["active_fraction"]) > 0, "the projection never acted"


def pixel_batch(B, T, num_actions, seed=0):
    """A ``[B, T]`` batch of 4x84x84 uint8 frame stacks, with an end of episode
    inside a row."""
    batch = random_batch(
        B,
        T,
        obs_dim=1,
        num_actions=num_actions,
        one_hot=True,
        dones=[(0, 1)],
        terminations=[(1, 3)],
        dtype=torch.float32,
        seed=seed,
    )
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(
        0, 256, (B, T + 1, 4, 84, 84), generator=g, dtype=torch.uint8
    )
    batch.set("pixels", frames[:, :T])
    batch.set(("next", "pixels"), frames[:, 1:])
    return batch.exclude("observation", ("next", "observation"))


def gaussian_batch(B, T, obs_dim, action_dim, seed=0):
    """A float32 ``[B, T]`` batch with behaviour Gaussians stored."""
    batch = random_batch(
        B,
        T,
        obs_dim=obs_dim,
        dones=[(0, 2)],
        terminations=[(1, 3)],
        dtype=torch.float32,
        seed=seed,
    )
    g = torch.Generator().manual_seed(seed + 1)
    loc = torch.randn(B, T, action_dim, generator=g) * 0.5
    scale = 0.3 + torch.rand(B, T, action_dim, generator=g)
    action = loc + scale * torch.randn(B, T, action_dim, generator=g)
    del batch["logits"]
    batch.set("action", action)
    batch.set("loc", loc)
    batch.set("scale", scale)
    batch.set("action_log_prob", D.Normal(loc, scale).log_prob(action).sum(-1))
    return batch


def test_cartpole_mlp_loss_matches_cpu(device):
    cpu, dev = loss_pair(
        lambda: mlp_actor_critic(4, 2, num_cells=[32, 32]),
        device,
        trust_region_delta=0.01,
    )
    batch = random_batch(
        4,
        6,
        obs_dim=4,
        num_actions=2,
        one_hot=True,
        dones=[(0, 2)],
        terminations=[(1, 4)],
        dtype=torch.float32,
    )
    assert_same_update(cpu, dev, batch, device)


def test_gaussian_sdn_loss_matches_cpu(device):
    B, T, obs_dim, d, n = 3, 5, 3, 2, 4
    cpu, dev = loss_pair(
        lambda: gaussian_actor_sdn(
            obs_dim, d, num_cells=[32, 32], fixed_scale=None, num_samples=n
        ),
        device,
        trust_region_delta=0.01,
    )
    # the draws a' (bias correction) and u_i (dueling baseline), the same on both
    noise = torch.randn(1 + n, B, T, d, generator=torch.Generator().manual_seed(3))
    replay_draws(cpu, noise)
    replay_draws(dev, noise.to(device))
    assert_same_update(cpu, dev, gaussian_batch(B, T, obs_dim, d), device)


def sharp_atari_actor_critic(num_actions, factor=30.0, **kwargs):
    """``atari_actor_critic`` with its policy head's weights scaled up: logits of a
    fresh network hardly differ from zero, and the trust region would not act."""
    actor, critic = atari_actor_critic(num_actions, **kwargs)
    head = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)][-1]
    assert head.out_features == num_actions
    with torch.no_grad():
        head.weight.mul_(factor)
    return actor, critic


def test_atari_shared_trunk_loss_matches_cpu_with_trust_region(device):
    cpu, dev = loss_pair(
        lambda: sharp_atari_actor_critic(6), device, trust_region_delta=0.01
    )
    batch = pixel_batch(3, 5, 6)
    assert batch["pixels"].dtype == torch.uint8
    assert_same_update(cpu, dev, batch, device)


@pytest.mark.parametrize("shared", [False, True])
def test_retrace_estimator_matches_cpu(device, shared):
    outs = []
    batch = random_batch(
        3,
        7,
        obs_dim=4,
        num_actions=3,
        one_hot=True,
        dones=[(0, 1), (2, 4)],
        terminations=[(1, 3)],
        dtype=torch.float32,
    )
    for where in (torch.device("cpu"), device):
        torch.manual_seed(0)
        actor, critic = mlp_actor_critic(4, 3, num_cells=[16], shared=shared)
        est = RetraceEstimator(
            gamma=0.9,
            lmbda=0.95,
            actor_network=actor.to(where),
            value_network=critic.to(where),
            shifted=True,
            device=where,  # its gamma, lambda and c buffers, as ACERLoss passes it
        )
        out = est(batch.clone().to(where))
        assert out["value_target"].device.type == where.type
        outs.append(out)
    new = set(outs[0].keys(True, True)) - set(batch.keys(True, True))
    assert "value_target" in new
    assert_tensordicts_close(outs[1].select(*new), outs[0].select(*new), "Retrace")


def in_host_memory(td):
    return all(v.device.type == "cpu" for v in td.values(True, True))


def collect(env, actor, T, batches):
    collector = Collector(
        env,
        actor,
        frames_per_batch=T * env.batch_size.numel(),
        total_frames=-1,
        auto_register_policy_transforms=False,
    )
    out = []
    for batch in collector:
        out.append(batch)
        if len(out) == batches:
            break
    collector.shutdown()
    return out


def test_segment_replay_in_host_memory_feeds_the_device_loss(device):
    T = 8
    cpu, dev = loss_pair(
        lambda: mlp_actor_critic(4, 2, num_cells=[16]), device, trust_region_delta=0.01
    )
    env = make_env("CartPole-v1", num_envs=2, seed=0)
    rb = make_segment_replay_buffer(200, T, 3)
    for batch in collect(env, cpu.actor_network, T, 3):
        rb.extend(batch)
    torch.manual_seed(0)
    sample = rb.sample()
    assert sample.batch_size == (3, T) and in_host_memory(sample)
    assert_same_update(cpu, dev, sample, device)


def test_frame_replay_in_host_memory_feeds_the_device_loss(device):
    pytest.importorskip("ale_py")
    from torchrl_acer.training.atari import make_atari_env

    T = 6
    env = make_atari_env("ALE/Breakout-v5", num_envs=2, seed=0)
    spec = env.action_spec[0]
    cpu, dev = loss_pair(
        lambda: sharp_atari_actor_critic(spec.shape[-1], action_spec=spec),
        device,
        trust_region_delta=0.01,
    )
    for loss in (cpu, dev):
        loss.set_keys(**ATARI_KEYS)
    rb = FrameStackReplayBuffer(2, 60, T, 3, generator=torch.Generator().manual_seed(0))
    for batch in collect(env, cpu.actor_network, T, 3):
        rb.extend(batch)
    env.close()
    sample = rb.sample()
    assert sample.batch_size == (3, T) and sample["pixels"].dtype == torch.uint8
    assert in_host_memory(sample)
    # Breakout's first steps have rewards of 0: too little gradient to project
    assert_same_update(cpu, dev, sample, device, projected=False)


def make_device_trainer(
    env, eval_env, actor, critic, replay, device, T, tmp_path, batches
):
    """``examples/acer_*.py``'s layout: networks, loss and optimizer on ``device``,
    the environments on the CPU, the collector's policy on ``device`` and its
    batches (and the replay) in host memory. The trainer saves to
    ``tmp_path/checkpoints/last`` at the end, evaluates greedily, and keeps each
    batch's loss terms in ``trainer.losses``."""
    actor, critic = actor.to(device), critic.to(device)
    loss = ACERLoss(actor, critic, trust_region_delta=1.0)
    loss.make_value_estimator(gamma=0.99)
    checkpoint = ACERCheckpoint()
    if not isinstance(replay, ReplayBuffer):
        # a replay of our own (Atari's frames), as experiment.make_trainer saves it
        checkpoint.register(
            "replay_buffer",
            replay,
            adapter=FiniteStateDictAdapter(payload_format="torch", weights_only=False),
        )
    trainer = ACERTrainer(
        collector=Collector(
            env,
            actor,
            frames_per_batch=T * env.batch_size.numel(),
            total_frames=-1,
            policy_device=device,
            storing_device="cpu",
            auto_register_policy_transforms=False,
        ),
        loss_module=loss,
        optimizer=torch.optim.Adam(loss.parameters(), lr=1e-3),
        alpha=0.99,
        total_frames=batches * T * env.batch_size.numel(),
        replay_buffer=replay,
        replay_ratio=2.0,
        replay_start=0,
        clip_norm=10.0,
        progress_bar=False,
        seed=0,
        save_trainer_file=tmp_path / "checkpoints" / "last",
        checkpoint=checkpoint,
    )
    trainer.evaluation = Evaluation(GreedyEvaluator(eval_env, actor, max_steps=10))
    trainer.evaluation.register(trainer)
    trainer.losses = []
    trainer.register_op(
        "post_optim_complete_log",
        lambda steps, losses: trainer.losses.append(losses),
    )
    return trainer


def check_trained_on(trainer, device, batches):
    loss = trainer.loss_module
    assert trainer.collected_frames == trainer.total_frames
    assert trainer.optimization_stepper.optimizer_step_count > batches  # replayed
    for p in loss.parameters():
        assert p.device.type == device.type and torch.isfinite(p).all()
    # the collector's policy is the learner's (same storage, no stale copy)
    actor_storage = {p.data_ptr() for p in loss.actor_network_params.values(True, True)}
    policy_storage = {p.data_ptr() for p in trainer.collector.policy.parameters()}
    assert policy_storage == actor_storage
    logs = trainer.losses
    assert len(logs) == batches and all(
        torch.isfinite(value).all()
        for losses in logs
        for key, value in losses.items()
        if "loss" in key
    )
    assert trainer.evaluation.last is not None
    assert trainer.save_trainer_file.is_dir()


def test_cartpole_trainer_with_the_learner_on_the_device(device, tmp_path):
    T = 5
    torch.manual_seed(0)
    env = make_env("CartPole-v1", num_envs=2, seed=0)
    actor, critic = mlp_actor_critic(
        4, 2, num_cells=[16], action_spec=env.action_spec[0]
    )
    trainer = make_device_trainer(
        env,
        make_env("CartPole-v1", num_envs=2, seed=1),
        actor,
        critic,
        make_segment_replay_buffer(200, T, 2),
        device,
        T,
        tmp_path,
        batches=10,
    )
    trainer.train()
    check_trained_on(trainer, device, batches=10)
    trainer.evaluation.evaluate.close()


def test_lean_collector_with_the_policy_on_the_device_equals_torchrls(device):
    """GymVectorCollector acting with a policy on the device (its outputs brought
    back to the CPU) collects TorchRL's Collector's batches there, bit for bit."""
    batches = {}
    for name in ("torchrl", "lean"):
        env = make_env("CartPole-v1", num_envs=3, seed=0)
        torch.manual_seed(0)
        actor, _ = mlp_actor_critic(
            4, 2, num_cells=[16], action_spec=env.action_spec[0]
        )
        actor = actor.to(device)
        torch.manual_seed(1)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(1)
        if name == "torchrl":
            collector = Collector(
                env,
                actor,
                frames_per_batch=3 * 30,
                total_frames=-1,
                policy_device=device,
                storing_device="cpu",
                auto_register_policy_transforms=False,
            )
        else:
            collector = GymVectorCollector(
                env, actor, frames_per_batch=3 * 30, policy_device=device
            )
        iterator = iter(collector)
        batches[name] = [next(iterator) for _ in range(2)]
        collector.shutdown()
    for expected, got in zip(batches["torchrl"], batches["lean"], strict=True):
        assert got.device == torch.device("cpu")
        assert set(got.keys(True, True)) == set(expected.keys(True, True))
        for key in expected.keys(True, True):
            a, b = expected.get(key), got.get(key)
            assert a.dtype == b.dtype and torch.equal(a, b.to(a.device)), key
    assert batches["lean"][1]["next", "done"].any()  # episodes ended on the way


def test_atari_trainer_with_the_learner_on_the_device(device, tmp_path):
    pytest.importorskip("ale_py")
    from torchrl_acer.training.atari import make_atari_env

    T = 5
    torch.manual_seed(0)
    env = make_atari_env("ALE/Breakout-v5", num_envs=2, seed=0)
    spec = env.action_spec[0]
    actor, critic = atari_actor_critic(spec.shape[-1], action_spec=spec)
    trainer = make_device_trainer(
        env,
        make_atari_env("ALE/Breakout-v5", num_envs=1, seed=1, training_signals=False),
        actor,
        critic,
        FrameStackReplayBuffer(2, 100, T, 2),
        device,
        T,
        tmp_path,
        batches=3,
    )
    trainer.loss_module.set_keys(**ATARI_KEYS)
    trainer.train()
    check_trained_on(trainer, device, batches=3)
    trainer.evaluation.evaluate.close()


def test_weights_pushed_to_worker_processes_travel_on_the_cpu(device, tmp_path):
    """A learner on the device pushes its weights to the collector's worker
    processes (acting on the CPU) as CPU tensors: workers given the device's
    tensors would open them through CUDA IPC, each starting a CUDA context."""
    from builders import small_gym_config, small_pieces

    from torchrl_acer.training import experiment

    cfg = small_gym_config(
        **{"collector.backend": "multiprocess", "collector.num_workers": 1}
    )
    pieces = small_pieces(cfg, device=device)
    collector = pieces["collector"]
    pushed = []  # the device of every tensor the trainer's hooks push
    push = collector.update_policy_weights_

    def recorded(*args, **kwargs):
        for weights in (*args, *kwargs.get("weights_dict", {}).values()):
            pushed.extend(t.device for t in weights.values(True, True))
        return push(*args, **kwargs)

    collector.update_policy_weights_ = recorded
    trainer = experiment.make_trainer(cfg, tmp_path, **pieces, logger=None)
    try:
        trainer.train()
    finally:
        experiment.close(trainer)
    assert trainer.collected_frames == trainer.total_frames
    assert pushed and {d.type for d in pushed} == {"cpu"}
