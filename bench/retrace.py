"""Retrace target: the shipped scan against a plain loop and TorchRL's TD(lambda).

    python bench/retrace.py [--rounds 15]

For each T in {20, 100, 1000} and batch in {16, 1024} (float32, one feature), times
in one interleaved run:
- ours: ``torchrl_acer.retrace_lambda_return_estimate`` (the parallel scan);
- loop: the backward recursion as a Python loop over time (``tests/reference.py``);
- torchrl_vec: TorchRL's ``vec_td_lambda_return_estimate``, the same kind of
  recurrence with constant coefficients, vectorised by convolution;
and prints the ratios of the medians. Results go to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from torchrl.objectives.value.functional import vec_td_lambda_return_estimate

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from _common import interleaved_medians, save  # noqa: E402
from reference import retrace_backward_loop  # noqa: E402

from torchrl_acer import retrace_lambda_return_estimate  # noqa: E402


def inputs(B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (B, T, 1)
    done = torch.rand(shape, generator=g) < 0.02
    return dict(
        log_pi=torch.randn(shape, generator=g) * 0.5,
        log_mu=torch.randn(shape, generator=g) * 0.5,
        q=torch.randn(shape, generator=g),
        next_v=torch.randn(shape, generator=g),
        reward=torch.randn(shape, generator=g),
        done=done,
        terminated=done & (torch.rand(shape, generator=g) < 0.5),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rows = []
    print(
        f"{'T':>5} {'B':>5} {'ours ms':>9} {'loop/ours':>10} {'torchrl_vec/ours':>17}"
    )
    for T in (20, 100, 1000):
        for B in (16, 1024):
            x = inputs(B, T)
            order = ("log_pi", "log_mu", "q", "next_v", "reward", "done", "terminated")
            a = [x[k] for k in order]
            td_args = [x[k] for k in ("next_v", "reward", "done", "terminated")]
            fns = {
                "ours": partial(retrace_lambda_return_estimate, 0.99, 1.0, *a),
                "loop": partial(retrace_backward_loop, 0.99, 1.0, *a),
                "torchrl_vec": partial(
                    vec_td_lambda_return_estimate, 0.99, 1.0, *td_args
                ),
            }
            with torch.no_grad():
                med = interleaved_medians(fns, args.rounds)
            row = {
                "T": T,
                "B": B,
                "median_s": med,
                "loop_over_ours": med["loop"] / med["ours"],
                "torchrl_vec_over_ours": med["torchrl_vec"] / med["ours"],
            }
            rows.append(row)
            print(
                f"{T:>5} {B:>5} {med['ours'] * 1e3:>9.3f} {row['loop_over_ours']:>10.2f}"
                f" {row['torchrl_vec_over_ours']:>17.2f}"
            )
    path = save(
        "retrace",
        {
            "settings": {"dtype": "float32", "rounds": args.rounds, "seed": 0},
            "rows": rows,
        },
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
