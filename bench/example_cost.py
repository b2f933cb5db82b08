"""Wall-clock cost per env step of two settings of an example, side by side.

    python bench/example_cost.py NAME --a KEY=VALUE ... --b KEY=VALUE ...
        [--example acer_gym] [--rounds 3] [--frames 20000] -- COMMON KEY=VALUE ...

Runs ``examples/<example>.py`` with the common overrides plus setting ``a``, then
plus setting ``b``, alternating for ``--rounds`` rounds (a then b, then b then a,
...), each run ``--frames`` env steps on one torch thread with evaluation off, in
a fresh run directory deleted afterwards. Reports each setting's median seconds
per 1k env steps of the training loop (start-up excluded: from the run's logged
frames per second) over the rounds and the median of the per-round ratios b / a
(the two runs of a round saw about the same load). Saves
``bench/results/example_cost_<NAME>-*.json``.

Used for the cost of a recurrent core on MinAtar (issue #18):

    python bench/example_cost.py minatar_breakout_lstm --a --b model.recurrent=lstm \
        loss.burn_in=5 -- env.name=MinAtar/Breakout-v1
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _common import per_round_ratios, save  # noqa: E402

from torchrl_acer.training.plot import read_scalar  # noqa: E402


def timed_run(example: str, overrides: list[str], frames: int) -> tuple[float, float]:
    """``(wall, loop)`` seconds of one run of ``frames`` env steps (evaluation off):
    the whole process, and the training loop alone (from the run's ``time/fps``
    log: each logged interval's frames over its frames per second)."""
    run_dir = tempfile.mkdtemp(prefix="example_cost_")
    cmd = [
        sys.executable,
        str(ROOT / "examples" / f"{example}.py"),
        *overrides,
        f"collector.total_frames={frames}",
        f"eval.interval={10 * frames}",
        "eval.episodes=1",
        "threads=1",
        "logger.progress_bar=false",
        f"logger.run_dir={run_dir}",
    ]
    try:
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
        wall = time.perf_counter() - start
        steps, fps = read_scalar(run_dir, "time/fps")
        intervals = np.diff(steps, prepend=0.0)
        return wall, float((intervals / fps).sum())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name")
    parser.add_argument("--a", nargs="*", default=[], help="setting a's overrides")
    parser.add_argument("--b", nargs="*", default=[], help="setting b's overrides")
    parser.add_argument("--example", default="acer_gym")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=20_000)
    argv = sys.argv[1:] if argv is None else list(argv)
    # the common overrides follow "--" (argparse would give them to --b)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.common = argv[cut + 1 :]
    settings = {"a": args.a, "b": args.b}
    wall = {"a": [], "b": []}
    seconds = {"a": [], "b": []}
    for r in range(args.rounds):
        for which in ("a", "b") if r % 2 == 0 else ("b", "a"):
            w, t = timed_run(
                args.example, [*args.common, *settings[which]], args.frames
            )
            wall[which].append(w)
            seconds[which].append(t)
            print(f"round {r} {which}: loop {t:.1f} s, wall {w:.1f} s", flush=True)
    per_k = {k: [1000 * s / args.frames for s in v] for k, v in seconds.items()}
    b_over_a = per_round_ratios(seconds["b"], seconds["a"])
    result = {
        "setting": {
            "example": args.example,
            "common": args.common,
            "a": args.a,
            "b": args.b,
            "frames_per_run": args.frames,
            "rounds": args.rounds,
            "torch_threads_per_run": 1,
        },
        "seconds_per_1k_steps": {
            k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in per_k.items()
        },
        "b_over_a": {k: b_over_a[k] for k in ("median", "min", "max")},
        "loop_s": seconds,
        "wall_s": wall,
    }
    print(
        f"a {result['seconds_per_1k_steps']['a']['median']:.2f} s/1k, "
        f"b {result['seconds_per_1k_steps']['b']['median']:.2f} s/1k, "
        f"b/a {result['b_over_a']['median']:.2f} "
        f"({result['b_over_a']['min']:.2f}-{result['b_over_a']['max']:.2f})"
    )
    save(f"example_cost_{args.name}", result)
    return result


if __name__ == "__main__":
    main()
