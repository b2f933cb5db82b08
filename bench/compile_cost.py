"""Whether ``compile=true`` pays in each example, its compile time included.

    python bench/compile_cost.py [--examples gym atari mujoco] [--rounds 3]

Runs each example script as a user would, in a process of its own, eager
(``compile=false loss.check_values=true``) and compiled (``compile=true
loss.check_values=false``: ``torch.compile`` of the loss's forward with no graph
break, the fastest setting of ``bench/loop.py``; the trainer's health checks still
check every collected batch), each for two lengths of training, in interleaved rounds (each round runs the four
in an order shuffled by ``random.Random(round)``). The seconds are the process's
wall time, start-up, compilation and the final evaluation and checkpoint included.
Each run compiles from an empty inductor cache of its own
(``TORCHINDUCTOR_CACHE_DIR``), as a first run on a machine does; after the four,
each round runs the compiled setting once more at the short length on the cache
its compiled short run left (``compiled_warm``: a later run of the same example on
the same machine). Per setting, the medians over the rounds give a line
``seconds = fixed + per_step x env steps`` through the two lengths; compiling
costs ``fixed`` more (the compilation, of each batch shape the loss sees) and
saves ``per_step`` per env step, so it pays past ``extra fixed / saving`` env steps (the break-even), which
is set against the example's own ``collector.total_frames``; with a warm cache
the extra fixed cost is the warm run's less the compiled line's at that length.
The same from each round's runs gives the ranges.

Each run: one torch thread (``threads=1``), no logger or progress bar, one
evaluation episode, no periodic checkpoint, replay from the example's config
except a start and capacity small enough that the runs measure the replayed
updates a long run is made of (``STEADY``); the lengths (``LENGTHS``) start past
that start.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import EXAMPLES, example_config, save  # noqa: E402

SCRIPTS = {"gym": "acer_gym", "atari": "acer_atari", "mujoco": "acer_mujoco"}
# env steps of the two runs of each example (agent steps for Atari): the long one
# long enough that the time compiling saves outweighs the spread of compile times
LENGTHS = {
    "gym": (20_000, 300_000),
    "atari": (6_400, 16_000),
    "mujoco": (4_000, 100_000),
}
# the replay of a long run, reached soon: its start (steps stored) and capacity
STEADY = {
    "gym": {},  # the defaults: start 1 000 of a 60 000-step run
    "atari": {"replay.start": 1_600, "replay.capacity": 40_000},
    "mujoco": {"replay.start": 1_000},
}
RUN = [
    "threads=1",
    "logger.backend=null",
    "logger.progress_bar=false",
    "eval.episodes=1",
    "checkpoint.every_minutes=null",
]
# eager with the value checks (every example's default before Atari's compiled one);
# compiled without them, as compiling needs for one graph (they cost the Atari loss
# about 2%, bench/loss.py's checked against unchecked)
SETTINGS = {
    "eager": ["compile=false", "loss.check_values=true"],
    "compiled": ["compile=true", "loss.check_values=false"],
}


def run_example(
    example: str, setting: str, frames: int, run_dir: Path, cache: Path
) -> float:
    """Wall seconds of one run of the example's script, with ``cache`` as the
    inductor's cache."""
    overrides = [
        *RUN,
        *SETTINGS[setting],
        *(f"{k}={v}" for k, v in STEADY[example].items()),
        f"collector.total_frames={frames}",
        f"eval.interval={frames}",
        f"logger.run_dir={run_dir}",
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
    }
    script = EXAMPLES / f"{SCRIPTS[example]}.py"
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, str(script), *overrides],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def fit(seconds: dict, lengths) -> dict:
    """``fixed``, ``per_step`` of each setting, and what compiling gains, from the
    seconds of each (setting, length) (and of ``("compiled_warm", short)``)."""
    short, long = lengths
    line = {}
    for setting in SETTINGS:
        per_step = (seconds[setting, long] - seconds[setting, short]) / (long - short)
        line[setting] = {
            "fixed_s": seconds[setting, short] - per_step * short,
            "per_step_s": per_step,
        }
    extra = line["compiled"]["fixed_s"] - line["eager"]["fixed_s"]
    warm = seconds["compiled_warm", short] - seconds["compiled", short] + extra
    saving = line["eager"]["per_step_s"] - line["compiled"]["per_step_s"]
    return {
        **line,
        "compile_extra_fixed_s": extra,
        "warm_cache_extra_fixed_s": warm,
        "saving_per_step_s": saving,
        "speedup_per_step": line["eager"]["per_step_s"]
        / line["compiled"]["per_step_s"],
        # None: compiling never pays (no saving per step)
        "break_even_env_steps": extra / saving if saving > 0 else None,
        "warm_break_even_env_steps": max(warm, 0) / saving if saving > 0 else None,
    }


def measure(example: str, rounds: int, work: Path) -> dict:
    lengths = LENGTHS[example]
    runs = [(s, n) for s in SETTINGS for n in lengths]
    samples = {run: [] for run in [*runs, ("compiled_warm", lengths[0])]}
    per_round = []
    for r in range(rounds):
        order = list(runs)
        random.Random(r).shuffle(order)
        # last: on the cache the compiled short run of this round left
        order.append(("compiled_warm", lengths[0]))
        this_round = {}
        for setting, frames in order:
            name = "compiled" if setting == "compiled_warm" else setting
            cache = work / f"{example}-{name}-{frames}-{r}-cache"
            run_dir = work / f"{example}-{setting}-{frames}-{r}"
            s = run_example(example, name, frames, run_dir, cache)
            samples[setting, frames].append(s)
            this_round[setting, frames] = s
            print(f"  {example} round {r}: {setting} {frames} steps: {s:.1f} s")
        per_round.append(fit(this_round, lengths))
    medians = {run: statistics.median(s) for run, s in samples.items()}
    cfg = example_config(f"config_{example}")
    total = cfg.collector.total_frames
    result = fit(medians, lengths)
    even = [f["break_even_env_steps"] for f in per_round]
    finite = [e for e in even if e is not None]
    result.update(
        {
            "env": cfg.env.name,
            "lengths": list(lengths),
            "seconds": {f"{s} {n}": v for (s, n), v in samples.items()},
            "break_even_range": [min(finite), max(finite)] if finite else None,
            "rounds_never_paying": len(even) - len(finite),
            "per_round": per_round,
            "default_total_frames": total,
            "pays_at_default": result["break_even_env_steps"] is not None
            and result["break_even_env_steps"] < total,
        }
    )
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", nargs="+", default=list(SCRIPTS), choices=SCRIPTS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default="/tmp/compile_cost", help="run directories")
    args = parser.parse_args()
    work = Path(args.work)
    results = {}
    for example in args.examples:
        results[example] = measure(example, args.rounds, work)
        r = results[example]
        even = r["break_even_env_steps"]
        print(
            f"{example}: compiling costs {r['compile_extra_fixed_s']:.1f} s more up "
            f"front and runs {r['speedup_per_step']:.2f}x per env step: pays past "
            f"{'never' if even is None else f'{even:,.0f}'} env steps (default run "
            f"{r['default_total_frames']:,}); with a warm cache "
            f"{r['warm_cache_extra_fixed_s']:.1f} s more up front",
            flush=True,
        )
    path = save(
        "compile_cost",
        {
            "settings": {
                "rounds": args.rounds,
                "run": RUN,
                "settings": SETTINGS,
                "steady": STEADY,
                "lengths": LENGTHS,
            },
            "examples": results,
        },
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
