"""What a new user waits for: the gym example's start-up, and one greedy evaluation.

    python bench/first_run.py [--rounds 3] [--checkout PATH ...] [--episodes 5]
                              [--bench-venv .venv-bench]

Start-up: seconds from launching ``examples/acer_gym.py`` (its defaults, one torch
thread) to its progress bar's first line, when training starts; the process is
then stopped. Each ``--checkout`` (a directory holding another version of this
repository, such as ``git archive COMMIT | tar -x -C DIR``) is timed the same way
with its own ``examples/`` and package, in interleaved rounds, so that a change
is measured against the same load.

Evaluation: seconds per call of :class:`~torchrl_acer.trainers.evaluation.GreedyEvaluator`
on the example's evaluation environments (``--episodes`` CartPole copies, one
thread) with the example's MLP set by hand to balance the pole (as a trained
policy does: episodes of up to 500 steps, and an evaluation's cost grows with
the longest), the median over ``--calls`` calls after one warm-up; with each
checkout's package in a subprocess of its own. Beside it, in the same rounds,
what a Stable-Baselines3 user's evaluation costs (in the benchmark venv,
``--bench-venv``, when it exists: ``bash bench/peers_setup.sh``): SB3's
``evaluate_policy`` (deterministic actions, one episode per copy of a
``make_vec_env`` of ``--episodes`` CartPole copies) with an A2C ``MlpPolicy``
([64, 64] tanh, as the zoo's A2C) set by hand to the same controller; reported per
round as ours over SB3's.

Saves ``bench/results/first_run-*.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _common import per_round_ratios, save  # noqa: E402

EVAL = """
import json, statistics, sys, time, torch
sys.path.insert(0, sys.argv[1] + "/examples")
torch.set_num_threads(1)
from torchrl_acer.trainers.evaluation import GreedyEvaluator
from utils_gym import make_env, make_models
from omegaconf import OmegaConf
cfg = OmegaConf.load(sys.argv[1] + "/examples/config_gym.yaml")
episodes, calls = int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
env = make_env(cfg, cfg.env.num_envs, seed=0)
actor, _ = make_models(cfg, env)
env.close()
# the MLP set to push toward the pole's fall (right if angle + angular velocity
# > 0): it balances, mostly for the whole 500 steps, as a trained policy does
linears = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)]
w = torch.tensor([0.0, 0.0, 1.0, 1.0])
with torch.no_grad():
    for m in linears:
        m.weight.zero_(), m.bias.zero_()
    linears[0].weight[0], linears[0].weight[1] = w, -w
    linears[1].weight[0, 0] = linears[1].weight[1, 1] = 1.0
    linears[2].weight[1, 0], linears[2].weight[1, 1] = 10.0, -10.0
evaluator = GreedyEvaluator(make_env(cfg, episodes, seed=10_000), actor, max_steps=500)
evaluator()
times = []
for _ in range(calls):
    start = time.perf_counter()
    result = evaluator()
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": statistics.median(times), "all": times, "reward": result}))
"""


# Stable-Baselines3's evaluation of the same controller, in the benchmark venv
SB3_EVAL = """
import json, statistics, sys, time, torch
torch.set_num_threads(1)
import stable_baselines3
from stable_baselines3 import A2C
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
episodes, calls = int(sys.argv[1]), int(sys.argv[2])
env = make_vec_env("CartPole-v1", n_envs=episodes, seed=10_000)
model = A2C("MlpPolicy", env, device="cpu", seed=0)
# tanh(tanh(angle + angular velocity)) pushes the same way as ours' controller
policy = model.policy
linears = [*policy.mlp_extractor.policy_net, policy.action_net]
linears = [m for m in linears if isinstance(m, torch.nn.Linear)]
with torch.no_grad():
    for m in linears:
        m.weight.zero_(), m.bias.zero_()
    linears[0].weight[0] = torch.tensor([0.0, 0.0, 1.0, 1.0])
    linears[1].weight[0, 0] = 1.0
    linears[2].weight[1, 0] = 10.0
evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=True)
times = []
for _ in range(calls):
    start = time.perf_counter()
    mean, _ = evaluate_policy(model, env, n_eval_episodes=episodes, deterministic=True)
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": statistics.median(times), "all": times, "reward": mean,
                  "stable_baselines3": stable_baselines3.__version__}))
"""


def startup(checkout: Path) -> float:
    """Seconds to the progress bar's first line of one run of ``checkout``'s
    gym example."""
    with tempfile.TemporaryDirectory(prefix="first_run_") as run_dir:
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        start = time.perf_counter()
        process = subprocess.Popen(
            [
                sys.executable,
                str(checkout / "examples" / "acer_gym.py"),
                "threads=1",
                f"logger.run_dir={run_dir}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=run_dir,
            env=env,
        )
        try:
            seen = b""
            # tqdm's first line: "| 0/60000 [00:00<?, ?it/s]"
            while b"it/s]" not in seen:
                chunk = process.stderr.read1(4096)
                if not chunk:
                    raise RuntimeError(f"{checkout}: no progress bar: {seen[-2000:]}")
                seen += chunk
            return time.perf_counter() - start
        finally:
            process.kill()
            process.wait()


def last_json_line(args: list[str], **kwargs) -> dict:
    """The JSON a script's subprocess prints last."""
    out = subprocess.run(args, capture_output=True, text=True, check=True, **kwargs)
    return json.loads(out.stdout.strip().splitlines()[-1])


def evaluation(checkout: Path, episodes: int, calls: int) -> dict:
    return last_json_line(
        [sys.executable, "-c", EVAL, str(checkout), str(episodes), str(calls)],
        cwd=checkout,  # first on the path (python -c puts the cwd there)
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )


def sb3_evaluation(venv: Path, episodes: int, calls: int) -> dict:
    python = str(venv / "bin" / "python")
    return last_json_line([python, "-c", SB3_EVAL, str(episodes), str(calls)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkout", type=Path, action="append", default=[])
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--bench-venv", type=Path, default=ROOT / ".venv-bench")
    args = parser.parse_args()
    checkouts = [ROOT, *[c.resolve() for c in args.checkout]]
    starts = {str(c): [] for c in checkouts}
    evals = {str(c): [] for c in checkouts}
    sb3 = [] if (args.bench_venv / "bin" / "python").exists() else None
    for r in range(args.rounds):
        for c in checkouts if r % 2 == 0 else checkouts[::-1]:
            starts[str(c)].append(startup(c))
            evals[str(c)].append(evaluation(c, args.episodes, args.calls))
        if sb3 is not None:
            sb3.append(sb3_evaluation(args.bench_venv, args.episodes, args.calls))
    result = {
        "startup_seconds": {
            c: {"median": statistics.median(v), "all": v} for c, v in starts.items()
        },
        "evaluation_seconds": {
            c: {
                "median": statistics.median(e["seconds"] for e in v),
                "per_round": [e["seconds"] for e in v],
                "reward": v[-1]["reward"],
            }
            for c, v in evals.items()
        },
        "episodes": args.episodes,
        "rounds": args.rounds,
    }
    if sb3 is not None:
        ours = [e["seconds"] for e in evals[str(ROOT)]]
        theirs = [e["seconds"] for e in sb3]
        result["sb3_evaluation_seconds"] = {
            "median": statistics.median(theirs),
            "per_round": theirs,
            "reward": sb3[-1]["reward"],
            "stable_baselines3": sb3[-1]["stable_baselines3"],
        }
        result["evaluation_over_sb3"] = per_round_ratios(ours, theirs)
    print(json.dumps(result, indent=1))
    save("first_run", result)


if __name__ == "__main__":
    main()
