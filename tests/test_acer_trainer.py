"""ACERTrainer, TorchRL's Trainer wired for ACER: its schedule, its hooks, and the
old trainer's parameters reached at the same seed."""

import pytest
import torch
from test_trainer import make_trainer
from torchrl.trainers import Trainer

from torchrl_acer.trainers.acer import ACERTrainer, ACERUpdateSchedule, as_segments


def new_trainer_like(old, **kwargs):
    """An ACERTrainer over the old trainer's own pieces (collector, loss, optimizer,
    replay), with its settings."""
    return ACERTrainer(
        collector=old.collector,
        total_frames=old.total_frames,
        loss_module=old.loss_module,
        optimizer=old.optimizer,
        replay_buffer=old.replay_buffer,
        replay_ratio=old.replay_ratio,
        replay_start=old.replay_start,
        target_net_updater=old.target_updater,
        clip_norm=old.max_grad_norm,
        progress_bar=False,
        seed=None,
        **kwargs,
    )


@pytest.mark.parametrize("backend", ["lean", "single"])
def test_reaches_the_old_trainers_parameters_after_three_iterations(tmp_path, backend):
    settings = {"collector.backend": backend, "collector.total_frames": 30}
    old = make_trainer(tmp_path / "old", **settings)
    it = iter(old.collector)
    for _ in range(3):
        old.train_on_batch(next(it))
    expected = old.loss_module.state_dict()
    assert old.updates > 3  # replayed updates happened too
    old.close()

    pieces = make_trainer(tmp_path / "new", **settings)  # same seed, fresh pieces
    trainer = new_trainer_like(pieces)
    trainer.schedule.generator.manual_seed(0)  # the old trainer's Poisson stream
    trainer.train()
    assert trainer.collected_frames == 30
    got = pieces.loss_module.state_dict()
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=key)
    pieces.close()
