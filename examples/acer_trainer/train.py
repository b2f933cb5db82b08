"""ACER on CartPole-v1 from TorchRL's config system: ``python train.py``.

The trainer, loss, networks, collector and replay are all built from
``config/config.yaml`` by Hydra; override any of them from the command line
(``python train.py trainer.replay_ratio=8 loss.entropy_coeff=0.02``).
"""

import hydra
import torchrl.trainers.algorithms.configs  # noqa: F401  (registers TorchRL's)

from torchrl_acer.trainers.configs import register_configs

register_configs()


@hydra.main(config_path="config", config_name="config", version_base="1.3")
def main(cfg):
    trainer = hydra.utils.instantiate(cfg.trainer)
    trainer.train()


if __name__ == "__main__":
    main()
