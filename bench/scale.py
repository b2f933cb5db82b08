"""Throughput against collector workers, and the per-step costs of a scaling model.

    python bench/scale.py [--tasks minatar atari] [--configs ...] [--rounds 5]
                          [--batches 6] [--quick]
    python bench/scale.py --two-nodes [--frames 3000] [--quick]

**Side by side** (the default mode), for each task, every ``collector.backend``
configuration is built as its example builds it (``make_collector`` and the
example's ``make_env``/``make_models``/loss/optimizer/averaged policy) and handed
to :class:`~torchrl_acer.trainers.ACERTrainer` (``_common.bare_trainer``: the
hooks ``experiment.make_trainer`` wires for the loop, without checkpoints, logging
or evaluation), all of them alive at
once, then timed in interleaved rounds (each round times every configuration once,
in a rotating order, so that load from elsewhere hits all of them alike):

- ``single``: one Collector in the learner's process (today's loop);
- ``mp1_sync``, ``mp1_async``, ``mp2_sync``, ``mp2_async``: TorchRL's
  multi-process collectors with 1 or 2 worker processes;
- ``ray2_async``: TorchRL's RayCollector, 2 workers on a local Ray cluster
  started by ``make_collector`` (``ray.num_cpus`` null: this machine's cores).

Two measures per configuration and round, in agent steps per second (a
configuration's window collects about ``--batches`` single-process batches'
worth of steps, after as many untimed batches as it has workers, which drains
what its workers collected while the others were timed):

- collection only: the trainer's collector's iterator, no learning;
- the whole loop: that iterator and ``_common.train_on_batch`` (the body of
  ``Trainer.train``'s loop), as ``bench/loop.py`` drives the trainer (the example's replay ratio, updates, weight pushes, health
  checks; evaluation, logging and checkpoints off; replay from the first batch,
  and a replay smaller than the example's, which changes no per-update cost).

Medians over rounds, and ratios to ``single``. The learner's torch threads are
each configuration's own: TorchRL's multi-process collectors lower the learner
process's threads to ``max(1, threads - workers)`` when built, as they do in the
example; each window restores its configuration's count. The share of the
machine's CPU time that was busy during each window (``/proc/stat``, every
process on the machine, the background ones included) is recorded, to tell
where the cores saturate.

Per-step costs, for a scaling model (medians of interleaved rounds,
``_common.interleaved_medians``):

- ``env_step``: the vector environment stepped by its own library with random
  actions (gymnasium's ``SyncVectorEnv`` for MinAtar, the ALE's C++
  ``AtariVectorEnv`` for Atari: the objects the examples wrap), per agent step;
- ``torchrl_env_step``: the same through TorchRL's wrapper and the example's
  transforms, per agent step;
- ``policy_forward``: the workers' policy (a no-grad
  :class:`~torchrl_acer.trainers.hooks.VersionedPolicy` copy) on one vector
  step's observations, on one thread as in a worker, per agent step;
- ``update_on_policy`` / ``update_replayed``: ``_common.update`` (the trainer's
  stepper: the loss's forward and backward, clipping, checks, the optimizer step;
  then its ``post_optim`` hooks: the averaged-policy step) on a collected ``[num_envs, T]`` batch and on a replayed one (sampling
  included), per update and per sample; with the replay ratio, the learner's
  seconds per collected agent step;
- ``ray_transfer``: a remote call returning one collected batch from a Ray actor
  on this node, against the same call returning nothing (the difference is the
  transfer of a batch through Ray's object store);
- ``weight_push``: the trainer's push of the policy weights to the workers
  (``UpdateWeights``' call of the collector's ``update_policy_weights_``),
  timed inside the loop windows, per push.

A ``model`` section puts these together: collector cost per agent step on one
core (from ``mp1_async`` collection alone), the learner's cost per agent step,
and the steps per second predicted for 1-64 collector cores feeding one CPU
learner, the smaller of the collectors' rate and the learner's. It is a
prediction from the measured costs, not a measurement.

Atari replay: the example's frame-lean ``FrameStackReplayBuffer``
(``experiment.make_replay(cfg, frame_stacks=True)``), one ring per environment of each worker, built
for the configuration's number of workers as the example builds it. A
collection-only window stores nothing, so each worker's first batch after it
continues nothing stored and serves as frame history only (the buffer warns and
counts it); the untimed batches at the start of every window absorb that.

**Two Ray nodes on this machine** (``--two-nodes``): starts a head node
(``ray start --head --num-cpus=1``, a temp dir of its own) and a second raylet
joining it (``ray start --address=127.0.0.1:<port> --num-cpus=1``), runs
``examples/acer_gym.py`` on MinAtar/Breakout-v1 with ``collector.backend=ray
ray.address=127.0.0.1:<port> collector.num_workers=2`` for ``--frames`` frames,
reads from the cluster's actor table which node each of the run's collector
actors ran on, and times a batch's transfer from an actor on each node. It
always stops the processes of the cluster it started, and only those (by their
process ids; ``ray stop`` would stop every Ray on the machine).

Results: ``bench/results/scale-<stamp>.json`` and
``bench/results/scale_two_nodes-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(EXAMPLES))
from _common import (  # noqa: E402
    UpdateTimer,
    bare_trainer,
    close,
    example_config,
    interleaved_medians,
    save,
    start,
    train_on_batch,
    update,
    updates,
)

from torchrl_acer.trainers import ACERTrainer, make_segment_replay_buffer  # noqa: E402
from torchrl_acer.trainers.hooks import VersionedPolicy  # noqa: E402
from torchrl_acer.training.experiment import (  # noqa: E402
    check_config,
    collector_workers,
    make_collector,
    make_loss,
    make_optimizer,
)
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer  # noqa: E402

# name -> (collector.backend, collector.num_workers, collector.sync, threads):
# threads None is the example's default (torch's own count, lowered by TorchRL's
# multi-process collectors); single_1t is the default loop with threads=1, as the
# learning runs use it (and as the multi-process collectors leave the learner)
CONFIGS = {
    "single": ("single", 1, False, None),
    "single_1t": ("single", 1, False, 1),
    "mp1_sync": ("multiprocess", 1, True, None),
    "mp1_async": ("multiprocess", 1, False, None),
    "mp2_sync": ("multiprocess", 2, True, None),
    "mp2_async": ("multiprocess", 2, False, None),
    "ray2_async": ("ray", 2, False, None),
}

# task -> (example config, env.name)
TASKS = {
    "minatar": ("gym", "MinAtar/Breakout-v1"),
    "atari": ("atari", "ALE/Breakout-v5"),
}

# the replay the benchmark keeps (steps, all rows); the examples' are 100 000
# (MinAtar) and 800 000 (Atari, 6 GB): the cost of an update or a sample does not
# depend on it, and six trainers must fit in memory beside the machine's others
REPLAY_STEPS = 16_000


def load_config(task: str, backend: str, workers: int, sync: bool):
    """The example's config, as Hydra composes it, for one configuration."""
    example, env_name = TASKS[task]
    cfg = example_config(f"config_{example}")
    settings = {
        "env.name": env_name,
        "collector.backend": backend,
        "collector.num_workers": workers,
        "collector.sync": sync,
        "replay.start": 0,
        "replay.capacity": REPLAY_STEPS,
        "logger.backend": None,
        "logger.progress_bar": False,
    }
    for key, value in settings.items():
        OmegaConf.update(cfg, key, value)
    check_config(cfg)
    return cfg


def make_trainer(task: str, cfg, pieces: dict | None = None) -> ACERTrainer:
    """The example's pieces for ``cfg`` (``examples/acer_gym.py`` or
    ``examples/acer_atari.py``), without evaluation, logging or checkpoints."""
    torch.manual_seed(cfg.seed)
    if task == "atari":
        import utils_atari as utils

        env = utils.make_env(cfg, cfg.env.num_envs, seed=cfg.seed)
        actor, critic = utils.make_models(env)
    else:
        import utils_gym as utils

        env = utils.make_env(cfg, cfg.env.num_envs, seed=cfg.seed)
        actor, critic = utils.make_models(cfg, env)
    loss = make_loss(cfg.loss, actor, critic)
    if task == "atari":
        loss.set_keys(**utils.TRAINING_KEYS)
    optimizer = make_optimizer(cfg.optim, loss.parameters())
    collector = make_collector(
        cfg, functools.partial(utils.make_env, cfg), actor, device="cpu", env=env
    )
    T, num_envs = cfg.collector.T, cfg.env.num_envs
    segments = cfg.replay.batch_segments or num_envs
    if task == "atari":
        workers = collector_workers(cfg)
        replay = FrameStackReplayBuffer(
            num_envs,
            REPLAY_STEPS // (workers * num_envs),
            T,
            segments,
            num_workers=workers,
        )
    else:
        replay = make_segment_replay_buffer(cfg.replay.capacity, T, segments)
    return bare_trainer(
        cfg, collector=collector, loss=loss, optimizer=optimizer, replay=replay
    )


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from ``/proc/stat``."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split()[1:9]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


class Setup:
    """One configuration's trainer, its iterator and its learner's threads."""

    def __init__(self, name, task, base_threads):
        backend, workers, sync, threads = CONFIGS[name]
        self.name, self.workers = name, workers
        self.cfg = load_config(task, backend, workers, sync)
        # as a fresh example process has them (with threads=N, set before the
        # collector is built)
        torch.set_num_threads(threads or base_threads)
        began = time.perf_counter()
        self.trainer = make_trainer(task, self.cfg)
        # the example's learner runs with what the collector left it
        self.threads = torch.get_num_threads()
        self.build_s = time.perf_counter() - began
        self.push_s: list[float] = []
        collector = self.trainer.collector
        original = collector.update_policy_weights_  # PolicyVersion's, if any

        def timed_push(*args, **kwargs):
            tick = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.push_s.append(time.perf_counter() - tick)

        collector.update_policy_weights_ = timed_push
        self.iterator = start(self.trainer)  # pushes the first weights

    def warm_up(self, train: bool):
        # drains what the workers collected while other configurations ran
        for _ in range(self.workers):
            batch = next(self.iterator)
            if train:
                train_on_batch(self.trainer, batch)

    def window(self, steps: int, train: bool) -> dict:
        torch.set_num_threads(self.threads)
        self.warm_up(train)
        trainer = self.trainer
        before, dropped = updates(trainer), self.dropped_batches()
        pushes = len(self.push_s)
        collect_s, done, batches = 0.0, 0, 0
        busy0, total0 = cpu_times()
        begin = time.perf_counter()
        with UpdateTimer(trainer) as update_s:
            while done < steps:
                tick = time.perf_counter()
                batch = next(self.iterator)
                collect_s += time.perf_counter() - tick
                done += batch.numel()
                batches += 1
                if train:
                    train_on_batch(trainer, batch)
        elapsed = time.perf_counter() - begin
        busy1, total1 = cpu_times()
        out = {
            "steps_per_s": done / elapsed,
            "steps": done,
            "batches": batches,
            "seconds": elapsed,
            "collect_fraction": collect_s / elapsed,
            "machine_cpu_busy": (busy1 - busy0) / max(total1 - total0, 1e-9),
            "loadavg_1min": os.getloadavg()[0],
        }
        if train:
            out["updates"] = updates(trainer) - before
            out["update_fraction"] = update_s.seconds / elapsed
            out["dropped_batches"] = self.dropped_batches() - dropped
            window_pushes = self.push_s[pushes:]
            out["pushes"] = len(window_pushes)
            out["push_fraction"] = sum(window_pushes) / elapsed
        return out

    def dropped_batches(self) -> int:
        """Batches dropped for their policy lag (``PolicyVersion``'s count; none
        without a multi-process or Ray collector)."""
        version = getattr(self.trainer, "policy_version", None)
        return 0 if version is None else version.dropped_batches

    def close(self):
        close(self.trainer)


@contextlib.contextmanager
def torch_threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _echo_actor_class():
    import ray

    @ray.remote(num_cpus=0)
    class BatchEcho:
        """Holds a batch and hands it out: ``get`` transfers it, ``noop`` is the
        same remote call without the batch."""

        def __init__(self, batch):
            self.batch = batch

        def get(self):
            return self.batch

        def noop(self):
            return None

        def node_id(self):
            return ray.get_runtime_context().get_node_id()

    return BatchEcho


def ray_transfer(batch, rounds, node_id=None) -> dict:
    """Seconds per remote call returning ``batch`` from an actor (on ``node_id``
    if given), against the same call returning nothing."""
    import ray

    options = {}
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_id, soft=False
        )
    actor = _echo_actor_class().options(**options).remote(batch)
    try:
        where = ray.get(actor.node_id.remote())
        times = interleaved_medians(
            {
                "get_batch_s": lambda: ray.get(actor.get.remote()),
                "noop_call_s": lambda: ray.get(actor.noop.remote()),
            },
            rounds,
            min_time=0.1,
        )
    finally:
        ray.kill(actor)
    return {
        **times,
        "transfer_s": times["get_batch_s"] - times["noop_call_s"],
        "batch_bytes": int(batch.bytes()),
        "batch_shape": list(batch.batch_size),
        "actor_node_id": where,
    }


def step_costs(task: str, single: Setup, rounds: int, with_ray: bool) -> dict:
    """The per-step costs of the scaling model (see the module's docstring)."""
    cfg, trainer = single.cfg, single.trainer
    num_envs, T = cfg.env.num_envs, cfg.collector.T
    if task == "atari":
        import utils_atari as utils
    else:
        import utils_gym as utils
    env = utils.make_env(cfg, num_envs, seed=cfg.seed + 999)
    vector = env.base_env._env  # the library's own vector env
    vector.reset(seed=cfg.seed)
    n_actions = int(vector.single_action_space.n)
    rng = np.random.default_rng(0)
    actions = iter(rng.integers(0, n_actions, size=(10**6, num_envs)))

    def env_step():
        vector.step(next(actions))

    tenv = utils.make_env(cfg, num_envs, seed=cfg.seed + 998)
    state = [tenv.reset()]

    def torchrl_env_step():
        _, state[0] = tenv.step_and_maybe_reset(tenv.rand_action(state[0]))

    acting = VersionedPolicy(
        copy.deepcopy(trainer.loss_module.actor_network).requires_grad_(False)
    )
    obs = tenv.reset()

    @torch.no_grad()
    def policy_forward():
        with torch_threads(1):  # as in a worker process or Ray actor
            acting(obs.clone())

    on_batch = next(single.iterator)
    if on_batch.ndim == 1:
        on_batch = on_batch.unsqueeze(0)

    def update_on_policy():
        update(trainer, on_batch)

    def update_replayed():
        update(trainer, trainer.replay_buffer.sample())

    def one_thread(fn):
        def run():
            with torch_threads(1):
                fn()

        return run

    def replay_sample():
        trainer.replay_buffer.sample()

    torch.set_num_threads(single.threads)
    medians = interleaved_medians(
        {
            "env_step": env_step,
            "torchrl_env_step": torchrl_env_step,
            "policy_forward": policy_forward,
            "update_on_policy": update_on_policy,
            "update_replayed": update_replayed,
            "update_on_policy_1t": one_thread(update_on_policy),
            "update_replayed_1t": one_thread(update_replayed),
            "replay_sample": replay_sample,
        },
        rounds,
        min_time=0.3,
    )
    env.close()
    tenv.close()
    sampled = trainer.replay_buffer.sample().batch_size
    replayed_samples = sampled[0] * sampled[1]
    on_samples = num_envs * T
    ratio = float(cfg.replay.ratio)
    costs = {
        "env_step_per_agent_step_s": medians["env_step"] / num_envs,
        "torchrl_env_step_per_agent_step_s": medians["torchrl_env_step"] / num_envs,
        "policy_forward_per_agent_step_s": medians["policy_forward"] / num_envs,
        "policy_forward_per_vector_step_s": medians["policy_forward"],
        "policy_forward_threads": 1,
        "on_policy_samples": on_samples,
        "replayed_samples": int(replayed_samples),
        "replay_ratio": ratio,
        "replay_sample_s": medians["replay_sample"],
    }
    for suffix, threads in (("", single.threads), ("_1t", 1)):
        on, off = (
            medians[f"update_on_policy{suffix}"],
            medians[f"update_replayed{suffix}"],
        )
        costs[f"learner{suffix}"] = {
            "threads": threads,
            "update_on_policy_s": on,
            "update_on_policy_per_sample_s": on / on_samples,
            "update_replayed_s": off,
            "update_replayed_per_sample_s": off / replayed_samples,
            # one on-policy and `ratio` replayed updates per collected batch
            "learner_per_agent_step_s": (on + ratio * off) / on_samples,
        }
    if with_ray:
        costs["ray_transfer"] = ray_transfer(on_batch, rounds)
    return costs


def model(task_result: dict) -> dict:
    """Predicted agent steps/s for N collector cores feeding one CPU learner."""
    costs = task_result["step_costs"]
    collect = task_result["collect"]["medians_steps_per_s"]
    worker = collect.get("mp1_async") or collect.get("single")
    per_core = 1.0 / worker  # one worker process on one core: env, policy, plumbing
    batch_steps = costs["on_policy_samples"]
    push = task_result["loop"].get("weight_push_median_s") or 0.0
    transfer = costs.get("ray_transfer", {}).get("transfer_s", 0.0)
    # one learner core: the updates on one thread
    learner = (
        costs["learner_1t"]["learner_per_agent_step_s"]
        + (push + transfer) / batch_steps
    )
    predictions = {str(n): min(n / per_core, 1.0 / learner) for n in (1, 2, 4, 16, 64)}
    return {
        "collector_core_per_agent_step_s": per_core,
        "collector_core_from": "mp1_async" if "mp1_async" in collect else "single",
        "learner_per_agent_step_s": learner,
        "learner_includes": "updates at the replay ratio on one thread, plus a "
        "weight push and a Ray transfer per batch",
        "learner_bound_steps_per_s": 1.0 / learner,
        "collector_cores_to_saturate_learner": per_core / learner,
        "predicted_steps_per_s": predictions,
        "note": "a prediction from the measured costs (collectors on their own "
        "cores, one learner on its own core(s), transfers free of CPU contention), "
        "not a measurement",
    }


def summarize(rounds: list[dict], key: str, configs: list[str]) -> dict:
    medians = {
        name: statistics.median(r[name]["steps_per_s"] for r in rounds)
        for name in configs
    }
    base = medians.get("single")
    out = {
        "medians_steps_per_s": medians,
        "ratios_to_single": {n: m / base for n, m in medians.items()} if base else {},
        "machine_cpu_busy_median": {
            name: statistics.median(r[name]["machine_cpu_busy"] for r in rounds)
            for name in configs
        },
    }
    if key == "loop":
        out["update_fraction_median"] = {
            name: statistics.median(r[name]["update_fraction"] for r in rounds)
            for name in configs
        }
    return out


def run_task(task: str, configs: list[str], args, base_threads: int) -> dict:
    print(f"== {task}: building {', '.join(configs)}", flush=True)
    setups = {}
    try:
        for name in configs:
            setups[name] = Setup(name, task, base_threads)
            print(
                f"  {name}: built in {setups[name].build_s:.1f} s, learner threads "
                f"{setups[name].threads}",
                flush=True,
            )
        num_envs = setups[configs[0]].cfg.env.num_envs
        T = setups[configs[0]].cfg.collector.T
        steps = args.batches * num_envs * T
        # fills some replay, so that every timed batch makes its replayed updates
        for name in configs:
            setups[name].window(args.prefill * num_envs * T, train=True)
        rounds = {"collect": [], "loop": []}
        for r in range(args.rounds):
            order = configs[r % len(configs) :] + configs[: r % len(configs)]
            for kind in ("collect", "loop"):
                entry = {}
                for name in order:
                    entry[name] = setups[name].window(steps, train=kind == "loop")
                    print(
                        f"  round {r} {kind:7s} {name:10s} "
                        f"{entry[name]['steps_per_s']:8.1f} steps/s "
                        f"(machine busy {entry[name]['machine_cpu_busy']:.0%})",
                        flush=True,
                    )
                rounds[kind].append(entry)
        result = {
            "settings": {
                "env": TASKS[task][1],
                "example_config": f"examples/config_{TASKS[task][0]}.yaml",
                "num_envs_per_worker": num_envs,
                "T": T,
                "replay_ratio": float(setups[configs[0]].cfg.replay.ratio),
                "replay_capacity_steps": REPLAY_STEPS,
                "replay_start": 0,
                "steps_per_window": steps,
                "prefill_steps": args.prefill * num_envs * T,
                "configs": {
                    name: {
                        "backend": CONFIGS[name][0],
                        "num_workers": CONFIGS[name][1],
                        "sync": CONFIGS[name][2],
                        "learner_threads": setups[name].threads,
                        "build_s": setups[name].build_s,
                        "replay": type(setups[name].trainer.replay_buffer).__name__,
                    }
                    for name in configs
                },
            },
            "collect": summarize(rounds["collect"], "collect", configs),
            "loop": summarize(rounds["loop"], "loop", configs),
            "rounds": rounds,
        }
        pushes = {
            name: statistics.median(s.push_s) for name, s in setups.items() if s.push_s
        }
        result["loop"]["weight_push_median_s_by_config"] = pushes
        ray_push = [v for n, v in pushes.items() if n.startswith("ray")]
        mp_push = [v for n, v in pushes.items() if n.startswith("mp")]
        result["loop"]["weight_push_median_s"] = (
            ray_push[0] if ray_push else (mp_push[0] if mp_push else None)
        )
        if task == "atari":
            result["settings"]["replay_note"] = (
                "the example's frame-lean FrameStackReplayBuffer, one ring per "
                "environment of each worker; a worker's first batch after a "
                "collection-only window is frame history only"
            )
        if "single" in setups:
            print(f"  {task}: per-step costs", flush=True)
            result["step_costs"] = step_costs(
                task,
                setups["single"],
                args.rounds,
                with_ray=any(CONFIGS[n][0] == "ray" for n in configs),
            )
            result["model"] = model(result)
        return result
    finally:
        for setup in setups.values():
            with contextlib.suppress(Exception):
                setup.close()


# -- two Ray nodes on this machine ------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_of(marker: str) -> list[int]:
    """Process ids whose command line holds ``marker`` (our cluster's temp dir),
    and all their descendants (Ray's workers rename themselves)."""
    cmdlines, parents = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    ours = {pid for pid, cmd in cmdlines.items() if marker.encode() in cmd}
    ours.discard(os.getpid())
    grew = True
    while grew:
        children = {pid for pid, ppid in parents.items() if ppid in ours} - ours
        children.discard(os.getpid())
        ours |= children
        grew = bool(children)
    return sorted(ours)


def stop_cluster(marker: str, grace: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, to the processes of the cluster whose temp dir is
    ``marker``; no other process is touched."""
    pids = _processes_of(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _processes_of(marker):
        time.sleep(0.5)
    for pid in _processes_of(marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start_node(temp_dir: str, head_port: int, head: bool, env: dict) -> dict:
    ports = {
        "node-manager-port": free_port(),
        "object-manager-port": free_port(),
        "dashboard-agent-listen-port": free_port(),
        "dashboard-agent-grpc-port": free_port(),
        "runtime-env-agent-port": free_port(),
        "metrics-export-port": free_port(),
    }
    cmd = [ray_cli(), "start", "--num-cpus=1", "--disable-usage-stats"]
    if head:
        cmd += [
            "--head",
            f"--port={head_port}",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
        ]
    else:
        cmd += [f"--address=127.0.0.1:{head_port}"]
    cmd += [f"--{key}={value}" for key, value in ports.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    return {
        "command": " ".join(cmd[1:]),
        "returncode": proc.returncode,
        "output_tail": (proc.stdout + proc.stderr)[-2000:],
    }


def two_nodes(args) -> dict:
    import ray

    temp_dir = tempfile.mkdtemp(prefix="ray_scale_", dir="/tmp")
    head_port = free_port()
    address = f"127.0.0.1:{head_port}"
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    # Ray 2.60's `ray start --head` turns token authentication on, and a node
    # joining it needs the token (a file in ~/.ray, or RAY_AUTH_TOKEN); this
    # cluster listens on loopback only and runs without (for every process of
    # it, this driver and the example's included)
    env["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if not args.bare_cluster:
        # the nodes' workers import the example's utils_gym (the driver's
        # make_env): make_collector gives them its folder only on a local Ray
        # it starts itself, not on a cluster it joins
        env["PYTHONPATH"] = os.pathsep.join(
            [
                str(EXAMPLES),
                *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p],
            ]
        )
    result: dict = {
        "address": address,
        "temp_dir": temp_dir,
        "examples_on_cluster_pythonpath": not args.bare_cluster,
    }
    try:
        result["head"] = start_node(temp_dir, head_port, True, env)
        if result["head"]["returncode"] != 0:
            raise RuntimeError(f"ray start --head failed: {result['head']}")
        result["worker_node"] = start_node(temp_dir, head_port, False, env)
        if result["worker_node"]["returncode"] != 0:
            raise RuntimeError(f"ray start --address failed: {result['worker_node']}")
        ray.init(address=address, log_to_driver=False)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        result["nodes"] = [
            {
                "node_id": n["NodeID"],
                "address": n["NodeManagerAddress"],
                "port": n["NodeManagerPort"],
                "cpus": n["Resources"].get("CPU"),
                "head": "node:__internal_head__" in n["Resources"],
            }
            for n in nodes
        ]
        print(f"cluster at {address}: {len(nodes)} nodes", flush=True)
        run_dir = Path(temp_dir) / "run"
        cmd = [
            sys.executable,
            str(EXAMPLES / "acer_gym.py"),
            "env.name=MinAtar/Breakout-v1",
            "collector.backend=ray",
            f"ray.address={address}",
            "collector.num_workers=2",
            f"collector.total_frames={args.frames}",
            "eval.interval=null",
            "eval.episodes=2",
            "eval.max_steps=200",
            "logger.log_interval=1000",
            "logger.progress_bar=false",
            f"logger.run_dir={run_dir}",
            "checkpoint.every_minutes=null",
            "threads=1",
        ]
        print(" ".join(cmd[1:]), flush=True)
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env=env, cwd=temp_dir, timeout=600
            )
        except subprocess.TimeoutExpired as err:
            # a stuck run (its collectors never started) is recorded, not waited on
            out = (err.stdout or b"") + (err.stderr or b"")
            proc = subprocess.CompletedProcess(
                cmd, "timeout", out.decode(errors="replace"), ""
            )
        elapsed = time.perf_counter() - start
        summary = run_dir / "summary.json"
        result["run"] = {
            "command": " ".join(cmd[1:]),
            "returncode": proc.returncode,
            "seconds": elapsed,
            "summary": json.loads(summary.read_text()) if summary.exists() else None,
            "output_tail": (proc.stdout + proc.stderr)[-3000:],
        }
        lag = run_dir / "logs" / "scalars" / "collector" / "policy_lag.csv"
        if lag.exists():
            result["run"]["policy_lag_rows"] = lag.read_text().splitlines()[-5:]
        # the run's collector actors, and the node each ran on (the actor table
        # keeps dead actors)
        from ray._private.state import actors

        table = actors()
        collectors = [
            {
                "actor_id": actor_id,
                "class": info.get("ActorClassName"),
                "node_id": (info.get("Address") or {}).get("NodeID"),
                "state": info.get("State"),
                "job_id": info.get("JobID"),
            }
            for actor_id, info in table.items()
            if "ollector" in str(info.get("ActorClassName"))
        ]
        result["collector_actors"] = collectors
        used = {c["node_id"] for c in collectors}
        result["collectors_on_both_nodes"] = (
            len(used & {n["node_id"] for n in result["nodes"]}) == 2
        )
        print(
            f"run: rc {proc.returncode} in {elapsed:.0f} s; collector actors on "
            f"{len(used)} node(s)",
            flush=True,
        )
        # a batch like the run's, from an actor on each node
        batch = _minatar_batch()
        result["ray_transfer_by_node"] = {
            ("head" if n["head"] else "worker_node"): ray_transfer(
                batch, args.transfer_rounds, n["node_id"]
            )
            for n in result["nodes"]
        }
        for where, t in result["ray_transfer_by_node"].items():
            print(
                f"transfer of a {t['batch_bytes'] / 1e6:.2f} MB batch from the "
                f"{where}: {1e3 * t['transfer_s']:.2f} ms (call "
                f"{1e3 * t['noop_call_s']:.2f} ms)",
                flush=True,
            )
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        result["stopped_pids"] = stop_cluster(temp_dir)
        result["left_running"] = _processes_of(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    return result


def _minatar_batch():
    """One collected batch of the gym example on MinAtar/Breakout-v1."""
    import utils_gym

    cfg = load_config("minatar", "single", 1, False)
    env = utils_gym.make_env(cfg, cfg.env.num_envs, seed=cfg.seed)
    actor, _ = utils_gym.make_models(cfg, env)
    collector = make_collector(
        cfg, functools.partial(utils_gym.make_env, cfg), actor, device="cpu", env=env
    )
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--batches",
        type=int,
        default=6,
        help="steps per window, in single-process batches (num_envs x T)",
    )
    parser.add_argument("--prefill", type=int, default=3, help="batches, untimed")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--two-nodes", action="store_true")
    parser.add_argument("--frames", type=int, default=3000, help="--two-nodes run")
    parser.add_argument("--transfer-rounds", type=int, default=7)
    parser.add_argument(
        "--bare-cluster",
        action="store_true",
        help="--two-nodes: start the nodes without examples/ on their PYTHONPATH",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.batches, args.prefill = 1, 2, 1
        args.transfer_rounds = 3
        args.frames = min(args.frames, 2000)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    base_threads = torch.get_num_threads()
    if args.two_nodes:
        result = two_nodes(args)
        result["settings"] = {
            "frames": args.frames,
            "quick": args.quick,
            "bare_cluster": args.bare_cluster,
        }
        path = save("scale_two_nodes", result)
        print(f"saved {path}")
        return
    tasks = {}
    for task in args.tasks:
        try:
            tasks[task] = run_task(task, list(args.configs), args, base_threads)
        except Exception:  # the other task still runs, and the file says why
            import traceback

            tasks[task] = {"error": traceback.format_exc()[-4000:]}
            print(tasks[task]["error"], flush=True)
    with contextlib.suppress(Exception):
        import ray

        ray.shutdown()
    result = {
        "settings": {
            "rounds": args.rounds,
            "batches_per_window": args.batches,
            "prefill_batches": args.prefill,
            "base_torch_threads": base_threads,
            "quick": args.quick,
        },
        "tasks": tasks,
    }
    path = save("scale", result)
    print(f"saved {path}")
    for task, res in tasks.items():
        if "error" in res:
            print(f"{task}: failed (the JSON has the traceback)")
            continue
        for kind in ("collect", "loop"):
            ratios = res[kind]["ratios_to_single"]
            shown = ", ".join(
                f"{n} {res[kind]['medians_steps_per_s'][n]:.0f} ({ratios.get(n, 0):.2f}x)"
                for n in res[kind]["medians_steps_per_s"]
            )
            print(f"{task} {kind}: {shown}")
        if "model" in res:
            m = res["model"]
            print(
                f"{task} model: learner bound {m['learner_bound_steps_per_s']:.0f} "
                f"steps/s, {m['collector_cores_to_saturate_learner']:.1f} collector "
                f"cores saturate it"
            )


if __name__ == "__main__":
    main()
