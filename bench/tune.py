"""Tuning the way users tune: an Optuna study of the gym example's settings.

    pip install -e ".[tune]"                               # Optuna
    nice -n 19 python bench/tune.py --task CartPole-v1 --trials 60
    python bench/tune.py --task CartPole-v1 --export       # the study as data, no runs
    nice -n 19 python bench/tune.py --task CartPole-v1 --study small_t \
        --space T=5,10 replay_ratio=1.0,2.0 --first T=5    # a second study, narrowed
    nice -n 19 python bench/tune.py --task LunarLander-v3 --objective final_return \
        --budget 500000 --trials 40                         # the return at 500k

Each trial samples ACER's settings (``SPACE``: T, number of envs, replay ratio and
start, whether each fresh batch gets an update of its own, replayed segments per
batch, learning rate and its schedule, entropy, δ, c, α, γ, critic weight, network
width, gradient clip) and trains ``examples/acer_gym.py`` with them once per tuning
seed (100 and up, kept apart from the seeds results are reported on, 0-9), each seed
in a process of its own on one thread, with the protocol of
``bench/time_to_solve.py`` (a greedy evaluation of ``episodes`` environment copies
every ``interval`` env steps). A run stops ``settle`` env steps after its first
evaluation at the threshold, or at the budget.

What a trial is worth (lower is better): the mean over its seeds of the CPU
seconds of the training loop until the threshold was first reached (evaluation
excluded; CPU time of the one-thread run, so that other work on the machine does not
stretch it), where a seed counts as solved only if it is still solved when it
stops (the mean of its last ``late`` evaluations at or above the threshold); an
unsolved or collapsed seed counts its CPU seconds plus ``FAIL_S``, more than any
run within the budget costs, so that a trial that stays solved on more seeds always
ranks first. With ``--objective env_steps`` a trial is worth the mean
env steps to the threshold instead, an unsolved or collapsed seed counting its env
steps plus the budget: the study then looks for the fewest samples, whatever the
compute. (The CartPole-v1 study ran with an unsolved seed at twice its CPU
seconds, which let a cheap setting that never solved rank first; its export keeps
those values as ``value_as_run`` and ranks the trials anew from their runs.) So the
study looks for settings that solve soon in both samples and compute, and stay
solved.

With ``--objective final_return`` (a task judged at a fixed budget, as
LunarLander-v3 is at 500k env steps, with ``bench/lunar_lander.py``'s protocol)
every run goes on to the budget, evaluating only from ``late`` evaluation intervals
before it (earlier greedy episodes would cost as much as the training and count for
nothing), and a trial is worth minus the mean over its seeds of ``late_mean``.

The study lives in ``bench/runs/tune/<task>.db`` (SQLite; the study resumes from
it: run the same command again; a second process may run it side by side with
``--sampler-seed 1``), and after every trial it is exported to
``bench/results/tune-<task>.json``: the commit, the machine, the space, every trial
with its settings, per-seed results and value, and the best trial's settings as
overrides of ``examples/acer_gym.py``. In a fresh checkout (no database) the same
command restores the study from that export, every trial under its own number (one
that had not finished comes back failed, with the runs it had finished), and goes on.

A second study of a task goes apart from the first with ``--study NAME``: its own
``bench/runs/tune/<task>-<NAME>.db`` and ``bench/results/tune-<task>-<NAME>.json``.
``--space name=v1,v2,...`` narrows it: a categorical's choices (JSON values, ``null``
for none), or a log range as ``name=low,high``, or ``name=value`` to pin either; the
rest of ``SPACE`` stays as is.
The study keeps its space and objective and refuses to resume with others (repeat
the same command). Its first trial is the example's defaults (``DEFAULTS``), with
``--first name=value ...`` in place of those the narrowed space leaves out. With
``--grid`` (every setting pinned or listed) it runs each combination once instead;
the processes of a grid share one ``--sampler-seed`` (its order).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import lunar_lander  # noqa: E402
from _common import git_commit, machine  # noqa: E402
from time_to_solve import (  # noqa: E402
    PROTOCOL,
    ROOT,
    THRESHOLDS,
    Recorder,
    train_ours,
)

RUNS = ROOT / "bench" / "runs" / "tune"
RESULTS = ROOT / "bench" / "results"
TUNING_SEEDS = (100, 101, 102)
# evaluations in a run's late_mean, unless --late says otherwise
LATE = 5
# task: (threshold, evaluation protocol), each as its own benchmark measures it
TASKS = {
    **{
        task: (
            threshold,
            {
                "interval": PROTOCOL["interval"][task],
                "episodes": PROTOCOL["episodes"],
                "max_steps": PROTOCOL["max_steps"],
            },
        )
        for task, threshold in THRESHOLDS.items()
    },
    lunar_lander.TASK: (lunar_lander.THRESHOLD, lunar_lander.PROTOCOL),
}

# name: (config key, kind, choices or (low, high)); categorical where the values
# are few and meaningful, log-uniform for rates
SPACE = {
    "T": ("collector.T", "cat", [5, 10, 20, 40]),
    "num_envs": ("env.num_envs", "cat", [4, 8, 16]),
    "replay_ratio": ("replay.ratio", "cat", [0.0, 1.0, 2.0, 4.0, 8.0]),
    "replay_start": ("replay.start", "cat", [0, 500, 1000, 2000]),
    # false: fully off-policy, the fresh batch only stored (needs replay_ratio > 0)
    "on_policy": ("replay.on_policy_updates", "cat", [True, False]),
    "batch_segments": ("replay.batch_segments", "cat", [8, 16, 32]),
    "lr": ("optim.lr", "log", (1e-4, 5e-3)),
    "lr_schedule": ("optim.schedule", "cat", ["constant", "linear"]),
    "entropy": ("loss.entropy_coeff", "log", (1e-4, 5e-2)),
    "delta": ("loss.trust_region_delta", "cat", [0.1, 0.3, 1.0, 3.0, None]),
    "c": ("loss.ratio_clip", "cat", [1.0, 3.0, 10.0]),
    "alpha": ("loss.alpha", "cat", [0.9, 0.95, 0.99, 0.995]),
    "gamma": ("loss.gamma", "cat", [0.98, 0.99, 0.995]),
    "critic": ("loss.critic_coeff", "cat", [0.25, 0.5, 1.0]),
    "width": ("model.num_cells", "cat", [32, 64, 128]),
    "grad_clip": ("optim.max_grad_norm", "cat", [0.5, 10.0, None]),
}


# examples/config_gym.yaml's values of SPACE
DEFAULTS = {
    "T": 20,
    "num_envs": 8,
    "replay_ratio": 4.0,
    "replay_start": 1000,
    "on_policy": True,
    "batch_segments": 32,
    "lr": 1e-3,
    "lr_schedule": "constant",
    "entropy": 1e-2,
    "delta": 1.0,
    "c": 10.0,
    "alpha": 0.99,
    "gamma": 0.99,
    "critic": 0.25,
    "width": 64,
    "grad_clip": 10.0,
}


def override(key: str, value) -> str:
    if key == "model.num_cells":
        return f"{key}=[{value},{value}]"
    if isinstance(value, bool):  # Hydra's spelling
        return f"{key}={str(value).lower()}"
    return f"{key}={'null' if value is None else value}"


def parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise SystemExit(f"{text!r}: expected a JSON value (5, 0.5, null)") from None


def named(option: str, spec: str, form: str) -> tuple[str, str]:
    """``(name, what follows "=")`` of ``spec``, refused unless ``name`` is in
    ``SPACE``."""
    name, sep, rest = spec.partition("=")
    if not sep or name not in SPACE:
        raise SystemExit(
            f"{option} {spec!r}: expected {form} with name one of {list(SPACE)}"
        )
    return name, rest


def narrowed(specs: list[str]) -> dict:
    """``SPACE`` with the choices (or log range) of ``name=v1,v2,...`` replaced."""
    space = dict(SPACE)
    for spec in specs:
        name, values = named("--space", spec, "name=v1,v2,...")
        key, kind, _ = SPACE[name]
        parsed = [parse_value(v) for v in values.split(",")]
        if kind == "log" and len(parsed) == 1:
            kind = "cat"  # one value: pinned, as a categorical of one choice
        elif kind == "log":
            if len(parsed) != 2 or not 0 < parsed[0] < parsed[1]:
                raise SystemExit(
                    f"--space {spec!r}: {name} is log-uniform, expected name=low,high "
                    "with 0 < low < high, or name=value to pin it"
                )
            parsed = (float(parsed[0]), float(parsed[1]))
        space[name] = (key, kind, parsed)
    return space


def first_trial(space: dict, specs: list[str]) -> dict:
    """``DEFAULTS`` with ``name=value`` in ``specs`` in their place, checked to lie
    in ``space`` (Optuna would not take a categorical value outside its choices)."""
    params = dict(DEFAULTS)
    for spec in specs:
        name, value = named("--first", spec, "name=value")
        params[name] = parse_value(value)
    for name, value in params.items():
        _, kind, values = space[name]
        inside = values[0] <= value <= values[1] if kind == "log" else value in values
        if not inside:
            raise SystemExit(
                f"the first trial's {name}={value} lies outside the space's {values}: "
                f"give --first {name}=VALUE"
            )
    return params


def sample(trial, space: dict) -> dict:
    params = {}
    for name, (_, kind, values) in space.items():
        if kind == "log":
            params[name] = trial.suggest_float(name, *values, log=True)
        else:  # optuna stores None as a choice as is
            params[name] = trial.suggest_categorical(name, values)
    return params


def overrides_of(params: dict) -> list[str]:
    return [override(SPACE[name][0], value) for name, value in params.items()]


class CPURecorder(Recorder):
    """``Recorder`` on the process's CPU clock (so that other work on the machine
    does not stretch it), run with ``settle`` env steps past the first evaluation at
    the threshold (so that a collapse right after shows)."""

    #: env steps before which evaluations are skipped (``None``: none is)
    evaluate_from = None

    def timer(self):
        return time.process_time()

    def evaluate(self, steps, fn):
        if self.evaluate_from is not None and steps < self.evaluate_from:
            return None  # the trainer's evaluation hook then logs nothing
        return super().evaluate(steps, fn)


def run_seed(task, seed, budget, settle, late, params, run_dir, objective="cpu_s"):
    """One run of ``examples/acer_gym.py`` with ``params`` (in this process).

    With ``final_return`` only the evaluations from ``late`` intervals before the
    budget on are run: the trial's value reads the last ``late`` of them, and the
    greedy episodes of every earlier one would cost as much as the training.
    """
    threshold, protocol = TASKS[task]
    rec = CPURecorder(threshold, protocol["interval"], budget, settle=settle, late=late)
    if objective == FINAL_RETURN:
        rec.evaluate_from = budget - late * protocol["interval"]
    overrides = [
        f"env.name={task}",
        f"seed={seed}",
        "threads=1",
        f"collector.total_frames={budget}",
        f"eval.interval={protocol['interval']}",
        f"eval.episodes={protocol['episodes']}",
        f"eval.max_steps={protocol['max_steps']}",
        "logger.progress_bar=false",
        f"logger.run_dir={run_dir}",
        "checkpoint.every_minutes=null",
        *overrides_of(params),
    ]
    train_ours(overrides, rec)
    last = [e["return"] for e in rec.evals[-late:]]
    late_mean = statistics.fmean(last) if last else None
    reached = rec.reached
    return {
        "seed": seed,
        "reached": reached is not None,
        "env_steps_to_threshold": reached["env_steps"] if reached else None,
        "cpu_s_to_threshold": reached["train_s"] if reached else None,
        "late_mean": late_mean,
        "stable": late_mean is not None and late_mean >= threshold,
        "final_env_steps": rec.evals[-1]["env_steps"] if rec.evals else 0,
        "cpu_s_total": rec.evals[-1]["train_s"] if rec.evals else None,
        "evals": [[e["env_steps"], round(e["return"], 2)] for e in rec.evals],
    }


# CPU seconds added for a seed not solved for good: more than a run of the budget
# costs on the tuning tasks (at most ~15 s here), so that no speed makes up for it
FAIL_S = 100.0

# what a seed is worth, lower is better: (its measure to a stable solve, that
# measure at its stop, the penalty of a seed not solved for good)
OBJECTIVES = {
    "cpu_s": ("cpu_s_to_threshold", "cpu_s_total", lambda budget: FAIL_S),
    # a seed not solved for good counts its env steps plus the budget: more than
    # any solved seed, whose env steps to the threshold are within the budget
    "env_steps": ("env_steps_to_threshold", "final_env_steps", lambda budget: budget),
}
# or, for a task judged by its return at a fixed budget (LunarLander-v3 at 500k):
# minus the run's late_mean, the mean of its last evaluations before the budget
FINAL_RETURN = "final_return"


def seed_value(run: dict, objective: str = "cpu_s", budget: int = 0) -> float:
    if objective == FINAL_RETURN:
        return -run["late_mean"]
    solved, at_stop, penalty = OBJECTIVES[objective]
    if run["reached"] and run["stable"]:
        return run[solved]
    return (run[at_stop] or math.inf) + penalty(budget)


def describe(objective: str, budget: int) -> str:
    """The objective in words, for the export."""
    if objective == "cpu_s":
        return (
            "mean over seeds of CPU seconds to a stable solve; "
            f"unsolved or collapsed: CPU seconds at stop + {FAIL_S:g}"
        )
    if objective == FINAL_RETURN:
        return (
            "minus the mean over seeds of the mean greedy return of the last `late` "
            f"evaluations before the budget ({budget} env steps; runs go on to it)"
        )
    return (
        "mean over seeds of env steps to a stable solve; "
        f"unsolved or collapsed: env steps at stop + the budget ({budget})"
    )


def run_in_process(task, seed, args, params, run_dir) -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONHASHSEED": str(seed),
    }
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--task",
        task,
        "--seed",
        str(seed),
        "--budget",
        str(args.budget),
        "--settle",
        str(args.settle),
        "--late",
        str(args.late),
        "--objective",
        args.objective,
        "--params",
        json.dumps(params),
        "--run-dir",
        str(run_dir),
        "--out",
        str(out),
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "log.txt", "a") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        out.unlink(missing_ok=True)
        return {"seed": seed, "error": f"failed: see {run_dir / 'log.txt'}"}
    result = json.loads(out.read_text())
    out.unlink()
    return result


def results_path(task: str, study: str | None = None) -> Path:
    name = task.lower().replace("-", "_") + (f"-{study}" if study else "")
    return RESULTS / f"tune-{name}.json"


def distributions(space: dict) -> dict:
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    return {
        name: FloatDistribution(*values, log=True)
        if kind == "log"
        else CategoricalDistribution(values)
        for name, (_, kind, values) in space.items()
    }


def restore(study, path: Path, space: dict, objective: str, budget: int) -> None:
    """The committed export's trials into a new study, so that a study goes on in a
    fresh checkout (the SQLite file is not committed). A trial that had not
    finished (failed, or running when its machine went) comes back as failed, with
    the runs it had finished, so that every trial keeps the number the export and
    the docs give it."""
    import optuna

    if not path.exists():
        return
    for t in json.loads(path.read_text())["trials"]:
        attrs = {"runs": t["runs"] or []}
        if "sampler_seed" in t:
            attrs["sampler_seed"] = t["sampler_seed"]
        value, state = None, optuna.trial.TrialState.FAIL
        if t["state"] == "COMPLETE":
            # ranked by this objective, from the runs (an export of an earlier
            # objective keeps its values as value_as_run)
            value = statistics.fmean(
                seed_value(r, objective, budget) for r in t["runs"]
            )
            state = optuna.trial.TrialState.COMPLETE
            as_run = t.get("value_as_run", t["value"])
            if as_run != value:
                attrs["value_as_run"] = as_run
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                # a setting added to SPACE after the trial ran at its default
                params={**DEFAULTS, **t["params"]},
                distributions=distributions(space),
                value=value,
                user_attrs=attrs,
            )
        )
    print(f"restored {len(study.trials)} trials from {path}", flush=True)


def commits(path: Path) -> list[str]:
    """The commits of the export at ``path`` and this one, oldest first."""
    old = json.loads(path.read_text()) if path.exists() else {}
    seen = old.get("commits") or ([old["commit"]] if "commit" in old else [])
    return list(dict.fromkeys([*seen, git_commit()]))


def command(args) -> str:
    """The command line that runs (and resumes) the study."""
    words = [
        f"nice -n 19 python bench/tune.py --task {args.task}",
        *([f"--study {args.study}"] if args.study else []),
        f"--trials {args.trials} --budget {args.budget} --settle {args.settle}",
        # the settings a run's result depends on, where not the defaults
        *(
            ["--seeds", *map(str, args.seeds)]
            if tuple(args.seeds) != TUNING_SEEDS
            else []
        ),
        *([f"--late {args.late}"] if args.late != LATE else []),
        *(["--space", *map(shlex.quote, args.space)] if args.space else []),
        *(["--first", *map(shlex.quote, args.first)] if args.first else []),
        *([f"--objective {args.objective}"] if args.objective != "cpu_s" else []),
        *(["--grid"] if args.grid else []),
    ]
    return " ".join(words)


def export(study, task, args, space: dict) -> Path:
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = min(done, key=lambda t: t.value) if done else None
    payload = {
        "benchmark": "tune",
        "command": command(args),
        "commit": git_commit(),
        # every commit that ran or exported this study (a resumed one spans several)
        "commits": commits(results_path(task, args.study)),
        "machine": machine(),
        "task": task,
        "threshold": TASKS[task][0],
        "protocol": TASKS[task][1],
        "settings": {
            "budget": args.budget,
            "settle": args.settle,
            "late": args.late,
            "seeds": list(args.seeds),
            # each trial's sampler_seed: that of the process that ran it (TPE: its
            # --sampler-seed + 1000 x the trials the study held when it started; a
            # grid: its --sampler-seed)
            "sampler": f"{'GridSampler' if args.grid else 'TPESampler'}"
            "(seed=sampler_seed), 0 where a trial has none",
        },
        "objective": describe(args.objective, args.budget),
        "space": {k: [v[0], v[1], v[2]] for k, v in space.items()},
        "trials": [
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                **(
                    {"value_as_run": t.user_attrs["value_as_run"]}
                    if "value_as_run" in t.user_attrs
                    else {}
                ),
                **(
                    {"sampler_seed": t.user_attrs["sampler_seed"]}
                    if "sampler_seed" in t.user_attrs
                    else {}
                ),
                "params": t.params,
                "runs": t.user_attrs.get("runs"),
            }
            for t in study.trials
        ],
        "best": None
        if best is None
        else {
            "number": best.number,
            "value": best.value,
            "params": best.params,
            "overrides": overrides_of(best.params),
        },
    }
    path = results_path(task, args.study)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="CartPole-v1", choices=list(TASKS))
    parser.add_argument(
        "--trials", type=int, default=60, help="in all, resumed ones too"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(TUNING_SEEDS))
    parser.add_argument("--budget", type=int, default=30_000, help="env steps per run")
    parser.add_argument(
        "--settle", type=int, default=10_000, help="env steps run past the threshold"
    )
    parser.add_argument(
        "--late", type=int, default=LATE, help="evaluations in late_mean"
    )
    parser.add_argument("--export", action="store_true", help="only write the JSON")
    parser.add_argument(
        "--study",
        help="a study of its own: <task>-<STUDY>.db, tune-<task>-<STUDY>.json",
    )
    parser.add_argument(
        "--space",
        nargs="+",
        default=[],
        metavar="NAME=V1,V2",
        help="narrow SPACE: a categorical's choices, or a log range as NAME=LOW,HIGH",
    )
    parser.add_argument(
        "--first",
        nargs="+",
        default=[],
        metavar="NAME=V",
        help="the first trial: the defaults with these in their place",
    )
    parser.add_argument(
        "--objective",
        default="cpu_s",
        choices=[*OBJECTIVES, FINAL_RETURN],
        help="what a trial minimises: CPU seconds (default) or env steps to a "
        "stable solve, or minus the return at the budget (final_return: the runs go "
        "on to the budget, --settle ignored)",
    )
    parser.add_argument(
        "--grid",
        action="store_true",
        help="every combination of the space once (each setting pinned or listed "
        "with --space), in place of TPE's choices and the defaults' first trial",
    )
    parser.add_argument(
        "--sampler-seed",
        type=int,
        default=0,
        help="seeds this process's sampler: processes running one study side by "
        "side each need their own, or they sample the same trials (those of a "
        "--grid study the same one)",
    )
    # one run, in a process of its own (the driver's child)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.objective == FINAL_RETURN:
        # no run stops at the threshold: it settles no sooner than the budget
        args.settle = args.budget

    if args.worker:
        import torch

        torch.set_num_threads(1)
        result = run_seed(
            args.task,
            args.seed,
            args.budget,
            args.settle,
            args.late,
            json.loads(args.params),
            Path(args.run_dir),
            args.objective,
        )
        Path(args.out).write_text(json.dumps(result) + "\n")
        return

    import optuna

    space = narrowed(args.space)
    # a grid has no first trial of its own: its combinations come in its order
    first = None if args.grid else first_trial(space, args.first)
    name = args.task + (f"-{args.study}" if args.study else "")
    RUNS.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=f"acer-{name}",
        storage=f"sqlite:///{RUNS / name}.db",
        direction="minimize",
        load_if_exists=True,
    )
    # JSON's view of the space (tuples as lists), as the study keeps it
    as_json = json.loads(json.dumps(space))
    kept = study.user_attrs.get("space")
    if kept is not None and kept != as_json:
        raise SystemExit(
            f"study {name!r} ran over another space: {kept}; resume it with its own "
            "--space, or start another with --study"
        )
    study.set_user_attr("space", as_json)
    # a study that ran before --objective existed minimised CPU seconds
    ran = study.user_attrs.get("objective", "cpu_s")
    if study.trials and ran != args.objective:
        raise SystemExit(
            f"study {name!r} minimises {ran}; resume it with --objective {ran}, or "
            "start another with --study"
        )
    study.set_user_attr("objective", args.objective)
    if not study.trials:  # a fresh checkout: the committed export, before any export
        path = results_path(args.task, args.study)
        restore(study, path, space, args.objective, args.budget)
    if args.export:
        print(export(study, args.task, args, space))
        return
    if args.grid:  # every combination once, in an order drawn from the seed
        logs = [n for n, (_, kind, _) in space.items() if kind == "log"]
        if logs:
            raise SystemExit(f"--grid: pin or list the choices of {logs} (--space)")
        grid = {name: values for name, (_, _, values) in space.items()}
        # a trial's grid id indexes that order: every process of the grid, first
        # or resumed, needs the same seed
        sampler_seed = args.sampler_seed
        study.sampler = optuna.samplers.GridSampler(grid, seed=sampler_seed)
    else:
        # a resumed process must not draw its first start's trials again (the
        # same settings and runs): its seed moves on with the trials the study holds
        sampler_seed = args.sampler_seed + 1000 * len(study.trials)
        study.sampler = optuna.samplers.TPESampler(seed=sampler_seed)
        if not study.trials:  # the example's defaults first: the baseline to beat
            study.enqueue_trial(first)

    def objective(trial):
        params = sample(trial, space)
        trial.set_user_attr("sampler_seed", sampler_seed)
        if not params["on_policy"] and params["replay_ratio"] == 0:
            # the example refuses it: nothing would ever train
            raise optuna.TrialPruned("on_policy=false needs replay_ratio > 0")
        runs = []
        for seed in args.seeds:
            run_dir = RUNS / name / f"trial{trial.number}-seed{seed}"
            runs.append(run_in_process(args.task, seed, args, params, run_dir))
            trial.set_user_attr("runs", runs)
            if "error" in runs[-1]:
                raise RuntimeError(runs[-1]["error"])
        return statistics.fmean(
            seed_value(r, args.objective, args.budget) for r in runs
        )

    def after(study, trial):
        path = export(study, args.task, args, space)
        print(f"trial {trial.number}: {trial.value} -> {path}", flush=True)

    finished = len([t for t in study.trials if t.state.is_finished()])
    study.optimize(
        objective,
        n_trials=max(0, args.trials - finished),
        callbacks=[after],
        catch=(RuntimeError,),
    )
    export(study, args.task, args, space)


if __name__ == "__main__":
    main()
