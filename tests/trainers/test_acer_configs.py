"""ACER's Hydra configs: registered beside TorchRL's, built into a training
trainer by examples/acer_trainer/train.py, and refusing values that cannot work."""

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from torchrl_acer.objectives import ACERLoss
from torchrl_acer.trainers.acer import ACERTrainer
from torchrl_acer.trainers.configs import (
    ACERLossConfig,
    ACERTrainerConfig,
    register_configs,
)

CONFIG_DIR = Path(__file__).parents[2] / "examples" / "acer_trainer" / "config"


def test_example_config_builds_and_trains_an_acer_trainer(tmp_path):
    import torchrl.trainers.algorithms.configs  # noqa: F401  (TorchRL's groups)

    register_configs()
    overrides = [
        "trainer.total_frames=320",
        "trainer.replay_start=0",
        "trainer.progress_bar=false",
        "trainer.log_interval=1",
        f"logger.log_dir={tmp_path}",
    ]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    trainer = instantiate(cfg.trainer)
    assert isinstance(trainer, ACERTrainer)
    loss = trainer.loss_module
    assert isinstance(loss, ACERLoss) and loss.value_estimator.gamma == 0.99
    before = {k: v.clone() for k, v in loss.state_dict().items()}
    trainer.train()
    assert trainer.collected_frames == 320
    changed = [k for k, v in loss.state_dict().items() if not torch.equal(v, before[k])]
    assert any("target_actor" in k for k in changed)  # the averaged policy moved
    assert any(k.startswith("actor_network") for k in changed)
    # the hook from the config logged, as did the trainer's loss averages
    logged = {p.stem for p in tmp_path.rglob("*.csv")}
    assert {"r_training_max", "loss_objective", "loss_critic"} <= logged


def test_example_script_is_short():
    script = CONFIG_DIR.parent / "train.py"
    assert len(script.read_text().splitlines()) <= 30


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("ratio_clip", 0.0, "ratio_clip=0.0 must be a number > 0"),
        ("trust_region_delta", -1.0, "trust_region_delta=-1.0"),
        (
            "trust_region_space",
            "probabilities",
            "trust_region_space='probabilities' must be",
        ),
        ("entropy_coeff", math.nan, "entropy_coeff=nan must be a finite number"),
        ("critic_coeff", -0.5, "critic_coeff=-0.5"),
        ("gamma", 1.5, r"gamma=1.5 must be a finite number in \(0, 1\]"),
        ("burn_in", 2.5, "burn_in=2.5 must be an integer >= 0"),
        ("check_values", "yes", "check_values='yes' must be true or false"),
    ],
)
def test_loss_config_refuses_values_naming_the_field(field, value, match):
    with pytest.raises(ValueError, match=f"ACERLossConfig: {match}"):
        ACERLossConfig(**{field: value})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"replay_ratio": math.inf}, "replay_ratio=inf must be a finite number"),
        ({"replay_start": -1}, "replay_start=-1"),
        ({"alpha": 1.0}, r"alpha=1.0 must be a finite number in \[0, 1\)"),
        (
            {"replay_ratio": 0.0, "on_policy_updates": False},
            "on_policy_updates=false must be true",
        ),
        ({"clip_norm": 0}, "clip_norm=0"),
        ({"total_frames": True}, "total_frames=true"),
    ],
)
def test_trainer_config_refuses_values_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=f"ACERTrainerConfig: {match}"):
        ACERTrainerConfig(**kwargs)


def test_configs_are_in_hydras_config_store():
    from hydra.core.config_store import ConfigStore

    register_configs()
    repo = ConfigStore.instance().repo
    assert "acer.yaml" in repo["loss"] and "acer.yaml" in repo["trainer"]
    assert "categorical_actor.yaml" in repo["model"]
    assert "gym_vector.yaml" in repo["env"]
