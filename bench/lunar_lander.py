"""LunarLander-v3: ours against DI-engine's ACER and Stable-Baselines3's A2C, PPO
and DQN, each at its own settings.

    bash bench/peers_setup.sh                  # once: .venv-bench with SB3, DI-engine
    pip install -e ".[box2d]"                  # LunarLander in the project's venv
    python bench/lunar_lander.py               # ours and DI-engine: 5 seeds, 1M steps
    python bench/lunar_lander.py --summary     # the result of the runs finished so far
    python bench/lunar_lander.py ... --continue bench/results/lunar_lander_sb3-<stamp>.json
                                               # a fresh checkout: the missing runs only
    python bench/lunar_lander.py --candidates sb3_a2c sb3_ppo sb3_dqn --budget 500000 \\
        --runs-dir bench/runs/lunar_lander_500k --result-name lunar_lander_sb3
    RESULTS_DIR=/tmp/ll python bench/lunar_lander.py --seeds 0 --budget 5000 \\
        --runs-dir /tmp/ll/runs                # smoke

Each run trains one candidate from one seed on gymnasium's ``LunarLander-v3``, in
a process of its own on one thread, to the full budget (``--budget``, 1M env steps:
rl-baselines3-zoo's ``n_timesteps`` for PPO on LunarLander; dizoo's config has no
budget, its pipeline stops once its own evaluator reaches 200). Per run: the env
steps (and training seconds) at which the greedy evaluation first reached 200
(LunarLander's "solved"), or not reached, and the evaluation at the budget.
Runs go one at a time (``--jobs`` more), seed after seed, the candidates of each
seed in a shuffled order.

The evaluation is bench/time_to_solve.py's, sized for LunarLander (``PROTOCOL``):
the mean return of 10 greedy (argmax) episodes, one per environment copy, each
copy seeded once from ``seed + 10_000``, episodes run to the task's own limit of
1000 steps, after the first update that takes the run's env steps to a multiple of
10 000 or past it (ours on its trainer's schedule, which also evaluates after its
first batch): 100 points over a run, 1% of the budget apart, at a cost of at most
10 000 policy steps each. Training seconds exclude setup, every evaluation and
the checkpoints.

Candidates:

- ``ours``: ``examples/acer_gym.py`` at its defaults with ``env.name=LunarLander-v3``,
  from a clean copy of one commit (``--ours-commit``), since runs span sessions
  while the working tree changes; the bench sets the budget, the protocol, one
  thread, no progress bar and a checkpoint every 50k env steps.
- ``di_acer``: DI-engine 0.5.3's ACER with dizoo's LunarLander config
  (``dizoo/box2d/lunarlander/config/lunarlander_acer_config.py``: 8 collector envs,
  [512, 64] encoder, unroll 32, 16 sequences collected then 10 updates of 32
  sequences, Adam 1e-4 for actor and critic, gamma 0.99, no entropy bonus,
  importance weights clipped at 10, a 50 000-sequence replay; ACERPolicy's
  defaults for the rest: trust region on, delta 1.0, value weight 0.5, averaged
  network momentum 0.01), in time_to_solve.py's serial loop. Two changes, both
  about where it runs: the environment is gymnasium's LunarLander-v3 through
  DI-engine's ``DingEnvWrapper`` (dizoo's own env is old gym's LunarLander-v2,
  the previous version of the task; peers_setup.sh checks that it runs), and the
  8 envs step in the run's process (``BaseEnvManager``; the config asks for
  subprocesses).
- ``sb3_a2c``, ``sb3_ppo``, ``sb3_dqn``: Stable-Baselines3 (2.9.2 in ``.venv-bench``)
  with rl-baselines3-zoo's tuned hyperparameters for ``LunarLander-v3`` (``ZOO``,
  from rl_zoo3 2.9.2's ``hyperparams/a2c.yml``, ``ppo.yml`` and ``dqn.yml``: that
  release keys them ``LunarLander-v3``, the task run here), through
  time_to_solve.py's SB3 loop (``train_sb3``). The budget governs, not the zoo's
  ``n_timesteps`` (A2C 200k, PPO 1M, DQN 100k): SB3 learns for the budget and its
  schedules (A2C's linear learning rate, DQN's exploration fraction) run over it,
  as rl_zoo3's own ``--n-timesteps`` does. PPO's rollout is 16 x 1024 env steps,
  so its last one ends past the budget (507 904 at 500k).

- ``torchrl_ppo``: TorchRL's own PPO with the zoo's PPO settings above (16 envs,
  rollouts of 1024 steps, minibatches of 64, 4 epochs, gamma 0.999, GAE lambda
  0.98, entropy 0.01; SB3's defaults for the rest), in the project's venv
  (time_to_solve.py's ``train_torchrl_ppo``: the loop of TorchRL's
  ``sota-implementations/ppo/``). Not resumable: a run stopped starts again.

Resumable: each finished run writes ``record.json`` in its directory
(``--runs-dir``/``<candidate>-seed<S>``), and the same command run again skips it.
Ours and SB3 save every ``--checkpoint-interval`` env steps (50k). An unfinished
run of ours resumes from its last checkpoint, its evaluations and training clock
up to it kept in ``recorder.json``; one of SB3 from its latest save
(``checkpoint-<steps>/``: model, DQN's replay; ``latest.json``: evaluations and
training clock; time_to_solve.py's ``train_sb3``, as bench/minatar_peers.py's),
on fresh episodes seeded ``seed + steps`` (not bit for bit the run that was
stopped), its schedules still over the budget; a record's ``resumed_at`` lists
the env steps it resumed at. One of DI-engine starts again from scratch (the
bench keeps no DI-engine checkpoint). A runs directory holds one setting
(``settings.json``: budget, protocol, checkpoint interval, ours' commit); another
needs another ``--runs-dir``. Long runs go at ``nice -n 19`` in the background;
a session that ends stops them, and the same command resumes them. Once every
run has a record, or with ``--summary``, the result is written to
``bench/results/lunar_lander-<UTC stamp>.json`` (commit, machine, settings, every
run's record with its evaluations, and per candidate the seeds' steps to 200,
medians and ranges); ``--result-name`` names it, one name per runs directory
(bench/report.py reads ``lunar_lander`` as the 1M comparison with DI-engine and
``lunar_lander_sb3`` as the SB3 one at 500k).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import checkpoint_path  # noqa: E402
from time_to_solve import (  # noqa: E402
    ROOT,
    ResumableRecorder,
    add_continue_argument,
    add_run_arguments,
    add_worker_arguments,
    di_config,
    export_commit,
    pin_settings,
    pinned,
    restore_runs,
    run_one,
    stats,
    tidy,
    train_di_acer,
    train_ours,
    train_sb3,
    train_torchrl_ppo,
    worker,
)

TASK = "LunarLander-v3"
THRESHOLD = 200.0
CANDIDATES = ("ours", "di_acer", "sb3_a2c", "sb3_ppo", "sb3_dqn", "torchrl_ppo")
PROTOCOL = {
    "interval": 10_000,  # env steps between greedy evaluations
    "episodes": 10,  # greedy episodes per evaluation, one per environment copy
    "max_steps": 1_000,  # the task's own time limit
}
DEFAULT_BUDGET = 1_000_000
CHECKPOINT_INTERVAL = 50_000  # ours and SB3: env steps between checkpoints
DI_SOURCE = "DI-engine 0.5.3, dizoo/box2d/lunarlander/config/lunarlander_acer_config.py"
# rl_zoo3 2.9.2 (rl-baselines3-zoo), rl_zoo3/hyperparams/{a2c,ppo,dqn}.yml, key
# LunarLander-v3 (the task run here), every value as written there; anything not listed is SB3's default. ("linear", x): the
# zoo's lin_x, x times the remaining fraction of the run. n_timesteps is the zoo's,
# recorded only: the bench's budget governs (train_sb3's total_timesteps).
ZOO = {
    "sb3_a2c": {
        "n_envs": 8,
        "n_timesteps": 200_000,
        "gamma": 0.995,
        "n_steps": 5,
        "learning_rate": ("linear", 0.00083),
        "ent_coef": 0.00001,
    },
    "sb3_ppo": {
        "n_envs": 16,
        "n_timesteps": 1_000_000,
        "n_steps": 1024,
        "batch_size": 64,
        "gae_lambda": 0.98,
        "gamma": 0.999,
        "n_epochs": 4,
        "ent_coef": 0.01,
    },
    "sb3_dqn": {  # one env (SB3's default)
        "n_timesteps": 100_000,
        "learning_rate": 6.3e-4,
        "batch_size": 128,
        "buffer_size": 50_000,
        "learning_starts": 0,
        "gamma": 0.99,
        "target_update_interval": 250,
        "train_freq": 4,
        "gradient_steps": -1,
        "exploration_fraction": 0.12,
        "exploration_final_eps": 0.1,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
}
ZOO_SOURCE = (
    "rl_zoo3 2.9.2 (rl-baselines3-zoo), rl_zoo3/hyperparams/a2c.yml, ppo.yml and "
    "dqn.yml, key LunarLander-v3"
)
ZOO_CHANGED = (
    "n_timesteps: the bench's budget, not the zoo's (A2C 200k, PPO 1M, DQN 100k); "
    "the schedules (A2C's linear learning rate, DQN's exploration fraction) run over "
    "the budget, as with rl_zoo3's --n-timesteps; evaluation: the bench's, not the zoo's"
)


# -- the worker: one run, in the candidate's venv ------------------------------------


class BudgetRecorder(ResumableRecorder):
    """A :class:`ResumableRecorder` of LunarLander's threshold and evaluation
    interval that also keeps its evaluations and training clock in ``path``
    (``recorder.json``) with each of ours' checkpoints (``keep``), for a run of
    ours resumed from one to go on with them (``restore_kept``)."""

    def __init__(self, budget, path=None):
        super().__init__(THRESHOLD, PROTOCOL["interval"], budget)
        self.path = path  # recorder.json
        self.clock = {}  # env steps of each checkpoint: training seconds then

    def keep(self, steps):
        """Writes the evaluations and the training clock at checkpoint ``steps``."""
        self.clock[str(steps)] = self.train_s()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"evals": self.evals, "clock": self.clock}))
        os.replace(tmp, self.path)

    def restore_kept(self, steps):
        """Takes back what :meth:`keep` wrote with the checkpoint at ``steps``."""
        kept = json.loads(self.path.read_text()) if self.path.exists() else {}
        if str(steps) not in kept.get("clock", {}):
            raise RuntimeError(
                f"{self.path} holds no training clock for the checkpoint at {steps} "
                f"env steps: delete {self.path.parent} to run this seed again"
            )
        self.clock = {s: t for s, t in kept["clock"].items() if int(s) <= steps}
        state = {"env_steps": steps, "train_s": self.clock[str(steps)]}
        self.restore({**state, "evals": kept["evals"]})


def run_ours(task, seed, budget, max_minutes, run_dir, tree=ROOT):
    rec = BudgetRecorder(budget, run_dir / "recorder.json")
    overrides = [
        f"env.name={task}",
        f"seed={seed}",
        "threads=1",
        f"collector.total_frames={budget}",
        f"eval.interval={PROTOCOL['interval']}",
        f"eval.episodes={PROTOCOL['episodes']}",
        f"eval.max_steps={PROTOCOL['max_steps']}",
        "logger.progress_bar=false",
        f"logger.run_dir={run_dir}",
        f"checkpoint.interval={pinned(run_dir)['checkpoint_interval']}",
    ]
    checkpoint = checkpoint_path(run_dir)
    resume = [f"resume={checkpoint}"] if checkpoint.exists() else []

    def patch(trainer):
        # the trainer's saves (every one: on schedule, at a stop, after a
        # failure) go through _save_trainer; resume() loads with load_from_file
        save, load = trainer._save_trainer, trainer.load_from_file

        def save_and_keep(*args, **kwargs):
            tick = time.perf_counter()
            rec.keep(
                trainer.collected_frames
            )  # first: a checkpoint never lacks its clock
            try:
                return save(*args, **kwargs)
            finally:
                rec.start += time.perf_counter() - tick  # not training time

        def load_and_restore(*args, **kwargs):
            out = load(*args, **kwargs)
            rec.restore_kept(trainer.collected_frames)
            return out

        trainer._save_trainer, trainer.load_from_file = save_and_keep, load_and_restore

    torchrl_version = train_ours([*overrides, *resume], rec, tree, patch)
    frames = rec.evals[-1]["env_steps"] if rec.evals else 0
    out = rec.result(frames, rec.stop_reason(frames) or "not finished")
    out["settings"] = {"overrides": overrides, "tree": str(tree)}
    out["versions"] = {"torchrl": torchrl_version}
    return out


def run_di_acer(task, seed, budget, max_minutes, run_dir):
    import ding
    from dizoo.box2d.lunarlander.config.lunarlander_acer_config import (
        create_config,
        main_config,
    )
    from easydict import EasyDict

    config = di_config(main_config, run_dir)
    create_config = EasyDict(json.loads(json.dumps(create_config)))
    create_config.env_manager.type = "base"  # train_di_acer steps them in-process
    rec = BudgetRecorder(budget)
    steps, stop, cfg = train_di_acer(
        config,
        create_config,
        task,
        seed,
        rec,
        episodes=PROTOCOL["episodes"],
        max_steps=PROTOCOL["max_steps"],
    )
    out = rec.result(steps, stop)
    out["settings"] = {
        "source": DI_SOURCE,
        "dizoo_config": main_config,
        # what the policy ran with: dizoo's settings over ACERPolicy's defaults
        "policy": json.loads(json.dumps(cfg.policy, default=str)),
        "changed": "env: gymnasium's LunarLander-v3 through DingEnvWrapper (dizoo's "
        "env is gym's LunarLander-v2); env_manager: base (in-process), not "
        "subprocess; dizoo's evaluator replaced by the bench's",
    }
    out["versions"] = {"di_engine": ding.__version__}
    return out


def run_sb3(algo, task, seed, budget, max_minutes, run_dir):
    rec = BudgetRecorder(budget)
    steps, stop, name, version = train_sb3(
        algo,
        task,
        ZOO[algo],
        seed,
        rec,
        total_timesteps=budget,
        episodes=PROTOCOL["episodes"],
        max_steps=PROTOCOL["max_steps"],
        run_dir=run_dir,
        save_interval=pinned(run_dir)["checkpoint_interval"],
    )
    out = rec.result(steps, stop)
    out["settings"] = {
        "algo": name,
        "zoo": ZOO[algo],
        "source": ZOO_SOURCE,
        "changed": ZOO_CHANGED,
    }
    out["versions"] = {"stable_baselines3": version}
    return out


def run_torchrl_ppo(task, seed, budget, max_minutes, run_dir):
    rec = BudgetRecorder(budget)
    steps, stop, version = train_torchrl_ppo(
        task,
        ZOO["sb3_ppo"],
        seed,
        rec,
        total_timesteps=budget,
        episodes=PROTOCOL["episodes"],
        max_steps=PROTOCOL["max_steps"],
    )
    out = rec.result(steps, stop)
    out["settings"] = {
        "algo": "ClipPPOLoss + GAE (TorchRL)",
        "zoo": ZOO["sb3_ppo"],
        "source": f"{ZOO_SOURCE}, the PPO entry, over SB3 2.9's PPO defaults; the "
        "loop of TorchRL's sota-implementations/ppo/ (time_to_solve.py's "
        "train_torchrl_ppo)",
        "changed": ZOO_CHANGED,
    }
    out["versions"] = {"torchrl": version}
    return out


# -- the driver: every run, one at a time, each finished one recorded ------------------


def check_settings(args):
    """The runs directory's setting (``settings.json``): written by the first
    invocation (or taken from the result file of ``--continue``), and every later
    one must match it."""
    if args.resume:
        folder = "{0[candidate]}-seed{0[seed]}".format
        restore_runs(args.resume, args.runs_dir, folder)
    path = args.runs_dir / "settings.json"
    earlier = json.loads(path.read_text()) if path.exists() else None
    rev = args.ours_commit or (earlier or {}).get("ours_commit") or "HEAD"
    ours_commit, args.ours_tree = export_commit(rev)
    settings = {
        "task": TASK,
        "threshold": THRESHOLD,
        "budget_env_steps": args.budget,
        "protocol": PROTOCOL,
        "checkpoint_interval": args.checkpoint_interval,
        "ours_commit": ours_commit,
    }
    return pin_settings(args.runs_dir, settings, earlier)


def run_and_record(candidate, seed, args):
    """One run (resumed, for ours, if it was stopped); a finished one's record is
    written to its ``record.json``, every attempt to ``attempts.json``."""
    run_dir = args.runs_dir / f"{candidate}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    attempts_file = run_dir / "attempts.json"
    attempts = json.loads(attempts_file.read_text()) if attempts_file.exists() else []
    record = run_one(candidate, TASK, seed, args, script=__file__, run_dir=run_dir)
    attempts.append(
        {
            "returncode": record["returncode"],
            "process_wall_s": record["process_wall_s"],
            "jobs": args.jobs,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    attempts_file.write_text(json.dumps(attempts, indent=1) + "\n")
    if record["returncode"] == 0 and record["stopped"] == "budget":
        record["attempts"] = attempts
        (run_dir / "record.json").write_text(json.dumps(record, indent=1) + "\n")
        tidy(run_dir)  # an SB3 run's checkpoints; ours' stay in checkpoints/
    return record


def summary(records, seeds):
    out = []
    for candidate in CANDIDATES:
        runs = {r["seed"]: r for r in records if r["candidate"] == candidate}
        if not runs:
            continue
        done = [runs[s] for s in seeds if s in runs]
        out.append(
            {
                "candidate": candidate,
                "seeds": [r["seed"] for r in done],
                "missing_seeds": [s for s in seeds if s not in runs],
                "reached": sum(r["reached"] for r in done),
                "env_steps_to_threshold_per_seed": {
                    r["seed"]: r["env_steps_to_threshold"]
                    if r["reached"]
                    else "not reached"
                    for r in done
                },
                "final_eval_per_seed": {r["seed"]: r["final_eval"] for r in done},
                # over the seeds that reached
                "env_steps_to_threshold": stats(
                    [r["env_steps_to_threshold"] for r in done]
                ),
                "train_s_to_threshold": stats(
                    [r["train_s_to_threshold"] for r in done]
                ),
                "final_eval": stats([r["final_eval"] for r in done]),
                "final_env_steps": stats([r["final_env_steps"] for r in done]),
                # the training loop's pace, setup and evaluations excluded
                "env_steps_per_train_s": stats(
                    [r["final_env_steps"] / r["evals"][-1]["train_s"] for r in done]
                ),
            }
        )
    return out


def write_result(args, settings, records):
    from _common import save

    by_key = {(r["candidate"], r["seed"]): r for r in records}
    runs = [by_key[k] for k in sorted(by_key)]
    missing = [
        {"candidate": c, "seed": s}
        for c in args.candidates
        for s in args.seeds
        if (c, s) not in by_key
    ]
    settings_of = {r["candidate"]: r["settings"] for r in runs}  # seed 0's, if run
    payload = {
        "settings": {
            **settings,
            "seeds": args.seeds,
            "candidates": args.candidates,
            "protocol_text": "greedy (argmax) evaluation: mean return of "
            f"{PROTOCOL['episodes']} episodes of at most {PROTOCOL['max_steps']} "
            "steps, one per environment copy (seeded once from seed + 10000), after "
            "the first update that takes the env steps to a multiple of "
            f"{PROTOCOL['interval']} or past it (ours, on its trainer's schedule, "
            "also after its first batch); runs go on to the budget; train seconds: "
            "the training loop's time, less evaluations and checkpoints (setup "
            "excluded); a resumed run (ours, SB3) goes on with the clock of its "
            "checkpoint",
            "threads": "torch.set_num_threads(1), OMP/MKL/OPENBLAS_NUM_THREADS=1, "
            "a process per run (each attempt's --jobs in its attempts)",
            **{c: settings_of.get(c) for c in args.candidates},
            **({"di_acer_source": DI_SOURCE} if "di_acer" in args.candidates else {}),
            **(
                {"zoo": ZOO, "zoo_source": ZOO_SOURCE, "zoo_changed": ZOO_CHANGED}
                if any(
                    c.startswith("sb3") or c == "torchrl_ppo" for c in args.candidates
                )
                else {}
            ),
        },
        # the command that runs them: --summary only writes what has finished
        "command": " ".join(
            [Path(sys.executable).name, *[a for a in sys.argv if a != "--summary"]]
        ),
        "complete": not missing,
        "missing_runs": missing,
        "runs_dir": str(args.runs_dir),
        "summary": summary(runs, args.seeds),
        "runs": runs,
    }
    path = save(args.result_name, payload)
    print(f"saved {path}")
    if missing:
        print(f"INCOMPLETE: not finished {missing}")
    for group in payload["summary"]:
        print(
            f"{group['candidate']}: reached {group['reached']}/{len(group['seeds'])}, "
            f"steps to {THRESHOLD:g} {group['env_steps_to_threshold_per_seed']}, "
            f"final {group['final_eval_per_seed']}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(
        parser, CANDIDATES, ours_commit="default: the runs directory's, else HEAD"
    )
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="env steps")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument(
        "--checkpoint-interval",
        type=int,
        default=CHECKPOINT_INTERVAL,
        help="env steps between checkpoints (ours and SB3)",
    )
    parser.add_argument(
        "--runs-dir", type=Path, default=ROOT / "bench" / "runs" / "lunar_lander"
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="write the result from the finished runs, running none",
    )
    parser.add_argument(
        "--result-name",
        default="lunar_lander",
        help="the result file's name before its stamp: one per runs directory",
    )
    add_continue_argument(parser)
    add_worker_arguments(parser, CANDIDATES)
    # the 1M comparison's; the SB3 peers run at 500k in a runs directory of their own
    parser.set_defaults(
        max_minutes=None, candidates=["ours", "di_acer"]
    )  # no time cap: runs go to the budget
    args = parser.parse_args()
    if args.worker:
        runners = {"ours": run_ours, "di_acer": run_di_acer}
        runners.update({c: functools.partial(run_sb3, c) for c in ZOO})
        runners["torchrl_ppo"] = run_torchrl_ppo
        return worker(args, runners)

    args.runs_dir = args.runs_dir.resolve()
    settings = check_settings(args)
    records = []
    for path in sorted(args.runs_dir.glob("*-seed*/record.json")):
        records.append(json.loads(path.read_text()))
        tidy(path.parent)  # in case the process ended between record and tidy
    if not args.summary:
        done = {(r["candidate"], r["seed"]) for r in records}
        order = random.Random(args.order_seed)
        plan = []
        for seed in args.seeds:
            candidates = list(args.candidates)
            order.shuffle(candidates)
            plan += [(c, seed) for c in candidates if (c, seed) not in done]
        print(f"{len(done)} runs finished before, {len(plan)} to run", flush=True)
        # run_one reads these: the budget per task, no time cap
        args.budget, args.max_minutes = {TASK: args.budget}, None

        def one(item):
            candidate, seed = item
            print(f"start {candidate} seed {seed}", flush=True)
            record = run_and_record(candidate, seed, args)
            if record["returncode"] == 0 and record["stopped"] == "budget":
                steps = record["env_steps_to_threshold"]
                print(
                    f"done {candidate} seed {seed}: "
                    + (f"reached {THRESHOLD:g} at {steps}" if steps else "not reached")
                    + f", final eval {record['final_eval']:.1f}, "
                    f"{record['process_wall_s']:.0f} s",
                    flush=True,
                )
                return record
            print(
                f"unfinished {candidate} seed {seed}: "
                f"{record.get('error', record.get('stopped'))}; run again to continue",
                flush=True,
            )
            return None

        with ThreadPoolExecutor(args.jobs) as pool:
            records += [r for r in pool.map(one, plan) if r is not None]
    finished = {(r["candidate"], r["seed"]) for r in records}
    missing = [
        (c, s) for s in args.seeds for c in args.candidates if (c, s) not in finished
    ]
    if missing and not args.summary:
        print(f"not finished: {missing}; run the same command again to continue")
        return
    chosen = [
        r
        for r in records
        if r["seed"] in args.seeds and r["candidate"] in args.candidates
    ]
    write_result(args, settings, chosen)


if __name__ == "__main__":
    main()
