"""The plumbing the example scripts share around the pieces they build.

Each example (``examples/acer_*.py``) builds its environment, networks, loss,
optimizer, collector, replay, evaluator and logger in the open and hands them to
:func:`make_trainer`, which wires :class:`~torchrl_acer.trainers.ACERTrainer` with
the hooks the run settings ask for. What is the same for all of them lives here:
the start (:func:`setup`: the config checks, the device, the run directory), the
loss, collector, optimizer, replay and evaluation choices, the trainer's hooks,
resume, and the summary printed at the end.
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import logging
import os
import re
import signal
import sys
import time
import weakref
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torchrl.checkpoint import GlobalRNGState
from torchrl.collectors import Collector, MultiAsyncCollector
from torchrl.data import ReplayBuffer, Unbounded
from torchrl.envs import TensorDictPrimer
from torchrl.record.loggers import CSVLogger
from torchrl.trainers import LRSchedulerHook
from torchrl.weight_update import MultiProcessWeightSyncScheme

from torchrl_acer.objectives.acer import ACERLoss
from torchrl_acer.trainers.acer import ACERTrainer, make_segment_replay_buffer
from torchrl_acer.trainers.checkpoint import (
    ACERCheckpoint,
    ACERCheckpointError,
    FiniteStateDictAdapter,
    ReplayContents,
    SaveEvery,
    _missing_message,
)
from torchrl_acer.trainers.configs import ACERLossConfig, _make_acer_loss
from torchrl_acer.trainers.evaluation import Evaluation, GreedyEvaluator
from torchrl_acer.trainers.hooks import (
    STOP_SIGNALS,
    FailureCheckpoint,
    GracefulStop,
    PolicyInputCheck,
    PolicyVersion,
    RunDirectoryLock,
    RunDirectoryOwnedError,
    VersionedPolicy,
    _around,
    _worker_failure,
)
from torchrl_acer.trainers.progress import TrainingLog
from torchrl_acer.training.env_state import CollectorState
from torchrl_acer.training.example_config import check_example_config
from torchrl_acer.training.frame_replay import FrameStackReplayBuffer
from torchrl_acer.training.gym_collector import GymVectorCollector, NotReproducedError
from torchrl_acer.training.refusal import ConfigError

__all__ = [
    "check_config",
    "checkpoint_run_dir",
    "close",
    "collector_workers",
    "cut_csv_logs",
    "frames_to_run",
    "get_device",
    "make_collector",
    "make_evaluator",
    "make_logger",
    "make_optimizer",
    "make_replay",
    "make_trainer",
    "quiet_torchrl_info",
    "resume",
    "run_dir_for",
    "setup",
    "train",
]


def get_device(name: str) -> torch.device:
    """The device the config's ``device`` names: ``cpu``, ``cuda`` (or ``cuda:N``),
    or ``auto`` (CUDA when available, else the CPU)."""
    name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", name):
        raise ConfigError(f"bad config: device={name!r} must be cpu, cuda or auto")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"bad config: device={name!r} but CUDA is not available "
            f"(device=auto falls back to the CPU)"
        )
    return torch.device(name)


def check_config(cfg: DictConfig) -> None:
    """Fails at start, naming the setting, its value and what it must be, for values
    that cannot work: a value of the wrong type (a string, or a bool, for a number),
    out of range or not finite (the checks of
    :mod:`~torchrl_acer.training.example_config`), or settings that
    contradict each other."""

    def need(condition, message):
        if not condition:
            raise ConfigError(f"bad config: {message}")

    try:
        check_example_config(cfg)
    except ValueError as err:
        raise ConfigError(f"bad config: {err}") from None
    get_device(cfg.device)
    burn_in = OmegaConf.select(cfg, "loss.burn_in", default=0)
    need(
        not burn_in or OmegaConf.select(cfg, "model.recurrent", default=None),
        f"loss.burn_in={burn_in} needs a recurrent model (model.recurrent)",
    )
    need(
        burn_in < cfg.collector.T,
        f"loss.burn_in={burn_in} must be smaller than collector.T="
        f"{cfg.collector.T}: no step of a segment would be trained on",
    )
    need(
        cfg.replay.on_policy_updates or cfg.replay.ratio > 0,
        "replay.on_policy_updates=false needs replay.ratio > 0",
    )
    if cfg.replay.ratio > 0:
        need(
            cfg.replay.capacity >= cfg.collector.T,
            f"replay.capacity={cfg.replay.capacity} steps is shorter than one "
            f"segment of collector.T={cfg.collector.T} steps",
        )
        need(
            cfg.replay.start <= cfg.replay.capacity,
            f"replay.start={cfg.replay.start} exceeds replay.capacity="
            f"{cfg.replay.capacity}: replay would never start",
        )


def setup(cfg: DictConfig) -> tuple[Path, torch.device]:
    """What an example does before it builds anything: TorchRL's INFO lines off
    (:func:`quiet_torchrl_info`), the config checked (:func:`check_config`),
    torch's threads (``threads``) and seed set. Returns the run directory
    (:func:`run_dir_for`) and the device of the networks, loss and optimizer
    (:func:`get_device`; the environments stay on the CPU)."""
    quiet_torchrl_info()
    check_config(cfg)
    run_dir = run_dir_for(cfg)
    device = get_device(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    return run_dir, device


def make_replay(cfg: DictConfig, *, frame_stacks: bool = False):
    """The replay the ``replay`` section asks for, or ``None`` when
    ``replay.ratio`` is 0: segments of ``collector.T`` steps,
    ``replay.capacity`` steps of all environments together,
    ``replay.batch_segments`` (or ``env.num_envs``) segments per replayed batch.

    ``frame_stacks`` (Atari): each frame stored once
    (:class:`~torchrl_acer.training.frame_replay.FrameStackReplayBuffer`), one
    ring per environment of each collector worker, which rebuilds a segment's
    stacks from the previous segment of its environment (batches name their
    worker: ``"worker_index"``)."""
    r = cfg.replay
    if not r.ratio > 0:
        return None
    T, num_envs = cfg.collector.T, cfg.env.num_envs
    segments = r.batch_segments or num_envs
    if not frame_stacks:
        return make_segment_replay_buffer(r.capacity, T, segments)
    workers = collector_workers(cfg)
    per_env = r.capacity // (workers * num_envs)
    return FrameStackReplayBuffer(num_envs, per_env, T, segments, num_workers=workers)


# the evaluation's environments are seeded apart from the training ones
EVAL_SEED_OFFSET = 10_000


def make_evaluator(cfg: DictConfig, make_env, actor) -> GreedyEvaluator:
    """The greedy evaluation of ``actor``: ``eval.episodes`` environments of
    ``make_env(num_envs, seed=...)`` (one episode each, seeded from ``seed`` +
    :data:`EVAL_SEED_OFFSET`), for at most ``eval.max_steps`` steps."""
    env = make_env(cfg.eval.episodes, seed=cfg.seed + EVAL_SEED_OFFSET)
    return GreedyEvaluator(env, actor, max_steps=cfg.eval.max_steps)


def quiet_torchrl_info() -> None:
    """Turns TorchRL's INFO messages off for this process and the processes it
    starts, keeping its warnings and errors: a new run would otherwise open with
    five of them (the info-dict reader's dummy rollout and ``check_env_specs``
    for each environment built, the replay's storage). ``RL_LOGGING_LEVEL``,
    TorchRL's own setting, wins when set (``RL_LOGGING_LEVEL=INFO`` shows them)."""
    level = os.environ.get("RL_LOGGING_LEVEL") or "WARNING"
    os.environ["RL_LOGGING_LEVEL"] = level  # for the processes it starts
    logger = logging.getLogger("torchrl")
    logger.setLevel(level)
    for handler in logger.handlers:
        handler.setLevel(level)


def frames_to_run(cfg: DictConfig) -> int:
    """The env steps the run trains for: ``collector.total_frames`` rounded up
    to whole batches (a batch is ``env.num_envs`` x ``collector.T`` steps, times
    ``collector.num_workers`` for a synchronous multi-worker collector), saying
    so when that differs from what was asked."""
    c = cfg.collector
    workers = collector_workers(cfg) if c.get("sync") else 1
    per_batch = c.T * cfg.env.num_envs * workers
    batches = -(-c.total_frames // per_batch)
    frames = batches * per_batch
    if frames != c.total_frames:
        times = f" x collector.num_workers={c.num_workers}" if workers > 1 else ""
        print(
            f"collector.total_frames={c.total_frames} is not a whole number of "
            f"batches of {per_batch} steps (env.num_envs={cfg.env.num_envs} x "
            f"collector.T={c.T}{times}): training runs {batches} batches, "
            f"{frames} steps"
        )
    return frames


def run_dir_for(cfg: DictConfig) -> Path:
    """Where the run writes its logs, checkpoints, config and summary:
    ``logger.run_dir`` if set, else the resumed checkpoint's own run
    (:func:`checkpoint_run_dir`), else ``runs/<env>/seed<seed>-<time>``.

    Only that last, default, directory is created here, under a name no other run
    has: two runs of one seed started in the same second get ``...-<time>`` and
    ``...-<time>-2`` (the directory is made with ``mkdir``, which fails when it
    exists, even for another process). Nothing is created for the other two; the
    trainer then takes the directory (:class:`RunDirectoryLock`, in
    :func:`make_trainer`)."""
    if cfg.logger.run_dir:
        return Path(cfg.logger.run_dir)
    if cfg.resume:
        return checkpoint_run_dir(cfg.resume)
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", cfg.env.name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / env / f"seed{cfg.seed}-{stamp}"
    base.parent.mkdir(parents=True, exist_ok=True)
    run_dir, n = base, 1
    while True:
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            n += 1
            run_dir = base.with_name(f"{base.name}-{n}")


# the first line of each CSV log the examples write (TorchRL's CSVLogger writes
# bare rows)
CSV_HEADER = "step,value\n"


def make_logger(backend: str | None, run_dir: Path):
    """The logger ``logger.backend`` names, writing under ``run_dir/logs``, or
    ``None`` for none. CSV logs (``logs/scalars/<metric>.csv``) are TorchRL's
    with a header row, ``step,value``, so that they read as tables (pandas,
    spreadsheets); :func:`~torchrl_acer.training.plot.read_scalar` and
    :func:`cut_csv_logs` read them with or without it."""
    if not backend:
        return None
    if backend == "csv":
        return _CSVLoggerWithHeader(log_dir=str(run_dir), exp_name="logs")
    from torchrl.record.loggers import get_logger

    return get_logger(backend, logger_name=str(run_dir), experiment_name="logs")


class _CSVLoggerWithHeader(CSVLogger):
    def log_scalar(self, name, value, step=None):
        experiment = self.experiment
        path = os.path.join(experiment.log_dir, "scalars", name + ".csv")
        if path not in experiment.files and not (
            os.path.isfile(path) and os.path.getsize(path)
        ):  # a new file: its header first (a resumed run's file has one)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(CSV_HEADER)
        super().log_scalar(name, value, step)


def cut_csv_logs(logger, frames: int) -> int:
    """Drops the rows logged after ``frames`` from a TorchRL ``CSVLogger``'s files
    (``<log_dir>/scalars/**.csv``, ``step,value`` rows), so that a run resumed
    from a checkpoint at ``frames`` continues its logs with steps that only go
    up. A row cut short by a crash goes too. Other loggers are left alone.
    Returns the number of rows dropped."""
    if not isinstance(logger, CSVLogger):
        return 0
    experiment = logger.experiment
    for handle in experiment.files.values():  # reopened (appending) when written
        handle.close()
    experiment.files.clear()
    dropped = 0
    for csv in sorted(Path(experiment.log_dir, "scalars").rglob("*.csv")):
        lines = csv.read_text().splitlines(keepends=True)
        keep = [
            line for line in lines if line == CSV_HEADER or _csv_step(line) <= frames
        ]
        if len(keep) < len(lines):
            dropped += len(lines) - len(keep)
            tmp = csv.with_name(csv.name + ".tmp")
            tmp.write_text("".join(keep))
            tmp.replace(csv)
    return dropped


def _csv_step(line: str) -> float:
    """The step of a ``step,value`` row; infinite for a partial or unreadable row."""
    step, _, value = line.partition(",")
    if not line.endswith("\n"):
        return float("inf")
    try:
        float(value)
        return int(step)
    except ValueError:
        return float("inf")


def make_loss(loss: DictConfig, actor, critic) -> ACERLoss:
    """:class:`~torchrl_acer.ACERLoss` from a config's ``loss`` section
    (:class:`~torchrl_acer.trainers.configs.ACERLossConfig`'s fields; ``alpha``
    is the trainer's), with ACER's Retrace estimator (:math:`\\lambda = 1`,
    :math:`\\bar c = 1`)."""
    config = ACERLossConfig(**{k: v for k, v in loss.items() if k != "alpha"})
    return _make_acer_loss(
        **{**vars(config), "actor_network": actor, "critic_network": critic}
    )


# collector.backend -> the backend of TorchRL's Collector(backend=...)
_TORCHRL_BACKENDS = {"multiprocess": "process", "ray": "ray"}


class RayWorkerCollector(Collector):
    """TorchRL's ``Collector`` for a Ray worker, with a one-line ``repr``.

    Ray names an actor's log lines after its ``repr``, which it prints as the actor
    starts; a ``Collector``'s spans about 90 lines (its env, policy and buffer),
    printed for every worker of every run.
    """

    def __repr__(self) -> str:
        return f"Collector(worker_idx={self.worker_idx})"


class PatientWeightSyncScheme(MultiProcessWeightSyncScheme):
    """TorchRL's :class:`~torchrl.weight_update.MultiProcessWeightSyncScheme`
    whose workers wait up to ``start_timeout`` seconds for their first weights.

    TorchRL's transport waits 10 seconds (``MPTransport(timeout=10.0)``, not a
    setting of the scheme); on a loaded machine the learner can take longer to
    send them after starting the workers (43 s were measured with two runs and
    benchmarks sharing 2 cores), and the run then died at its start with
    ``_queue.Empty`` from a worker. Later weight pushes keep TorchRL's timeout.
    """

    def __init__(self, *args, start_timeout: float = 600.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_timeout = start_timeout

    def _setup_connection_and_weights_on_receiver_impl(self, *args, **kwargs):
        transport = self._receiver_transport  # None: TorchRL raises, naming it
        if transport is not None:
            default, transport.timeout = transport.timeout, self.start_timeout
        try:
            return super()._setup_connection_and_weights_on_receiver_impl(
                *args, **kwargs
            )
        finally:
            if transport is not None:
                transport.timeout = default


class PatientAsyncCollector(MultiAsyncCollector):
    """TorchRL's :class:`~torchrl.collectors.MultiAsyncCollector` whose workers
    wait for the learner to take their batch instead of throwing it away.

    TorchRL's output queue holds one batch: a worker that cannot put its batch
    there within a second (the other worker's is waiting while the learner
    trains) drops it and collects the next, so its environments' steps are
    lost and the batches it delivers skip steps (on Atari with replay, from the
    learner's third batch on, none continued the previous one of its worker).
    The Atari replay, which rebuilds a segment's frame stacks from the previous
    segment of its environment (:class:`~torchrl_acer.FrameStackReplayBuffer`),
    cannot use such batches. With room for one batch of every worker, a worker
    puts its batch at once and waits for the learner to ask for the next, as
    in TorchRL's synchronous collector.
    """

    @property
    def _queue_len(self) -> int:
        return self.num_workers


def collector_workers(cfg: DictConfig) -> int:
    """The collectors ``cfg.collector.backend`` runs: ``collector.num_workers``
    for the multi-process and Ray backends, one in this process otherwise."""
    c = cfg.collector
    return c.num_workers if c.get("backend", "single") in _TORCHRL_BACKENDS else 1


def make_collector(cfg: DictConfig, make_env, actor, *, device, env=None):
    """The collector ``cfg.collector.backend`` names, running ``actor``.

    ``single`` (the default): one :class:`~torchrl.collectors.Collector` in this
    process, stepping ``env`` (or ``make_env(num_envs, seed=cfg.seed)``) with the
    learner's own actor: ``[num_envs, T]`` batches, no lag, nothing to push.

    ``auto``: ``lean`` where it reproduces ``single``, ``single`` elsewhere (it
    says so and why).

    ``lean``: the same in-process collection by a
    :class:`~torchrl_acer.training.gym_collector.GymVectorCollector`, which steps
    the gymnasium vector env itself: the ``single`` backend's batches, bit for bit,
    at a fraction of its cost (``bench/collection.py``). It refuses, naming them,
    environments and transforms it does not reproduce (Atari's, recurrent
    models' ``InitTracker`` and primers).

    ``multiprocess`` and ``ray``: ``collector.num_workers`` collectors, each
    stepping ``make_env(num_envs, seed=cfg.seed + i * num_envs)``, each step
    tagged with ``"worker_index"`` ``i``, in its own process (TorchRL's
    ``MultiSyncCollector`` / ``MultiAsyncCollector``) or Ray actor
    (``RayCollector``), through ``Collector(backend=..., num_collectors=...,
    sync=...)``. With ``collector.sync`` a batch is every worker's
    ``[num_envs, T]`` together; without, each worker's batch as it comes (a
    :class:`PatientAsyncCollector` for ``multiprocess``: none is dropped). Each
    worker acts with its own copy of the policy on the CPU, a
    :class:`~torchrl_acer.trainers.hooks.VersionedPolicy` that the trainer
    updates every ``collector.weight_update_interval`` batches through TorchRL's
    weight-sync schemes (``update_policy_weights_``), and that writes the
    version of its weights with every step: the trainer measures the policy lag
    from it. ``env`` (built for its specs) is closed.

    ``make_env(num_envs, seed=...)`` must pickle (a module-level function or a
    ``functools.partial`` of one) for the workers to build their environments.
    Ray is started from the config's ``ray`` section (a local cluster unless
    ``ray.address`` names one) when it is not running already.
    """
    c = cfg.collector
    T, num_envs = c.T, cfg.env.num_envs
    backend = c.get("backend", "single")
    if backend in ("lean", "auto", "single"):
        env = env if env is not None else make_env(num_envs, seed=cfg.seed)
        # endless (total_frames=-1): the trainer counts frames
        batches = dict(frames_per_batch=T * num_envs, total_frames=-1)
        if backend != "single":
            try:
                return GymVectorCollector(env, actor, policy_device=device, **batches)
            except NotReproducedError as err:
                if backend == "lean":
                    raise
                # the same batches from TorchRL's own Collector (its refusals come
                # before it touches the env: nothing differs but the cost); any
                # other error, the policy failing on the first observation say,
                # is raised
                print(f"collector.backend=auto: TorchRL's Collector, since {err}")
        return Collector(
            env,
            actor,
            policy_device=device,
            storing_device="cpu",  # the replay stays in host memory
            auto_register_policy_transforms=False,
            **batches,
        )
    if backend not in _TORCHRL_BACKENDS:
        raise ConfigError(f"bad config: collector.backend={backend!r}")
    if env is not None:
        env.close()
    workers, sync = c.num_workers, c.sync
    env_fns = [
        functools.partial(
            _worker_env, make_env, i, num_envs, seed=cfg.seed + i * num_envs
        )
        for i in range(workers)
    ]
    # The workers act with copies: TorchRL moves a CPU policy's parameters into
    # shared memory, and workers acting with the learner's own (or one shared
    # copy) would act with weights changing under them, at no known version.
    acting = VersionedPolicy(copy.deepcopy(actor).to("cpu").requires_grad_(False))
    per_worker = T * num_envs
    worker_kwargs = {
        "policy_device": "cpu",
        "storing_device": "cpu",
        "auto_register_policy_transforms": False,
    }
    if backend == "multiprocess":
        backend_kwargs = {
            **worker_kwargs,
            "total_frames": -1,
            # each worker deep-copies the template into a policy of its own, and
            # applies pushed weights (sent through a pipe) from a background
            # thread: VersionedPolicy tells which weights acted. sync=False: a
            # push does not wait for acknowledgements, which a dead worker would
            # never send (collecting finds it dead instead)
            "policy_factory": functools.partial(copy.deepcopy, copy.deepcopy(acting)),
            "weight_sync_schemes": {
                "policy": PatientWeightSyncScheme(
                    sync=False, start_timeout=c.get("worker_start_timeout", 600.0)
                )
            },
        }
    else:
        backend_kwargs = {
            "collector_kwargs": worker_kwargs,
            # RayCollector stops at total_frames (-1 would be no batch at all)
            "total_frames": 2**62,
            "ray_init_config": _ray_init_config(cfg, make_env),
            # collectors on the CPU, whatever the learner's machine has
            "remote_configs": {"num_cpus": 1, "num_gpus": 0, "memory": 2 * 1024**3},
            "collector_class": RayWorkerCollector,
        }
    if backend == "multiprocess" and not sync:
        # what Collector(backend="process", sync=False) builds, keeping every batch
        collector = PatientAsyncCollector(
            env_fns, acting, frames_per_batch=per_worker, **backend_kwargs
        )
    else:
        collector = Collector(
            env_fns,
            acting,
            backend=_TORCHRL_BACKENDS[backend],
            num_collectors=workers,
            sync=sync,
            # sync: every worker's [num_envs, T] in one batch; async: one worker's
            frames_per_batch=per_worker * workers if sync else per_worker,
            **backend_kwargs,
        )
    if backend == "multiprocess":
        _MULTIPROCESS_COLLECTORS.add(collector)
    return collector


# Their worker processes wait for commands until they are shut down, and the
# interpreter's exit waits for them: an error before train() closes one (a refusal,
# a worker dying while it is seeded) would hang the exit forever. Registered after
# multiprocessing's exit function (torch imports it), so it runs before that one
# joins the workers; upstream/torchrl/0008 does the same inside TorchRL.
_MULTIPROCESS_COLLECTORS = weakref.WeakSet()


@atexit.register
def _shut_down_multiprocess_collectors() -> None:
    for collector in list(_MULTIPROCESS_COLLECTORS):
        shut_down(collector)  # a no-op for those already shut down


def shut_down(collector) -> None:
    """``collector.shutdown()`` (a no-op once done), and its weight-sync schemes'
    too: TorchRL 0.14 leaves theirs to ``__del__``, which, run at the
    interpreter's exit before a scheme has sent anything, starts a queue thread
    that can never start and hangs the exit (``upstream/torchrl/0008`` fixes
    both this and the exit function in TorchRL)."""
    collector.shutdown()
    for scheme in (getattr(collector, "_weight_sync_schemes", None) or {}).values():
        try:
            scheme.shutdown()
        except RuntimeError:  # Python 3.12+ refuses new threads in its exit
            pass


def _worker_env(make_env, index: int, num_envs: int, *, seed: int):
    """``make_env(num_envs, seed=seed)`` for collector worker ``index``, with the
    index written under ``"worker_index"`` at every step (a TorchRL primer: set at
    reset, carried through the steps).

    TorchRL's multi collectors do not say which worker a batch came from (an
    asynchronous one yields the workers' batches in any order, and Ray workers'
    ``("collector", "traj_ids")`` all start at 0): a replay that keeps each
    worker's environments apart reads it
    (:class:`~torchrl_acer.training.frame_replay.FrameStackReplayBuffer`).
    """
    env = make_env(num_envs, seed=seed)
    return env.append_transform(
        TensorDictPrimer(
            worker_index=Unbounded(shape=(), dtype=torch.long),
            default_value=index,
            expand_specs=True,  # to the environment's batch
        )
    )


def _ray_init_config(cfg: DictConfig, make_env) -> dict:
    """``ray.init``'s arguments from the config's ``ray`` section. A local Ray's
    workers also get the folder of ``make_env``'s module on their path (the
    examples' ``utils_*.py`` are on the driver's path only)."""
    ray_cfg = cfg.get("ray") or {}
    address = ray_cfg.get("address")
    config = {
        "address": address,
        "num_cpus": None if address else ray_cfg.get("num_cpus"),
        "include_dashboard": False,
        "ignore_reinit_error": True,
    }
    if not address:
        func = getattr(make_env, "func", make_env)
        name = getattr(func, "__module__", "") or ""
        module = sys.modules.get(name)
        paths = []
        if module is not None and "." not in name and getattr(module, "__file__", None):
            paths.append(str(Path(module.__file__).resolve().parent))  # a script's
        paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        config["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
    return config


def make_optimizer(optim: DictConfig, params) -> torch.optim.Optimizer:
    """Adam or RMSProp as the config's ``optim`` section says.

    Adam runs fused (one kernel over every parameter) where torch has the kernel,
    RMSProp over lists of tensors (``foreach``; it has no fused kernel): for the
    small networks here the default's per-tensor loop costs several times the
    fused step. Results agree with the default up to float rounding."""
    params = list(params)
    if optim.name == "adam":
        fused = all(
            p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params
        )
        return torch.optim.Adam(params, lr=optim.lr, eps=optim.eps, fused=fused or None)
    return torch.optim.RMSprop(
        params, lr=optim.lr, alpha=optim.decay, eps=optim.eps, foreach=True
    )


# the manifest metadata entry holding the run directory a checkpoint was written in
RUN_DIR_KEY = "run_dir"


def checkpoint_run_dir(checkpoint: str | Path) -> Path:
    """The run directory a checkpoint belongs to, wherever it now lies.

    The checkpoint's manifest records the run directory it was written in
    (:func:`make_trainer`); that run, if it still exists. A run moved as a whole
    is found from the checkpoint's own place, ``<run>/checkpoints/<name>``; a
    lone copy whose run is gone still goes back to where its run was. Only the
    manifest is read."""
    path = Path(checkpoint)
    try:
        recorded = ACERCheckpoint.manifest(path)["metadata"].get(RUN_DIR_KEY)
    except Exception:  # no manifest to read: the checkpoint's place only
        recorded = None
    recorded = Path(recorded) if recorded else None
    layout = path.parent.parent if path.parent.name == "checkpoints" else None
    if recorded is not None and (recorded.is_dir() or layout is None):
        return recorded
    if layout is not None:
        return layout
    raise ConfigError(
        f"resume={checkpoint}: cannot tell which run directory it belongs to (it "
        f"records none and is not in a run's checkpoints/ folder); set "
        f"logger.run_dir"
    )


def make_trainer(
    cfg: DictConfig,
    run_dir: Path,
    *,
    collector,
    loss: ACERLoss,
    optimizer: torch.optim.Optimizer,
    replay,
    evaluator,
    logger,
) -> ACERTrainer:
    """:class:`~torchrl_acer.trainers.ACERTrainer` over the example's pieces, with
    the hooks the run settings (``examples/run/default.yaml``) ask for.

    - checkpoints: an :class:`~torchrl_acer.trainers.ACERCheckpoint` of
      everything the trainer holds, the environments mid-episode
      (:class:`~torchrl_acer.training.env_state.CollectorState`, training and
      evaluation) and every random state, with the resolved config, written to
      ``run_dir/checkpoints/last`` every ``checkpoint.interval`` frames,
      every ``checkpoint.every_minutes`` (:class:`SaveEvery`), at the end, on a
      stop signal (:class:`GracefulStop`) and after a failure
      (:class:`FailureCheckpoint`);
    - the learning rate falling linearly to 0 with ``optim.schedule: linear``
      (TorchRL's ``LRSchedulerHook``);
    - the run directory owned by this run (:class:`RunDirectoryLock`);
    - policy versions and lag (:class:`PolicyVersion`) for collectors whose
      workers act with their own copy of the policy;
    - the training log (:class:`TrainingLog`) and greedy evaluation
      (:class:`Evaluation`), to ``logger``;
    - non-finite observations refused while the policy acts, naming them, and
      the trainer's phase (:class:`PolicyInputCheck`, ``trainer.policy_check``):
      an error while the environments step (or the policy acts in them) leaves
      their state out of the checkpoint written after it, so that a resume
      starts fresh episodes instead of stepping into the same failure; a
      second signal while collecting stops the collection at once and still
      saves what was trained before it.
    """

    def frames() -> int:  # stored with the environments' state
        return trainer.collected_frames

    checkpoint = ACERCheckpoint(
        config=OmegaConf.to_container(cfg, resolve=True),
        allow_config_change=cfg.resume_allow_config_change or (),
        force=cfg.resume_force,
        # where a copy of the checkpoint resumes (checkpoint_run_dir)
        metadata={RUN_DIR_KEY: str(Path(run_dir).resolve())},
    )
    # not checked for non-finite numbers: a running episode's return is NaN after
    # a NaN reward (the batch is dropped, the episode goes on), and refusing the
    # save for it would lose the run
    envs_adapter = FiniteStateDictAdapter(
        payload_format="torch", weights_only=False, check_finite=False
    )
    # under "collector", which the trainer then leaves alone: the collector's
    # counters and carried step with its environments' state
    environments = [CollectorState(collector, seed=cfg.seed, frames=frames)]
    checkpoint.register("collector", environments[0], adapter=envs_adapter)
    eval_env = getattr(evaluator, "env", None)
    if eval_env is not None:
        environments.append(
            CollectorState(
                eval_env, name="evaluation", seed=cfg.seed, stream=1, frames=frames
            )
        )
        checkpoint.register("eval_envs", environments[1], adapter=envs_adapter)
    checkpoint.register("rng", GlobalRNGState())
    if isinstance(replay, ReplayBuffer):
        # what it holds, not the capacity its storage is allocated at
        checkpoint.register("replay_buffer", ReplayContents(replay))
    elif replay is not None:
        # a replay of its own (Atari's frames): its state dict as one torch file
        checkpoint.register(
            "replay_buffer",
            replay,
            adapter=FiniteStateDictAdapter(payload_format="torch", weights_only=False),
        )
    try:
        trainer = ACERTrainer(
            collector=collector,
            total_frames=frames_to_run(cfg),
            loss_module=loss,
            optimizer=optimizer,
            replay_buffer=replay,
            replay_ratio=cfg.replay.ratio,
            replay_start=cfg.replay.start,
            on_policy_updates=cfg.replay.on_policy_updates,
            alpha=cfg.loss.alpha,
            weight_update_interval=cfg.collector.weight_update_interval,
            check_health=cfg.health.check,
            max_nonfinite_in_a_row=cfg.health.max_nonfinite_in_a_row,
            logger=logger,
            clip_grad_norm=cfg.optim.max_grad_norm is not None,
            clip_norm=cfg.optim.max_grad_norm,
            progress_bar=cfg.logger.progress_bar,
            seed=cfg.seed,
            log_interval=cfg.logger.log_interval,
            save_trainer_file=run_dir / "checkpoints" / "last",
            # TorchRL saves once more than save_trainer_interval frames have passed
            # since the last save: checkpoint.interval frames apart is interval - 1
            save_trainer_interval=(cfg.checkpoint.interval or 2**62) - 1,
            checkpoint=checkpoint,
        )
    except (EOFError, ConnectionError) as err:  # TorchRL's Trainer seeds it
        worker = _worker_failure(err, collector, [])
        if worker is None:
            raise
        raise RuntimeError(
            f"{worker} died while the trainer seeded the collector (its error is "
            f"printed above)"
        ) from err
    trainer.environments = environments
    if cfg.optim.get("schedule", "constant") == "linear":
        # the learning rate falls linearly to 0 over the run (baselines' ACER,
        # lrschedule="linear"), set after each batch from the frames collected:
        # a resumed run, or a collector with batches of its own size, follows
        # the same line
        total = trainer.total_frames
        decay = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda _: max(0.0, 1 - trainer.collected_frames / total)
        )
        LRSchedulerHook(decay).register(trainer)
    try:
        RunDirectoryLock(run_dir, resume=bool(cfg.resume)).register(trainer)
    except RunDirectoryOwnedError as err:  # what to type, in the examples' terms
        raise RunDirectoryOwnedError(
            f"{err}. To resume it: resume={run_dir / 'checkpoints' / 'last'}"
        ) from None
    hint = "resume={}"
    if cfg.collector.get("backend", "single") in _TORCHRL_BACKENDS:
        PolicyVersion(cfg.collector.max_policy_lag).register(trainer)
        hint += (
            " (collector.num_workers may change on resume, except with the Atari "
            "frame replay, which keeps each worker's environments apart)"
        )
    TrainingLog().register(trainer)
    trainer.evaluation = Evaluation(evaluator, cfg.eval.interval)
    trainer.evaluation.register(trainer)
    if cfg.checkpoint.every_minutes:
        SaveEvery(cfg.checkpoint.every_minutes).register(trainer)
    trainer.policy_check = PolicyInputCheck(
        loss.actor_network, evaluation=trainer.evaluation, check=cfg.health.check
    )
    trainer.policy_check.register(trainer)
    _around(trainer, "train", functools.partial(_note_failed_environments, trainer))
    # before GracefulStop: see its docs
    FailureCheckpoint(resume_hint=hint.format).register(trainer)
    trainer.stop = GracefulStop()
    trainer.stop.register(trainer)
    _around(trainer, "train", functools.partial(_save_after_a_second_signal, trainer))
    return trainer


def _environments_failed(trainer, phase: str, err: BaseException) -> str | None:
    """Leaves the state of the environments that failed (``phase`` collecting or
    evaluating) out of the next saves; returns the note saying so."""
    states = trainer.environments
    failed = {"collecting": states[:1], "evaluating": states[1:]}.get(phase, [])
    for state in failed:
        state.unsaved = (
            f"{phase} failed with {type(err).__name__} after "
            f"{trainer.collected_frames} frames"
        )
    if not failed:
        return None
    return (
        f"training stopped while {phase}; the {failed[0].name} environments' "
        f"state is left out of the checkpoint: a resume starts fresh episodes"
    )


def _note_failed_environments(trainer, inner):
    """``train``, leaving the state of the environments that raised out of the
    checkpoint :class:`FailureCheckpoint` (registered after, hence around this)
    writes: a resume would step into the same failure (a NaN observation
    carried to the next step, a simulator in a broken state)."""
    try:
        return inner()
    except Exception as err:
        note = _environments_failed(trainer, trainer.policy_check.phase, err)
        if note is not None:
            err.add_note(note)
        raise


def _save_after_a_second_signal(trainer, inner):
    """``train``, saving when a second signal stopped a collection
    (:class:`GracefulStop` raises ``KeyboardInterrupt``): what was trained before
    that batch is whole; the training environments, stopped mid-step, are left
    out. At any other time a second signal ends the run without saving."""
    try:
        return inner()
    except KeyboardInterrupt as err:
        if trainer.stop.signum is None or trainer.policy_check.phase != "collecting":
            raise
        _environments_failed(trainer, "collecting", err)
        trainer._save_trainer()


def resume(trainer: ACERTrainer, checkpoint: str | Path) -> None:
    """Restores ``trainer`` from ``checkpoint`` (a run's ``checkpoints/last``)
    and says where it resumes.

    The checkpoint's config must match the run's, except for the settings safe to
    change (:data:`~torchrl_acer.trainers.checkpoint.SAFE_CONFIG_CHANGES`); the
    config's ``resume_allow_config_change`` (a list of dotted keys or patterns)
    allows others, ``resume_force: true`` any.

    The run continues the same run: the environments continue their episodes
    where their state was saved (else start fresh ones, and it says so), and the
    CSV logs lose the rows written after the checkpoint (:func:`cut_csv_logs`).
    A finished run (``frames >= total_frames``) is left as it is: this says so
    and exits with status 0."""
    path = Path(checkpoint)
    if not path.exists():  # TorchRL would try torch.load on it
        raise ConfigError(f"resume: {_missing_message(path)}")
    if path.is_dir():  # its manifest's sha256, which TorchRL's check does not read
        ACERCheckpoint.verify(path, components=())
    elif not ACERCheckpoint.is_checkpoint(path):  # nor would it say what it is
        raise ACERCheckpointError(
            f"{path} is not a torchrl-acer checkpoint (a run's checkpoints/last "
            f"folder, with its manifest)"
        )
    trainer.load_from_file(checkpoint)
    for key, saved, current in trainer.checkpoint.config_changes:
        print(f"resume: {key} changed since the checkpoint: {saved!r} -> {current!r}")
    frames = trainer.collected_frames
    if frames >= trainer.total_frames:
        # nothing to train: no checkpoint, config, log or summary is touched
        print(
            f"resume: {checkpoint} is a finished run ({frames} frames, "
            f"collector.total_frames={trainer.total_frames}); nothing to do, "
            f"nothing changed. Raise collector.total_frames to train on."
        )
        close(trainer)
        sys.exit(0)
    # rows logged after the checkpoint (a run killed past it) would repeat steps
    dropped = cut_csv_logs(trainer.logger, frames)
    print(f"resumed from {checkpoint} at {frames} frames")
    if dropped:
        print(f"resume: dropped {dropped} log rows written after {frames}")
    for state in trainer.environments:
        for note in state.notes:
            print(f"resume: {note}")


def close(trainer: ACERTrainer) -> None:
    """Closes what a :func:`make_trainer` trainer holds open: TorchRL's progress
    bar (left open by ``train``), the collector (its workers and environments)
    and the evaluation's environments."""
    bar = getattr(trainer, "_pbar", None)
    if bar is not None:
        bar.close()
    shut_down(trainer.collector)
    evaluate = trainer.evaluation.evaluate
    if hasattr(evaluate, "close"):
        evaluate.close()


def train(trainer: ACERTrainer, cfg: DictConfig, run_dir: Path) -> None:
    """Resumes (``cfg.resume``), writes the resolved config to
    ``run_dir/config.yaml``, trains, then writes ``summary.json`` and prints
    the final greedy evaluation and where the logs, the plot and the checkpoint
    are. A run stopped by a signal (Ctrl-C, SIGTERM, SIGHUP, ...: ``STOP_SIGNALS``)
    prints how to resume it instead and exits with status 128 + the signal's
    number (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP)."""
    if cfg.resume:
        resume(trainer, cfg.resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    try:
        trainer.train()
    finally:
        close(trainer)
    checkpoint = trainer.save_trainer_file
    frames = trainer.collected_frames
    if trainer.stop.signum is not None:
        # stopped and saved: a signal during the exit (whose hooks may take
        # seconds) would only print a traceback over the resume hint
        for other in STOP_SIGNALS:
            signal.signal(other, signal.SIG_IGN)
        name = signal.Signals(trainer.stop.signum).name
        print(
            f"interrupted ({name}) at {frames} frames; checkpoint written to "
            f"{checkpoint}\nresume with: resume={checkpoint}",
            flush=True,
        )
        sys.exit(trainer.stop.exit_code)
    last = trainer.evaluation.last
    summary = {
        "frames": frames,
        "updates": trainer._optim_count,
        "final_eval": last,
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"final greedy evaluation ({cfg.eval.episodes} episodes) after {frames} env "
        f"steps: mean return {last['reward']:.1f} (min {last['reward_min']:.1f}, "
        f"max {last['reward_max']:.1f})"
    )
    if cfg.logger.backend == "csv":
        from torchrl_acer.training.plot import plot_groups

        out = run_dir / "eval_reward.png"
        plot = plot_groups({"ACER": [run_dir]}, out, title=cfg.env.name)
        print(f"logs: {run_dir / 'logs'}\nplot: {plot}")
    print(f"checkpoint: {checkpoint}")
