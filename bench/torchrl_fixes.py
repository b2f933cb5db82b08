"""TorchRL's Collector with and without the fixes offered upstream (``upstream/torchrl/``).

    python bench/torchrl_fixes.py [--rounds 15]

Two worker processes, one importing the installed TorchRL and one a copy of it with
the patches applied (``tools/torchrl_fixes.py``), each build the same TorchRL
``Collector`` over the same env and policy, and time batches on the parent's
request, in turns (the order shuffled each round), so that load from elsewhere on
the machine hits both alike. Reported: per task, the median over rounds of the
per-round ratio installed / patched seconds per batch (above 1: the patches are
faster), with its range, and the share of steps on which some copy's episode
ended (where patch 0001 still converts the info dict). The batches themselves are
equal bit for bit (tests/tools/test_torchrl_fixes.py).

Tasks, each a ``[8, 20]`` batch (160 env steps) of ``make_env``'s env (gymnasium's
vector env in TorchRL's ``GymWrapper`` with ``RewardSum``):

- ``cartpole``: CartPole-v1 with ``examples/acer_gym.py``'s actor, untrained (its
  episodes are short: some copy ends on about a third of the steps);
- ``pendulum``: Pendulum-v1 with TorchRL's ``RandomPolicy`` (every episode is cut
  at 200 steps, all copies together).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _common import per_round_ratios, save  # noqa: E402
from collection import NUM_ENVS, T, torchrl_collector  # noqa: E402

TASKS = ("cartpole", "pendulum")
MARK = "@@ "  # starts the worker's answers (TorchRL logs to stdout too)


def worker(task: str) -> None:
    """Builds the task's collector, then answers each line ``N`` on stdin with the
    seconds ``N`` batches took and the steps on which some copy ended."""
    import warnings

    import torch
    import torchrl
    from torchrl.modules import RandomPolicy

    from torchrl_acer.modules.models import mlp_actor_critic
    from torchrl_acer.training.envs import make_env

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if task == "cartpole":
        env = make_env(
            "CartPole-v1", num_envs=NUM_ENVS, seed=0, action_space="discrete"
        )
        policy, _ = mlp_actor_critic(4, 2, num_cells=[64, 64])
    else:
        env = make_env("Pendulum-v1", num_envs=NUM_ENVS, seed=0)
        policy = RandomPolicy(env.action_spec)
    collector = torchrl_collector(env, policy)
    batches = iter(collector)
    # the terminal-observation reader alone, on a step where no copy ended
    reader = env.base_env.info_dict_reader[0]
    step_out = env.base_env.rand_step(env.base_env.reset())["next"]
    print(MARK + json.dumps({"torchrl": torchrl.__file__}), flush=True)
    for line in sys.stdin:
        if line.startswith("reader"):
            n = int(line.split()[1])
            start = time.perf_counter()
            for _ in range(n):
                reader({}, step_out)
            answer = {"seconds": (time.perf_counter() - start) / n, "ended": 0.0}
            print(MARK + json.dumps(answer), flush=True)
            continue
        n = int(line)
        ended = 0
        start = time.perf_counter()
        for _ in range(n):
            batch = next(batches)
            ended += int(batch["next", "done"].any(0).sum())
        seconds = time.perf_counter() - start
        answer = {"seconds": seconds / n, "ended": ended / (n * T)}
        print(MARK + json.dumps(answer), flush=True)
    collector.shutdown()


class Worker:
    def __init__(self, task: str, pythonpath: Path | None):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        # the patched copy, if any, before the installed torchrl
        first = [] if pythonpath is None else [str(pythonpath)]
        env["PYTHONPATH"] = os.pathsep.join(
            [*first, str(ROOT), *filter(None, [env.get("PYTHONPATH")])]
        )
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", task],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),  # not ROOT: its torchrl_acer comes by PYTHONPATH
        )
        self.torchrl = self._read()["torchrl"]

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited with {self.proc.wait()}")
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])

    def batches(self, n: int, what: str = "") -> dict:
        self.proc.stdin.write(f"{what}{n}\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def measure(task: str, copy: Path, rounds: int, min_time: float) -> dict:
    workers = {"installed": Worker(task, None), "patched": Worker(task, copy)}
    calls = {}
    for name, w in workers.items():
        w.batches(5)  # warm-up
        calls[name] = max(1, round(min_time / w.batches(5)["seconds"]))

    def interleaved(request) -> dict:
        """``{worker: [answer of round 0, ...]}``, the workers' order shuffled
        each round."""
        answers = {name: [] for name in workers}
        order = list(workers)
        for _ in range(rounds):
            random.shuffle(order)
            for name in order:
                answers[name].append(request(name))
        return answers

    outs = interleaved(lambda name: workers[name].batches(calls[name]))
    samples = {k: [out["seconds"] for out in v] for k, v in outs.items()}
    ended = {k: [out["ended"] for out in v] for k, v in outs.items()}
    # the reader alone: many short calls, interleaved the same way
    reader = interleaved(lambda name: workers[name].batches(2000, "reader ")["seconds"])
    reader_ratios = per_round_ratios(reader["installed"], reader["patched"])
    paths = {name: w.torchrl for name, w in workers.items()}
    for w in workers.values():
        w.close()
    ratios = per_round_ratios(samples["installed"], samples["patched"])
    return {
        "reader_seconds_no_end": {k: statistics.median(v) for k, v in reader.items()},
        "reader_speedup": reader_ratios["median"],
        "reader_speedup_range": [reader_ratios["min"], reader_ratios["max"]],
        "torchrl": paths,
        "seconds_per_batch": {k: statistics.median(v) for k, v in samples.items()},
        "samples": samples,
        "speedup": ratios["median"],
        "speedup_range": [ratios["min"], ratios["max"]],
        "steps_with_an_end": statistics.mean(ended["installed"]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.5, help="s per sample")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--worker", choices=TASKS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    sys.path.insert(0, str(ROOT / "tools"))
    from torchrl_fixes import PATCHES, patched_copy

    random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        copy = patched_copy(Path(tmp) / "patched")
        results = {
            task: measure(task, copy, args.rounds, args.min_time) for task in args.tasks
        }
    path = save(
        "torchrl_fixes",
        {
            "setting": {
                "num_envs": NUM_ENVS,
                "T": T,
                "rounds": args.rounds,
                "min_time": args.min_time,
                "torch_threads": 1,
                "patches": [patch.name for patch in PATCHES],
            },
            "tasks": results,
        },
    )
    for task, r in results.items():
        low, high = r["speedup_range"]
        ms = {k: f"{1e3 * v:.1f} ms" for k, v in r["seconds_per_batch"].items()}
        print(
            f"{task}: patched {r['speedup']:.2f}x faster ({low:.2f}-{high:.2f}); "
            f"per batch {ms}; some copy ended on {100 * r['steps_with_an_end']:.0f}%"
            " of the steps"
        )
        us = {k: f"{1e6 * v:.0f} us" for k, v in r["reader_seconds_no_end"].items()}
        low, high = r["reader_speedup_range"]
        print(
            f"  reader on a step where no copy ended: {us}, patched "
            f"{r['reader_speedup']:.1f}x faster ({low:.1f}-{high:.1f})"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
