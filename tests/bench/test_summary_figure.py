"""bench/summary_figure.py picks each task's result file and draws median and range."""

import json

import numpy as np
import pytest
from builders import load_script

summary_figure = load_script("bench/summary_figure.py")


def write(results, name, stamp, runs, protocol, **extra):
    path = results / f"learning-{name}-{stamp}.json"
    result = {"name": name, "protocol": protocol, "threshold": None, "runs": runs}
    path.write_text(json.dumps({**result, **extra}))
    return path


def run(seed, steps, values, returncode=0):
    return {
        "seed": seed,
        "returncode": returncode,
        "eval_steps": steps,
        "eval_reward": values,
    }


def reference(curves, x):
    """Median, min and max over seeds at step x, each curve interpolated by hand."""
    at = []
    for steps, values in curves:
        for i in range(len(steps) - 1):
            if steps[i] <= x <= steps[i + 1]:
                w = (x - steps[i]) / (steps[i + 1] - steps[i])
                at.append(values[i] + w * (values[i + 1] - values[i]))
                break
    at = sorted(at)
    return at[len(at) // 2], at[0], at[-1]


def test_summary_picks_files_and_draws_median_and_range(tmp_path):
    cartpole = "CartPole-v0, env steps, greedy eval every 10 env steps"
    minatar = "MinAtar/Breakout-v1, 1M env steps (frames), greedy eval every 10 steps"
    steps = [0, 10, 20]
    # older file of the same name and a newer ablation: neither may be picked
    write(
        tmp_path,
        "cartpole_v0",
        "20260101T000000Z",
        [run(0, steps, [9, 9, 9])],
        cartpole,
    )
    write(
        tmp_path,
        "cartpole_v0_no_replay",
        "20260103T000000Z",
        [run(0, steps, [7, 7, 7])],
        cartpole,
    )
    write(
        tmp_path,
        "cartpole_v0",
        "20260102T000000Z",
        [
            run(0, steps, [0, 1, 2]),
            run(1, steps, [0, 3, 6]),
            # evaluated twice at its last step: the later value (10) counts
            run(2, [0, 10, 20, 20], [0, 5, 99, 10]),
            run(3, steps, [50, 50, 50], returncode=1),  # failed: left out
        ],
        cartpole,
        threshold=195,
    )
    # a merged result whose runs keep their curves in the files merged
    parts = [
        write(
            tmp_path,
            "minatar_breakout_a",
            "20260101T000000Z",
            [run(0, steps, [1, 2, 3]), run(1, steps, [1, 4, 5])],
            minatar,
        ),
        write(
            tmp_path,
            "minatar_breakout_b",
            "20260101T000000Z",
            [run(2, steps, [1, 6, 8])],
            minatar,
        ),
    ]
    pinned = write(
        tmp_path,
        "minatar_breakout",
        "20260102T000000Z",
        [{"seed": s, "returncode": 0} for s in (0, 1, 2)],
        minatar,
        merged_from=[{"file": p.name} for p in parts],
    )
    write(
        tmp_path,
        "minatar_breakout",
        "20260104T000000Z",
        [run(0, steps, [0, 0, 0])],
        minatar,
    )
    tasks = [
        ("cartpole_v0", summary_figure.NEWEST, ""),
        ("minatar_breakout", pinned.name, ""),
        ("pendulum", summary_figure.NEWEST, ""),  # no result: left out
    ]
    panels = summary_figure.main(["--results", str(tmp_path)], tasks=tasks)

    assert (tmp_path / "summary.png").is_file()
    assert [(p.name, p.file.name) for p in panels] == [
        ("cartpole_v0", "learning-cartpole_v0-20260102T000000Z.json"),
        ("minatar_breakout", pinned.name),
    ]
    cart, mini = panels
    assert cart.seeds == [0, 1, 2] and mini.seeds == [0, 1, 2]
    assert (cart.unit, mini.unit) == ("env steps", "env steps (= frames)")
    assert (cart.task, cart.threshold) == ("CartPole-v0", 195)
    assert (cart.median[-1], cart.low[-1], cart.high[-1]) == (6, 2, 10)
    expected = [[0, 1, 2], [0, 3, 6], [0, 5, 10]], [[1, 2, 3], [1, 4, 5], [1, 6, 8]]
    for p, values in zip(panels, expected, strict=True):
        curves = [(steps, v) for v in values]
        ref = np.array([reference(curves, x) for x in p.steps])
        np.testing.assert_allclose(np.stack([p.median, p.low, p.high], 1), ref)


def comparison_run(candidate, seed, steps, values, stopped="budget"):
    evals = [{"env_steps": s, "return": v} for s, v in zip(steps, values, strict=True)]
    return {
        "candidate": candidate,
        "seed": seed,
        "returncode": 0,
        "stopped": stopped,
        "evals": evals,
    }


def test_comparison_panel_draws_each_candidate_from_its_finished_runs(tmp_path):
    steps = [0, 10, 20]
    runs = [
        comparison_run("ours", 0, steps, [0, 4, 8]),
        comparison_run("ours", 1, steps, [0, 2, 2]),
        comparison_run("ours", 2, steps, [0, 6, 4]),
        # unfinished: a shorter curve that would cut the grid at 10, left out
        comparison_run("ours", 3, [0, 10], [90, 90], stopped="interrupted"),
        comparison_run("peer", 0, steps, [-5, -5, -5]),
        comparison_run("peer", 1, steps, [-1, -1, 1]),
        comparison_run("peer", 2, steps, [-3, 0, 9]),
    ]
    settings = {"task": "LunarLander-v3", "threshold": 200}
    result = {"settings": settings, "runs": runs}
    (tmp_path / "bench_x-20260101T000000Z.json").write_text(json.dumps(result))
    comparisons = [("bench_x", summary_figure.NEWEST, {"ours": "A", "peer": "B"})]
    [p] = summary_figure.main(
        ["--results", str(tmp_path)], tasks=[], comparisons=comparisons
    )
    assert (tmp_path / "summary.png").is_file()
    assert (p.task, p.threshold, p.unit) == ("LunarLander-v3", 200, "env steps")
    assert [(s.label, s.seeds) for s in p.series] == [
        ("A", [0, 1, 2]),
        ("B", [0, 1, 2]),
    ]
    ours = [[0, 4, 8], [0, 2, 2], [0, 6, 4]]
    peer = [[-5, -5, -5], [-1, -1, 1], [-3, 0, 9]]
    for s, values in zip(p.series, (ours, peer), strict=True):
        curves = [(steps, v) for v in values]
        ref = np.array([reference(curves, x) for x in s.steps])
        np.testing.assert_allclose(np.stack([s.median, s.low, s.high], 1), ref)


def test_comparison_panel_refuses_a_candidate_without_a_finished_run(tmp_path):
    runs = [
        comparison_run("ours", 0, [0, 10], [1, 2]),
        comparison_run("peer", 0, [0, 10], [1, 2], stopped="interrupted"),
    ]
    path = tmp_path / "bench_x-20260101T000000Z.json"
    path.write_text(json.dumps({"settings": {"task": "T"}, "runs": runs}))
    with pytest.raises(ValueError, match="no finished run of 'peer'"):
        summary_figure.comparison_panel("bench_x", path, {"ours": "A", "peer": "B"})


def test_compare_draws_one_panel_a_curve_per_named_result(tmp_path):
    protocol = "MinAtar/Seaquest-v1, 1M env steps (frames), greedy eval every 10 steps"
    steps = [0, 10, 20]
    base = [[0, 2, 4], [0, 1, 1], [0, 3, 9]]
    write(tmp_path, "sq", "20260101T000000Z", [run(0, steps, [50, 50, 50])], protocol)
    pinned = write(
        tmp_path,
        "sq",
        "20260102T000000Z",
        [run(s, steps, v) for s, v in enumerate(base)],
        protocol,
    )
    write(  # newer than the pinned one: --compare NAME=FILE must not take it
        tmp_path, "sq", "20260103T000000Z", [run(0, steps, [70, 70, 70])], protocol
    )
    write(tmp_path, "sq_x", "20260101T000000Z", [run(4, steps, [5, 6, 7])], protocol)
    out = tmp_path / "cmp.png"
    [p] = summary_figure.main(
        [
            "--results",
            str(tmp_path),
            "--out",
            str(out),
            "--compare",
            f"sq={pinned.name}:defaults",
            "sq_x:entropy 0.03",
        ]
    )
    assert out.is_file()
    assert [(s.label, s.seeds, s.file.name) for s in p.series] == [
        ("defaults", [0, 1, 2], pinned.name),
        ("entropy 0.03", [4], "learning-sq_x-20260101T000000Z.json"),
    ]
    assert (p.task, p.unit) == ("MinAtar/Seaquest-v1", "env steps (= frames)")
    ref = np.array(
        [reference([(steps, v) for v in base], x) for x in p.series[0].steps]
    )
    s = p.series[0]
    np.testing.assert_allclose(np.stack([s.median, s.low, s.high], 1), ref)


def test_compare_refuses_results_of_different_tasks(tmp_path):
    steps = [0, 10]
    write(
        tmp_path,
        "a",
        "20260101T000000Z",
        [run(0, steps, [1, 2])],
        "CartPole-v1, env steps",
    )
    write(
        tmp_path,
        "b",
        "20260101T000000Z",
        [run(0, steps, [1, 2])],
        "Acrobot-v1, env steps",
    )
    with pytest.raises(ValueError, match="different tasks"):
        summary_figure.compare_panel(tmp_path, ["a:A", "b:B"])
    with pytest.raises(ValueError, match="expected NAME"):
        summary_figure.compare_panel(tmp_path, ["a"])
