"""bench/_common.package_at: a git revision of the package, imported beside today's
(``bench/loss.py --against REV`` times both in one process)."""

import copy
import sys
from pathlib import Path

import torch
from builders import _bench_common, table_actor_critic, table_batch

import torchrl_acer

ROOT = Path(__file__).parents[2]


def test_a_revision_runs_beside_todays_package_on_its_own_modules():
    old = _bench_common().package_at("HEAD")
    assert old.__name__ == "torchrl_acer_at_HEAD"
    assert old.ACERLoss is not torchrl_acer.ACERLoss
    folder = Path(old.__file__).parent
    assert not folder.is_relative_to(ROOT)
    # its own imports are renamed: each module it loaded is one of its files
    loaded = [m for name, m in sys.modules.items() if name.startswith(old.__name__)]
    assert len(loaded) > 5
    assert all(Path(m.__file__).is_relative_to(folder) for m in loaded)
    assert _bench_common().package_at("HEAD") is old  # imported once
    # HEAD's loss is today's (a clean checkout): the same losses on the same batch
    batch, _, S = table_batch(2, 6, 3, dones=[(0, 2)], terminations=[(1, 4)])
    actor, critic, _, _ = table_actor_critic(S, 3)
    losses = [
        package.ACERLoss(copy.deepcopy(actor), copy.deepcopy(critic))(batch.clone())
        for package in (torchrl_acer, old)
    ]
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(losses[0][key], losses[1][key], rtol=0, atol=0)
