"""The core imports on the oldest torch TorchRL supports (2.1).

A fresh interpreter imports torch, tensordict and torchrl, then deletes the
torch APIs that came after 2.1 and imports the core: an import-time use of one
of them fails here rather than on a user's older torch. torch itself calls some
of them at run time, so they are put back before the loss runs once (the trust
region included), which checks that the import left a working loss.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (module, attribute, the torch release that added it)
NEWER_THAN_2_1 = (
    ("torch.library", "custom_op", "2.4"),
    ("torch.library", "register_fake", "2.4"),
    ("torch.library", "register_autograd", "2.4"),
    ("torch.library", "register_kernel", "2.4"),
    ("torch.library", "opcheck", "2.4"),
    ("torch.library", "infer_schema", "2.5"),
    ("torch.library", "triton_op", "2.6"),
    ("torch.compiler", "is_compiling", "2.3"),
    ("torch.compiler", "is_dynamo_compiling", "2.3"),
    ("torch.compiler", "substitute_in_graph", "2.5"),
    ("torch.compiler", "set_stance", "2.6"),
    ("torch.nn", "attention", "2.2"),
    ("torch.amp", "GradScaler", "2.3"),
)

SCRIPT = """
import importlib, sys
import torch, tensordict, torchrl, torchrl.objectives  # their own imports first

removed = {{}}
for module, name, version in {newer!r}:
    owner = importlib.import_module(module)
    if hasattr(owner, name):
        removed[(owner, name)] = getattr(owner, name)
        delattr(owner, name)
assert any(name == "custom_op" for _, name in removed), removed

sys.path.insert(0, {tests!r})
import torchrl_acer.modules, torchrl_acer.objectives
for (owner, name), value in removed.items():
    setattr(owner, name, value)
from builders import discrete_actor_critic, random_batch
from torchrl_acer import ACERLoss

actor, critic = discrete_actor_critic()
loss = ACERLoss(actor, critic, trust_region_delta=0.01)
loss.make_value_estimator(gamma=0.9)
with torch.no_grad():
    loss.target_actor_network_params.apply(lambda p: p.add_(torch.randn_like(p)))
out = loss(random_batch(3, 5, dones=[(0, 1)]))
(out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()
stats = loss.trust_region_stats
assert stats["active_fraction"] > 0, stats["active_fraction"]
print("ok", len(removed))
"""


def test_core_runs_without_torch_apis_newer_than_2_1():
    script = SCRIPT.format(newer=NEWER_THAN_2_1, tests=str(ROOT / "tests"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok"), result.stdout


def test_core_uses_torchrls_is_compiling():
    # torch.compiler.is_compiling is torch >= 2.3; torchrl._utils.is_compiling
    # falls back to torch._dynamo's on older releases
    core = [ROOT / "torchrl_acer" / d for d in ("objectives", "modules")]
    calls = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in core
        for path in sorted(folder.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "compiler.is_compiling" in line or "_dynamo.is_compiling" in line
    ]
    assert not calls, f"use torchrl._utils.is_compiling instead at {calls}"
