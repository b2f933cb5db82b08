"""Learning benchmarks: several seeds of an example, steps to a threshold, curves.

    python bench/learning.py NAME --seeds 0 1 2 3 4 [--threshold 195] [--jobs 2] \
        [--example acer_gym] -- KEY=VALUE ...

Runs ``examples/<example>.py KEY=VALUE ... seed=S`` once per seed (``--jobs`` at a
time, one torch thread each), each in ``bench/runs/NAME/seedS``, then reads the
greedy-evaluation logs and writes ``bench/results/learning-NAME-<time>.json``
(commit, machine, command, protocol, per-seed results, median and range, wall
time) and the curve ``bench/results/NAME.png`` (median and range across seeds).

Run again with the same arguments, it continues the seeds whose runs were
stopped (from their last checkpoint: ``checkpoint.every_minutes`` bounds what a
stop loses) and leaves the finished ones as they are; ``wall_s`` sums every
invocation.

Per seed it reports the env steps at which the greedy evaluation first reached
``--threshold`` (None if never), the last evaluation, and the best one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _common import RESULTS, checkpoint_path, save  # noqa: E402

from torchrl_acer.training.plot import plot_groups, read_scalar  # noqa: E402


def run_seed(example, overrides, seed, run_dir, log):
    """One seed's run; a run stopped earlier (its checkpoint is there) continues
    from its last checkpoint, and a finished one is left as it is."""
    cmd = [
        sys.executable,
        str(ROOT / "examples" / f"{example}.py"),
        *overrides,
        f"seed={seed}",
        "threads=1",
        "logger.progress_bar=false",
        f"logger.run_dir={run_dir}",
    ]
    checkpoint = checkpoint_path(run_dir)  # a directory, ACERCheckpoint's
    resumed = checkpoint.exists()
    if resumed:
        cmd.append(f"resume={checkpoint}")
    # the wall time of every invocation, summed: a resumed run's total
    wall_file = Path(run_dir) / "bench_wall_s.txt"
    earlier = float(wall_file.read_text()) if resumed and wall_file.exists() else 0.0
    start = time.time()
    with open(log, "a" if resumed else "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    wall = earlier + time.time() - start
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    wall_file.write_text(f"{wall}\n")
    return {
        "seed": seed,
        "returncode": proc.returncode,
        "wall_s": wall,
        "resumed": resumed,
    }


def summarize(run_dir, threshold):
    steps, values = read_scalar(run_dir, "eval/reward")
    out = {
        "eval_steps": steps.tolist(),
        "eval_reward": values.tolist(),
        "final_eval": float(values[-1]),
        "best_eval": float(values.max()),
    }
    try:
        train_steps, train = read_scalar(run_dir, "train/reward")
        # Mean training-episode return over the last logging interval.
        out["final_train_reward"] = float(train[-1])
        out["final_train_step"] = float(train_steps[-1])
    except FileNotFoundError:
        pass
    if threshold is not None:
        hit = np.nonzero(values >= threshold)[0]
        out["steps_to_threshold"] = float(steps[hit[0]]) if len(hit) else None
    return out


def stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "median": float(np.median(values)),
        "min": float(np.min(values)),
        "max": float(np.max(values)),
        "n": len(values),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--example", default="acer_gym")
    parser.add_argument("--protocol", default="", help="text stored with the result")
    parser.add_argument(
        "--existing",
        action="store_true",
        help="summarize runs already in bench/runs/NAME (e.g. a resumed long run) "
        "instead of starting them; --wall-s gives their wall time",
    )
    parser.add_argument("--wall-s", type=float, nargs="*", default=None)
    parser.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="combine the runs of earlier result files (seeds run apart, e.g. two "
        "more seeds of a finished setting) into one result under NAME; the "
        "settings (example, overrides) must match",
    )
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.overrides = argv[split + 1 :]
    base = ROOT / "bench" / "runs" / args.name
    base.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if args.merge:
        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        for part in parts[1:]:
            for key in ("example", "overrides"):
                if part[key] != parts[0][key]:
                    raise SystemExit(
                        f"--merge: {key} differs between the files: "
                        f"{parts[0][key]!r} and {part[key]!r}"
                    )
        runs = [run for part in parts for run in part["runs"]]
        seeds = [run["seed"] for run in runs]
        if len(set(seeds)) != len(seeds):
            raise SystemExit(f"--merge: a seed appears twice: {sorted(seeds)}")
        args.seeds, args.example = seeds, parts[0]["example"]
        args.overrides = parts[0]["overrides"]
        args.protocol = args.protocol or parts[0]["protocol"]
        args.threshold = (
            parts[0]["threshold"] if args.threshold is None else args.threshold
        )
        merged_from = [
            {"file": Path(f).name, "commit": part.get("commit"), "seeds": part["seeds"]}
            for f, part in zip(args.merge, parts, strict=True)
        ]
    elif args.existing:
        walls = args.wall_s or [None] * len(args.seeds)
        runs = [
            {"seed": seed, "returncode": 0, "wall_s": wall}
            for seed, wall in zip(args.seeds, walls, strict=True)
        ]
    else:
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [
                pool.submit(
                    run_seed,
                    args.example,
                    args.overrides,
                    seed,
                    base / f"seed{seed}",
                    base / f"seed{seed}.log",
                )
                for seed in args.seeds
            ]
            runs = [f.result() for f in futures]
    for run in runs:
        if run["returncode"] != 0:
            print(f"seed {run['seed']} failed: see {base}/seed{run['seed']}.log")
            continue
        if not args.merge:  # merged runs carry their summaries
            run.update(summarize(base / f"seed{run['seed']}", args.threshold))
    ok = [r for r in runs if r["returncode"] == 0]
    result = {
        "name": args.name,
        "example": args.example,
        "overrides": args.overrides,
        "seeds": args.seeds,
        "protocol": args.protocol,
        "threshold": args.threshold,
        "steps_to_threshold": stats([r.get("steps_to_threshold") for r in ok])
        if args.threshold is not None
        else None,
        "reached": sum(r.get("steps_to_threshold") is not None for r in ok),
        "final_eval": stats([r["final_eval"] for r in ok]),
        "best_eval": stats([r["best_eval"] for r in ok]),
        "final_train_reward": stats([r.get("final_train_reward") for r in ok]),
        "wall_s_per_run": stats([r["wall_s"] for r in ok]),
        "wall_s_total": None if args.existing or args.merge else time.time() - start,
        "existing": args.existing,
        "runs": runs,
    }
    if args.merge:
        result["merged_from"] = merged_from
    path = save(f"learning-{args.name}", result)
    if ok and not args.merge:  # the curves of merged runs are in their own files
        plot_groups(
            {args.name: [base / f"seed{r['seed']}" for r in ok]},
            RESULTS / f"{args.name}.png",
            title=f"{args.name}: greedy evaluation",
        )
    print(f"saved {path}")
    for key in ("steps_to_threshold", "final_eval", "best_eval", "wall_s_per_run"):
        print(f"{key}: {result[key]}")
    print(f"reached threshold: {result['reached']}/{len(ok)}")


if __name__ == "__main__":
    main()
