"""Continuous-action ACER (paper section 5) on Box-action gymnasium tasks.

    python examples/acer_mujoco.py                        # HalfCheetah-v5 (mujoco extra)
    python examples/acer_mujoco.py env.name=Pendulum-v1   # no MuJoCo needed

Settings are in ``config_mujoco.yaml`` (with the run settings all examples share in
``run/default.yaml``): the paper's continuous ACER (fully
off-policy, T = 50, averaged-policy decay 0.995, c = 5) with a fixed policy scale
of 0.1 and a trust-region bound of 2 (with the paper's scale 0.3, HalfCheetah-v5
learned more slowly and ended lower; with a bound of 1 it ended a little lower, by
less than the spread between seeds). The environments and networks are in
``utils_mujoco.py``.
The policy is a Gaussian MLP whose mean is squashed into the action bounds
(``model.bound_mean``; the Gaussian itself is not squashed), the critic a stochastic dueling network
(:class:`torchrl_acer.StochasticDuelingNetwork`); actions are clipped to the
action bounds by the environment, so the policy's log-probabilities stay exact.

The script builds each piece in turn (environment, networks, loss, optimizer,
collector, replay, evaluator, logger) and hands them to
:class:`torchrl_acer.trainers.ACERTrainer`, TorchRL's ``Trainer`` wired for ACER's
loop. What all examples add around it (checkpoints, the guards, evaluation and
logs as trainer hooks; the run directory, resume and the final summary) is
:mod:`torchrl_acer.training.experiment`'s ``make_trainer`` and ``train``.
"""

import functools

import hydra
from omegaconf import DictConfig
from utils_mujoco import make_env, make_models

from torchrl_acer.training.experiment import (
    make_collector,
    make_evaluator,
    make_logger,
    make_loss,
    make_optimizer,
    make_replay,
    make_trainer,
    setup,
    train,
)
from torchrl_acer.training.refusal import report_refusals


@hydra.main(config_path=".", config_name="config_mujoco", version_base="1.3")
@report_refusals  # a refusal ends with its message alone (HYDRA_FULL_ERROR=1: traceback)
def main(cfg: DictConfig) -> None:
    # -- config checked (refusing values that cannot work, naming the setting), run
    # directory (logs, checkpoints, config.yaml, summary.json), device (networks,
    # loss, optimizer; envs on the CPU), threads and seed
    run_dir, device = setup(cfg)

    # -- environment: num_envs copies stepped together -------------------------------
    env = make_env(cfg, cfg.env.num_envs, seed=cfg.seed)

    # -- models: the Gaussian policy (actor) and the dueling critic ------------------
    actor, critic = make_models(cfg, env)
    actor, critic = actor.to(device), critic.to(device)

    # -- loss: ACER's policy, critic and entropy terms, Retrace targets --------------
    loss = make_loss(cfg.loss, actor, critic)
    if cfg.compile:
        loss.compile()  # its forward only: parameters and checkpoints stay as they are

    # -- optimizer (the trainer keeps the averaged policy: SoftUpdate, loss.alpha) ---
    optimizer = make_optimizer(cfg.optim, loss.parameters())

    # -- collector: [num_envs, T] batches, with the behaviour log-probabilities ------
    # collector.backend: this process, or num_workers processes or Ray actors, each
    # stepping num_envs envs with a copy of the policy the trainer keeps updated
    collector = make_collector(
        cfg, functools.partial(make_env, cfg), actor, device=device, env=env
    )

    # -- replay: segments of T steps (replay.ratio 0: none) --------------------------
    replay = make_replay(cfg)

    # -- evaluator (greedy policy, one episode per env) and logger -------------------
    evaluator = make_evaluator(cfg, functools.partial(make_env, cfg), actor)
    logger = make_logger(cfg.logger.backend, run_dir)  # csv: step,value rows

    # -- the loop: ACERTrainer with the run settings' hooks (checkpoints, guards,
    # evaluation, logs), then the final summary: summary.json, the last greedy
    # evaluation, the plot
    trainer = make_trainer(
        cfg,
        run_dir,
        collector=collector,
        loss=loss,
        optimizer=optimizer,
        replay=replay,
        evaluator=evaluator,
        logger=logger,
    )
    train(trainer, cfg, run_dir)


if __name__ == "__main__":
    main()
