"""Fixes offered to TorchRL (``upstream/torchrl/``): its gymnasium path, SoftUpdate,
multi collectors' exit.

Each check runs the same script on the installed TorchRL and on a copy of it with
the patches applied (``tools/torchrl_fixes.py``), in subprocesses:

- 0001 (the terminal-observation reader's fast path) changes no output: a
  CartPole rollout of vector envs, with episodes ending alone and together, is the
  same bit for bit, and so is a collector's batch;
- 0002 (a full reset after a step where some copies ended) returns the states the
  new episodes start from, where the installed TorchRL returns what it saved at
  that step (the bug ``reset_every_copy`` works around);
- 0007 (SoftUpdate in one foreach lerp) keeps the same averaged parameters, bit
  for bit;
- 0008 (multi collectors shut down at exit, with their weight-sync schemes): a
  program with one exits, where the installed TorchRL never does (``--runslow``).

With a TorchRL checkout that has the patches' base commit (``TORCHRL_CHECKOUT``,
else /work/torchrl_checkout), the patches also apply there with ``git am``, and
the tests they add pass (``--runslow``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from builders import load_script, run_patched_torchrl_tests

fixes = load_script("tools/torchrl_fixes.py")

# Writes what the TorchRL it imports does into argv[2] (torch.save).
SCRIPT = r"""
import sys, warnings
import gymnasium as gym
import numpy as np
import torch
import torchrl
from torchrl.collectors import Collector
from torchrl.envs import GymWrapper
from torchrl.modules import RandomPolicy

warnings.filterwarnings("ignore")
torch.manual_seed(0)
out = {"torchrl": torchrl.__file__}


def vector(lengths=None, num_envs=4, env_id="CartPole-v1"):
    kwargs = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
    if lengths is None:
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                            vector_kwargs=kwargs)
    fns = [lambda n=n: gym.make(env_id, max_episode_steps=n) for n in lengths]
    return gym.vector.SyncVectorEnv(fns, **kwargs)


# a rollout: episodes end alone (CartPole) and together (time limits of 7)
for name, vec in (("alone", vector()), ("together", vector([7, 7, 7, 7]))):
    env = GymWrapper(vec)
    env.set_seed(0)
    rollout = env.rollout(120, break_when_any_done=False)
    out[name] = rollout.to_dict()
    done = rollout["next", "done"].squeeze(-1)  # [copies, steps]
    out[name + "_ends"] = {"all": int(done.all(0).sum()),
                           "some": int((done.any(0) & ~done.all(0)).sum())}
    env.close()

# a collector's batch
env = GymWrapper(vector())
env.set_seed(1)
collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=200,
                      total_frames=400)
out["batches"] = [batch.exclude("collector").to_dict() for batch in collector]
collector.shutdown()

# a full reset after a step where some, not all, copies ended
vec = vector()
env = GymWrapper(vec)
env.set_seed(2)
td = env.reset()
for _ in range(500):
    td = env.rand_step(td)
    done = td["next", "done"].squeeze(-1)
    if done.any() and not done.all():
        break
    td = td["next"].exclude("reward", "done", "terminated", "truncated")
out["partial_done"] = done.tolist()
reset = env.reset()
out["reset_observation"] = reset["observation"]
out["reset_state"] = torch.as_tensor(
    np.stack([copy.unwrapped.state for copy in vec.envs]), dtype=torch.float32
)
env.close()

# the averaged parameters SoftUpdate keeps over a few steps
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

torch.manual_seed(3)
actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[8]),
                    in_keys=["observation"], action_space="one-hot")
loss = DQNLoss(actor, delay_value=True, action_space="one-hot")
updater = SoftUpdate(loss, eps=0.9)
for _ in range(3):
    with torch.no_grad():
        for p in loss.value_network_params.values(True, True):
            p.add_(torch.randn_like(p))
    updater.step()
out["soft_update"] = {
    str(k): v.detach().clone()
    for k, v in loss.target_value_network_params.items(True, True)
}
out["soft_update_lists"] = "_lerp_lists" in updater.__dict__
torch.save(out, sys.argv[1])
"""


# 0008: a program with a multi collector whose weight-sync scheme has sent nothing
# (as before the first weight update) ends with argv[1]: "shutdown" or "error"
EXIT_SCRIPT = r"""
import sys
import torch
from tensordict.nn import TensorDictModule
from torchrl.collectors import MultiSyncCollector
from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv
from torchrl.weight_update import MultiProcessWeightSyncScheme

if __name__ == "__main__":
    env = ContinuousActionVecMockEnv()
    observation = env.observation_spec["observation"].shape[-1]
    policy = TensorDictModule(torch.nn.Linear(observation, env.action_spec.shape[-1]),
                              in_keys=["observation"], out_keys=["action"])
    collector = MultiSyncCollector(
        [ContinuousActionVecMockEnv] * 2, policy, frames_per_batch=20, total_frames=-1,
        weight_sync_schemes={"policy": MultiProcessWeightSyncScheme()})
    if sys.argv[1] == "shutdown":
        collector.shutdown()
    else:
        raise RuntimeError("an error before the shutdown")
"""


def run_script(
    tmp_path: Path,
    name: str,
    pythonpath: Path | None,
    *args,
    script=SCRIPT,
    timeout=600,
) -> subprocess.CompletedProcess:
    """Runs ``script`` with ``args`` on the installed TorchRL (``pythonpath`` None)
    or the patched copy; the SCRIPT's record is in ``tmp_path/<name>.pt``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(pythonpath), *filter(None, [env.get("PYTHONPATH")])]
        )
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def record(tmp_path: Path, name: str, pythonpath: Path | None) -> dict:
    out = tmp_path / f"{name}.pt"
    run_script(tmp_path, name, pythonpath, str(out)).check_returncode()
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    """A copy of the installed TorchRL with the patches applied."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    return fixes.patched_copy(tmp_path_factory.mktemp("torchrl_fixes") / "patched")


@pytest.fixture(scope="module")
def outputs(patched):
    """What the script records on the installed TorchRL and on the patched copy."""
    tmp = patched.parent
    return record(tmp, "installed", None), record(tmp, "patched", patched)


def assert_same(a, b, where=""):
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


def test_each_patch_changes_the_installed_torchrl(outputs):
    installed, patched = outputs
    assert Path(installed["torchrl"]).parent == fixes.installed_torchrl()
    assert "patched" in Path(patched["torchrl"]).parts


def test_reader_fast_path_changes_no_output(outputs):
    installed, patched = outputs
    # the rollouts had steps where copies ended alone and all together
    assert installed["alone_ends"]["some"] >= 2
    assert installed["together_ends"] == {"all": 120 // 7, "some": 0}
    for key in ("alone", "together", "batches"):
        assert_same(installed[key], patched[key], key)


def test_full_reset_returns_the_new_episodes_observations(outputs):
    installed, patched = outputs
    for out in outputs:
        assert any(out["partial_done"]) and not all(out["partial_done"])
    assert torch.equal(patched["reset_observation"], patched["reset_state"])
    # the installed TorchRL returns what the last step saved; when this fails,
    # TorchRL fixed it, and reset_every_copy's workaround can go
    assert not torch.equal(installed["reset_observation"], installed["reset_state"])


def test_soft_update_in_one_foreach_lerp_changes_no_output(outputs):
    installed, patched = outputs
    assert patched["soft_update_lists"] and not installed["soft_update_lists"]
    assert_same(installed["soft_update"], patched["soft_update"], "soft_update")


def test_a_program_with_a_multi_collector_exits(patched):
    for ending, status in (("shutdown", 0), ("error", 1)):
        ended = run_script(patched.parent, ending, patched, ending, script=EXIT_SCRIPT)
        assert ended.returncode == status, ended.stderr[-3000:]
    assert "an error before the shutdown" in ended.stderr


@pytest.mark.slow
def test_the_installed_torchrl_never_exits_there(tmp_path):
    # when this fails, TorchRL fixed it, and experiment.shut_down's workaround can go
    with pytest.raises(subprocess.TimeoutExpired):
        run_script(tmp_path, "", None, "shutdown", script=EXIT_SCRIPT, timeout=60)


@pytest.mark.slow
def test_patches_apply_upstream_and_their_tests_pass(tmp_path):
    gym = run_patched_torchrl_tests(
        tmp_path / "gym",
        ["test/libs/test_gym.py", "test/libs/conftest.py"],
        "test_gym.py",
        "-k",
        "final_observations or full_reset_after_partial_done",
    )
    assert gym.returncode == 0, gym.stdout[-3000:]
    assert "4 passed" in gym.stdout, gym.stdout[-3000:]
    objectives = [
        f"test/objectives/{name}"
        for name in ("test_loss_module.py", "_objectives_common.py", "conftest.py")
    ]
    soft_update = run_patched_torchrl_tests(
        tmp_path / "soft_update", objectives, "test_loss_module.py", "-k", "updater"
    )
    assert soft_update.returncode == 0, soft_update.stdout[-3000:]
    assert (
        "test_soft_update_follows_loading_and_dtype_moves"
        in (tmp_path / "soft_update" / "tests" / "test_loss_module.py").read_text()
    )
    collectors = run_patched_torchrl_tests(
        tmp_path / "collectors",
        ["test/test_collectors.py", "test/conftest.py"],
        "test_collectors.py",
        "-k",
        "test_program_exits_after_multi_collector",
    )
    assert collectors.returncode == 0, collectors.stdout[-3000:]
    assert "4 passed" in collectors.stdout, collectors.stdout[-3000:]
