"""The training loop's plumbing: what replay stores, the optimizer it builds."""

import torch
from builders import close_trainer, small_trainer
from omegaconf import OmegaConf
from tensordict.utils import unravel_key

from torchrl_acer.training.experiment import make_optimizer


def test_replay_stores_only_what_the_loss_reads(tmp_path):
    trainer = small_trainer(tmp_path, **{"collector.total_frames": 20})
    trainer.train()
    replay = trainer.schedule.replay_buffer
    stored = replay.storage[: len(replay)]
    # "index": the buffer's own bookkeeping, written by TensorDictReplayBuffer
    keys = {unravel_key(k) for k in stored.keys(True, True)} - {"index"}
    wanted = {unravel_key(k) for k in trainer.loss_module.in_keys}
    assert keys == wanted, (keys - wanted, wanted - keys)
    # episode returns are still counted from the collected batch
    assert ("next", "episode_reward") not in keys
    # and a replayed update runs on what was stored
    stepper = trainer.optimization_stepper
    updates = stepper.optimizer_step_count
    stepper.step(trainer, replay.sample())
    assert stepper.optimizer_step_count == updates + 1
    close_trainer(trainer)


def _steps(optimizer, params, n=5):
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return [p.detach().clone() for p in params]


def test_adam_is_fused_and_agrees_with_the_default():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    ref = [p.detach().clone().requires_grad_() for p in net.parameters()]
    cfg = OmegaConf.create({"name": "adam", "lr": 1e-2, "eps": 1e-5, "decay": 0.99})
    ours = make_optimizer(cfg, net.parameters())
    assert ours.param_groups[0]["fused"] is True
    got = _steps(ours, list(net.parameters()))
    want = _steps(torch.optim.Adam(ref, lr=1e-2, eps=1e-5), ref)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_rmsprop_runs_over_tensor_lists():
    net = torch.nn.Linear(4, 2)
    cfg = OmegaConf.create({"name": "rmsprop", "lr": 1e-3, "eps": 1e-5, "decay": 0.99})
    assert make_optimizer(cfg, net.parameters()).param_groups[0]["foreach"] is True
