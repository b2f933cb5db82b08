"""Markdown tables of the results of every benchmark in bench/results/.

    python bench/report.py           # print every table
    python bench/report.py --write   # write the results pages and the pages' tables
    python bench/report.py --check   # exit 1, with a diff, if those differ from the data

Every number table of the docs comes from here, with the file it was read from and
the command that re-runs it: whole pages (docs/results/ but its index and
discussion), and in the README and the hand-written pages the tables between
``<!-- report: NAME -->`` and ``<!-- /report -->`` (``BLOCKS[NAME]`` prints
them). `.ci/run` runs ``--check``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
from learning import stats  # bench/ is on the path: this runs as a script

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
PAGES = Path("docs") / "results"  # relative to the checkout's root


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


COLLECTION_PATHS = {
    "collector_probabilistic": "TorchRL's `Collector`, TorchRL's `ProbabilisticActor`",
    "collector": "TorchRL's `Collector`, `CategoricalActor` (the example's)",
    "lean_collector": "`GymVectorCollector`, `CategoricalActor`",
    "gymnasium": "gymnasium's vector env alone, random actions",
    "policy_bare": "the bare policy network alone",
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
        print("| path | ms per batch, median over rounds |")
        print("|---|---|")
        for name, seconds in r["seconds_per_batch"].items():
            print(f"| {COLLECTION_PATHS.get(name, name)} | {seconds * 1e3:.1f} |")
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
    "ours_tuned": "ours, tuned preset",
    "ours": "ours (`examples/acer_gym.py` defaults)",
    "ours_preset": "ours, `preset=lunar_lander`",
    "sb3_ppo": "Stable-Baselines3 PPO (zoo)",
    "sb3_a2c": "Stable-Baselines3 A2C (zoo)",
    "sb3_dqn": "Stable-Baselines3 DQN (zoo)",
    "di_acer": "DI-engine 0.5.3 ACER (dizoo)",
    "torchrl_ppo": "TorchRL PPO (zoo settings)",
}
# what must agree between two time-to-solve files read side by side
SAME_PROTOCOL = ("thresholds", "budget_env_steps", "max_minutes")


def tts_label(candidate, settings, task):
    if candidate == "ours_tuned":
        preset = settings["ours_tuned_presets"][task]
        return f"ours, `preset={preset}`"
    return TIME_TO_SOLVE_LABELS.get(candidate, candidate)


@functools.cache
def side_by_side():
    """Ours and the peers, time to solve: per task, the newest file that ran ours on
    it (its tuned preset if any file did, else the defaults), and the newest that ran
    the peers, as ``(files, settings, groups, runs)`` (so that a file that re-ran one
    task's preset leaves the other tasks' rows as they were). Two files must share
    the protocol (thresholds, budgets, time cap, evaluation), or this refuses to put
    them side by side."""
    files = every("time_to_solve")
    if not files:
        return None
    tasks = list(dict.fromkeys(g["task"] for _, r in files for g in r["summary"]))
    ours = {}  # task: (path, result)
    for task in tasks:
        ours[task] = next(
            (
                (path, r)
                for name in ("ours_tuned", "ours")
                for path, r in reversed(files)
                if any(
                    (g["candidate"], g["task"]) == (name, task) for g in r["summary"]
                )
            ),
            files[-1],
        )
    peers = next(
        (
            (path, r)
            for path, r in reversed(files)
            if any(not g["candidate"].startswith("ours") for g in r["summary"])
        ),
        files[-1],
    )
    ours_files = list({path: (path, r) for path, r in ours.values()}.values())
    for mine in ours_files:
        for key in SAME_PROTOCOL:
            a, b = (f[1]["settings"].get(key) for f in (mine, peers))
            # per-task settings need agree only on the tasks both ran
            if a != b and not (
                isinstance(a, dict)
                and isinstance(b, dict)
                and all(a[t] == b[t] for t in set(a) & set(b))
            ):
                raise ValueError(
                    f"{mine[0].name} and {peers[0].name} differ in settings.{key}: "
                    f"{a} against {b}"
                )
        proto = [
            {k: v for k, v in f[1]["settings"]["protocol"].items() if k != "text"}
            for f in (mine, peers)
        ]
        if proto[0] != proto[1]:
            raise ValueError(
                f"{mine[0].name} and {peers[0].name} differ in settings.protocol: "
                f"{proto[0]} against {proto[1]}"
            )
    groups, runs, presets = [], [], {}
    for task, (_, r) in ours.items():
        # the preset first (the targets read it), then the defaults where the same
        # file ran them beside it
        names = [
            name
            for name in ("ours_tuned", "ours")
            if any((g["candidate"], g["task"]) == (name, task) for g in r["summary"])
        ]
        groups += [
            g
            for n in names
            for g in r["summary"]
            if (g["candidate"], g["task"]) == (n, task)
        ]
        runs += [x for x in r["runs"] if x["candidate"] in names and x["task"] == task]
        if "ours_tuned" in names:
            presets[task] = r["settings"]["ours_tuned_presets"][task]
    groups += [g for g in peers[1]["summary"] if not g["candidate"].startswith("ours")]
    runs += [r for r in peers[1]["runs"] if not r["candidate"].startswith("ours")]
    paths = [path for path, _ in ours_files]
    paths += [] if peers[0] in paths else [peers[0]]
    settings = {**peers[1]["settings"]}
    for _, r in reversed(ours_files):  # the newest file's settings last
        for key, value in r["settings"].items():
            # per-task settings: those of every task any file ran
            both = isinstance(value, dict) and isinstance(settings.get(key), dict)
            settings[key] = {**settings[key], **value} if both else value
    settings["ours_tuned_presets"] = presets
    return [(path, dict(files)[path]) for path in paths], settings, groups, runs


def solved_for_good(g, missing="-"):
    """``k/n`` solved for good, or ``missing`` where the runs stopped at the first reach."""
    if g.get("solved_for_good") is None:
        return missing
    return f"{g['solved_for_good']}/{g['seeds']}"


def time_to_solve():
    """Env steps and training seconds until the greedy evaluation first reached the
    threshold, per candidate and task (medians and ranges over the seeds that did),
    and for runs that went on past it (``--settle``) how many stayed solved."""
    found = side_by_side()
    if found is None:
        return
    files, s, groups, runs = found
    budget = ", ".join(f"{t} {b:,}" for t, b in s["budget_env_steps"].items())
    cap = f", or {s['max_minutes']:g} min of training" if s.get("max_minutes") else ""
    names = " and ".join(f"`{path.name}`" for path, _ in files)
    print(
        f"Time to solve, one thread per run, runs interleaved ({names}; not "
        f"reached: after {budget} env steps{cap}); {s['protocol']['text']}; CPU "
        "seconds: the same on the run's CPU clock (one thread: its work, which other "
        "load on the machine does not stretch; `-`: not recorded). "
        "Solved for good: of the runs that went on past the first evaluation at the "
        "threshold (`--settle`; their `settle_env_steps`), those whose mean of the last "
        f"{s.get('late', 5)} evaluations is at or above it (late mean: that mean, "
        "median over seeds); `-`: the runs stopped at the first reach."
    )
    print()
    print(
        "| task | candidate | reached | env steps to threshold, median (range) "
        "| training s to threshold, median (range) | training CPU s to threshold, "
        "median (range) | env steps per training s, median | solved for good "
        "| late mean, median (range) | final greedy eval, median |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    order = list(TIME_TO_SOLVE_LABELS)
    rows = sorted(
        groups,
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
            for run in runs
            if (run["candidate"], run["task"]) == (g["candidate"], g["task"])
            and run["returncode"] == 0
            and run["evals"]
        ]
        rate = f"{np.median(rates):.0f}" if rates else "-"
        print(
            f"| {g['task']} → {threshold:g} "
            f"| {tts_label(g['candidate'], s, g['task'])} "
            f"| {g['reached']}/{g['seeds']} "
            f"| {fmt_range(g['env_steps_to_threshold'], 1000, 'k')} "
            f"| {fmt_range(g['train_s_to_threshold'], 1, ' s')} "
            f"| {fmt_range(g.get('train_cpu_s_to_threshold'), 1, ' s', '-')} | {rate} "
            f"| {solved_for_good(g)} | {fmt_range(g.get('late_mean'), missing='-')} "
            f"| {final} |"
        )
    print()
    for path, r in files:
        source(path, r)


def time_to_solve_targets():
    """Issue #34's targets on the time-to-solve tasks, each met or missed: ours'
    median env steps at most the best peer's, its median seconds at most the
    fastest peer's, every seed solved, solved for good on most seeds."""
    found = side_by_side()
    if found is None:
        return
    files, s, groups, _ = found
    print("| task | target | ours | peers | met |")
    print("|---|---|---|---|---|")
    for task in s["thresholds"]:
        candidates = [g for g in groups if g["task"] == task and g["candidate"].startswith("ours")]  # fmt: skip
        peers = [g for g in groups if g["task"] == task and g not in candidates]
        if not candidates or not peers:
            continue

        def median(g, key):
            return g[key]["median"] if g[key] else float("inf")

        def label(g, task=task):
            return tts_label(g["candidate"], s, task)

        every_peer = "; ".join(f"{label(g)} {g['reached']}/{g['seeds']}" for g in peers)
        peers_good = "; ".join(
            f"{label(g)} "
            + solved_for_good(g, missing="not measured (stopped at the first reach)")
            for g in peers
        )
        # each of ours that ran (the preset, and the defaults where run beside it)
        for ours in candidates:
            for key, what, unit in (
                ("env_steps_to_threshold", "median env steps ≤ the best peer's", "k"),
                ("train_s_to_threshold", "median seconds ≤ the fastest peer's", " s"),
            ):
                scale = 1000 if unit == "k" else 1
                best = min(peers, key=lambda g: median(g, key))
                met = median(ours, key) <= median(best, key)
                print(
                    f"| {task} | {what} | {label(ours)}: {fmt_range(ours[key], scale, unit)} "
                    f"| {label(best)}: {fmt_range(best[key], scale, unit)} "
                    f"| {'yes' if met else 'no'} |"
                )
            print(
                f"| {task} | every seed solved "
                f"| {label(ours)}: {ours['reached']}/{ours['seeds']} "
                f"| {every_peer} "
                f"| {'yes' if 0 < ours['reached'] == ours['seeds'] else 'no'} |"
            )
            good = ours.get("solved_for_good")
            print(
                f"| {task} | solved for good on most seeds | {label(ours)}: "
                + solved_for_good(ours, missing="not measured")
                + f" | {peers_good} | "
                + ("no" if good is None or 2 * good <= ours["seeds"] else "yes")
                + " |"
            )
    print()
    for path, r in files:
        source(path, r)


def return_target_met(ours, peers):
    """``yes`` where ours' median return is at least every peer's, ``no`` where a
    peer's is higher, ``open: ...`` while a peer has seeds to finish; ``peers`` are
    ``(label, returns, all seeds done)``."""
    if not all(done for *_, done in peers):
        return "open: a peer has seeds to finish"
    best = max(stats(returns)["median"] for _, returns, _ in peers)
    return "yes" if stats(ours)["median"] >= best else "no"


def return_targets():
    """Issue #34's targets on LunarLander and MinAtar, each met or missed: ours' final
    greedy return at the peers' env steps (median over seeds) at least every peer's;
    open while a peer has seeds to finish."""
    rows = []  # (task, ours' label, ours' returns, [(peer label, returns, done)], files)
    found = lunar_lander_peer_groups()
    if found:
        files, s, groups = found
        ours = lunar_lander_ours(groups)
        peers = [
            (
                TIME_TO_SOLVE_LABELS[g["candidate"]],
                [a["return"] for a in g["at_budget"]],
                not g["missing"],
            )
            for g in groups
            if not g["candidate"].startswith("ours") and g["at_budget"]
        ]
        budget = s["budget_env_steps"] // 1000
        task = f"{s['task']} at {budget}k"
        returns = [a["return"] for a in ours["at_budget"]]
        names = [path.name for path, _ in files]
        label = TIME_TO_SOLVE_LABELS[ours["candidate"]]
        rows.append((task, label, returns, peers, names))
    path, r = newest("minatar_peers")
    if r:
        s = r["settings"]
        for game in r["summary"]:
            peers = [
                (
                    MINATAR_PEER_LABELS[g["algo"]],
                    list(g["final_eval_per_seed"].values()),
                    not g["missing_seeds"],
                )
                for g in game["peers"]
                if g["final_eval_per_seed"]
            ]
            task = f"{s['games'][game['game']]} at {s['budget_env_steps'] // 10**6}M"
            label = TIME_TO_SOLVE_LABELS["ours"]
            ours = list(game["ours"]["final_eval_per_seed"].values())
            rows.append((task, label, ours, peers, [game["ours"]["file"], path.name]))
    if not rows:
        return
    print("| task | ours | best peer, median | met | data |")
    print("|---|---|---|---|---|")
    for task, label, ours, peers, names in rows:
        best_label, best, _ = max(peers, key=lambda p: stats(p[1])["median"])
        print(
            f"| {task} | {label}: {fmt_range(stats(ours))} "
            f"| {best_label}: {fmt_range(stats(best))} "
            f"| {return_target_met(ours, peers)} "
            f"| {', '.join(f'`{name}`' for name in names)} |"
        )
    print()


PRIORITIZED_LABELS = {
    "ours_tuned": "uniform segment replay (the preset as it is)",
    "ours_tuned_prioritized": "prioritized segment replay",
}


def prioritized_replay():
    """The tuned presets with and without prioritized segment replay
    (bench/prioritized_replay.py): env steps and CPU seconds to the threshold, and
    how many runs stayed solved."""
    path, r = newest("prioritized_replay")
    if r is None:
        return
    s = r["settings"]
    p = s["prioritized"]
    presets = ", ".join(f"{t}: `preset={name}`" for t, name in s["presets"].items())
    print(
        f"Each task's tuned preset ({presets}) with its uniform segment replay and "
        f"with prioritized segment replay (priority: {p['priority']}; sampled by "
        f"{p['sampler']}, alpha {p['alpha']:g}; importance weights "
        f"{p['importance_weights']}), the time-to-solve protocol above, runs going "
        f"on {s['settle_env_steps']:,} env steps past the threshold (solved for "
        f"good: the mean of the last {s['late']} evaluations at or above it), "
        f"budget {', '.join(f'{t} {b:,}' for t, b in s['budget_env_steps'].items())} "
        "env steps."
    )
    print()
    print(
        "| task | replay | reached | env steps to threshold, median (range) "
        "| training CPU s to threshold, median (range) | solved for good "
        "| late mean, median (range) |"
    )
    print("|---|---|---|---|---|---|---|")
    order = list(PRIORITIZED_LABELS)
    for g in sorted(
        r["summary"],
        key=lambda g: (
            list(s["thresholds"]).index(g["task"]),
            order.index(g["candidate"]),
        ),
    ):
        print(
            f"| {g['task']} → {s['thresholds'][g['task']]:g} "
            f"| {PRIORITIZED_LABELS[g['candidate']]} | {g['reached']}/{g['seeds']} "
            f"| {fmt_range(g['env_steps_to_threshold'], 1000, 'k')} "
            f"| {fmt_range(g['train_cpu_s_to_threshold'], 1, ' s')} "
            f"| {solved_for_good(g)} | {fmt_range(g['late_mean'], missing='-')} |"
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


MINATAR_PEER_LABELS = {
    "sb3_dqn": "Stable-Baselines3 DQN (MinAtar paper's settings)",
    "sb3_ppo": "Stable-Baselines3 PPO (zoo's Atari settings)",
    "sb3_a2c": "Stable-Baselines3 A2C (zoo's Atari settings)",
}


def seeds_done(g):
    """``n/N seeds`` of a minatar_peers group, naming the missing ones."""
    n, missing = len(g["seeds"]), g["missing_seeds"]
    return f"{n}/{n + len(missing)} seeds" + (
        f" (missing {', '.join(map(str, missing))})" if missing else ""
    )


def minatar_peers():
    """Stable-Baselines3's DQN, PPO and A2C on MinAtar with the paper's network, by
    ours (bench/minatar_peers.py): per game, each one's final greedy return over
    the seeds finished, ours' from its learning file beside them."""
    path, r = newest("minatar_peers")
    if r is None:
        return
    s = r["settings"]
    print(
        f"{s['budget_env_steps']:,} env steps a run, seeds "
        f"{', '.join(map(str, s['seeds']))} (`{path.name}`"
        f"{'' if r['complete'] else '; INCOMPLETE'}); {s['protocol_text']}; "
        f"{s['network']}:"
    )
    print()
    print(
        "| game | candidate | final greedy eval, median (range) | seeds "
        "| env steps, median | training s, median |"
    )
    print("|---|---|---|---|---|---|")
    for game in r["summary"]:
        ours = game["ours"]
        print(
            f"| {game['game']} | ours (`examples/acer_gym.py` defaults, "
            f"`{ours['file']}`) | {fmt_range(ours['final_eval'])} "
            f"| {len(ours['final_eval_per_seed'])}/{len(ours['seeds'])} seeds | - | - |"
        )
        for g in game["peers"]:
            steps, train_s = (
                f"{g[key]['median']:,.0f}" if g[key] else "-"
                for key in ("final_env_steps", "train_s")
            )
            print(
                f"| {game['game']} | {MINATAR_PEER_LABELS[g['algo']]} "
                f"| {fmt_range(g['final_eval'], missing='none finished')} "
                f"| {seeds_done(g)} | {steps} | {train_s} |"
            )
    print()
    source(path, r)


def minatar_best_peer(name):
    """The headline's peer cell for ours' learning run ``name`` (``minatar_<game>``):
    the peer of the newest minatar_peers file with the highest median final greedy
    return over its finished seeds, and that file; ``None`` where none finished."""
    path, r = newest("minatar_peers")
    game = next(
        (g for g in (r or {}).get("summary", []) if f"minatar_{g['game']}" == name),
        None,
    )
    finished = [g for g in game["peers"] if g["final_eval"]] if game else []
    if not finished:
        return None
    best = max(finished, key=lambda g: g["final_eval"]["median"])
    return (
        f"{MINATAR_PEER_LABELS[best['algo']]}: {fmt_range(best['final_eval'])}; "
        f"{seeds_done(best)}",
        path,
    )


def at_budget(run, budget, threshold):
    """A LunarLander run read at ``budget`` env steps: its evaluation there (the
    first at or past it, as a run of that budget ends), the env steps of the first
    evaluation at ``threshold`` up to it (None: not reached by then), and the mean
    of its evaluations over the last 100k env steps up to it."""
    evals = [e for e in run["evals"] if e["env_steps"] < budget]
    evals += [e for e in run["evals"] if e["env_steps"] >= budget][:1]
    if evals[-1]["env_steps"] < budget:
        raise ValueError(
            f"{run['candidate']} seed {run['seed']} stops at "
            f"{evals[-1]['env_steps']} env steps, before {budget}"
        )
    reached = next((e for e in evals if e["return"] >= threshold), None)
    steps = [e["env_steps"] for e in evals]
    return {
        "return": evals[-1]["return"],
        "env_steps": steps[-1],
        "to_threshold": reached["env_steps"] if reached else None,
        "late_mean": late_mean(steps, [e["return"] for e in evals]),
    }


def lunar_lander_peer_groups():
    """The SB3 peers' LunarLander file (``lunar_lander_sb3``) with ours and
    DI-engine's ACER read at its budget from their longer runs (``lunar_lander``,
    the same protocol): (files, settings, rows), a row per candidate with its seeds,
    missing seeds and each seed's :func:`at_budget`; None without the SB3 file."""
    peer_path, peer = newest("lunar_lander_sb3")
    path, r = newest("lunar_lander")
    if peer is None or r is None:
        return None
    s = peer["settings"]
    for key in ("task", "threshold", "protocol"):
        if r["settings"][key] != s[key]:
            raise ValueError(
                f"{path.name} and {peer_path.name} differ in {key}: "
                f"{r['settings'][key]} against {s[key]}"
            )
    budget, threshold = s["budget_env_steps"], s["threshold"]
    rows = []
    files = [(path, r), (peer_path, peer)]
    preset_path, preset = newest("learning-lunar_lander_preset")
    if preset is not None:
        rows.append(preset_row(preset_path, preset, s))
        files.insert(0, (preset_path, preset))
    for source_file, result in ((path, r), (peer_path, peer)):
        missing = result.get("missing_runs", [])
        for candidate in result["settings"]["candidates"]:
            runs = [run for run in result["runs"] if run["candidate"] == candidate]
            rows.append(
                {
                    "candidate": candidate,
                    "file": source_file,
                    "missing": [
                        m["seed"] for m in missing if m["candidate"] == candidate
                    ],
                    "at_budget": [at_budget(run, budget, threshold) for run in runs],
                }
            )
    return files, s, rows


def lunar_lander_ours(rows):
    """Ours' row of :func:`lunar_lander_peer_groups`: with ``preset=lunar_lander``
    where it has run, else at its defaults."""
    return min(
        (row for row in rows if row["candidate"] in ("ours_preset", "ours")),
        key=lambda row: row["candidate"] != "ours_preset",
    )


def preset_row(path, r, s):
    """Ours with ``preset=lunar_lander`` (a ``bench/learning.py`` file) as a row of
    :func:`lunar_lander_peer_groups`, refused unless it ran the peers' protocol."""
    p = s["protocol"]
    wanted = {
        f"env.name={s['task']}",
        f"eval.interval={p['interval']}",
        f"eval.episodes={p['episodes']}",
        f"eval.max_steps={p['max_steps']}",
        "preset=lunar_lander",
    }
    if not wanted <= set(r["overrides"]) or r["threshold"] != s["threshold"]:
        raise ValueError(
            f"{path.name} is not preset=lunar_lander under the protocol of the "
            f"peers ({sorted(wanted)}, threshold {s['threshold']:g})"
        )
    runs = [
        {
            "candidate": "ours_preset",
            "seed": run["seed"],
            "evals": [
                {"env_steps": steps, "return": ret}
                for steps, ret in zip(
                    run["eval_steps"], run["eval_reward"], strict=True
                )
            ],
        }
        for run in r["runs"]
    ]
    ran = {run["seed"] for run in runs}
    return {
        "candidate": "ours_preset",
        "file": path,
        "missing": [seed for seed in s["seeds"] if seed not in ran],
        "at_budget": [
            at_budget(run, s["budget_env_steps"], s["threshold"]) for run in runs
        ],
    }


def peer_version(result, prefix, package):
    """``package``'s version in the first run of ``result`` whose candidate starts
    with ``prefix``."""
    return next(
        run["versions"][package]
        for run in result["runs"]
        if run["candidate"].startswith(prefix)
    )


def lunar_lander_peers():
    """LunarLander at the SB3 peers' budget: every candidate's greedy evaluation
    there and the env steps to the threshold by then, ours and DI-engine's read
    from their 1M runs at that point."""
    found = lunar_lander_peer_groups()
    if found is None:
        return
    files, s, rows = found
    (path, r), (peer_path, peer) = files[-2:]
    budget, threshold = s["budget_env_steps"], s["threshold"]
    latest = max(a["env_steps"] for row in rows for a in row["at_budget"])
    sb3_version = peer_version(peer, "sb3", "stable_baselines3")
    print(
        f"{s['task']} at {budget:,} env steps, the same protocol as above. "
        f"Stable-Baselines3 {sb3_version} with {s['zoo_source']}"
        + (
            " (TorchRL's PPO, in TorchRL "
            + peer_version(peer, "torchrl_ppo", "torchrl")
            + ", with its PPO entry)"
            if any(run["candidate"] == "torchrl_ppo" for run in peer["runs"])
            else ""
        )
        + f"; {s['zoo_changed']}. Ours at its defaults and DI-engine's ACER "
        f"are their runs above (`{path.name}`) read at {budget:,} env steps; every run "
        f"is read at its first evaluation at or past {budget:,} env steps (the latest "
        f"at {latest:,}: a peer's last batch may end past it). "
        "Each peer's settings are in the file."
        + (
            f" Ours with `preset=lunar_lander` ran to {budget:,} env steps "
            f"(`{files[0][0].name}`, `bench/learning.py`: an evaluation after the "
            "first batch and after each batch that takes the env steps to or past a "
            "multiple of the interval)."
            if len(files) > 2
            else ""
        )
        + (
            ""
            if peer["complete"]
            else " INCOMPLETE, not finished: "
            + "; ".join(
                f"{row['candidate']} seed{'s' if len(row['missing']) > 1 else ''} "
                + ", ".join(map(str, row["missing"]))
                for row in rows
                if row["missing"]
            )
            + "."
        )
    )
    print()
    print(
        f"| candidate | seeds | reached {threshold:g} by {budget // 1000}k "
        f"| env steps to {threshold:g}, median (range) "
        f"| greedy eval at {budget // 1000}k, median (range) "
        f"| mean of the last 100k to {budget // 1000}k, median (range) | data |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        done = row["at_budget"]
        label = TIME_TO_SOLVE_LABELS.get(row["candidate"], row["candidate"])
        planned = len(done) + len(row["missing"])
        if not done:
            print(f"| {label} | 0/{planned} | - | - | - | - | `{row['file'].name}` |")
            continue
        print(
            f"| {label} | {len(done)}/{planned} "
            f"| {sum(a['to_threshold'] is not None for a in done)}/{len(done)} "
            f"| {k_steps(stats([a['to_threshold'] for a in done]))} "
            f"| {fmt_range(stats([a['return'] for a in done]))} "
            f"| {fmt_range(stats([a['late_mean'] for a in done]))} "
            f"| `{row['file'].name}` |"
        )
    print()
    source(peer_path, peer)
    if len(files) > 2:
        source(*files[0])


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
    found = side_by_side()
    if found:
        files, s, groups, _ = found
        names = ", ".join(f"`{path.name}`" for path, _ in files)
        for task, threshold in s["thresholds"].items():
            ours = next(
                (g for g in groups if g["task"] == task and g["candidate"].startswith("ours")), None
            )  # fmt: skip
            peers = [g for g in groups if g["task"] == task and g is not ours]
            if ours is None or not peers:
                continue
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
                good = solved_for_good(g)
                return (
                    f"{k_steps(g['env_steps_to_threshold'])} env steps, "
                    f"{fmt_range(g['train_s_to_threshold'], 1, ' s')}; "
                    f"{g['reached']}/{g['seeds']}"
                    + ("" if good == "-" else f", {good} solved for good")
                )

            print(
                f"| {task} → {threshold:g} "
                f"| {tts_label(ours['candidate'], s, task)}: {cell(ours)} "
                f"| {tts_label(best['candidate'], s, task)}: {cell(best)} "
                f"| {ours['seeds']} seeds, to the first greedy eval at {threshold:g}, "
                f"one thread per run | {names} |"
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
    found = lunar_lander_peer_groups()
    if found:
        files, s, rows = found
        budget = s["budget_env_steps"]

        def summed(row):
            done = row["at_budget"]
            return (
                f"at {budget // 1000}k "
                f"{fmt_range(stats([a['return'] for a in done]))}; "
                f"{sum(a['to_threshold'] is not None for a in done)}/{len(done)} "
                f"reached {s['threshold']:g}"
            )

        ours = lunar_lander_ours(rows)
        # the peer with most seeds reaching, then the best median at the budget
        best = max(
            (
                row
                for row in rows
                if not row["candidate"].startswith("ours") and row["at_budget"]
            ),
            key=lambda row: (
                sum(a["to_threshold"] is not None for a in row["at_budget"])
                / len(row["at_budget"]),
                stats([a["return"] for a in row["at_budget"]])["median"],
            ),
        )
        seeds = ", ".join(
            f"{TIME_TO_SOLVE_LABELS[row['candidate']].split(' (')[0]}: "
            f"{len(row['at_budget'])} finished"
            for row in rows
            if row["missing"]
        )
        if ours["candidate"] == "ours":
            label, longer = "", "ours and DI-engine read from their 1M runs"
        else:
            label = f"{TIME_TO_SOLVE_LABELS['ours_preset']}: "
            longer = "DI-engine read from its 1M runs"
        print(
            f"| {s['task']} at {budget // 1000}k | {label}{summed(ours)} "
            f"| {TIME_TO_SOLVE_LABELS[best['candidate']]}: {summed(best)} "
            f"| {len(s['seeds'])} seeds"
            + (f" ({seeds})" if seeds else "")
            + f", {budget // 1000}k env steps, greedy eval every 10k; {longer} "
            f"| {', '.join(f'`{path.name}`' for path, _ in files)} |"
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
        peer, peer_path = minatar_best_peer(name) or ("none run side by side", None)
        print(
            f"| {task} | {fmt_range(value)} | {peer} "
            f"| {len(r['seeds'])} seed{'s' if len(r['seeds']) > 1 else ''}, {protocol}"
            f"{', final greedy eval' if name != 'atari_breakout' else ''} "
            f"| `{path.name}`{f', `{peer_path.name}`' if peer_path else ''} |"
        )
    print()


# ---------------------------------------------------------------------------
# Tables for the hand-written pages. A page holds each between
# `<!-- report: NAME -->` and `<!-- /report -->`; `--write` fills in what
# BLOCKS[NAME] prints, `--check` compares it, as for the generated pages.


def every(prefix):
    """Every result file of a benchmark, oldest first."""
    return [
        (path, json.loads(path.read_text()))
        for path in sorted(RESULTS.glob(f"{prefix}-*.json"))
    ]


def over_seeds(values, digits=1):
    """``median (min-max)`` of per-seed values, ``-`` without any."""
    if not values:
        return "-"
    return (
        f"{np.median(values):.{digits}f} ({min(values):.{digits}f}-"
        f"{max(values):.{digits}f})"
    )


def eval_at(step):
    """A run's greedy evaluation at ``step`` env steps (evaluations fall at the end
    of a collected batch, a few steps past the round number)."""

    def value(run):
        for s, v in zip(run["eval_steps"], run["eval_reward"], strict=True):
            if abs(s - step) <= 1_000:
                return v
        return None

    return value


def evals_from(start):
    """A run's mean evaluation from ``start`` env steps on, one per step evaluated
    (the end-of-run evaluation may repeat the last scheduled one)."""

    def value(run):
        by_step = dict(zip(run["eval_steps"], run["eval_reward"], strict=True))
        return float(np.mean([v for s, v in by_step.items() if s >= start]))

    return value


def last_100k(run):
    return late_mean(run["eval_steps"], run["eval_reward"])


def per_run(value, digits=1):
    """A column of ``value(run)`` over the seeds: median (range)."""
    return lambda r: over_seeds(
        [v for v in map(value, r["runs"]) if v is not None], digits
    )


# A learning table's columns: (header, what a result file gives the cell).
STEPS = (
    "env steps to {threshold}, median (range)",
    lambda r: (
        "-" if r["threshold"] is None else fmt_range(r["steps_to_threshold"], 1000, "k")
    ),
)
REACHED = (
    "reached",
    lambda r: "-" if r["threshold"] is None else f"{r['reached']}/{len(r['runs'])}",
)
FINAL = ("final greedy eval, median (range)", lambda r: fmt_range(r["final_eval"]))
BEST = ("best greedy eval, median (range)", lambda r: fmt_range(r["best_eval"]))
TRAIN = (
    "final training return, median (range)",
    lambda r: fmt_range(r.get("final_train_reward"), missing="-"),
)
LATE = ("greedy eval, each run's mean over its last 100k env steps", per_run(last_100k))
FROM_800K = (
    "greedy eval, each run's mean from 800k env steps on",
    per_run(evals_from(800_000)),
)
MINUTES = ("min/run", lambda r: f"{r['wall_s_per_run']['median'] / 60:.0f}")


def at(step):
    return (f"greedy eval at {step // 1000}k", per_run(eval_at(step)))


def runs_table(rows, columns):
    """A table of learning runs: ``rows`` of (label, file, result), then each
    file's protocol and the command that re-runs it."""
    if not rows:
        return
    thresholds = {r["threshold"] for *_, r in rows if r["threshold"] is not None}
    threshold = f"{thresholds.pop():g}" if len(thresholds) == 1 else "the threshold"
    headers = [header.format(threshold=threshold) for header, _ in columns]
    print("| run | " + " | ".join(headers) + " | data |")
    print("|---" * (len(columns) + 2) + "|")
    for label, path, r in rows:
        cells = " | ".join(value(r) for _, value in columns)
        print(f"| {label} | {cells} | `{path.name}` |")
    print()
    for _, path, r in rows:
        print(f"- `{path.name}`: {r['protocol']}; re-run: `{command_of(r)}`")
    print()


def newest_runs(names):
    """(label, file, result) for each run name's newest file, in LEARNING_RUNS'
    words; names without a file are left out."""
    labels = dict(LEARNING_RUNS)
    return [
        (labels[name], *newest(f"learning-{name}"))
        for name in names
        if newest(f"learning-{name}")[1] is not None
    ]


def learning_table():
    """Every learning run, its newest file."""
    runs_table(
        newest_runs([name for name, _ in LEARNING_RUNS]),
        [STEPS, REACHED, FINAL, TRAIN, MINUTES],
    )


def recurrent_cartpole():
    runs_table(
        newest_runs(
            [
                "cartpole_pomdp_lstm_burn_in",
                "cartpole_pomdp_lstm_zero",
                "cartpole_pomdp_lstm_stored",
                "cartpole_pomdp_feedforward",
            ]
        ),
        [STEPS, REACHED, FINAL, LATE, MINUTES],
    )
    path, peer = newest("recurrent_peer")
    if peer:
        steps = stats(peer["steps_to_threshold"])
        print(
            f"The peer, {peer['peer']} (`{path.name}`; {peer['protocol']}): "
            f"{k_steps(steps)} env steps to {peer['threshold']:g}, "
            f"{steps['n']}/{len(peer['seeds'])} seeds; final greedy eval "
            f"{fmt_range(peer['final_eval'])}. The file records no command: "
            f"it comes from `.venv-bench/bin/python bench/recurrent_peer.py`."
        )
        print()


def recurrent_cue():
    runs_table(
        newest_runs(
            [
                "cue_recall_lstm_stored",
                "cue_recall_lstm_zero",
                "cue_recall_lstm_burn_in",
                "cue_recall_feedforward",
            ]
        ),
        [STEPS, REACHED, FINAL, BEST],
    )


def recurrent_minatar():
    runs_table(
        newest_runs(["minatar_breakout_lstm", "minatar_breakout"]),
        [at(500_000), FINAL, FROM_800K, TRAIN],
    )
    example_cost()


def example_cost():
    for path, r in every("example_cost_*"):
        s, ratio = r["setting"], r["b_over_a"]
        print(
            f"`{s['example']}` with {' '.join(s['b']) or 'its defaults'} against "
            f"{' '.join(s['a']) or 'its defaults'} ({' '.join(s['common'])}), time "
            f"per env step: {ratio['median']:.2f}x ({ratio['min']:.2f}-"
            f"{ratio['max']:.2f}), median (range) of {s['rounds']} alternating rounds "
            f"of {s['frames_per_run']} env steps, {s['torch_threads_per_run']} torch "
            f"thread per run."
        )
        print()
        source(path, r)


SCALE_CONFIGS = {
    "single": "single process, 2 threads",
    "single_1t": "single, 1 thread",
    "mp1_sync": "1 process, sync",
    "mp1_async": "1 process, async",
    "mp2_sync": "2 processes, sync",
    "mp2_async": "2 processes, async",
    "ray2_async": "2 Ray workers, async",
}


def scaling():
    path, r = newest("scale")
    if r:
        tasks = r["tasks"]
        configs = [
            c
            for c in SCALE_CONFIGS
            if c in tasks["minatar"]["loop"]["medians_steps_per_s"]
        ]
        for part, what in (
            (
                "loop",
                "Agent steps/s of the whole loop (replay ratio "
                f"{tasks['minatar']['settings']['replay_ratio']:g}), and its ratio to "
                "the single process measured in the same rounds (medians of "
                f"{r['settings']['rounds']} rounds):",
            ),
            (
                "collect",
                "Collection alone, agent steps/s (ratio to the single process):",
            ),
        ):
            print(what)
            print()
            print("| | " + " | ".join(SCALE_CONFIGS[c] for c in configs) + " |")
            print("|---" * (len(configs) + 1) + "|")
            for t in tasks.values():
                m = t[part]
                cells = [
                    f"{m['medians_steps_per_s'][c]:.0f} ({m['ratios_to_single'][c]:.2f}x)"
                    for c in configs
                ]
                print(f"| {t['settings']['env']} | " + " | ".join(cells) + " |")
            print()
        print("Where the loop's time goes, per configuration (medians):")
        print()
        print("| | " + " | ".join(SCALE_CONFIGS[c] for c in configs) + " |")
        print("|---" * (len(configs) + 1) + "|")
        for t in tasks.values():
            loop = t["loop"]
            print(
                f"| {t['settings']['env']}: share of the learner's time in updates | "
                + " | ".join(
                    f"{loop['update_fraction_median'][c]:.0%}" for c in configs
                )
                + " |"
            )
            print(
                f"| {t['settings']['env']}: machine CPU busy | "
                + " | ".join(
                    f"{loop['machine_cpu_busy_median'][c]:.0%}" for c in configs
                )
                + " |"
            )
            pushes = loop["weight_push_median_s_by_config"]
            print(
                f"| {t['settings']['env']}: weight push, ms | "
                + " | ".join(
                    f"{pushes[c] * 1e3:.0f}" if c in pushes else "-" for c in configs
                )
                + " |"
            )
        print()
        print(
            "A scaling model from the per-step costs measured in the same run (one "
            "thread each; the file's `model` entry):"
        )
        print()
        print(
            "| | collector core, agent steps/s | learner, ms per collected agent step "
            "| collector cores that saturate the learner | Ray batch transfer "
            "| predicted agent steps/s, 4, 16 and 64 collector cores |"
        )
        print("|---|---|---|---|---|---|")
        for t in tasks.values():
            m, ray = t["model"], t["step_costs"]["ray_transfer"]
            predicted = ", ".join(
                f"{m['predicted_steps_per_s'][k]:.0f}" for k in ("4", "16", "64")
            )
            print(
                f"| {t['settings']['env']} | {1 / m['collector_core_per_agent_step_s']:.0f} "
                f"| {m['learner_per_agent_step_s'] * 1e3:.1f} "
                f"| {m['collector_cores_to_saturate_learner']:.2f} "
                f"| {ray['transfer_s'] * 1e3:.0f} ms for {ray['batch_bytes'] / 1e6:.2f} MB "
                f"| {predicted} |"
            )
        print()
        source(path, r)
    path, r = newest("scale_two_nodes")
    if r:
        s = r["settings"]
        by_node = r["ray_transfer_by_node"]
        print(
            f"Two Ray nodes on this machine (`{path.name}`): the run of {s['frames']} "
            f"frames exited with {r['run']['returncode']}; collector actors on both "
            f"nodes: {'yes' if r['collectors_on_both_nodes'] else 'no'}; a "
            f"{by_node['head']['batch_bytes'] / 1e6:.2f} MB batch took "
            f"{by_node['worker_node']['transfer_s'] * 1e3:.0f} ms from the second "
            f"node and {by_node['head']['transfer_s'] * 1e3:.0f} ms from the head "
            "(one median each; the file has no range)."
        )
        print()
        source(path, r)
    runs_table(
        newest_runs(["minatar_breakout_multiprocess", "minatar_breakout"]),
        [FINAL, TRAIN, MINUTES],
    )


def health_cost():
    print(
        "| file | task | loop checked / unchecked, median (range) over rounds "
        "| one replayed update, checked / unchecked | batch check | policy input "
        "check, per step |"
    )
    print("|---|---|---|---|---|---|")
    found = every("health_cost")
    for path, r in found:
        for task in ("cartpole", "atari"):
            t = r.get(task)
            if t is None:
                continue
            ratios = t["ratios"]
            check = (
                f"{t['policy_input_check_seconds'] * 1e6:.0f} µs, "
                f"{pct(t['policy_input_checks_fraction_of_iteration'])} of an iteration"
                if "policy_input_check_seconds" in t
                else "not measured"
            )
            print(
                f"| `{path.name}` | {task} | {t['ratio_checked_over_unchecked']:.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}) "
                f"| {t['update_ratio_checked_over_unchecked']:.2f} "
                f"| {t['batch_check_seconds'] * 1e3:.2f} ms, "
                f"{pct(t['batch_check_fraction_of_iteration'])} of an iteration "
                f"| {check} |"
            )
    print()
    for path, r in found:
        print(
            f"- `{path.name}`: {r['args']['rounds']} interleaved rounds, torch on "
            f"{r['torch_threads']} thread(s); re-run: `{command_of(r)}`"
        )
    print()


def trainer_overhead():
    path, r = newest("trainer_overhead")
    if r is None:
        return
    print("| loop | env steps/s, median over rounds |")
    print("|---|---|")
    for name, value in r["env_steps_per_s"].items():
        print(f"| `{name}` | {value:.0f} |")
    print()
    ratios = {k: v for k, v in r.items() if k.startswith("ratio_")}
    print(
        "Seconds per batch, median of the per-round ratios ("
        + "; ".join(f"`{k}`: {v:.3f}" for k, v in ratios.items())
        + f"; {r['settings']['rounds']} rounds of {r['settings']['batches']} batches; "
        "the file records no range)."
    )
    if "ratio_new_over_old" in r:
        print(
            "This file predates the script's current fields: `new` is `ACERTrainer`, "
            "`old` the loop it replaced; re-running the command writes "
            "`ratio_trainer_over_plain`, `ACERTrainer` against a plain loop over the "
            "same pieces."
        )
    print()
    source(path, r)


def first_run():
    path, r = newest("first_run")
    if r is None:
        return
    print(
        "| checkout | start-up s, median (range) | one greedy evaluation s, median "
        "(range) | its return |"
    )
    print("|---|---|---|---|")
    for checkout, start in r["startup_seconds"].items():
        ev = r["evaluation_seconds"][checkout]
        print(
            f"| `{checkout}` | {over_seeds(start['all'], 2)} "
            f"| {over_seeds(ev['per_round'], 3)} | {ev['reward']['reward']:g} |"
        )
    print()
    print(
        f"{r['rounds']} interleaved rounds; the evaluation plays {r['episodes']} "
        "episodes with a hand-set balancing policy. The checkouts are the versions "
        "compared when the file was written (the command's `--checkout`)."
    )
    sb3 = r.get("sb3_evaluation_seconds")
    if sb3 is not None:
        ratio = r["evaluation_over_sb3"]
        print(
            f"In the same rounds, Stable-Baselines3 {sb3['stable_baselines3']}'s "
            f"`evaluate_policy` of the same controller (an A2C `MlpPolicy` set by "
            f"hand; {r['episodes']} CartPole copies, one episode each): "
            f"{over_seeds(sb3['per_round'], 3)} s (return {sb3['reward']:g}); "
            f"this checkout's evaluation over SB3's, per round: "
            f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})."
        )
    print()
    source(path, r)


def envpool():
    print(
        "| envpool | raw vector env, envpool / the ALE's (1 thread, 2 threads) "
        "| through TorchRL, envpool's `MultiThreadedEnv` / ours | envpool's frames "
        "all zero | data |"
    )
    print("|---|---|---|---|---|")
    found = every("envpool")
    for path, r in found:
        ratios = r["ratios_envpool_over_ours"]
        raw = ", ".join(
            f"{ratios[k]:.2f}x" for k in ("raw_t1", "raw_t2") if k in ratios
        )
        torchrl = (
            ", ".join(
                f"{ratios[k]:.2f}x" for k in ("torchrl_t1", "torchrl_t2") if k in ratios
            )
            or "failed: "
            + r["errors"]["envpool_torchrl_t1"].strip().splitlines()[-1][:120]
        )
        blank = r["preprocessing"]["deterministic_game"]["envpool_frames_all_zero"]
        print(
            f"| {r['versions']['envpool']} | {raw} | {torchrl} "
            f"| {'yes' if blank else 'no'} | `{path.name}` |"
        )
    print()
    for path, r in found:
        print(
            f"- `{path.name}`: {r['install_note']}; re-run: `python bench/envpool_bench.py --quick` (a Python with envpool)"
        )
    print()


def atari_learning():
    runs_table(newest_runs(["atari_breakout"]), [TRAIN, FINAL, BEST, MINUTES])


def pendulum():
    found = every("learning-pendulum")
    runs_table(
        [
            (
                "Pendulum-v1 (the newest file)"
                if i == len(found) - 1
                else "Pendulum-v1, an earlier file",
                path,
                r,
            )
            for i, (path, r) in enumerate(found)
        ],
        [STEPS, REACHED, FINAL, BEST],
    )


def halfcheetah():
    names = [name for name, _ in LEARNING_RUNS if name.startswith("halfcheetah")]
    runs_table(
        newest_runs(names),
        [FINAL, LATE, BEST, at(300_000), at(500_000), at(800_000), TRAIN, MINUTES],
    )


def loop_settings():
    """The CartPole loop against its compute bound in each setting, over the files
    of each command (loop.py's settings are its flags)."""
    runs = {}
    for path, r in every("loop"):
        runs.setdefault(r["command"], []).append((path, r))
    print(
        "| command | files | loop / compute bound, median over files (each file's "
        "median) | range over files | env steps/s, median |"
    )
    print("|---|---|---|---|---|")
    for command, found in runs.items():
        ratios = [r["loop_over_bound"] for _, r in found]
        rate = np.median([r["loop_steps_per_s"] for _, r in found])
        print(
            f"| `{command}` | {len(found)} | {np.median(ratios):.3f} "
            f"| {min(ratios):.3f}-{max(ratios):.3f} | {rate:.0f} |"
        )
    print()
    print(
        "Files: "
        + ", ".join(f"`{path.name}`" for found in runs.values() for path, _ in found)
        + "."
    )
    print()
    print("Where the loop's time goes (the newest file of each command):")
    print()
    print("| command | share of the loop's time |")
    print("|---|---|")
    for command, found in runs.items():
        shares = sorted(found[-1][1]["time_fractions"].items(), key=lambda x: -x[1])
        cells = ", ".join(f"{name} {share:.0%}" for name, share in shares)
        print(f"| `{command}` | {cells} |")
    print()


def compile_cost():
    """Whether ``compile=true`` pays in each example, compile time included: each
    example from the newest file that measured it."""
    files, examples = [], {}
    for path, r in reversed(every("compile_cost")):
        mine = {k: v for k, v in r["examples"].items() if k not in examples}
        if mine:
            files.append((path, r))
            examples.update({k: (v, r["settings"]) for k, v in mine.items()})
    if not files:
        return

    def steps(value):
        return "never" if value is None else f"{value / 1000:,.0f}k"

    print(
        "| example | env steps per second, compiled over eager | compiling's extra "
        "seconds, first run: median (range) | with a warm cache | pays past, env "
        "steps (each round's) | the example's default run |"
    )
    print("|---|---|---|---|---|---|")
    for name in ("gym", "atari", "mujoco"):
        if name not in examples:
            continue
        e, _ = examples[name]
        rounds = e["per_round"]
        extra = [x["compile_extra_fixed_s"] for x in rounds]
        speed = [x["speedup_per_step"] for x in rounds]
        each = ", ".join(steps(x["break_even_env_steps"]) for x in rounds)
        print(
            f"| `examples/acer_{name}.py` ({e['env']}) "
            f"| {e['speedup_per_step']:.2f} ({min(speed):.2f}-{max(speed):.2f}) "
            f"| {e['compile_extra_fixed_s']:.0f} ({min(extra):.0f}-{max(extra):.0f}) "
            f"| {e['warm_cache_extra_fixed_s']:.0f} "
            f"| {steps(e['break_even_env_steps'])} ({each}) "
            f"| {e['default_total_frames'] / 1000:,.0f}k env steps: "
            f"{'pays' if e['pays_at_default'] else 'does not pay'} |"
        )
    print()
    lengths = "; ".join(
        f"{n} {e['lengths'][0]:,} and {e['lengths'][1]:,}"
        for n, (e, _) in sorted(examples.items())
    )
    early = "; ".join(
        f"{n}: " + " ".join(f"{k}={v}" for k, v in settings["steady"][n].items())
        for n, (_, settings) in sorted(examples.items())
        if settings["steady"].get(n)
    )
    print(
        f"Each example's script run as a user runs it, eager (`compile=false`, the "
        f"value checks on) and compiled (`compile=true loss.check_values=false`), for "
        f"two lengths "
        f"({lengths} env steps; Atari's are agent steps), "
        f"{files[0][1]['settings']['rounds']} interleaved rounds; the process's wall "
        f"seconds, start-up, compilation (from an empty inductor cache, as a first "
        f"run on a machine; a warm cache: a later run), final evaluation and "
        f"checkpoint included; one torch thread, replay started early ({early}). A "
        f"line through the two lengths per setting, from the medians (and from each "
        f"round's runs), gives the speed per env step and the fixed cost."
    )
    print()
    for path, r in files:
        source(path, r)


def loss_row(r, case):
    return next(row for row in r["rows"] if row["case"] == case)


def newest_with(prefix, field):
    """The newest file of ``prefix`` whose rows hold ``field``."""
    for path, r in reversed(every(prefix)):
        if all(field in row for row in r["rows"]):
            return path, r
    return None, None


def speed_targets():
    """The speed targets of issue #17 against the newest measurement of each."""
    print("| target | measured | met | data |")
    print("|---|---|---|---|")
    path, r = newest("loss")
    if r:
        for case, bound in (
            ("cartpole_mlp_16x20", 2.0),
            ("cartpole_mlp_128x20", 1.3),
            ("atari_dqn_conv_shared_16x20", 1.05),
        ):
            ratio = loss_row(r, case)["loss_over_bare"]
            print(
                f"| `ACERLoss` / its bare networks, {case}: ≤ {bound:g}x "
                f"| {ratio:.2f}x | {'yes' if ratio <= bound else 'no'} | `{path.name}` |"
            )
        pairs = [
            (row["case"], row["loss_over_bare"], row["a2c_gae_over_bare"])
            for row in r["rows"]
            if "a2c_gae_over_bare" in row
        ]
        print(
            "| `ACERLoss` below TorchRL's A2CLoss + GAE, same run | "
            + "; ".join(
                f"{c}: {ours:.2f}x against {a2c:.2f}x" for c, ours, a2c in pairs
            )
            + f" | {'yes' if all(o < a for _, o, a in pairs) else 'no'} | `{path.name}` |"
        )
    path, r = newest_with("loss", "loss_over_against")
    if r:
        # every run of the newest one's commit against the same revision: the
        # median of their per-round medians, and their range
        runs = [
            other
            for _, other in every("loss")
            if other["commit"] == r["commit"]
            and other["settings"].get("against") == r["settings"]["against"]
        ]
        ratios = [
            (row["case"], [loss_row(o, row["case"])["loss_over_against"] for o in runs])
            for row in r["rows"]
        ]
        print(
            f"| `ACERLoss` no slower per update than at "
            f"`{r['settings']['against'][:7]}` (issue #32), same process and rounds "
            f"(median of {len(runs)} runs at `{r['commit'][:7]}`) | "
            + "; ".join(
                f"{c}: {np.median(x):.3f}x ({min(x):.3f}-{max(x):.3f})"
                for c, x in ratios
            )
            + f" | {'yes' if all(np.median(x) <= 1 for _, x in ratios) else 'no'} "
            f"| `loss-*.json` at `{r['commit'][:7]}` |"
        )
    path, r = newest_with("loss", "compiled_over_bare")
    if r:
        pairs = [
            (row["case"], row["loss_over_bare"] / row["compiled_over_bare"])
            for row in r["rows"]
        ]
        print(
            "| `torch.compile(loss)` faster than eager | "
            + "; ".join(f"{c}: {s:.2f}x faster" for c, s in pairs)
            + f" | {'yes' if all(s > 1 for _, s in pairs) else 'no'} | `{path.name}` |"
        )
    loops = {}
    for _, r in every("loop"):
        loops.setdefault(r["command"], []).append(r["loop_over_bound"])
    if loops:
        best_command = max(loops, key=lambda c: np.median(loops[c]))
        best = float(np.median(loops[best_command]))
        print(
            f"| CartPole loop ≥ 0.4 of its networks' compute bound | {best:.3f} "
            f"(the best setting, `{best_command}`; every setting: "
            "[the loop table](speed.md#loop-settings)) "
            f"| {'yes' if best >= 0.4 else 'no'} | `loop-*.json` |"
        )
    path, r = newest("throughput")
    if r:
        print(
            f"| Atari loop ≥ 0.85 of its compute bound | {r['median_ratio']:.2f} "
            f"| {'yes' if r['median_ratio'] >= 0.85 else 'no'} | `{path.name}` |"
        )
    found = side_by_side()
    if found:
        files, s, all_groups, _ = found
        cells, met = [], True
        for task in s["thresholds"]:
            groups = [g for g in all_groups if g["task"] == task]
            times = {
                g["candidate"]: g["train_s_to_threshold"]["median"]
                for g in groups
                if g["train_s_to_threshold"]
            }
            ours = next((g["candidate"] for g in groups if g["candidate"].startswith("ours")), None)  # fmt: skip
            if ours is None:
                continue
            fastest = min(times, key=times.get)
            met &= fastest == ours
            cells.append(
                f"{task}: {tts_label(ours, s, task)} "
                f"{times.get(ours, float('nan')):.1f} s, fastest "
                f"{tts_label(fastest, s, task)} {times[fastest]:.1f} s"
            )
        names = ", ".join(f"`{path.name}`" for path, _ in files)
        print(
            "| time to solve: ours the fastest (training seconds, median) | "
            + "; ".join(cells)
            + f" | {'yes' if met else 'no'} | {names} |"
        )
    print()


# The MinAtar paper's curves (Young and Tian 2019, the training return against
# frames; the same figure as kenjyoung/MinAtar at 4241f24, img/learning_curves.gif)
# read off by eye: about ±1, ±5 for SpaceInvaders. Not data of ours: the paper's.
MINATAR_PAPER = {
    "asterix": ("~8", "~17", "~1", "~19"),
    "breakout": ("~9.5", "~10", "~9.5", "~17.5"),
    "freeway": ("~49", "~50", "~0.5", "~47"),
    "seaquest": ("~1", "~20", "~1", "~15"),
    "space_invaders": ("~33", "~43", "~45", "~185"),
}


def minatar_vs_paper():
    print(
        "| game | ours: final greedy eval, median | ours: final training return, "
        "median | DQN 1M | DQN 5M | AC(λ = 0.8) 1M | AC(λ = 0.8) 5M | data |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for game, paper in MINATAR_PAPER.items():
        path, r = newest(f"learning-minatar_{game}")
        if r is None:
            continue
        print(
            f"| {r['protocol'].split(',')[0]} | {r['final_eval']['median']:.1f} "
            f"| {r['final_train_reward']['median']:.1f} | "
            + " | ".join(paper)
            + f" | `{path.name}` |"
        )
    print()
    print(
        "Ours: 1M frames, the seeds of each file; the paper's columns are read off its "
        "figure by eye (about ±1, ±5 for SpaceInvaders), not measured here."
    )
    print()


def minatar_ablations():
    runs_table(
        newest_runs(
            [
                "minatar_breakout",
                "minatar_breakout_no_replay",
                "minatar_breakout_no_trust_region",
                "minatar_space_invaders",
                "minatar_space_invaders_no_replay",
                "minatar_space_invaders_no_trust_region",
                "minatar_asterix",
                "minatar_asterix_ratio8",
                "minatar_asterix_entropy003",
                "minatar_seaquest",
                "minatar_seaquest_entropy003",
                "minatar_freeway",
            ]
        ),
        [at(400_000), FINAL, BEST, FROM_800K, TRAIN],
    )


def cartpole_ablations():
    runs_table(
        newest_runs(
            [
                "cartpole_v0",
                "cartpole_v0_no_replay",
                "cartpole_v0_no_trust_region",
                "cartpole_v1",
                "cartpole_v1_no_replay",
                "cartpole_v1_no_trust_region",
            ]
        ),
        [STEPS, REACHED, FINAL],
    )


def seaquest_deaths():
    """How MinAtar Seaquest episodes end, per result file (policies of one run
    name) and way of acting, summed over the seeds' policies."""
    print(
        "| policies | acting | episodes | ended: oxygen out | hit | surfaced with no "
        "diver | episodes that refilled at the surface | length, median | return, "
        "median | data |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    found = every("seaquest_deaths")
    for path, r in found:
        name = Path(r["runs"][0]["run_dir"]).parent.name
        for policy in r["settings"]["policies"]:
            played = [run["policies"][policy]["episodes"] for run in r["runs"]]
            # a uniformly random policy plays the same episodes for every seed
            same = len(played) > 1 and all(p == played[0] for p in played)
            played = played[:1] if same else played
            episodes = [e for p in played for e in p]
            ends = {}
            for e in episodes:
                ends[e["end"]] = ends.get(e["end"], 0) + 1
            surfaced = sum(e["surfacings"] > 0 for e in episodes)
            print(
                f"| {name} ({'any seed: the same episodes' if same else f'{len(played)} seeds'}) "
                f"| {policy} | {len(episodes)} | {ends.pop('oxygen', 0)} "
                f"| {ends.pop('hit', 0)} | {ends.pop('surfaced_empty', 0)} "
                f"| {surfaced} | {np.median([e['length'] for e in episodes]):g} "
                f"| {np.median([e['return'] for e in episodes]):g} | `{path.name}` |"
            )
            assert not ends, f"{path.name}: episode ends not in the table: {ends}"
    print()
    for path, r in found:
        print(f"- `{path.name}`: re-run: `{command_of(r)}`")
    print()


def fault_cases():
    path, r = newest("fault_cases")
    if r is None:
        return
    print("| case | what | exit status | as described | seconds |")
    print("|---|---|---|---|---|")
    for case in r["cases"]:
        print(
            f"| {case['case']} | {case['name']} | {case['exit_status']} "
            f"| {'yes' if case['as_described'] else '**no**'} | {case['seconds']:g} |"
        )
    print()
    print(
        f"What each case printed is in `bench/results/{path.with_suffix('.md').name}`, "
        "written by the same run."
    )
    print()
    source(path, r)


BLOCKS = {
    "headline": headline,
    "speed_targets": speed_targets,
    "minatar_vs_paper": minatar_vs_paper,
    "minatar_ablations": minatar_ablations,
    "cartpole_ablations": cartpole_ablations,
    "seaquest_deaths": seaquest_deaths,
    "recurrent_cartpole": recurrent_cartpole,
    "recurrent_cue": recurrent_cue,
    "recurrent_minatar": recurrent_minatar,
    "scaling": scaling,
    "health_cost": health_cost,
    "envpool": envpool,
    "atari_learning": atari_learning,
    "pendulum": pendulum,
    "halfcheetah": halfcheetah,
}
BLOCK = re.compile(r"(<!-- report: (\w+) -->\n)(.*?)(<!-- /report -->)", re.S)


def fill_blocks(text, where):
    """``text`` with every block's table made anew from the data."""

    def fill(match):
        name = match[2]
        if name not in BLOCKS:
            raise KeyError(
                f"{where}: unknown block `<!-- report: {name} -->`; known: "
                + ", ".join(BLOCKS)
            )
        return match[1] + captured(BLOCKS[name]) + match[4]

    return BLOCK.sub(fill, text)


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


def minatar_peers_section():
    """The learning page's MinAtar peers section, absent before the first file."""
    table = captured(minatar_peers)
    return ["## MinAtar against Stable-Baselines3", "", table] if table else []


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
                "## Loop settings",
                "",
                "The CartPole training loop (`examples/acer_gym.py`'s defaults without "
                "evaluation, logging or checkpoints, past its replay start) against "
                "its networks' compute bound, in each setting `bench/loop.py` was run "
                "with:",
                "",
                captured(loop_settings),
                "## Compile",
                "",
                "Whether `compile=true` pays in each example, its compile time "
                "included (`bench/compile_cost.py`):",
                "",
                captured(compile_cost),
                "## Time to solve",
                "",
                "Ours against the libraries users would pick instead, with every "
                "candidate's loop pace: [Time to solve](time-to-solve.md).",
                "",
                "## The trainer's overhead",
                "",
                captured(trainer_overhead),
                "## First run",
                "",
                "What a new user waits for: `examples/acer_gym.py`'s start-up to its "
                "first progress line, and one greedy evaluation.",
                "",
                captured(first_run),
            ]
        ),
        PAGES / "time-to-solve.md": "\n".join(
            [
                "# Time to solve",
                "",
                GENERATED,
                "",
                "Ours (with its tuned preset, `examples/preset/` from the Optuna "
                "study of `bench/tune.py` on tuning seeds 100 and up, where a file ran "
                "it; else at its defaults) against the peers users would pick instead "
                "(Stable-Baselines3 with rl-baselines3-zoo's tuned settings, and "
                "TorchRL's own PPO with the zoo's PPO settings), from the "
                "newest `bench/time_to_solve.py` file of each, which must share the "
                "protocol; what the numbers mean: [the discussion](discussion.md).",
                "",
                "## Every candidate",
                "",
                captured(time_to_solve),
                "## Targets (issue #34)",
                "",
                "Best peer: the lowest median env steps; fastest peer: the lowest "
                "median training seconds, each over the seeds that reached.",
                "",
                captured(time_to_solve_targets),
                "On LunarLander and MinAtar the target is the final greedy return "
                "at the peers' env steps, median over the seeds, at least every "
                "peer's (the tables: [learning](learning.md)):",
                "",
                captured(return_targets),
                "## Prioritized segment replay (issue #34)",
                "",
                captured(prioritized_replay),
            ]
        ),
        PAGES / "faults.md": "\n".join(
            [
                "# Fault cases",
                "",
                GENERATED,
                "",
                "Every fault case of a long run (signals, crashes, corrupt "
                "checkpoints, bad settings) as a user meets it, each checked against "
                "what [Long runs](../long-runs.md) says it does.",
                "",
                captured(fault_cases),
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
                *minatar_peers_section(),
                "## LunarLander against Stable-Baselines3",
                "",
                captured(lunar_lander_peers),
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


def expected(root):
    """Every generated file under ``root`` and the text the data gives it: the
    generated pages, and the README and hand-written pages with their blocks'
    tables made anew."""
    files = {root / path: text for path, text in pages().items()}
    hand_written = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    for path in hand_written:
        if path in files or "_build" in path.parts:
            continue
        text = path.read_text()
        if BLOCK.search(text):
            files[path] = fill_blocks(text, path)
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
        time_to_solve_targets()
        prioritized_replay()
        lunar_lander()
        minatar_peers()
        lunar_lander_peers()
        learning_table()
        trust_region()
        for name, section in BLOCKS.items():
            print(f"<!-- report: {name} -->")
            section()
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
