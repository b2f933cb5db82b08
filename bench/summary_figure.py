"""One-page summary of the learning results: every task's greedy-evaluation curve.

    python bench/summary_figure.py [--results bench/results] [--out summary.png]
    python bench/summary_figure.py --compare NAME[=FILE]:LABEL ... --out x.png \
        [--title TITLE]

One panel per task at its default settings (the main configuration, not the
ablations), each the median over seeds with the min-max band, read from the
``learning-<name>-<time>.json`` files that ``bench/learning.py`` writes; then one
panel per side-by-side benchmark against a peer (``COMPARISONS``: ours and the
peer in one panel, from ``<benchmark>-<time>.json``, bench/lunar_lander.py's
format). Which file each panel uses is the tables ``TASKS`` and ``COMPARISONS``
below; a task without a result file yet is left out (and said so), so running this
again after new results adds their panels.

``--compare`` draws one panel instead, a curve for each result named (its newest
``learning-<NAME>-<time>.json``, or the FILE given): settings side by side from the
committed results alone, where ``torchrl_acer.training.plot`` needs the runs' logs.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
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


# Side-by-side benchmarks: (benchmark, the file to read or NEWEST, {candidate:
# label}), ours first; each one panel with a curve per candidate.
COMPARISONS = [
    (
        "lunar_lander",
        NEWEST,
        {"ours": "ours", "di_acer": "DI-engine 0.5.3 ACER (dizoo config)"},
    ),
]


@dataclass
class Series:
    """One curve: the median over seeds and the min-max band."""

    label: str | None
    curves: dict  # {seed: (steps, values)}, one value per step
    file: Path | None = None  # where a curve of --compare comes from
    steps: np.ndarray = field(init=False)
    median: np.ndarray = field(init=False)
    low: np.ndarray = field(init=False)
    high: np.ndarray = field(init=False)

    def __post_init__(self):
        if not self.curves:
            raise ValueError(f"{self.label or 'a curve'}: no finished seed to draw")
        self.steps, self.median, self.low, self.high = aggregate(
            list(self.curves.values())
        )

    @property
    def seeds(self):
        return sorted(self.curves)


@dataclass
class Panel:
    name: str
    file: Path
    task: str  # the environment id, from the result's protocol
    unit: str  # what the x axis counts, from the result's protocol
    series: list  # [Series], ours first
    threshold: float | None
    note: str = ""

    # the first (ours') curve, the only one of a task's panel
    seeds = property(lambda self: self.series[0].seeds)
    curves = property(lambda self: self.series[0].curves)
    steps = property(lambda self: self.series[0].steps)
    median = property(lambda self: self.series[0].median)
    low = property(lambda self: self.series[0].low)
    high = property(lambda self: self.series[0].high)


def select(results, tasks=TASKS, prefix="learning-"):
    """``[(name, path or None, note)]``: the result file each task's panel reads.

    A task's NEWEST file is the latest ``<prefix><name>-<time>.json``.
    """
    chosen = []
    for name, choice, note in tasks:
        if choice == NEWEST:
            stem = re.escape(prefix + name)
            pattern = re.compile(rf"{stem}-\d{{8}}T\d{{6}}Z\.json")
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
    return Panel(
        name=name,
        file=path,
        task=result["protocol"].split(",")[0].strip(),
        unit=step_unit(result["protocol"]),
        series=[Series(None, curves(path))],
        threshold=result.get("threshold"),
        note=note,
    )


def comparison_panel(name, path, labels):
    """Ours and a peer in one panel, from a side-by-side benchmark's result.

    Only runs that finished their budget count (an unfinished run's curve would cut
    every seed's grid short); a candidate without one is an error, since the
    panel would silently show one side of the comparison.
    """
    result = json.loads(path.read_text())
    settings = result["settings"]
    series = []
    for candidate, label in labels.items():
        runs = {
            run["seed"]: dedup(
                [e["env_steps"] for e in run["evals"]],
                [e["return"] for e in run["evals"]],
            )
            for run in result["runs"]
            if run["candidate"] == candidate
            and run["returncode"] == 0
            and run["stopped"] == "budget"
        }
        if not runs:
            raise ValueError(f"{path.name}: no finished run of {candidate!r}")
        series.append(Series(label, runs))
    return Panel(
        name=name,
        file=path,
        task=settings["task"],
        unit="env steps",  # the budget and the evaluations count env steps
        series=series,
        threshold=settings.get("threshold"),
    )


def compare_panel(results, specs):
    """One panel, a curve per ``NAME[=FILE]:LABEL`` spec, all of one task."""
    series, tasks = [], set()
    for spec in specs:
        ref, sep, label = spec.partition(":")
        name, _, choice = ref.partition("=")
        if not sep or not name or not label:
            raise ValueError(f"--compare {spec!r}: expected NAME[=FILE]:LABEL")
        [(_, path, _)] = select(results, [(name, choice or NEWEST, "")])
        if path is None:
            raise FileNotFoundError(f"--compare {spec!r}: no learning-{name}-*.json")
        p = panel(name, path)
        [curve] = p.series  # a task's one curve, named for this panel
        curve.label, curve.file = label, path
        series.append(curve)
        tasks.add((p.task, p.unit, p.threshold))
    if len(tasks) != 1:
        raise ValueError(f"--compare: the results are of different tasks: {tasks}")
    [(task, unit, threshold)] = tasks
    return Panel(
        name="compare",
        file=series[0].file,
        task=task,
        unit=unit,
        series=series,
        threshold=threshold,
    )


def draw(panels, out, columns=3, suptitle=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows,
        columns,
        # one panel (--compare) as large as the plot module's figures
        figsize=(7, 4.6) if len(panels) == 1 else (4.2 * columns, 3.3 * rows),
        squeeze=False,
    )
    for ax, p in zip(axes.flat, panels, strict=False):  # spare axes hidden below
        for s in p.series:
            n = len(s.seeds)
            label = s.label and f"{s.label}, {n} seed{'s' if n != 1 else ''}"
            line = ax.plot(s.steps, s.median, lw=1.5, label=label)[0]
            ax.fill_between(s.steps, s.low, s.high, color=line.get_color(), alpha=0.25)
            if n == 1:  # no band: mark the (few) evaluations instead
                ax.plot(
                    *next(iter(s.curves.values())), "o", color=line.get_color(), ms=3
                )
        if len(p.series) > 1:
            ax.legend(fontsize=6, loc="lower right")
            counts = {len(s.seeds) for s in p.series}
            seeds = f"{counts.pop()} seeds each" if len(counts) == 1 else "seeds"
        else:
            n = len(p.seeds)
            seeds = f"{n} seed{'s' if n != 1 else ''}"
        title = f"{p.task}, {p.note}" if p.note else p.task
        title += f"\n{seeds}, {p.unit}"
        if p.threshold is not None:
            ax.axhline(p.threshold, color="grey", ls="--", lw=0.8)
            title += f", threshold {p.threshold:g} (dashed)"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(p.unit, fontsize=8)
        ax.set_ylabel("greedy eval return", fontsize=8)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        files = [s.file.name for s in p.series if s.file] or [p.file.name]
        ax.annotate(  # which results the panel shows, under its axis label
            "\n".join(files),
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
        suptitle
        or "ACER learning results: greedy evaluation return, "
        "median over seeds (line) and min-max (band)",
        fontsize=11,
    )
    return save_figure(fig, out)


def main(argv=None, tasks=TASKS, comparisons=COMPARISONS):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: RESULTS/summary.png"
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="NAME[=FILE]:LABEL",
        help="one panel of these results instead of the summary (needs --out)",
    )
    parser.add_argument("--title", default=None, help="the figure's title")
    args = parser.parse_args(argv)
    if args.compare:
        if args.out is None:
            parser.error("--compare needs --out")
        p = compare_panel(args.results, args.compare)
        for s in p.series:
            print(f"{s.label}: {len(s.seeds)} seeds")
        print(f"saved {draw([p], args.out, columns=1, suptitle=args.title)}")
        return [p]
    panels = []
    for name, path, note in select(args.results, tasks):
        if path is None:
            print(f"{name}: no result file yet, left out")
            continue
        panels.append(panel(name, path, note))
        print(f"{name}: {path.name} ({len(panels[-1].seeds)} seeds)")
    for name, choice, labels in comparisons:
        [(_, path, _)] = select(args.results, [(name, choice, "")], prefix="")
        if path is None:
            print(f"{name}: no result file yet, left out")
            continue
        panels.append(comparison_panel(name, path, labels))
        counts = ", ".join(f"{s.label} {len(s.seeds)}" for s in panels[-1].series)
        print(f"{name}: {path.name} (seeds: {counts})")
    out = draw(panels, args.out or args.results / "summary.png")
    print(f"saved {out}")
    return panels


if __name__ == "__main__":
    main()
