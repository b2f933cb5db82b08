"""Learning curves from runs' CSV logs: the median and the range across seeds.

    python -m torchrl_acer.training.plot RUN_DIR [RUN_DIR ...] --out curve.png \
        [--metric eval/reward] [--label NAME] [--reference 1e6:9 ...]

Each ``RUN_DIR`` is a run written by the examples (its scalars are under
``RUN_DIR/logs/scalars``). Several runs of one configuration (seeds) make one
curve; pass ``--group`` to draw several configurations, one curve each, with
``--label`` naming them in order.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

__all__ = ["read_scalar", "aggregate", "plot_groups"]


def read_scalar(run_dir, metric="eval/reward"):
    """``(steps, values)`` of one run's metric."""
    path = Path(run_dir) / "logs" / "scalars" / f"{metric}.csv"
    if not path.is_file():
        raise FileNotFoundError(f"no {metric!r} log in {run_dir} (looked for {path})")
    steps, values = [], []
    with open(path) as f:
        for row in csv.reader(f):
            try:  # the header row (``step,value``) is no number
                step, value = (float(x) for x in row)
            except ValueError:
                continue
            steps.append(step)
            values.append(value)
    return np.asarray(steps), np.asarray(values)


def aggregate(curves, num_points=200):
    """Median, min and max across runs, on a common grid of steps.

    Each run is interpolated linearly (held constant past its last point); the grid
    stops at the shortest run's last step, so every point has every run.
    """
    end = min(steps[-1] for steps, _ in curves)
    start = max(steps[0] for steps, _ in curves)
    grid = np.linspace(start, end, num_points)
    values = np.stack([np.interp(grid, s, v) for s, v in curves])
    return grid, np.median(values, 0), values.min(0), values.max(0)


def plot_groups(groups, out, *, metric="eval/reward", title=None, references=()):
    """One median curve with a min-max band per group of runs.

    Args:
        groups: ``{label: [run_dir, ...]}``.
        out: the PNG to write.
        references: ``(step, value, label)`` points to mark (published numbers).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, runs in groups.items():
        curves = [read_scalar(r, metric) for r in runs]
        grid, med, lo, hi = aggregate(curves)
        line = ax.plot(grid, med, label=f"{label} (median of {len(runs)})")[0]
        ax.fill_between(grid, lo, hi, color=line.get_color(), alpha=0.2)
    for step, value, label in references:
        ax.plot([step], [value], "k*", markersize=10)
        ax.annotate(label, (step, value), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return save_figure(fig, out)


def save_figure(fig, out) -> Path:
    """Lays ``fig`` out, writes it to ``out`` (folders made), closes it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--metric", default="eval/reward")
    parser.add_argument("--title", default=None)
    parser.add_argument(
        "--group",
        action="append",
        type=int,
        default=None,
        help="split the runs into groups of these sizes, in order (repeatable)",
    )
    parser.add_argument("--label", action="append", default=None)
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        help="STEP:VALUE[:LABEL], a published point to mark",
    )
    args = parser.parse_args(argv)
    sizes = args.group or [len(args.runs)]
    if sum(sizes) != len(args.runs):
        parser.error(f"--group sizes {sizes} do not add up to {len(args.runs)} runs")
    default = [f"group {i}" for i in range(len(sizes))] if len(sizes) > 1 else ["ACER"]
    labels = args.label or default
    if len(labels) != len(sizes):
        parser.error("give one --label per group")
    groups, i = {}, 0
    for label, size in zip(labels, sizes, strict=True):
        groups[label] = args.runs[i : i + size]
        i += size
    references = []
    for ref in args.reference:
        parts = ref.split(":")
        references.append((float(parts[0]), float(parts[1]), ":".join(parts[2:])))
    out = plot_groups(
        groups, args.out, metric=args.metric, title=args.title, references=references
    )
    print(out)


if __name__ == "__main__":
    main()
