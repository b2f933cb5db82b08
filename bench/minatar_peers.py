"""MinAtar Breakout and SpaceInvaders: Stable-Baselines3's DQN, PPO and A2C beside ours.

    bash bench/peers_setup.sh                  # once: .venv-bench with SB3 and MinAtar
    nice -n 19 python bench/minatar_peers.py --bench-venv .venv-bench   # every run
    python bench/minatar_peers.py --summary    # the result of the runs finished so far
    python bench/minatar_peers.py --continue bench/results/minatar_peers-<stamp>.json
                                               # a fresh checkout: the missing runs only
    python bench/minatar_peers.py --status     # each run's progress
    RESULTS_DIR=/tmp/mp python bench/minatar_peers.py --seeds 0 --budget 3000 \\
        --save-interval 1000 --runs-dir /tmp/mp/runs             # smoke

The peers on ours' protocol (``bench/run_learning.sh``'s ``minatar_run``):
gymnasium's ``MinAtar/<Game>-v1`` from the minatar package (1.0.15, its
``minatar.gym`` registration: the minimal action set, MinAtar's defaults of sticky
actions with probability 0.1 and difficulty ramping on, no time limit in
training; ours' runs use the same ids with the same defaults), 10x10xC boolean
grids, channels last, as ours sees them; 1M env steps (frames) a run, seeds 0-2;
greedy (``deterministic=True``: the argmax) evaluation, the mean return of 10
episodes of at most 10 000 steps, one per environment copy of a separate set
seeded once from ``seed + 10_000 + i`` (``time_to_solve.greedy_return``; once more
after a resume), after the first update that takes the run's env steps to a
multiple of 50 000 or past it, and once more at the end. Training seconds exclude setup, evaluations and saves.

Every peer has the MinAtar paper's network (Young & Tian 2019), given through its
``policy_kwargs``: one conv layer of 16 3x3 filters (stride 1) and a ReLU, a
128-unit ReLU layer (``MinAtarNet``, a ``BaseFeaturesExtractor``), then linear
heads on those 128 features (``net_arch=[]``): DQN's Q head; PPO's and A2C's
policy and value heads, sharing the features (SB3's default), as ours' heads do.

Settings (``SETTINGS``):

- ``sb3_dqn``: the MinAtar paper's DQN: one env, a 100k replay, batches of 32,
  RMSprop (lr 2.5e-4, alpha 0.95, eps 0.01, centered), target network copied every
  1000 steps, epsilon 1.0 -> 0.1 over the first 100k steps (``exploration_fraction``
  0.1 of 1M), 5000 steps before learning, one update every step, gamma 0.99, the
  Huber loss (SB3's). SB3 clips the gradient norm at 10 (its default; the paper
  does not clip).
- ``sb3_ppo``, ``sb3_a2c``: rl-baselines3-zoo has no MinAtar settings; these are
  rl_zoo3 2.9.2's ``atari`` entries of ``hyperparams/ppo.yml`` and ``a2c.yml``
  (read from its wheel) less what only Atari needs: its ``AtariWrapper`` and
  ``frame_stack: 4`` (MinAtar's grids already show motion; ours stacks none). The
  linear schedules (``lin_``) run over the run's 1M env steps, not the zoo's 1e7.

Resumable across sessions: a run saves its model (and DQN's replay buffer) and its
evaluations and training clock every ``--save-interval`` env steps (100k) into
``<runs-dir>/<game>-<algo>-seed<S>/checkpoint-<steps>/`` (``latest.json`` names
the newest), and the same command resumes it (``load``, then ``learn`` with
``reset_num_timesteps=False``, on fresh episodes seeded ``seed + steps``: the
episodes in progress and the RNG states are not saved, so a resumed run is not
bit for bit the one that was stopped). A finished run writes ``record.json`` and
is skipped afterwards. Runs go one at a time: Breakout, then SpaceInvaders; within
a game seed after seed, DQN, PPO and A2C in each. ``--summary`` (or the end of
every run having finished) writes ``bench/results/minatar_peers-<UTC stamp>.json``: per algorithm
and game the final greedy return's median and range over the finished seeds, the
missing seeds, and ours' from the committed learning files (``OURS``) beside them.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from time_to_solve import (  # noqa: E402
    ROOT,
    ResumableRecorder,
    _schedule,
    add_continue_argument,
    add_worker_arguments,
    latest_checkpoint,
    pin_settings,
    pinned,
    restore_runs,
    run_one,
    stats,
    tidy,
    train_sb3,
    worker,
)

GAMES = {
    "breakout": "MinAtar/Breakout-v1",
    "space_invaders": "MinAtar/SpaceInvaders-v1",
}
ALGOS = ("sb3_dqn", "sb3_ppo", "sb3_a2c")
PROTOCOL = {
    "interval": 50_000,  # env steps between greedy evaluations
    "episodes": 10,  # greedy episodes per evaluation, one per environment copy
    "max_steps": 10_000,  # ours' eval.max_steps (MinAtar has no time limit)
}
DEFAULT_BUDGET = 1_000_000
SAVE_INTERVAL = 100_000
RUNS_DIR = ROOT / "bench" / "runs" / "minatar_peers"
# ours at its defaults, bash bench/run_learning.sh minatar (the same protocol)
OURS = {
    "breakout": "learning-minatar_breakout-20261130T044419Z.json",
    "space_invaders": "learning-minatar_space_invaders-20261130T040148Z.json",
}
ZOO_SOURCE = (
    "rl_zoo3 2.9.2 hyperparams/{}.yml, the atari entry, less its AtariWrapper and "
    "frame_stack 4; lin_ schedules over the run's budget"
)
SETTINGS = {
    "sb3_dqn": {
        "source": "MinAtar paper (Young & Tian 2019) DQN; SB3's max_grad_norm 10 kept",
        "n_envs": 1,
        "buffer_size": 100_000,
        "batch_size": 32,
        "learning_rate": 2.5e-4,
        "optimizer": ("RMSprop", {"alpha": 0.95, "eps": 0.01, "centered": True}),
        "target_update_interval": 1000,
        "exploration_initial_eps": 1.0,
        "exploration_final_eps": 0.1,
        "exploration_steps": 100_000,
        "learning_starts": 5000,
        "train_freq": 1,
        "gradient_steps": 1,
        "gamma": 0.99,
    },
    "sb3_ppo": {
        "source": ZOO_SOURCE.format("ppo"),
        "n_envs": 8,
        "n_steps": 128,
        "n_epochs": 4,
        "batch_size": 256,
        "learning_rate": ("linear", 2.5e-4),
        "clip_range": ("linear", 0.1),
        "vf_coef": 0.5,
        "ent_coef": 0.01,
    },
    "sb3_a2c": {
        "source": ZOO_SOURCE.format("a2c"),
        "n_envs": 16,
        "ent_coef": 0.01,
        "vf_coef": 0.25,
        "optimizer": ("RMSpropTFLike", {"eps": 1e-5}),
    },
}


# -- the worker: one run, in the peers' venv ------------------------------------------


@functools.cache
def minatar_net():
    """The MinAtar paper's network as an SB3 features extractor (built on first use:
    the driver's venv need not have SB3)."""
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class MinAtarNet(BaseFeaturesExtractor):
        """16 3x3 filters (stride 1), ReLU, 128 ReLU units, on ``[B, 10, 10, C]``
        grids (SB3 hands them over as floats, channels last as MinAtar gives them)."""

        def __init__(self, observation_space):
            super().__init__(observation_space, features_dim=128)
            height, width, channels = observation_space.shape
            self.layers = torch.nn.Sequential(
                torch.nn.Conv2d(channels, 16, 3, stride=1),
                torch.nn.ReLU(),
                torch.nn.Flatten(),
                torch.nn.Linear(16 * (height - 2) * (width - 2), 128),
                torch.nn.ReLU(),
            )

        def forward(self, obs):
            return self.layers(obs.permute(0, 3, 1, 2))

    return MinAtarNet


def model_kwargs(algo, budget):
    """SB3's constructor arguments for ``algo`` (``SETTINGS``) over ``budget`` env
    steps, and its number of envs."""
    import torch
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    hp = {k: v for k, v in SETTINGS[algo].items() if k != "source"}
    n_envs = hp.pop("n_envs")
    policy_kwargs = {"features_extractor_class": minatar_net(), "net_arch": []}
    if "optimizer" in hp:
        name, kwargs = hp.pop("optimizer")
        optimizer = {"RMSprop": torch.optim.RMSprop, "RMSpropTFLike": RMSpropTFLike}
        policy_kwargs.update(optimizer_class=optimizer[name], optimizer_kwargs=kwargs)
    if "exploration_steps" in hp:  # SB3 takes it as a fraction of the run
        hp["exploration_fraction"] = hp.pop("exploration_steps") / budget
    kwargs = {key: _schedule(value) for key, value in hp.items()}
    return {**kwargs, "policy_kwargs": policy_kwargs}, n_envs


class PeerRecorder(ResumableRecorder):
    """A :class:`ResumableRecorder` of evaluations every ``PROTOCOL["interval"]``
    env steps to the budget (no threshold)."""

    def __init__(self, budget):
        super().__init__(float("inf"), PROTOCOL["interval"], budget)


def run_peer(algo, task, seed, budget, max_minutes, run_dir):
    """One run of ``algo`` on ``task`` to ``budget`` env steps, from its latest
    checkpoint if it has one (time_to_solve's resumable ``train_sb3``); its record
    (``stopped="budget"`` once finished)."""
    import gymnasium as gym
    from minatar.gym import register_envs

    if task not in gym.registry:
        register_envs()
    save_interval = pinned(run_dir)["save_interval"]
    kwargs, n_envs = model_kwargs(algo, budget)
    rec = PeerRecorder(budget)
    steps, _, name, version = train_sb3(
        algo,
        task,
        {**kwargs, "n_envs": n_envs},
        seed,
        rec,
        total_timesteps=budget,
        episodes=PROTOCOL["episodes"],
        max_steps=PROTOCOL["max_steps"],
        run_dir=run_dir,
        save_interval=save_interval,
    )
    return {
        "final_eval": rec.evals[-1]["return"],
        "final_env_steps": int(steps),
        "train_s": rec.evals[-1]["train_s"],
        "eval_s_total": rec.eval_s,
        "stopped": "budget" if steps >= budget else "not finished",
        "resumed_at": rec.resumed_at,
        "evals": rec.evals,
        "settings": {
            "algo": name,
            "n_envs": n_envs,
            **SETTINGS[algo],
            "network": "MinAtarNet (16 3x3 conv, 128 ReLU) shared, net_arch=[]",
        },
        "versions": {"stable_baselines3": version},
    }


# -- the driver: every run, one at a time, each finished one recorded ------------------


def check_settings(args):
    """The runs directory's setting (``settings.json``): written by the first
    invocation (or taken from the result file of ``--continue``), and every later
    one must match it."""
    if args.resume:
        folder = "{0[game]}-{0[candidate]}-seed{0[seed]}".format
        restore_runs(args.resume, args.runs_dir, folder)
    path = args.runs_dir / "settings.json"
    earlier = json.loads(path.read_text()) if path.exists() else None
    settings = {
        "games": GAMES,
        "budget_env_steps": args.budget,
        "protocol": PROTOCOL,
        "save_interval": args.save_interval,
        "settings": json.loads(json.dumps(SETTINGS)),
    }
    return pin_settings(args.runs_dir, settings, earlier)


def run_and_record(game, algo, seed, args):
    """One run (resumed if it was stopped); a finished one's record goes to its
    ``record.json``, every attempt to ``attempts.json``."""
    run_dir = args.runs_dir / f"{game}-{algo}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    attempts_file = run_dir / "attempts.json"
    attempts = json.loads(attempts_file.read_text()) if attempts_file.exists() else []
    record = run_one(algo, GAMES[game], seed, args, script=__file__, run_dir=run_dir)
    record["game"] = game
    attempts.append(
        {
            "returncode": record["returncode"],
            "process_wall_s": record["process_wall_s"],
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )
    attempts_file.write_text(json.dumps(attempts, indent=1) + "\n")
    if record["returncode"] == 0 and record["stopped"] == "budget":
        record["attempts"] = attempts
        (run_dir / "record.json").write_text(json.dumps(record, indent=1) + "\n")
        tidy(run_dir)
    return record


def ours_final(game, results=ROOT / "bench" / "results"):
    """Ours' final greedy returns on ``game`` from its committed learning file."""
    data = json.loads((results / OURS[game]).read_text())
    return {
        "file": OURS[game],
        "commit": data["commit"],
        "seeds": data["seeds"],
        "final_eval_per_seed": {r["seed"]: r["final_eval"] for r in data["runs"]},
        "final_eval": data["final_eval"],
    }


def summary(records, seeds, games=tuple(GAMES), algos=ALGOS, progress=None):
    """Per game: ours' final returns, and per algorithm the final greedy return's
    median and range over the finished seeds, with the missing ones (``progress``:
    the env steps of each unfinished run's latest save, by run name)."""
    out = []
    for game in games:
        peers = []
        for algo in algos:
            runs = {
                r["seed"]: r
                for r in records
                if r["game"] == game and r["candidate"] == algo
            }
            done = [runs[s] for s in seeds if s in runs]
            missing = [s for s in seeds if s not in runs]
            peers.append(
                {
                    "algo": algo,
                    "seeds": [r["seed"] for r in done],
                    "missing_seeds": missing,
                    "saved_env_steps_of_missing": {
                        s: (progress or {}).get(f"{game}-{algo}-seed{s}")
                        for s in missing
                    },
                    "final_eval_per_seed": {r["seed"]: r["final_eval"] for r in done},
                    "final_eval": stats([r["final_eval"] for r in done]),
                    "final_env_steps": stats([r["final_env_steps"] for r in done]),
                    "train_s": stats([r["train_s"] for r in done]),
                }
            )
        out.append({"game": game, "ours": ours_final(game), "peers": peers})
    return out


def write_result(args, settings, records):
    from _common import save

    runs = sorted(records, key=lambda r: (r["game"], r["candidate"], r["seed"]))
    progress = {
        path.parent.name: json.loads(path.read_text())["env_steps"]
        for path in args.runs_dir.glob("*-seed*/latest.json")
    }
    payload = {
        "settings": {
            **settings,
            "seeds": args.seeds,
            "algos": args.algos,
            "protocol_text": "greedy (deterministic=True) evaluation: mean return of "
            f"{PROTOCOL['episodes']} episodes of at most {PROTOCOL['max_steps']} "
            "steps, one per environment copy of a separate set (seeded once from "
            "seed + 10000 + i), after the first update that takes the env steps to a "
            f"multiple of {PROTOCOL['interval']} or past it, and at the end; "
            "MinAtar's defaults (sticky actions 0.1, difficulty ramping), as ours; "
            "train seconds: the training loop's, less evaluations and saves",
            "threads": "torch.set_num_threads(1), OMP/MKL/OPENBLAS_NUM_THREADS=1, "
            "one run at a time, at nice 19 beside other jobs on a 2-core machine",
            "network": "the MinAtar paper's (16 3x3 conv stride 1, ReLU, 128 ReLU) "
            "as an SB3 features extractor, linear heads (net_arch=[]), shared by "
            "PPO's and A2C's policy and value",
        },
        "complete": all(
            (g, a, s) in {(r["game"], r["candidate"], r["seed"]) for r in runs}
            for g in args.games
            for a in args.algos
            for s in args.seeds
        ),
        "runs_dir": str(args.runs_dir),
        "summary": summary(runs, args.seeds, args.games, args.algos, progress),
        "runs": runs,
    }
    path = save("minatar_peers", payload)
    print(f"saved {path}")
    for game in payload["summary"]:
        ours = game["ours"]["final_eval"]
        print(
            f"{game['game']}: ours {ours['median']:.1f} ({ours['min']:.1f}-{ours['max']:.1f})"
        )
        for peer in game["peers"]:
            final = peer["final_eval"]
            text = (
                f"{final['median']:.1f} ({final['min']:.1f}-{final['max']:.1f})"
                if final
                else "none finished"
            )
            print(f"  {peer['algo']}: {text}, missing seeds {peer['missing_seeds']}")
    return path


def status(args):
    """Prints each run's state: its final return, or its latest save and the last
    evaluation in its log, or not started."""
    for game in args.games:
        for seed in args.seeds:
            for algo in args.algos:
                run_dir = args.runs_dir / f"{game}-{algo}-seed{seed}"
                if (run_dir / "record.json").exists():
                    r = json.loads((run_dir / "record.json").read_text())
                    state = (
                        f"done: final greedy return {r['final_eval']:.2f}, "
                        f"train {r['train_s']:.0f} s"
                    )
                elif (run_dir / "log.txt").exists():
                    latest = latest_checkpoint(run_dir)
                    lines = (run_dir / "log.txt").read_text().splitlines()
                    last = next((x for x in reversed(lines) if "greedy" in x), None)
                    state = (
                        f"saved at {latest['env_steps'] if latest else 0} env steps; "
                        f"last evaluation: {last or 'none yet'}"
                    )
                else:
                    state = "not started"
                print(f"{run_dir.name}: {state}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="env steps")
    parser.add_argument(
        "--save-interval", type=int, default=SAVE_INTERVAL, help="env steps"
    )
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    parser.add_argument("--bench-venv", default=str(ROOT / ".venv-bench"))
    parser.add_argument(
        "--summary",
        action="store_true",
        help="write the result from the finished runs, running none",
    )
    parser.add_argument(
        "--status", action="store_true", help="print each run's progress, run none"
    )
    add_continue_argument(parser)
    add_worker_arguments(parser, ALGOS)
    parser.set_defaults(max_minutes=None)  # no time cap: runs go to the budget
    args = parser.parse_args()
    if args.worker:
        runners = {algo: functools.partial(run_peer, algo) for algo in ALGOS}
        return worker(args, runners)

    args.runs_dir = args.runs_dir.resolve()
    if args.status:
        return status(args)
    settings = check_settings(args)
    records = []
    for path in sorted(args.runs_dir.glob("*-seed*/record.json")):
        records.append(json.loads(path.read_text()))
        tidy(path.parent)
    records = [
        r
        for r in records
        if r["game"] in args.games
        and r["candidate"] in args.algos
        and r["seed"] in args.seeds
    ]

    def unfinished():
        """The runs without a record, in the order they run."""
        done = {(r["game"], r["candidate"], r["seed"]) for r in records}
        return [
            (game, algo, seed)
            for game in args.games
            for seed in args.seeds
            for algo in args.algos
            if (game, algo, seed) not in done
        ]

    if not args.summary:
        plan = unfinished()
        print(f"{len(records)} runs finished before, {len(plan)} to run", flush=True)
        budget = args.budget
        args.budget = {GAMES[g]: budget for g in args.games}  # as run_one reads it
        for game, algo, seed in plan:
            print(f"start {game} {algo} seed {seed}", flush=True)
            record = run_and_record(game, algo, seed, args)
            if record["returncode"] == 0 and record["stopped"] == "budget":
                records.append(record)
                print(
                    f"done {game} {algo} seed {seed}: final greedy return "
                    f"{record['final_eval']:.2f}, train {record['train_s']:.0f} s, "
                    f"{record['process_wall_s']:.0f} s in all",
                    flush=True,
                )
            else:
                print(
                    f"unfinished {game} {algo} seed {seed}: "
                    f"{record.get('error', record.get('stopped'))}; "
                    "run again to continue",
                    flush=True,
                )
        args.budget = budget
    missing = unfinished()
    if missing and not args.summary:
        print(f"not finished: {missing}; run the same command again to continue")
        return
    write_result(args, settings, records)


if __name__ == "__main__":
    main()
