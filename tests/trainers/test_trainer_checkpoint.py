"""torchrl_acer.trainers.checkpoint: ACERCheckpoint keeps the single-file format's
guarantees on torchrl.checkpoint.Checkpoint.

Each test breaks one guarantee's premise for real (a flipped byte, a truncated file,
a state_dict that raises, another config, another network, a NaN, a file of the old
format) and checks what is refused, what it names, and that nothing was loaded or
the previous checkpoint was kept.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from builders import load_script, run_patched_torchrl_tests
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointRotation,
    GlobalRNGState,
    StateDictCheckpointAdapter,
)
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs import GymEnv
from torchrl.modules import ProbabilisticActor, RandomPolicy, ValueOperator
from torchrl.objectives import A2CLoss
from torchrl.trainers import ReplayBufferTrainer, Trainer

from torchrl_acer.trainers.checkpoint import (
    ACERCheckpoint,
    ACERCheckpointError,
    FiniteStateDictAdapter,
    NonFiniteCheckpointError,
)
from torchrl_acer.training.env_state import CollectorState
from torchrl_acer.training.envs import make_env

CONFIG = {
    "model": {"num_cells": [8], "activation": "tanh"},
    "optim": {"lr": 0.01},
    "collector": {"total_frames": 16},
    "seed": 0,
}


def with_changes(config, **changes):
    """``config`` with dotted keys changed."""
    out = {
        key: dict(value) if isinstance(value, dict) else value
        for key, value in config.items()
    }
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = out
        for key in parents:
            node = node[key]
        node[last] = value
    return out


# -- a real TorchRL Trainer -----------------------------------------------------


def cartpole_trainer(path, *, seed, config=CONFIG):
    """A TorchRL ``Trainer``: A2C on CartPole, 8-frame batches, two updates per batch
    from a replay buffer, saving through an ``ACERCheckpoint`` after every batch."""
    torch.manual_seed(seed)
    env = GymEnv("CartPole-v1")
    env.set_seed(seed)
    actor = ProbabilisticActor(
        TensorDictModule(
            nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)),
            ["observation"],
            ["logits"],
        ),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = ValueOperator(
        nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)),
        in_keys=["observation"],
    )
    loss = A2CLoss(actor, critic)
    loss.make_value_estimator(gamma=0.9)
    optimizer = torch.optim.Adam(loss.parameters(), lr=config["optim"]["lr"])
    collector = Collector(env, actor, frames_per_batch=8, total_frames=16)
    replay = TensorDictReplayBuffer(storage=LazyTensorStorage(32))
    trainer = Trainer(
        collector=collector,
        total_frames=16,
        frame_skip=1,
        optim_steps_per_batch=2,
        loss_module=loss,
        optimizer=optimizer,
        progress_bar=False,
        log_interval=10**9,
        save_trainer_interval=0,  # after every batch (the collector is shut at the end)
        save_trainer_file=path,
        checkpoint=ACERCheckpoint(config=config),
    )
    ReplayBufferTrainer(replay, batch_size=4).register(trainer)
    return trainer, replay


@pytest.mark.filterwarnings("ignore")
def test_a_torchrl_trainer_resumes_parameters_optimizer_counters_and_replay(
    tmp_path,
):
    path = tmp_path / "checkpoint"
    trainer, replay = cartpole_trainer(path, seed=0)
    trainer.train()
    assert trainer.collected_frames == 16 and len(replay) == 16
    manifest = ACERCheckpoint.verify(path)
    assert {"loss_module", "optimizer", "replay_buffer", "trainer_state"} <= set(
        manifest["components"]
    )
    resumed, resumed_replay = cartpole_trainer(path, seed=1)
    before = resumed.loss_module.state_dict()
    assert not all(
        torch.equal(before[k], v) for k, v in trainer.loss_module.state_dict().items()
    )
    resumed.load_from_file(path)
    saved = trainer.loss_module.state_dict()
    after = resumed.loss_module.state_dict()
    assert saved.keys() == after.keys()
    assert all(torch.equal(saved[k], after[k]) for k in saved)
    assert resumed.collected_frames == 16
    assert resumed._optim_count == trainer._optim_count == 4
    adam, resumed_adam = trainer.optimizer.state_dict(), resumed.optimizer.state_dict()
    for index, state in adam["state"].items():
        for key, value in state.items():
            assert torch.equal(resumed_adam["state"][index][key], value), (index, key)
    assert len(resumed_replay) == 16
    torch.testing.assert_close(resumed_replay[:], replay[:], rtol=0, atol=0)


# -- the same, directly -----------------------------------------------------------


class Counters:
    """Counters as a trainer keeps them, with state_dict / load_state_dict."""

    def __init__(self, frames=0, updates=0):
        self.frames, self.updates = frames, updates

    def state_dict(self):
        return {"frames": self.frames, "updates": self.updates}

    def load_state_dict(self, state):
        self.frames, self.updates = state["frames"], state["updates"]


class Exploding(Counters):
    """Counters whose ``state_dict`` raises once armed: a save killed halfway."""

    armed = False

    def state_dict(self):
        if self.armed:
            raise RuntimeError("killed while saving")
        return super().state_dict()


def pieces(seed=0, *, out_features=2, frames=0):
    """A network trained one step, its Adam optimizer, counters, and a replay buffer
    holding ``frames`` transitions (``None`` when ``frames`` is 0)."""
    torch.manual_seed(seed)
    net = nn.Linear(3, out_features)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    net(torch.randn(4, 3)).pow(2).sum().backward()
    optimizer.step()
    replay = None
    if frames:
        replay = TensorDictReplayBuffer(storage=LazyTensorStorage(8))
        replay.extend(
            TensorDict({"observation": torch.randn(frames, 3)}, batch_size=[frames])
        )
    return net, optimizer, Counters(frames, frames // 2), replay


def checkpoint_of(net, optimizer, counters, replay=None, config=CONFIG, **kwargs):
    components = {"net": net, "optim": optimizer, "counters": counters}
    if replay is not None:
        components["replay"] = replay
    return ACERCheckpoint(config=config, **kwargs, **components)


def state(net):
    return {k: v.clone() for k, v in net.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def payload(path, component="net") -> Path:
    """The largest tensor file of ``component`` in a directory checkpoint."""
    files = (path / "components").glob(f"*-{component}/state/tensor_*")
    return max(files, key=lambda file: file.stat().st_size)


@pytest.mark.parametrize("fmt", ["directory", "archive"])
def test_round_trip_restores_every_component(tmp_path, fmt):
    net, optimizer, counters, replay = pieces(0, frames=5)
    path = checkpoint_of(net, optimizer, counters, replay, format=fmt).save(
        tmp_path / "c"
    )
    assert path.is_dir() == (fmt == "directory")
    assert Checkpoint.manifest(path)["container"] == fmt
    target = pieces(1, frames=1)[:3] + (
        TensorDictReplayBuffer(storage=LazyTensorStorage(8)),
    )
    result = checkpoint_of(*target).load(path)
    assert result.loaded == {"net", "optim", "counters", "replay"}
    assert same(target[0].state_dict(), net.state_dict())
    saved_adam, loaded_adam = optimizer.state_dict(), target[1].state_dict()
    assert all(
        torch.equal(loaded_adam["state"][0][k], v)
        for k, v in saved_adam["state"][0].items()
    )
    assert (target[2].frames, target[2].updates) == (5, 2)
    assert torch.equal(target[3][:]["observation"], replay[:]["observation"])
    # nothing left beside it: no stage, no temporary copy
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_an_adapter_registered_for_a_type_saves_that_type(tmp_path):
    # TorchRL's register_adapter, here after the components are registered (as on
    # a trainer's checkpoint): the type's components are saved by that adapter
    net, optimizer, counters, _ = pieces(0, frames=4)
    checkpoint = checkpoint_of(net, optimizer, counters)
    checkpoint.register_adapter(Counters, StateDictCheckpointAdapter("torch"))
    path = checkpoint.save(tmp_path / "c")
    saved = sorted(p.name for p in (path / "components").glob("*-counters/*"))
    assert saved == ["state.pt"]
    target = pieces(1)
    checkpoint_of(*target).load(path)
    assert (target[2].frames, target[2].updates) == (4, 2)
    # the others are still checked for non-finite numbers
    with torch.no_grad():
        net.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteCheckpointError, match="net.weight"):
        checkpoint.save(path)


def test_versions_commit_and_config_are_in_the_manifest(tmp_path):
    run = {"run_dir": str(tmp_path), "collected_frames": 0}
    path = checkpoint_of(*pieces(), metadata=run).save(
        tmp_path / "c", metadata={"collected_frames": 8}
    )
    metadata = Checkpoint.manifest(path)["metadata"]
    assert metadata["run_dir"] == str(tmp_path) and metadata["collected_frames"] == 8
    ours = metadata["torchrl_acer"]
    assert ours["config"] == CONFIG
    assert ours["versions"]["torch"] == torch.__version__
    assert ours["versions"]["torchrl-acer"] and ours["versions"]["torchrl"]
    assert "git_commit" in ours
    # every component file has its size and sha256
    assert any(name.endswith(".memmap") for name in ours["files"])
    assert all(len(v["sha256"]) == 64 for v in ours["files"].values())


def test_a_plain_torchrl_checkpoint_reads_it_and_is_refused_by_it(tmp_path):
    net, optimizer, counters, _ = pieces(0)
    path = checkpoint_of(net, optimizer, counters).save(tmp_path / "c")
    other = nn.Linear(3, 2)
    assert Checkpoint(net=other).load(path, components=["net"]).loaded == {"net"}
    assert same(other.state_dict(), net.state_dict())
    plain = Checkpoint(net=net).save(tmp_path / "plain")
    with pytest.raises(ACERCheckpointError, match="not written by ACERCheckpoint"):
        ACERCheckpoint(net=other).load(plain)


# -- integrity ------------------------------------------------------------------


def flip(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0xFF
    file.write_bytes(bytes(data))


def test_a_flipped_byte_is_refused_naming_the_file_before_anything_loads(tmp_path):
    net, optimizer, counters, _ = pieces(0, frames=4)
    path = checkpoint_of(net, optimizer, counters).save(tmp_path / "c")
    target = pieces(1)
    before = state(target[0])
    bad = payload(path, "optim")  # "counters" and "net" load before "optim"
    flip(bad, 5)
    with pytest.raises(CheckpointError) as err:
        checkpoint_of(*target).load(path)
    assert "is corrupted" in str(err.value)
    assert bad.relative_to(path).as_posix() in str(err.value)
    assert same(state(target[0]), before) and target[2].frames == 0
    # the manifest itself: a digit of the stored config
    path = checkpoint_of(net, optimizer, counters).save(tmp_path / "d")
    manifest = path / "manifest.json"
    text = manifest.read_text()
    manifest.write_text(text.replace('"lr": 0.01', '"lr": 0.02'))
    with pytest.raises(CheckpointError, match=r"sha256 of its manifest\.json"):
        checkpoint_of(*target).load(path)


def test_a_flipped_byte_in_an_archive_is_refused(tmp_path):
    net, optimizer, counters, _ = pieces(0)
    path = checkpoint_of(net, optimizer, counters, format="archive").save(
        tmp_path / "c.torchrl"
    )
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(".memmap"))
    # the member's data: after its local header (30 bytes, name, extra field)
    with open(path, "rb") as file:
        file.seek(info.header_offset + 26)
        name_length, extra_length = (
            int.from_bytes(file.read(2), "little") for _ in range(2)
        )
    flip(path, info.header_offset + 30 + name_length + extra_length + 2)
    target = pieces(1)
    before = state(target[0])
    with pytest.raises(CheckpointError) as err:
        checkpoint_of(*target).load(path)
    assert str(path) in str(err.value) and info.filename in str(err.value)
    assert same(state(target[0]), before)


def test_a_truncated_file_is_refused_naming_it(tmp_path):
    net, optimizer, counters, _ = pieces(0)
    path = checkpoint_of(net, optimizer, counters).save(tmp_path / "c")
    bad = payload(path, "net")
    data = bad.read_bytes()
    bad.write_bytes(data[:-4])
    with pytest.raises(CheckpointError, match="is truncated") as err:
        checkpoint_of(*pieces(1)).load(path)
    assert f"has {len(data) - 4} bytes where {len(data)} were written" in str(err.value)
    assert bad.relative_to(path).as_posix() in str(err.value)
    # an archive cut short
    archive = checkpoint_of(net, optimizer, counters, format="archive").save(
        tmp_path / "c.torchrl"
    )
    archive.write_bytes(archive.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated or corrupted") as err:
        checkpoint_of(*pieces(1)).load(archive)
    assert str(archive) in str(err.value)


# -- atomic write ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["directory", "archive"])
def test_a_save_killed_halfway_keeps_the_previous_checkpoint(tmp_path, fmt):
    net, optimizer, counters, _ = pieces(0)
    exploding = Exploding(3, 1)
    checkpoint = checkpoint_of(net, optimizer, counters, format=fmt, zz=exploding)
    path = checkpoint.save(tmp_path / "c")
    saved = state(net)
    with torch.no_grad():
        net.weight.add_(1.0)
    exploding.armed, exploding.frames = True, 9
    with pytest.raises(RuntimeError, match="killed while saving"):
        checkpoint.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["c"]  # nothing half-written left
    target = pieces(1)
    checkpoint_of(*target, format=fmt, zz=Exploding()).load(path)
    assert same(target[0].state_dict(), saved)


@pytest.mark.parametrize("fmt", ["directory", "archive"])
def test_every_file_and_folder_is_synced_before_it_is_published(
    tmp_path, monkeypatch, fmt
):
    # what os.fsync was called on, by path (the calls still go to the system)
    synced = []
    fsync = os.fsync

    def recording_fsync(fd):
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    path = checkpoint_of(*pieces(), format=fmt).save(tmp_path / "c")
    # the parent folder, after the rename (the last time: a TorchRL that syncs
    # its own stage syncs it before too)
    published = len(synced) - 1 - synced[::-1].index(tmp_path)
    before = synced[:published]
    stage = next(p for p in before if p.name.startswith(".c.acer-"))
    written = {p.relative_to(stage) for p in before if p.is_relative_to(stage)}
    if fmt == "directory":
        assert {p.relative_to(path) for p in path.rglob("*")} | {Path(".")} <= written
    else:
        assert before[-1] == stage.with_name(stage.name + ".zip")  # the archive


def test_an_interrupted_replacement_names_where_the_previous_checkpoint_is(tmp_path):
    path = checkpoint_of(*pieces()).save(tmp_path / "c")
    # a kill between moving the old folder aside and renaming the new one in
    aside = tmp_path / ".c.previous-0123"
    path.rename(aside)
    with pytest.raises(FileNotFoundError, match="previous checkpoint is at") as err:
        checkpoint_of(*pieces(1)).load(path)
    assert str(aside) in str(err.value)
    aside.rename(path)
    checkpoint_of(*pieces(1)).load(path)


def test_rotation_keeps_the_last_checkpoints_and_loads_the_latest(tmp_path):
    net, optimizer, counters, _ = pieces(0)
    checkpoint = checkpoint_of(net, optimizer, counters)
    rotation = CheckpointRotation(tmp_path, keep_last=2)
    for step in (8, 16, 24):
        counters.frames = step
        rotation.save(checkpoint, step=step, metadata={"collected_frames": step})
    assert [p.name for p in sorted(tmp_path.iterdir())] == [
        "checkpoint-000000000016",
        "checkpoint-000000000024",
    ]
    target = pieces(1)
    rotation.load_latest(checkpoint_of(*target))
    assert target[2].frames == 24


# -- the environments' state ---------------------------------------------------


def test_the_environments_resume_bit_for_bit(tmp_path):
    def collector(seed):
        env = make_env("CartPole-v1", num_envs=2, seed=seed)
        return Collector(
            env, RandomPolicy(env.action_spec), frames_per_batch=16, total_frames=-1
        )

    def checkpoint(collector):
        return (
            ACERCheckpoint(config=CONFIG)
            .register(
                "envs",
                CollectorState(collector),
                adapter=FiniteStateDictAdapter(
                    payload_format="torch", weights_only=False
                ),
            )
            .register("rng", GlobalRNGState())  # the random policy's
        )

    torch.manual_seed(0)
    running = collector(0)
    batches = iter(running)
    for _ in range(3):  # episodes under way
        next(batches)
    path = checkpoint(running).save(tmp_path / "c")
    expected = next(batches)
    assert not expected["next", "done"].all()
    resumed = collector(1)
    assert checkpoint(resumed).load(path).loaded == {"envs", "rng"}
    got = next(iter(resumed))
    for key in ("observation", "action", ("next", "reward"), ("next", "done")):
        assert torch.equal(got[key], expected[key]), key
    running.shutdown()
    resumed.shutdown()


# -- the config -----------------------------------------------------------------


def test_a_config_change_outside_the_safe_list_is_refused_naming_it(tmp_path):
    path = checkpoint_of(*pieces()).save(tmp_path / "c")
    relu = with_changes(CONFIG, **{"model.activation": "relu"})
    target = pieces(1)
    before = state(target[0])
    with pytest.raises(CheckpointError) as err:
        checkpoint_of(*target, config=relu).load(path)
    message = str(err.value)
    assert "model.activation: 'tanh' in the checkpoint, 'relu' now" in message
    assert "allow_config_change=[model.activation]" in message
    assert same(state(target[0]), before) and target[2].frames == 0
    # allowed by name or pattern, for one load or for the checkpoint object
    result = checkpoint_of(*target, config=relu).load(
        path, allow_config_change=["model.*"]
    )
    assert result.comparison["config_changes"] == [("model.activation", "tanh", "relu")]
    checkpoint_of(
        *pieces(1), config=relu, allow_config_change=["model.activation"]
    ).load(path)
    checkpoint_of(*pieces(1), config=relu).load(path, force=True)
    checkpoint_of(*pieces(1), config=relu, force=True).load(path)
    # settings safe to change
    longer = with_changes(CONFIG, **{"collector.total_frames": 10_000})
    result = checkpoint_of(*pieces(1), config=longer).load(path)
    assert result.loaded and result.comparison["config_changes"] == []


# -- strict loading -------------------------------------------------------------


def test_a_network_of_another_shape_is_refused_naming_the_keys(tmp_path):
    path = checkpoint_of(*pieces(out_features=2)).save(tmp_path / "c")
    wider = pieces(1, out_features=4)
    before = state(wider[0])
    with pytest.raises(CheckpointError) as err:
        checkpoint_of(*wider, force=True).load(path)
    message = str(err.value)
    assert "net.weight: (2, 3) in the checkpoint, (4, 3) here" in message
    assert "net.bias: (2,) in the checkpoint, (4,) here" in message
    assert (
        "optim.state[0].exp_avg: (2, 3) in the checkpoint, parameter (4, 3)" in message
    )
    assert "nothing was loaded" in message
    # "counters" sorts before "net": it would have loaded first
    assert same(state(wider[0]), before) and wider[2].frames == 0
    # other keys
    deeper = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(CheckpointError) as err:
        ACERCheckpoint(config=CONFIG, net=deeper).load(path, components=["net"])
    message = str(err.value)
    assert "missing net.0.weight" in message and "unexpected net.weight" in message


# -- non-finite numbers ---------------------------------------------------------


def test_no_checkpoint_from_non_finite_numbers(tmp_path):
    net, optimizer, counters, _ = pieces(0)
    checkpoint = checkpoint_of(net, optimizer, counters)
    path = checkpoint.save(tmp_path / "c")
    saved = state(net)
    with torch.no_grad():
        net.weight[0, 0] = float("nan")
    optimizer.state[net.bias]["exp_avg_sq"][0] = float("inf")
    with pytest.raises(NonFiniteCheckpointError) as err:
        checkpoint.save(path)
    message = str(err.value)
    assert "net.weight" in message and "optim.state.1.exp_avg_sq" in message
    assert "net.bias" not in message
    assert str(path) in message and "previous checkpoint there" in message
    assert [p.name for p in tmp_path.iterdir()] == ["c"]
    target = pieces(1)
    checkpoint_of(*target).load(path)
    assert same(target[0].state_dict(), saved)


# -- the old format -------------------------------------------------------------


def write_single_file_checkpoint(path, header):
    """A file of the single-file format torchrl-acer wrote before (format 1),
    written by hand: its marker, the header's and the payload's lengths and a
    sha256 (two little-endian uint64 and 32 bytes), the JSON header, the
    ``torch.save`` payload."""
    import hashlib
    import io
    import json
    import struct

    header = json.dumps({"format_version": 1, "library_version": "0.1.0", **header})
    payload = io.BytesIO()
    torch.save({"loss_module": {}}, payload)
    body = header.encode() + payload.getvalue()
    fixed = struct.pack(
        "<QQ32s", len(header), len(payload.getvalue()), hashlib.sha256(body).digest()
    )
    path.write_bytes(b"torchrl-acer checkpoint\n" + fixed + body)
    return path


def test_a_single_file_checkpoint_is_refused_naming_its_format_version(tmp_path):
    old = write_single_file_checkpoint(
        tmp_path / "last.pt", {"frames": 40, "config": CONFIG}
    )
    with pytest.raises(CheckpointError) as err:
        checkpoint_of(*pieces()).load(old)
    message = str(err.value)
    assert str(old) in message
    assert "checkpoint format 1" in message
    assert "at 40 frames" in message
    assert "cannot be loaded by this version" in message
    assert "written by torchrl-acer 0.1.0" in message
    # a trainer hands it over (is_checkpoint: yes, to refuse it by name)
    assert ACERCheckpoint.is_checkpoint(old) and not Checkpoint.is_checkpoint(old)


@pytest.mark.filterwarnings("ignore")
def test_a_trainer_refuses_a_single_file_checkpoint_naming_its_version(tmp_path):
    if "Checkpoint.is_checkpoint(file)" in inspect.getsource(Trainer.load_from_file):
        pytest.skip(
            "this TorchRL's Trainer.load_from_file asks Checkpoint, not the "
            "trainer's checkpoint, whether a file is one (upstream/torchrl/0006)"
        )
    old = write_single_file_checkpoint(tmp_path / "last.pt", {"frames": 40})
    trainer, _ = cartpole_trainer(tmp_path / "checkpoint", seed=0)
    with pytest.raises(ACERCheckpointError, match="cannot be loaded by this version"):
        trainer.load_from_file(old)


# -- the patches to torchrl.checkpoint (upstream/torchrl/0003-0006) -------------------

fixes = load_script("tools/torchrl_fixes.py")
CHECKPOINT_PATCHES = [
    p for p in fixes.PATCHES if "Checkpoint" in p.name or "load_from_file" in p.name
]


@pytest.mark.slow
def test_acer_checkpoint_works_on_a_patched_torchrl(tmp_path):
    # the patches make TorchRL sync, hash and check shapes itself: ACERCheckpoint
    # keeps working on top of them (this file's tests, against the patched copy)
    assert len(CHECKPOINT_PATCHES) == 4
    copy = fixes.patched_copy(tmp_path / "patched")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
         "-k", "not patched_torchrl and not apply_upstream"],
        cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.slow
def test_checkpoint_patches_apply_upstream_and_their_tests_pass(tmp_path):
    # TorchRL's checkpoint tests, with those the patches add
    added = (
        "test_checkpoint_is_synced_before_it_is_published",
        "test_corrupted_payload_is_refused_before_any_component_loads",
        "test_mismatched_shapes_are_named_before_any_component_loads",
    )
    result = run_patched_torchrl_tests(
        tmp_path / "checkpoint", ["test/test_checkpoint.py"], "test_checkpoint.py"
    )
    assert result.returncode == 0, result.stdout[-3000:]
    text = (tmp_path / "checkpoint" / "tests" / "test_checkpoint.py").read_text()
    assert all(name in text for name in added)
    # 0006's test, and the trainer's other checkpoint tests
    result = run_patched_torchrl_tests(
        tmp_path / "trainer",
        ["test/test_trainer.py"],
        "test_trainer.py",
        "-k",
        "unified or recognizes",
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert (
        "test_load_from_file_asks_the_trainers_checkpoint_what_it_recognizes"
        in (tmp_path / "trainer" / "tests" / "test_trainer.py").read_text()
    )
