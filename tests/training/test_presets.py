"""The gym example's presets (``examples/preset/*.yaml``, ``preset=NAME``): each
replaces its settings in the composed config, what the command line sets still wins,
and the values reach the trainer the example builds."""

from pathlib import Path

import pytest
from builders import close_trainer, small_trainer
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import nn

EXAMPLES = Path(__file__).parents[2] / "examples"
PRESETS = sorted(p.stem for p in (EXAMPLES / "preset").glob("*.yaml"))


def composed(*overrides):
    """``config_gym`` as ``python examples/acer_gym.py *overrides`` gets it."""
    with initialize_config_dir(config_dir=str(EXAMPLES), version_base="1.3"):
        cfg = compose("config_gym", overrides=list(overrides))
    OmegaConf.set_struct(cfg, False)
    return cfg


def leaves(node, prefix=""):
    """``{dotted key: value}`` of every leaf of a config (lists are leaves)."""
    out = {}
    for key, value in node.items():
        if OmegaConf.is_dict(value):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = (
                OmegaConf.to_container(value) if OmegaConf.is_list(value) else value
            )
    return out


def preset_values(name):
    return leaves(OmegaConf.load(EXAMPLES / "preset" / f"{name}.yaml"))


def test_default_preset_is_the_config_as_it_is():
    assert "default" in PRESETS and preset_values("default") == {}
    assert composed() == composed("preset=default")


@pytest.mark.parametrize("name", [p for p in PRESETS if p != "default"])
def test_a_preset_sets_its_values_and_the_command_line_wins(name):
    values = preset_values(name)
    assert values, f"examples/preset/{name}.yaml sets nothing"
    plain, cfg = leaves(composed()), leaves(composed(f"preset={name}"))
    assert set(values) <= set(plain), "a preset key the config does not have"
    for key, value in values.items():
        assert cfg[key] == value, key
    # only the preset's keys differ from the defaults
    assert {k for k in plain if plain[k] != cfg[k]} <= set(values)
    assert composed(f"preset={name}", "optim.lr=0.123").optim.lr == 0.123


def test_classic_control_values_reach_the_trainer(tmp_path):
    values = preset_values("classic_control")
    cfg = composed("preset=classic_control")
    # the run kept short: none of these keys is the preset's
    small = {
        "collector.total_frames": 2 * values["env.num_envs"] * values["collector.T"],
        "eval.interval": None,
        "logger.backend": None,
        "logger.progress_bar": False,
        "checkpoint.every_minutes": None,
    }
    assert not set(small) & set(values)
    for key, value in small.items():
        OmegaConf.update(cfg, key, value)
    trainer = small_trainer(tmp_path, cfg)
    try:
        loss = trainer.loss_module
        assert trainer.optimizer.param_groups[0]["lr"] == values["optim.lr"]
        assert values["optim.max_grad_norm"] is None and not trainer.clip_grad_norm
        assert loss.value_estimator.gamma == pytest.approx(values["loss.gamma"])
        assert loss.entropy_coeff == pytest.approx(values["loss.entropy_coeff"])
        assert loss.critic_coeff == pytest.approx(values["loss.critic_coeff"])
        assert loss.ratio_clip == pytest.approx(values["loss.ratio_clip"])
        assert loss.trust_region_delta == values["loss.trust_region_delta"]
        assert trainer.target_net_updater.eps == pytest.approx(values["loss.alpha"])
        assert trainer.schedule.replay_ratio == values["replay.ratio"]
        assert trainer.schedule.replay_start == values["replay.start"]
        assert trainer.replay_buffer.batch_size == values["replay.batch_segments"]
        layers = [m for m in loss.actor_network.modules() if isinstance(m, nn.Linear)]
        assert [m.out_features for m in layers[:-1]] == values["model.num_cells"]
        batch = next(iter(trainer.collector))
        assert tuple(batch.shape) == (values["env.num_envs"], values["collector.T"])
    finally:
        close_trainer(trainer)
