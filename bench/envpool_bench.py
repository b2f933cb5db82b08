"""The ALE's vector environment (the Atari example's) against envpool, at equal
settings, and whether envpool's preprocessing matches ours.

envpool is not a dependency; run this with a Python that has it, e.g. a
throwaway virtual environment that sees this project's packages::

    python3.11 -m venv /tmp/envpool_venv
    echo "$PWD/.venv/lib/python3.11/site-packages" \\
        > /tmp/envpool_venv/lib/python3.11/site-packages/main_venv.pth
    /tmp/envpool_venv/bin/pip install "envpool==0.8.4" gym   # or envpool (1.x)
    /tmp/envpool_venv/bin/python bench/envpool_bench.py [--rounds 5] [--quick]

(``gym`` because TorchRL's ``MultiThreadedEnv`` builds its specs with the gym
backend.) Without envpool, or when something fails, the JSON says what.

Measured, in agent steps per second (one agent step = 4 frames), random actions,
interleaved rounds, medians (``_common.interleaved_medians``), Breakout with 8
environments and the example's DeepMind preprocessing (frame skip 4 with the max
over the last two frames, 84x84 grey, a stack of 4, up to 30 no-op starts, FIRE
at reset, no sticky actions, no reward clipping and no episode end at a lost
life inside the environment: the example derives its training signals from
``lives`` instead, 108 000 frames per game), each at 1 and 2 threads:

- the libraries alone: the ALE's ``AtariVectorEnv`` (the object the example
  wraps, from :func:`~torchrl_acer.training.atari.make_atari_env`) against
  ``envpool.make(..., env_type="gymnasium")``;
- through TorchRL: the example's env (``make_atari_env``, ``training_signals=False``:
  the wrapper, the rename to ``pixels`` and ``RewardSum``) against TorchRL's
  ``MultiThreadedEnv`` with ``RewardSum``.

Preprocessing: both settings side by side, how each fills a new episode's stack
(zeros or the first frame), and, with no-op starts off (both deterministic
then), the frames, rewards and lives of one game stepped with the same actions
in both.

Results: ``bench/results/envpool-<stamp>.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
# the package itself, for a Python that sees this project's packages through a
# .pth file (which does not run the editable install's own .pth)
sys.path.insert(1, str(Path(__file__).parents[1]))
from _common import interleaved_medians, save  # noqa: E402

from torchrl_acer.training.atari import make_atari_env  # noqa: E402

GAME_ID = "ALE/Breakout-v5"

# the example's settings (examples/config_atari.yaml, make_atari_env), as the
# ALE's vector env takes them and as envpool takes them
OURS = {
    "frameskip": 4,
    "maxpool": True,
    "img_height": 84,
    "img_width": 84,
    "grayscale": True,
    "stack_num": 4,
    "noop_max": 30,
    "use_fire_reset": True,
    "repeat_action_probability": 0.0,
    "reward_clipping": False,
    "episodic_life": False,
    "max_num_frames_per_episode": 108_000,
}
ENVPOOL = {
    "frame_skip": 4,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "stack_num": 4,
    "noop_max": 30,
    "use_fire_reset": True,
    "repeat_action_probability": 0.0,
    "reward_clip": False,
    "episodic_life": False,
    "max_episode_steps": 27_000,  # agent steps: 108 000 frames
}


def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def ours_env(num_envs, threads, seed=0, noop_max=30):
    return make_atari_env(
        GAME_ID,
        num_envs=num_envs,
        seed=seed,
        num_threads=threads,
        noop_max=noop_max,
        training_signals=False,
    )


def envpool_raw(num_envs, threads, seed=0, noop_max=30):
    import envpool

    kwargs = dict(ENVPOOL, noop_max=noop_max)
    return envpool.make(
        "Breakout-v5",
        env_type="gymnasium",
        num_envs=num_envs,
        num_threads=threads,
        seed=seed,
        **kwargs,
    )


def envpool_torchrl(num_envs, threads, seed=0):
    from torchrl.envs import MultiThreadedEnv, RewardSum, TransformedEnv

    env = MultiThreadedEnv(
        num_envs, GAME_ID, create_env_kwargs=dict(ENVPOOL, num_threads=threads)
    )
    env.set_seed(seed)
    return TransformedEnv(env, RewardSum())


def stepper_raw(env, num_envs, steps):
    try:
        env.reset(seed=0)
    except TypeError:  # envpool seeds at make
        env.reset()
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 4, size=(100_000, num_envs))
    i = [0]

    def run():
        for _ in range(steps):
            env.step(actions[i[0] % len(actions)])
            i[0] += 1

    return run


def stepper_torchrl(env, steps):
    state = [env.reset()]

    def run():
        for _ in range(steps):
            _, state[0] = env.step_and_maybe_reset(env.rand_action(state[0]))

    return run


def compare_preprocessing(steps=300) -> dict:
    """One Breakout game in each, no-op starts off (``noop_max=1``: envpool
    crashes the process with 0), the same actions."""
    import envpool

    out = {}
    ours = ours_env(1, 1, seed=0, noop_max=1).base_env._env
    pool = envpool_raw(1, 1, seed=0, noop_max=1)
    o_obs, o_info = ours.reset(seed=0)
    p_obs, p_info = pool.reset()
    out["stack_padding_at_reset"] = {
        "ours": "zeros" if (o_obs[0, :-1] == 0).all() else "not zeros",
        "envpool": (
            "zeros"
            if (p_obs[0, :-1] == 0).all()
            else "first frame repeated"
            if all((p_obs[0, i] == p_obs[0, -1]).all() for i in range(3))
            else "other"
        ),
    }
    rng = np.random.default_rng(1)
    equal, diffs, rewards_equal, lives_equal = [], [], 0, 0
    frames = [(o_obs[0, -1], p_obs[0, -1])]
    game_over = None
    for step in range(steps):
        a = rng.integers(0, 4, size=1)
        o_obs, o_r, o_term, o_trunc, o_info = ours.step(a)
        p_obs, p_r, p_term, p_trunc, p_info = pool.step(a)
        frames.append((o_obs[0, -1], p_obs[0, -1]))
        rewards_equal += int(o_r[0] == p_r[0])
        lives_equal += int(o_info["lives"][0] == p_info["lives"][0])
        if o_term[0] or o_trunc[0] or p_term[0] or p_trunc[0]:
            game_over = step + 1
            break
    for a, b in frames:
        equal.append(bool((a == b).all()))
        diffs.append(float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean()))
    n = len(frames) - 1
    out["deterministic_game"] = {
        "steps": n,
        "frames_identical_fraction": float(np.mean(equal)),
        "frame_mean_abs_diff": float(np.mean(diffs)),
        "frame_max_pixel_diff": int(
            max(
                np.abs(a.astype(np.int16) - b.astype(np.int16)).max() for a, b in frames
            )
        ),
        "rewards_equal_fraction": rewards_equal / max(n, 1),
        "lives_equal_fraction": lives_equal / max(n, 1),
        "first_frame_identical": equal[0],
        "ours_frames_all_zero": all(not a.any() for a, _ in frames),
        "envpool_frames_all_zero": all(not b.any() for _, b in frames),
        "differing_frames_at_steps": [i for i, e in enumerate(equal) if not e],
        "game_over_at_step": game_over,
        "note": "the ALE vector env resets in the step that ends a game (the "
        "example's autoreset_mode SameStep: that step returns the new game's "
        "frame); envpool returns the last frame and resets on the next step",
    }
    out["envpool_config"] = {
        k: (v if isinstance(v, (int, float, bool, str)) else str(v))
        for k, v in dict(envpool_raw(1, 1).spec.config._asdict()).items()
        if k not in ("base_path",)
    }
    ours.close()
    pool.close()
    del envpool
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50, help="vector steps per call")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--note", default=None, help="how envpool was installed, kept in the JSON"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps = 1, 20
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    result = {
        "settings": {
            "game": GAME_ID,
            "num_envs": args.envs,
            "rounds": args.rounds,
            "vector_steps_per_call": args.steps,
            "threads": args.threads,
            "ours": OURS,
            "envpool": ENVPOOL,
            "actions": "uniform random",
            "quick": args.quick,
        },
        "versions": {
            "envpool": version("envpool"),
            "ale_py": version("ale-py"),
            "gymnasium": version("gymnasium"),
            "gym": version("gym"),
            "numpy": version("numpy"),
        },
        "install_note": args.note,
        "errors": {},
    }
    try:
        import envpool  # noqa: F401
    except Exception as err:
        result["errors"]["import envpool"] = f"{type(err).__name__}: {err}"
        path = save("envpool", result)
        print(f"envpool not importable ({err}); saved {path}")
        return

    fns, envs = {}, []
    for t in args.threads:
        for name, build in (
            (f"ale_vector_raw_t{t}", lambda t=t: ours_env(args.envs, t).base_env._env),
            (f"envpool_raw_t{t}", lambda t=t: envpool_raw(args.envs, t)),
        ):
            try:
                env = build()
                envs.append(env)
                fns[name] = stepper_raw(env, args.envs, args.steps)
            except Exception as err:
                result["errors"][name] = traceback.format_exc(limit=3)[-2000:]
                print(f"{name}: {err}")
        for name, build in (
            (f"ours_torchrl_t{t}", lambda t=t: ours_env(args.envs, t)),
            (f"envpool_torchrl_t{t}", lambda t=t: envpool_torchrl(args.envs, t)),
        ):
            try:
                env = build()
                envs.append(env)
                fns[name] = stepper_torchrl(env, args.steps)
            except Exception as err:
                result["errors"][name] = traceback.format_exc(limit=3)[-2000:]
                print(f"{name}: {type(err).__name__}: {err}")
    medians = interleaved_medians(fns, args.rounds, min_time=0.5)
    rates = {k: args.steps * args.envs / v for k, v in medians.items()}
    result["agent_steps_per_s"] = rates
    result["ratios_envpool_over_ours"] = {}
    for t in args.threads:
        for kind in ("raw", "torchrl"):
            ours_key = f"ale_vector_raw_t{t}" if kind == "raw" else f"ours_torchrl_t{t}"
            pool_key = f"envpool_{kind}_t{t}"
            if ours_key in rates and pool_key in rates:
                result["ratios_envpool_over_ours"][f"{kind}_t{t}"] = (
                    rates[pool_key] / rates[ours_key]
                )
    for env in envs:
        try:
            env.close()
        except Exception:
            pass
    try:
        result["preprocessing"] = compare_preprocessing(60 if args.quick else 1000)
    except Exception:
        result["errors"]["preprocessing"] = traceback.format_exc(limit=4)[-2000:]
    path = save("envpool", result)
    for name, rate in rates.items():
        print(f"{name}: {rate:.0f} agent steps/s")
    for name, ratio in result["ratios_envpool_over_ours"].items():
        print(f"envpool / ours, {name}: {ratio:.2f}")
    if "preprocessing" in result:
        print(result["preprocessing"]["stack_padding_at_reset"])
        print(result["preprocessing"]["deterministic_game"])
    for name in result["errors"]:
        print(f"failed: {name}")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
