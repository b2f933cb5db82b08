"""Markdown tables of the newest result of every benchmark in bench/results/.

    python bench/report.py

Every number in the README's results section comes from here, with the file it
was read from.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def newest(prefix):
    files = sorted(RESULTS.glob(f"{prefix}-*.json"))
    return (files[-1], json.loads(files[-1].read_text())) if files else (None, None)


def fmt_range(stats, scale=1.0, unit=""):
    if not stats:
        return "not reached"
    return (
        f"{stats['median'] / scale:.1f}{unit} ({stats['min'] / scale:.1f}-"
        f"{stats['max'] / scale:.1f}{unit})"
    )


def learning_row(name, label):
    path, r = newest(f"learning-{name}")
    if r is None:
        return None
    n = len(r["runs"])
    if r["threshold"] is not None:
        steps = fmt_range(r["steps_to_threshold"], 1000, "k")
        reached = f"{r['reached']}/{n}"
    else:
        steps, reached = "", ""
    final = fmt_range(r["final_eval"])
    wall = r["wall_s_per_run"]["median"] / 60
    return f"| {label} | {steps} | {reached} | {final} | {wall:.1f} | `{path.name}` |"


def trust_region_activity(name):
    """Median over seeds of each run's mean share of steps with an active trust
    region (from the runs' CSV logs, which stay in bench/runs/)."""
    import numpy as np

    from torchrl_acer.plot import read_scalar

    base = Path(__file__).parent / "runs" / name
    shares = []
    for run in sorted(base.glob("seed*/")):
        try:
            _, values = read_scalar(run, "train/trust_region_active_fraction")
        except FileNotFoundError:
            continue
        shares.append(float(values.mean()))
    if not shares:
        return None
    return float(np.median(shares)), min(shares), max(shares), len(shares)


def main():
    print(
        "| run | env steps to threshold, median (range) | reached | final greedy eval, median (range) | min/run | data |"
    )
    print("|---|---|---|---|---|---|")
    for name, label in [
        ("cartpole_v0", "CartPole-v0 → 195"),
        ("cartpole_v0_no_replay", "CartPole-v0, replay ratio 0"),
        ("cartpole_v0_no_trust_region", "CartPole-v0, no trust region"),
        ("cartpole_v1", "CartPole-v1 → 500"),
        ("cartpole_v1_no_replay", "CartPole-v1, replay ratio 0"),
        ("cartpole_v1_no_trust_region", "CartPole-v1, no trust region"),
        ("minatar_breakout", "MinAtar Breakout, 1M"),
        ("minatar_breakout_no_replay", "MinAtar Breakout, replay ratio 0"),
        ("minatar_breakout_no_trust_region", "MinAtar Breakout, no trust region"),
        ("minatar_space_invaders", "MinAtar SpaceInvaders, 1M"),
        ("minatar_space_invaders_no_replay", "MinAtar SpaceInvaders, replay ratio 0"),
        (
            "minatar_space_invaders_no_trust_region",
            "MinAtar SpaceInvaders, no trust region",
        ),
    ]:
        row = learning_row(name, label)
        if row:
            print(row)
    print()
    for name in (
        "cartpole_v0",
        "cartpole_v1",
        "minatar_breakout",
        "minatar_space_invaders",
    ):
        activity = trust_region_activity(name)
        if activity:
            med, lo, hi, n = activity
            print(
                f"- {name}: trust region active on {med:.1%} of steps "
                f"(median over {n} seeds, range {lo:.1%}-{hi:.1%})"
            )


if __name__ == "__main__":
    main()
