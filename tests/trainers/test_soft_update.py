"""The averaged policy as the new trainer keeps it: TorchRL's SoftUpdate
(``ACERTrainer``'s ``target_net_updater``, stepped after every optimizer step),
the exponential average of the policy, that keeps following the live parameters
after a resume loads the loss's state in place (``upstream/torchrl/0007``'s lists
of tensors, gathered at the first step, must stay the live ones)."""

import copy

import pytest
import torch
from builders import small_trainer
from torchrl.objectives import SoftUpdate

from torchrl_acer import ACERLoss
from torchrl_acer.modules.models import mlp_actor_critic


def make_loss(shared):
    torch.manual_seed(0)
    actor, critic = mlp_actor_critic(4, 3, num_cells=[8, 8], shared=shared)
    return ACERLoss(actor, critic)


def perturb(loss, seed):
    """An optimizer step's stand-in: every trained parameter moves."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in loss.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g))


def targets(loss):
    return {
        k: v.clone()
        for k, v in loss.state_dict().items()
        if k.startswith("target_") or "target_" in k
    }


def sources(loss, keys):
    """The live parameter each averaged entry follows."""
    live = dict(loss.named_parameters())
    out = {k: k.replace("target_", "", 1) for k in keys}
    assert all(source in live for source in out.values()), out
    return {k: live[source].detach().clone() for k, source in out.items()}


@pytest.mark.parametrize("shared", [False, True])
def test_averaged_policy_is_the_exponential_average_of_the_policy(shared):
    loss = make_loss(shared)
    updater = SoftUpdate(loss, eps=0.9)
    expected = targets(loss)
    assert expected  # the averaged policy's parameters are in the state dict
    before = dict(expected)
    for seed in range(5):
        perturb(loss, seed)
        live = sources(loss, expected)
        expected = {k: 0.9 * v + 0.1 * live[k] for k, v in expected.items()}
        updater.step()
    got = targets(loss)
    assert got.keys() == expected.keys()
    for k in got:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-6)
    # and it moved: a step that did nothing would fail here
    assert any(not torch.equal(got[k], before[k]) for k in got)


def test_keeps_updating_after_load_state_dict():
    """A resumed trainer loads the loss's state in place: the tensors the
    updater steps must still be the live ones."""
    loss = make_loss(False)
    updater = SoftUpdate(loss, eps=0.5)
    perturb(loss, 0)
    updater.step()
    saved = copy.deepcopy(loss.state_dict())
    perturb(loss, 1)
    loss.load_state_dict(saved)
    perturb(loss, 2)
    before = targets(loss)
    updater.step()
    after = targets(loss)
    moved = [k for k in after if not torch.equal(after[k], before[k])]
    assert moved
    live = sources(loss, moved)
    # each moved halfway to its source parameter (eps=0.5)
    for k in moved:
        torch.testing.assert_close(after[k], 0.5 * before[k] + 0.5 * live[k])


def test_the_trainer_averages_with_softupdate_at_the_configs_alpha(tmp_path):
    trainer = small_trainer(tmp_path)
    updater = trainer.target_net_updater
    assert type(updater) is SoftUpdate and updater.loss_module is trainer.loss_module
    assert float(updater.eps) == pytest.approx(0.99)  # config_gym's loss.alpha
    trainer.collector.shutdown()
    trainer.evaluation.evaluate.close()
