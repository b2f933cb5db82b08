"""ForeachSoftUpdate against TorchRL's SoftUpdate: the same averaged policy."""

import copy

import pytest
import torch
from torchrl.objectives import SoftUpdate

from torchrl_acer import ACERLoss
from torchrl_acer.modules.models import mlp_actor_critic
from torchrl_acer.training.soft_update import ForeachSoftUpdate


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


@pytest.mark.parametrize("shared", [False, True])
def test_same_averaged_policy_as_softupdate(shared):
    ours, theirs = make_loss(shared), make_loss(shared)
    a, b = ForeachSoftUpdate(ours, eps=0.9), SoftUpdate(theirs, eps=0.9)
    before = targets(ours)
    assert before  # the averaged policy's parameters are in the state dict
    for seed in range(5):
        perturb(ours, seed)
        perturb(theirs, seed)
        a.step()
        b.step()
    got, want = targets(ours), targets(theirs)
    assert got.keys() == want.keys()
    for k in got:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6)
    # and it moved: a step that did nothing would fail here
    assert any(not torch.equal(got[k], before[k]) for k in got)


def test_keeps_updating_after_load_state_dict():
    """A resumed trainer loads the loss's state in place: the lists gathered at
    the first step must still be the live tensors."""
    loss = make_loss(False)
    updater = ForeachSoftUpdate(loss, eps=0.5)
    perturb(loss, 0)
    updater.step()
    saved = copy.deepcopy(loss.state_dict())
    perturb(loss, 1)
    loss.load_state_dict(saved)
    live = dict(loss.named_parameters())
    perturb(loss, 2)
    before = targets(loss)
    updater.step()
    after = targets(loss)
    moved = [k for k in after if not torch.equal(after[k], before[k])]
    assert moved
    # each moved halfway to its source parameter (eps=0.5)
    sources = {k: k.replace("target_", "", 1) for k in moved}
    assert all(source in live for source in sources.values()), sources
    for k, source in sources.items():
        torch.testing.assert_close(
            after[k], 0.5 * before[k] + 0.5 * live[source].detach()
        )


def test_state_dict_is_softupdates():
    loss = make_loss(False)
    theirs = SoftUpdate(loss, eps=0.99)
    ours = ForeachSoftUpdate(make_loss(False), eps=0.99)
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict() == theirs.state_dict()
