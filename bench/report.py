"""Markdown tables of the newest result of every benchmark in bench/results/.

    python bench/report.py           # print every table
    python bench/report.py --write   # write docs/results/*.md and the README's results table
    python bench/report.py --check   # exit 1, with a diff, if those differ from the data

Every number on the results pages comes from here, with the file it was read from
and the command that re-runs it; `.ci/run` runs ``--check``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import io
import json
import sys
from pathlib import Path

import numpy as np
from learning import stats  # bench/ is on the path: this runs as a script

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PAGES = Path("docs") / "results"  # relative to the checkout's root
README_START, README_END = "<!-- results-table-start -->", "<!-- results-table-end -->"


@functools.cache
def newest(prefix):
    files = sorted(RESULTS.glob(f"{prefix}-*.json"))
    return (files[-1], json.loads(files[-1].read_text())) if files else (None, None)


def command_of(r):
    """The command recorded in a result file (``command`` or ``commands``)."""
    command = r.get("command") or r.get("commands")
    if isinstance(command, list):
        command = "; ".join(command)
    return command


def source(path, r):
    """One line naming a result file and the command that re-runs it."""
    command = command_of(r)
    rerun = f"; re-run: `{command}`" if command else ""
    print(f"*Data: `bench/results/{path.name}`{rerun}.*")
    print()


def fmt_range(stats, scale=1.0, unit="", missing="not reached"):
    if not stats:
        return missing
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
    train = fmt_range(r.get("final_train_reward"), missing="-")
    wall = r["wall_s_per_run"]
    wall = f"{wall['median'] / 60:.0f}" if wall else "?"
    return (
        f"| {label} | {n} | {steps} | {reached} | {final} | {train} | {wall} "
        f"| `{path.name}` |"
    )


def pct(fraction):
    return f"{fraction * 100:.2g}%"


def trust_region_shares(name):
    """Each run's mean share of steps with an active trust region (from the runs'
    CSV logs, which stay in bench/runs/)."""
    from torchrl_acer.training.plot import read_scalar

    base = Path(__file__).parent / "runs" / name
    shares = []
    for run in sorted(base.glob("seed*/")):
        try:
            _, values = read_scalar(run, "train/trust_region_active_fraction")
        except FileNotFoundError:
            continue
        shares.append(float(values.mean()))
    return shares


def late_eval_means(name, window=100_000):
    """Each run's mean greedy evaluation over its last ``window`` env steps:
    steadier than the single final evaluation."""
    _, r = newest(f"learning-{name}")
    if r is None:
        return []
    return [
        late_mean(run["eval_steps"], run["eval_reward"], window) for run in r["runs"]
    ]


def late_mean(steps, values, window=100_000):
    """The mean of a run's evaluations over its last ``window`` env steps."""
    steps, values = np.asarray(steps), np.asarray(values)
    return float(values[steps > steps[-1] - window].mean())


def print_over_seeds(names, per_seed, what, fmt):
    """One line per run name: ``what`` with ``{}`` filled by the median over seeds of
    the values ``per_seed(name)`` returns, then the range (names without values are
    skipped)."""
    for name in names:
        values = per_seed(name)
        if values:
            med, lo, hi = float(np.median(values)), min(values), max(values)
            print(
                f"- {name}: {what.format(fmt(med))} "
                f"(median over {len(values)} seeds, range {fmt(lo)}-{fmt(hi)})"
            )


LOSS_COLUMNS = {
    "loss": "ACERLoss",
    "unchecked": "`check_values=False`",
    "compiled": "`torch.compile`",
    "a2c_gae": "TorchRL A2CLoss + GAE",
    "ppo_gae": "TorchRL ClipPPOLoss + GAE",
    "dqn": "TorchRL DQNLoss",
}


def speed_and_memory():
    path, r = newest("retrace")
    if r:
        print(
            f"Retrace target, float32, {r['settings']['rounds']} rounds (`{path.name}`):"
        )
        print()
        print("| T | batch | plain loop / ours | TorchRL vec_td_lambda / ours |")
        print("|---|---|---|---|")
        for row in r["rows"]:
            print(
                f"| {row['T']} | {row['B']} | {row['loop_over_ours']:.1f}x "
                f"| {row['torchrl_vec_over_ours']:.1f}x |"
            )
        print()
        source(path, r)
    path, r = newest("loss")
    if r:
        print(f"ACERLoss forward+backward / bare networks' (`{path.name}`):")
        print()
        columns = [
            c for c in LOSS_COLUMNS if any(f"{c}_over_bare" in w for w in r["rows"])
        ]
        print("| case | " + " | ".join(LOSS_COLUMNS[c] for c in columns) + " |")
        print("|---" * (len(columns) + 1) + "|")
        for row in r["rows"]:
            cells = []
            for c in columns:
                ratio, spread = (
                    row.get(f"{c}_over_bare"),
                    row.get(f"{c}_over_bare_range"),
                )
                cells.append(
                    "-"
                    if ratio is None
                    else f"{ratio:.2f}x"
                    + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else "")
                )
            print(f"| {row['case']} | " + " | ".join(cells) + " |")
        print()
        source(path, r)
    path, r = newest("loss_recurrent")
    if r:
        print(f"ACERLoss with an LSTM / bare recurrent networks (`{path.name}`):")
        print()
        print("| case | loss / bare (range) | `check_values=False` (range) |")
        print("|---|---|---|")
        for row in r["rows"]:
            cells = [
                (row[f"{c}_over_bare"], *row[f"{c}_over_bare_range"])
                for c in ("loss", "unchecked")
            ]
            print(
                f"| {row['case']} | "
                + " | ".join(f"{m:.2f}x ({lo:.2f}-{hi:.2f})" for m, lo, hi in cells)
                + " |"
            )
        print()
        source(path, r)
    path, r = newest("example_cost_minatar_breakout_lstm")
    if r:
        s, ratio = r["setting"], r["b_over_a"]
        print(
            f"MinAtar Breakout's training loop with {' '.join(s['b'])} / feed-forward, "
            f"per env step: {ratio['median']:.2f}x ({ratio['min']:.2f}-"
            f"{ratio['max']:.2f}), {s['rounds']} rounds of {s['frames_per_run']} env "
            f"steps (`{path.name}`)"
        )
        print()
        source(path, r)
    path, r = newest("throughput")
    if r:
        s = r["settings"]
        print(
            f"Atari training loop ({s['game']}, {s['envs']} envs, T={s['T']}, replay "
            f"ratio {s['replay_ratio']:g}, {s['threads']} threads; `{path.name}`): "
            f"{np.median(r['loop_steps_per_s']):.0f} agent steps/s against a compute "
            f"bound of {np.median(r['bound_steps_per_s']):.0f}, ratio "
            f"{r['median_ratio']:.2f} (median of {len(r['ratios'])} repeats, range "
            f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}); "
            f"{np.median(r['time_in_updates']):.0%} of the loop's time is in updates."
        )
        overlap = [
            part["overlap_estimate_over_serial"]
            for part in r["bound_parts"]
            if "overlap_estimate_over_serial" in part
        ]
        if overlap:
            print()
            print(
                "Collecting in a separate process (learner on one thread, collection "
                "on the other core) would take an estimated "
                f"{np.median(overlap):.2f}x the serial loop's time (median of "
                f"{len(overlap)} repeats, range {min(overlap):.2f}-{max(overlap):.2f})."
            )
        print()
        source(path, r)
    path, r = newest("loop")
    if r:
        lo, hi = r["loop_over_bound_range"]
        shares = ", ".join(
            f"{name} {share:.0%}"
            for name, share in sorted(r["time_fractions"].items(), key=lambda x: -x[1])
        )
        print(
            f"CartPole loop / its networks' compute bound (`{path.name}`): "
            f"{r['loop_over_bound']:.3f} (range {lo:.3f}-{hi:.3f}); "
            f"{r['loop_steps_per_s']:.0f} env steps/s against {r['bound_steps_per_s']:.0f}; "
            f"time: {shares}."
        )
        print()
        source(path, r)
    path, r = newest("collection")
    if r:
        line = (
            f"One [8, 20] CartPole batch (`{path.name}`): TorchRL's Collector takes "
            f"{r['collector_over_floor']:.1f}x gymnasium + the bare policy"
        )
        if "lean_collector_speedup" in r:
            lo, hi = r["lean_collector_speedup_range"]
            line += (
                f"; GymVectorCollector {r['lean_collector_over_floor']:.1f}x, "
                f"{r['lean_collector_speedup']:.2f}x faster than the Collector "
                f"(per-round {lo:.2f}-{hi:.2f})"
            )
        print(line + ".")
        print()
        source(path, r)
    path, r = newest("torchrl_fixes")
    if r:
        parts = []
        for task, t in r["tasks"].items():
            lo, hi = t["speedup_range"]
            rlo, rhi = t["reader_speedup_range"]
            parts.append(
                f"{task}: a Collector batch {t['speedup']:.2f}x (per-round "
                f"{lo:.2f}-{hi:.2f}), the reader on a step where no copy ended "
                f"{t['reader_speedup']:.1f}x ({rlo:.1f}-{rhi:.1f})"
            )
        print(
            f"TorchRL with `upstream/torchrl/` applied against the installed one "
            f"(`{path.name}`): " + "; ".join(parts) + "."
        )
        print()
        source(path, r)
    path, r = newest("memory")
    if r:
        gb = 1e9
        print(
            f"Frame-lean Atari replay (`{path.name}`): {r['bytes_per_step']:.0f} bytes "
            f"per stored step; the default replay ({r['settings']['envs']} envs x "
            f"{r['settings']['steps_per_env']} steps) holds "
            f"{r['replay_tensor_bytes'] / gb:.2f} GB of tensors and grows the "
            f"process's RSS by {r['rss_growth_bytes'] / gb:.2f} GB; storing both "
            f"stacks naively would take {r['naive_uint8_total_bytes'] / gb:.1f} GB "
            f"as uint8, {r['naive_float32_total_bytes'] / gb:.1f} GB as float32."
        )
        print()
        source(path, r)


TIME_TO_SOLVE_LABELS = {
    "ours": "ours (`examples/acer_gym.py` defaults)",
    "sb3_ppo": "Stable-Baselines3 PPO (zoo)",
    "sb3_a2c": "Stable-Baselines3 A2C (zoo)",
    "di_acer": "DI-engine 0.5.3 ACER (dizoo)",
}


def time_to_solve():
    """Env steps and training seconds until the greedy evaluation first reached the
    threshold, per candidate and task (medians and ranges over the seeds that did)."""
    path, r = newest("time_to_solve")
    if r is None:
        return
    s = r["settings"]
    budget = ", ".join(f"{t} {b:,}" for t, b in s["budget_env_steps"].items())
    cap = f", or {s['max_minutes']:g} min of training" if s.get("max_minutes") else ""
    print(
        f"Time to solve, one thread per run, runs interleaved (`{path.name}`; not "
        f"reached: after {budget} env steps{cap}); {s['protocol']['text']}:"
    )
    print()
    print(
        "| task | candidate | reached | env steps to threshold, median (range) "
        "| training s to threshold, median (range) | env steps per training s, "
        "median | final greedy eval, median |"
    )
    print("|---|---|---|---|---|---|---|")
    order = list(TIME_TO_SOLVE_LABELS)
    rows = sorted(
        r["summary"],
        key=lambda g: (
            list(s["thresholds"]).index(g["task"]),
            order.index(g["candidate"]) if g["candidate"] in order else len(order),
        ),
    )
    for g in rows:
        threshold = s["thresholds"][g["task"]]
        final = f"{g['final_eval']['median']:.1f}" if g["final_eval"] else "-"
        # the pace of the training loop alone, over every finished run
        rates = [
            run["final_env_steps"] / run["evals"][-1]["train_s"]
            for run in r["runs"]
            if (run["candidate"], run["task"]) == (g["candidate"], g["task"])
            and run["returncode"] == 0
            and run["evals"]
        ]
        rate = f"{np.median(rates):.0f}" if rates else "-"
        print(
            f"| {g['task']} → {threshold:g} "
            f"| {TIME_TO_SOLVE_LABELS.get(g['candidate'], g['candidate'])} "
            f"| {g['reached']}/{g['seeds']} "
            f"| {fmt_range(g['env_steps_to_threshold'], 1000, 'k')} "
            f"| {fmt_range(g['train_s_to_threshold'], 1, ' s')} | {rate} | {final} |"
        )
    print()
    source(path, r)


def lunar_lander():
    """Ours against DI-engine's ACER on LunarLander (bench/lunar_lander.py): per
    candidate, the seeds that reached the threshold and when, and the evaluations
    at the budget: the last one, each run's mean over its last 100k env steps (10
    evaluations, steadier than one) and its best."""
    path, r = newest("lunar_lander")
    if r is None:
        return
    s = r["settings"]
    print(
        f"{s['task']}, {s['budget_env_steps']:,} env steps a run, seeds "
        f"{', '.join(map(str, s['seeds']))} (`{path.name}`"
        f"{'' if r['complete'] else '; INCOMPLETE'}); {s['protocol_text']}:"
    )
    print()
    print(
        f"| candidate | reached {s['threshold']:g} | env steps to {s['threshold']:g}, "
        "median (range) | training s to it, median (range) | final greedy eval, median "
        "(range) | mean of the last 100k, median (range) | best eval, median (range) "
        "| env steps per training s, median |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for g in r["summary"]:
        runs = [
            run
            for run in r["runs"]
            if run["candidate"] == g["candidate"] and run["seed"] in g["seeds"]
        ]
        late, best = [], []
        for run in runs:
            steps = [e["env_steps"] for e in run["evals"]]
            values = [e["return"] for e in run["evals"]]
            late.append(late_mean(steps, values))
            best.append(max(values))
        label = TIME_TO_SOLVE_LABELS.get(g["candidate"], g["candidate"])
        print(
            f"| {label} | {g['reached']}/{len(g['seeds'])} "
            f"| {fmt_range(g['env_steps_to_threshold'], 1000, 'k')} "
            f"| {fmt_range(g['train_s_to_threshold'], 1, ' s')} "
            f"| {fmt_range(g['final_eval'])} | {fmt_range(stats(late))} "
            f"| {fmt_range(stats(best))} "
            f"| {g['env_steps_per_train_s']['median']:.0f} |"
        )
    print()
    source(path, r)


LEARNING_RUNS = [
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
    ("minatar_asterix", "MinAtar Asterix, 1M"),
    ("minatar_asterix_ratio8", "MinAtar Asterix, replay ratio 8"),
    ("minatar_asterix_entropy003", "MinAtar Asterix, entropy 0.03"),
    ("minatar_freeway", "MinAtar Freeway, 1M"),
    ("minatar_seaquest", "MinAtar Seaquest, 1M"),
    ("minatar_seaquest_entropy003", "MinAtar Seaquest, entropy 0.03"),
    ("minatar_breakout_lstm", "MinAtar Breakout, 1M, LSTM, burn-in 5"),
    (
        "minatar_breakout_multiprocess",
        "MinAtar Breakout, 1M, 2 async worker processes",
    ),
    ("minatar_space_invaders_no_replay", "MinAtar SpaceInvaders, replay ratio 0"),
    (
        "minatar_space_invaders_no_trust_region",
        "MinAtar SpaceInvaders, no trust region",
    ),
    ("pendulum", "Pendulum-v1 → -200"),
    ("cartpole_pomdp_lstm_burn_in", "CartPole-v1 no velocities, LSTM, burn-in 5"),
    ("cartpole_pomdp_lstm_stored", "CartPole-v1 no velocities, LSTM, stored"),
    ("cartpole_pomdp_lstm_zero", "CartPole-v1 no velocities, LSTM, zero state"),
    ("cartpole_pomdp_feedforward", "CartPole-v1 no velocities, feed-forward"),
    ("cue_recall_lstm_stored", "CueRecall-v0 → 0.9, LSTM, stored"),
    ("cue_recall_lstm_zero", "CueRecall-v0, LSTM, zero state"),
    ("cue_recall_lstm_burn_in", "CueRecall-v0, LSTM, burn-in 5"),
    ("cue_recall_feedforward", "CueRecall-v0, feed-forward"),
    (
        "halfcheetah_scale01_delta2",
        "HalfCheetah-v5, 1M, scale 0.1, δ = 2 (defaults)",
    ),
    (
        "halfcheetah_scale01_delta2_no_sdn",
        "HalfCheetah-v5, scale 0.1, δ = 2, no dueling network",
    ),
    (
        "halfcheetah_scale01_no_trust_region",
        "HalfCheetah-v5, scale 0.1, no trust region",
    ),
    (
        "halfcheetah_learned_scale",
        "HalfCheetah-v5, 1M, learned scale from 0.1, entropy 0.001, δ = 2",
    ),
    ("halfcheetah_scale01", "HalfCheetah-v5, 1M, scale 0.1, δ = 1"),
    (
        "halfcheetah_scale01_ratio8",
        "HalfCheetah-v5, 1M, scale 0.1, δ = 1, replay ratio 8",
    ),
    (
        "halfcheetah_scale01_no_sdn",
        "HalfCheetah-v5, scale 0.1, δ = 1, no dueling network",
    ),
    ("halfcheetah", "HalfCheetah-v5, 1M, scale 0.3, replay ratio 4"),
    ("halfcheetah_ratio16", "HalfCheetah-v5, 1M, scale 0.3, replay ratio 16"),
    ("halfcheetah_no_sdn", "HalfCheetah-v5, scale 0.3, no dueling network"),
    (
        "halfcheetah_no_trust_region",
        "HalfCheetah-v5, scale 0.3, no trust region",
    ),
    ("atari_breakout", "ALE/Breakout-v5, 1M agent steps"),
]


def learning_table():
    """One row per learning run (its newest file), then each file's command."""
    print(
        "| run | seeds | env steps to threshold, median (range) | reached "
        "| final greedy eval, median (range) | final training return, median (range) "
        "| min/run | data |"
    )
    print("|---|---|---|---|---|---|---|---|")
    commands = []
    for name, label in LEARNING_RUNS:
        row = learning_row(name, label)
        if row:
            print(row)
            path, r = newest(f"learning-{name}")
            commands.append((path, r))
    print()
    print("Each run's protocol and the command that re-runs it:")
    print()
    for path, r in commands:
        print(f"- `{path.name}`: {r['protocol']}; `{command_of(r)}`")
    print()


def late_evals():
    print_over_seeds(
        (
            "halfcheetah_scale01_delta2",
            "halfcheetah_scale01_delta2_no_sdn",
            "halfcheetah_scale01_no_trust_region",
            "halfcheetah_learned_scale",
            "halfcheetah_scale01",
            "halfcheetah_scale01_ratio8",
            "cartpole_pomdp_lstm_burn_in",
            "cartpole_pomdp_lstm_stored",
            "cartpole_pomdp_lstm_zero",
            "cartpole_pomdp_feedforward",
        ),
        late_eval_means,
        "greedy evaluation averaged over the last 100k env steps {}",
        lambda value: f"{value:.0f}",
    )
    print()


def trust_region():
    """Needs the runs' CSV logs (bench/runs/, not in the repository): stdout only."""
    print_over_seeds(
        (
            "cartpole_v0",
            "cartpole_v1",
            "minatar_breakout",
            "minatar_space_invaders",
            "pendulum",
            "halfcheetah_scale01_delta2",
            "halfcheetah_scale01_delta2_no_sdn",
            "halfcheetah_learned_scale",
            "halfcheetah_scale01",
            "halfcheetah_scale01_ratio8",
            "halfcheetah",
            "halfcheetah_ratio16",
            "atari_breakout",
        ),
        trust_region_shares,
        "trust region active on {} of steps",
        pct,
    )


# The README's headline table: per task, ours and the best peer run side by side.
# (task, our result, the protocol in a line); the numbers come from the files.
HEADLINE_LEARNING = [
    ("MinAtar Breakout-v1", "minatar_breakout", "1M frames"),
    ("MinAtar SpaceInvaders-v1", "minatar_space_invaders", "1M frames"),
    ("MinAtar Asterix-v1", "minatar_asterix", "1M frames"),
    ("MinAtar Freeway-v1", "minatar_freeway", "1M frames"),
    ("MinAtar Seaquest-v1", "minatar_seaquest", "1M frames"),
    ("ALE/Breakout-v5", "atari_breakout", "1M agent steps, training return"),
    ("Pendulum-v1", "pendulum", "greedy eval every 5k env steps"),
    ("HalfCheetah-v5", "halfcheetah_scale01_delta2", "1M env steps"),
]


def k_steps(s):
    return fmt_range(s, 1000, "k")


def headline():
    """The README's results table: a row per task, ours against the best peer
    measured side by side (the one that reached the threshold on most seeds, then
    fastest), and the protocol in one line."""
    print("| task | ours | best peer, same runs | protocol | data |")
    print("|---|---|---|---|---|")
    path, r = newest("time_to_solve")
    if r:
        s = r["settings"]
        for task, threshold in s["thresholds"].items():
            groups = [g for g in r["summary"] if g["task"] == task]
            ours = next(g for g in groups if g["candidate"] == "ours")
            peers = [g for g in groups if g["candidate"] != "ours"]
            best = min(
                peers,
                key=lambda g: (
                    -g["reached"],
                    g["train_s_to_threshold"]["median"]
                    if g["train_s_to_threshold"]
                    else float("inf"),
                ),
            )

            def cell(g):
                return (
                    f"{k_steps(g['env_steps_to_threshold'])} env steps, "
                    f"{fmt_range(g['train_s_to_threshold'], 1, ' s')}; "
                    f"{g['reached']}/{g['seeds']}"
                )

            label = TIME_TO_SOLVE_LABELS.get(best["candidate"], best["candidate"])
            print(
                f"| {task} → {threshold:g} | {cell(ours)} | {label}: {cell(best)} "
                f"| {ours['seeds']} seeds, to the first greedy eval at {threshold:g}, "
                f"one thread per run | `{path.name}` |"
            )
    path, r = newest("lunar_lander")
    if r:
        s = r["settings"]
        cells = {}
        for g in r["summary"]:
            cells[g["candidate"]] = (
                f"final {fmt_range(g['final_eval'])}; "
                f"{g['reached']}/{len(g['seeds'])} reached {s['threshold']:g}"
            )
        print(
            f"| {s['task']} | {cells['ours']} "
            f"| {TIME_TO_SOLVE_LABELS['di_acer']}: {cells['di_acer']} "
            f"| {len(s['seeds'])} seeds, {s['budget_env_steps'] / 1e6:g}M env steps, "
            f"greedy eval every 10k | `{path.name}` |"
        )
    path, r = newest("learning-cartpole_pomdp_lstm_burn_in")
    peer_path, peer = newest("recurrent_peer")
    if r and peer:
        peer_steps = stats(peer["steps_to_threshold"])
        print(
            f"| CartPole-v1, velocities hidden → {r['threshold']:g} "
            f"| LSTM: {k_steps(r['steps_to_threshold'])} env steps; "
            f"{r['reached']}/{len(r['seeds'])} "
            f"| sb3-contrib RecurrentPPO: {k_steps(peer_steps)} env steps; "
            f"{peer_steps['n']}/{len(peer['seeds'])} "
            f"| {len(r['seeds'])} seeds, greedy eval every 5k env steps "
            f"| `{path.name}`, `{peer_path.name}` |"
        )
    for task, name, protocol in HEADLINE_LEARNING:
        path, r = newest(f"learning-{name}")
        if r is None:
            continue
        value = r["final_eval"] if name != "atari_breakout" else r["final_train_reward"]
        print(
            f"| {task} | {fmt_range(value)} | none run side by side "
            f"| {len(r['seeds'])} seed{'s' if len(r['seeds']) > 1 else ''}, {protocol}"
            f"{', final greedy eval' if name != 'atari_breakout' else ''} "
            f"| `{path.name}` |"
        )
    print()


def captured(*sections):
    """What the sections print, as one string."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for section in sections:
            section()
    return out.getvalue()


GENERATED = (
    "<!-- generated by bench/report.py from bench/results/*.json: do not edit -->"
)

LEARNING_INTRO = "Every task's greedy evaluation at its default settings (median over seeds, min-max band, each\npanel naming its result file) is redrawn by `python bench/summary_figure.py` (or `bash\nbench/run_learning.sh summary_plot`) from each task's newest result, unless the script's `TASKS`\ntable pins one; the LunarLander panel has DI-engine's ACER beside ours (`COMPARISONS`).\n\n![Learning curves of every task](../../bench/results/summary.png)\n\nAll learning runs use the examples' shipped defaults (`examples/config_gym.yaml`: 8 envs, T = 20,\nreplay ratio 4, replay start 1 000 steps, Adam 1e-3, grad-norm clip 10, c = 10, δ = 1 on the\nlogits, α = 0.99, entropy 0.01, γ = 0.99; `examples/config_atari.yaml`: OpenAI baselines' ACER\nsettings), one torch thread per run, and are started by `bash bench/run_learning.sh <part>`.\nEvaluation is greedy (the policy's mode), one episode per evaluation environment, run to the\nepisode's end or `eval.max_steps`; \"reached\" counts the seeds whose evaluation got to the\nthreshold. Steps are env steps summed over the parallel envs (agent steps on Atari, where one\nstep is 4 frames)."


def pages():
    """Each generated file's path (relative to the checkout) and text."""
    headline_table = captured(headline)
    return {
        PAGES / "headline.md": "\n".join(
            [
                "# Headline results",
                "",
                GENERATED,
                "",
                "Per task, ours and the best peer measured in the same runs (same "
                "protocol, same machine); the other pages give every run.",
                "",
                headline_table,
                "![Learning curves of every task](../../bench/results/summary.png)",
                "",
            ]
        ),
        PAGES / "speed.md": "\n".join(
            [
                "# Speed and memory",
                "",
                GENERATED,
                "",
                "Ratios measured side by side in one run (medians over interleaved "
                "rounds); what they mean: [the discussion](discussion.md).",
                "",
                "## Loss and estimator",
                "",
                captured(speed_and_memory),
                "## Time to solve",
                "",
                captured(time_to_solve),
            ]
        ),
        PAGES / "learning.md": "\n".join(
            [
                "# Learning",
                "",
                GENERATED,
                "",
                LEARNING_INTRO,
                "",
                "## Every run",
                "",
                captured(learning_table),
                "## LunarLander against DI-engine",
                "",
                captured(lunar_lander),
                "## Steadier than the last evaluation",
                "",
                captured(late_evals),
                "## Figures",
                "",
                *[
                    f"![{png.stem}](../../bench/results/{png.name})\n"
                    for png in sorted(RESULTS.glob("*.png"))
                    if png.stem != "summary"
                ],
            ]
        ),
    }


def readme(text, table):
    """The README with its results table replaced by ``table``."""
    head, rest = text.split(README_START + "\n", 1)
    _, tail = rest.split(README_END, 1)
    return head + README_START + "\n" + table + README_END + tail


def expected(root):
    """Every generated file under ``root`` and the text the data gives it."""
    files = {root / path: text for path, text in pages().items()}
    readme_path = root / "README.md"
    files[readme_path] = readme(readme_path.read_text(), captured(headline))
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="write the pages")
    mode.add_argument("--check", action="store_true", help="fail if pages are stale")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        speed_and_memory()
        time_to_solve()
        lunar_lander()
        learning_table()
        trust_region()
        late_evals()
        return 0
    stale = 0
    for path, text in expected(args.root).items():
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        else:
            stale += 1
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    f"{path} (committed)",
                    f"{path} (from bench/results)",
                )
            )
    if stale:
        print(
            f"\n{stale} file(s) differ from bench/results: run "
            "`python bench/report.py --write`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
