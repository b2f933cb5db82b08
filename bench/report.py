"""Markdown tables of the newest result of every benchmark in bench/results/.

    python bench/report.py

Every number in the README's results section comes from here, with the file it
was read from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from learning import stats  # bench/ is on the path: this runs as a script

RESULTS = Path(__file__).parent / "results"


def newest(prefix):
    files = sorted(RESULTS.glob(f"{prefix}-*.json"))
    return (files[-1], json.loads(files[-1].read_text())) if files else (None, None)


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
    return f"| {label} | {steps} | {reached} | {final} | {train} | {wall} | `{path.name}` |"


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
        f"Time to solve, one thread per run, runs interleaved (`{path.name}`, ours "
        f"from {r.get('ours_code', r['commit'])}; not reached: after {budget} env "
        f"steps{cap}):"
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
        f"{s['task']}, {s['budget_env_steps']:,} env steps a run (`{path.name}`, "
        f"ours from {s['ours_commit'][:7]}{'' if r['complete'] else '; INCOMPLETE'}):"
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


def main():
    speed_and_memory()
    time_to_solve()
    lunar_lander()
    print(
        "| run | env steps to threshold, median (range) | reached "
        "| final greedy eval, median (range) | final training return, median (range) "
        "| min/run | data |"
    )
    print("|---|---|---|---|---|---|---|")
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
    ]:
        row = learning_row(name, label)
        if row:
            print(row)
    print()
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
    print()
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


if __name__ == "__main__":
    main()
