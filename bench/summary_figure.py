"""One-page summary of the learning results: every task's greedy-evaluation curve.

    python bench/summary_figure.py [--results bench/results] [--out summary.png]

One panel per task at its default settings (the main configuration, not the
ablations), each the median over seeds with the min-max band, read from the
``learning-<name>-<time>.json`` files that ``bench/learning.py`` writes. Which file
each panel uses is the table ``TASKS`` below; a task without a result file yet is
left out (and said so), so running this again after new results adds their panels.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchrl_acer.training.plot import aggregate, save_figure

RESULTS = Path(__file__).parent / "results"
NEWEST = "newest"
MINATAR_GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")

# (result name, the file to read or NEWEST, a note for the title), in panel order.
# NEWEST is the latest learning-<name>-<time>.json; a pinned file is the one the
# README's table names when that is not the newest.
TASKS = [
    ("cartpole_v0", NEWEST, ""),
    ("cartpole_v1", NEWEST, ""),
    *[(f"minatar_{game}", NEWEST, "") for game in MINATAR_GAMES],
    ("atari_breakout", NEWEST, ""),
    ("pendulum", NEWEST, ""),
    (
        "halfcheetah_scale01_delta2",
        # the defaults' 5 seeds (seeds 0-2 and 3-4 merged), as in the README's table
        "learning-halfcheetah_scale01_delta2-20261201T030720Z.json",
        "defaults (σ = 0.1, δ = 2)",
    ),
]


@dataclass
class Panel:
    name: str
    file: Path
    task: str  # the environment id, from the result's protocol
    unit: str  # what the x axis counts, from the result's protocol
    seeds: list
    curves: dict  # {seed: (steps, values)}, one value per step
    steps: np.ndarray
    median: np.ndarray
    low: np.ndarray
    high: np.ndarray
    threshold: float | None
    note: str = ""


def select(results, tasks=TASKS):
    """``[(name, path or None, note)]``: the result file each task's panel reads."""
    chosen = []
    for name, choice, note in tasks:
        if choice == NEWEST:
            pattern = re.compile(rf"learning-{re.escape(name)}-\d{{8}}T\d{{6}}Z\.json")
            files = sorted(p for p in results.iterdir() if pattern.fullmatch(p.name))
            path = files[-1] if files else None  # the timestamps sort in time order
        else:
            path = results / choice
            if not path.is_file():
                raise FileNotFoundError(f"{name}: the pinned result {path} is missing")
        chosen.append((name, path, note))
    return chosen


def curves(path):
    """``{seed: (steps, values)}``, each finished seed's greedy evaluations.

    A result written by ``learning.py --merge`` may leave a seed's curve in the
    file it was merged from (``merged_from``); it is read from there.
    """
    result = json.loads(path.read_text())
    out = {}
    for run in result["runs"]:
        if run["returncode"] != 0:  # learning.py leaves failed seeds out too
            continue
        if "eval_steps" in run:
            out[run["seed"]] = dedup(run["eval_steps"], run["eval_reward"])
            continue
        for part in result.get("merged_from", []):
            found = curves(path.parent / part["file"]).get(run["seed"])
            if found is not None:
                out[run["seed"]] = found
                break
        else:
            raise ValueError(f"{path.name}: no curve stored for seed {run['seed']}")
    return out


def dedup(steps, values):
    """One value per step: the last one.

    Older runs evaluated twice at their last step (the scheduled evaluation and the
    end-of-run one); the later is the result's ``final_eval``.
    """
    steps, values = np.asarray(steps, float), np.asarray(values, float)
    keep = np.append(steps[1:] != steps[:-1], True)
    return steps[keep], values[keep]


def step_unit(protocol):
    if "agent steps" in protocol:
        skip = re.search(r"frame skip (\d+)", protocol)
        return f"agent steps ({skip.group(1)} frames each)" if skip else "agent steps"
    if "env steps (frames)" in protocol:
        return "env steps (= frames)"
    if "env steps" in protocol:
        return "env steps"
    raise ValueError(f"the protocol does not say what its steps count: {protocol!r}")


def panel(name, path, note=""):
    result = json.loads(path.read_text())
    runs = curves(path)
    steps, median, low, high = aggregate(list(runs.values()))
    return Panel(
        name=name,
        file=path,
        task=result["protocol"].split(",")[0].strip(),
        unit=step_unit(result["protocol"]),
        seeds=sorted(runs),
        curves=runs,
        steps=steps,
        median=median,
        low=low,
        high=high,
        threshold=result.get("threshold"),
        note=note,
    )


def draw(panels, out, columns=3):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.3 * rows), squeeze=False
    )
    for ax, p in zip(axes.flat, panels, strict=False):  # spare axes hidden below
        line = ax.plot(p.steps, p.median, lw=1.5)[0]
        ax.fill_between(p.steps, p.low, p.high, color=line.get_color(), alpha=0.25)
        n = len(p.seeds)
        if n == 1:  # no band: mark the (few) evaluations instead
            ax.plot(*next(iter(p.curves.values())), "o", color=line.get_color(), ms=3)
        title = f"{p.task}, {p.note}" if p.note else p.task
        title += f"\n{n} seed{'s' if n != 1 else ''}, {p.unit}"
        if p.threshold is not None:
            ax.axhline(p.threshold, color="grey", ls="--", lw=0.8)
            title += f", threshold {p.threshold:g} (dashed)"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(p.unit, fontsize=8)
        ax.set_ylabel("greedy eval return", fontsize=8)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.annotate(  # which result the panel shows, under its axis label
            p.file.name,
            (1, 0),
            xycoords="axes fraction",
            xytext=(0, -30),
            textcoords="offset points",
            ha="right",
            va="top",
            fontsize=6,
            color="grey",
        )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        "ACER learning results: greedy evaluation return, "
        "median over seeds (line) and min-max (band)",
        fontsize=11,
    )
    return save_figure(fig, out)


def main(argv=None, tasks=TASKS):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: RESULTS/summary.png"
    )
    args = parser.parse_args(argv)
    panels = []
    for name, path, note in select(args.results, tasks):
        if path is None:
            print(f"{name}: no result file yet, left out")
            continue
        panels.append(panel(name, path, note))
        print(f"{name}: {path.name} ({len(panels[-1].seeds)} seeds)")
    out = draw(panels, args.out or args.results / "summary.png")
    print(f"saved {out}")
    return panels


if __name__ == "__main__":
    main()
