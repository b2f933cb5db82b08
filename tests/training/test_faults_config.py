"""Bad configurations are refused at start, naming the key, the value and what it
must be, before any environment or network is built; run directories never
collide; Ctrl-C with parallel environments ends with the resume hint."""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from builders import run_example
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from torchrl.checkpoint import CheckpointError

from torchrl_acer.trainers import ACERTrainer, GreedyEvaluator, hooks
from torchrl_acer.trainers.checkpoint import ACERCheckpointError
from torchrl_acer.trainers.hooks import RunDirInUseError, lock_run_dir
from torchrl_acer.training import experiment
from torchrl_acer.training.experiment import check_config, run_dir_for
from torchrl_acer.training.refusal import ConfigError, Refusal, report_refusals

EXAMPLES = Path(__file__).parents[2] / "examples"
CONFIGS = ("config_gym", "config_atari", "config_mujoco")


@pytest.fixture(scope="module")
def configs():
    """The three example configs, composed by Hydra as the scripts get them."""
    with initialize_config_dir(config_dir=str(EXAMPLES), version_base="1.3"):
        return {name: compose(name) for name in CONFIGS}


def with_override(cfg, override):
    """``cfg`` with one command-line override (``key=value``), parsed by Hydra's
    own parser, as ``python examples/acer_gym.py key=value`` would have it (one
    compose per case would cost a third of a second)."""
    parsed = OverridesParser.create().parse_overrides([override])[0]
    cfg = OmegaConf.create(OmegaConf.to_container(cfg))
    OmegaConf.update(cfg, parsed.key_or_group, parsed.value(), merge=False)
    return cfg


# (override, the refusal's text after "bad config: "); each was accepted before
# (or died with a bare TypeError), then went wrong later or silently
REFUSED = [
    # no replay at all: torch.poisson(inf) is a huge negative count
    ("replay.ratio=inf", "replay.ratio=inf must be a finite number >= 0"),
    ("replay.ratio=nan", "replay.ratio=nan must be a finite number >= 0"),
    ("replay.ratio=fast", "replay.ratio='fast' must be a finite number >= 0"),
    # a return of 0 reported without playing
    ("eval.max_steps=0", "eval.max_steps=0 must be an integer >= 1"),
    ("loss.critic_coeff=-1", "loss.critic_coeff=-1 must be a finite number >= 0"),
    ("loss.entropy_coeff=-0.01", "loss.entropy_coeff=-0.01 must be a finite number"),
    # silently num_envs
    ("replay.batch_segments=0", "replay.batch_segments=0 must be an integer >= 1"),
    ("replay.batch_segments=-4", "replay.batch_segments=-4 must be an integer >= 1"),
    # strings, and bools, for numbers: a bare TypeError, or accepted
    ("optim.lr=abc", "optim.lr='abc' must be a finite number > 0"),
    ("optim.lr=true", "optim.lr=true must be a finite number > 0"),
    ("optim.lr=inf", "optim.lr=inf must be a finite number > 0"),
    ("env.num_envs=two", "env.num_envs='two' must be an integer >= 1"),
    ("loss.gamma=high", "loss.gamma='high' must be a finite number in (0, 1]"),
    ("replay.capacity=big", "replay.capacity='big' must be an integer >= 1"),
    ("collector.total_frames=1e6", "collector.total_frames=1000000.0 must be an int"),
    # the rest of the sweep
    ("collector.T=2.5", "collector.T=2.5 must be an integer >= 1"),
    ("loss.ratio_clip=0", "loss.ratio_clip=0 must be a number > 0"),
    ("loss.trust_region_delta=0", "loss.trust_region_delta=0 must be a number > 0"),
    ("loss.trust_region_space=kl", "loss.trust_region_space='kl' must be 'logits',"),
    ("optim.eps=-1e-5", "optim.eps=-1e-05 must be a finite number >= 0"),
    ("optim.decay=1.5", "optim.decay=1.5 must be a finite number in [0, 1)"),
    ("optim.max_grad_norm=0", "optim.max_grad_norm=0 must be a number > 0"),
    ("env.num_envs=2.0", "env.num_envs=2.0 must be an integer >= 1"),
    ("env.parallel=1", "env.parallel=1 must be true or false"),
    ("eval.episodes=1.5", "eval.episodes=1.5 must be an integer >= 1"),
    ("eval.interval=0", "eval.interval=0 must be an integer >= 1, or null"),
    ("logger.log_interval=0", "logger.log_interval=0 must be an integer >= 1"),
    ("checkpoint.interval=0", "checkpoint.interval=0 must be an integer >= 1"),
    ("checkpoint.interval=-5", "checkpoint.interval=-5 must be an integer >= 1"),
    ("seed=1.5", "seed=1.5 must be an integer >= 0"),
    ("seed=-1", "seed=-1 must be an integer >= 0"),
    ("threads=-2", "threads=-2 must be an integer >= 1, or null"),
    ("model.num_cells=[64,0]", "model.num_cells=[64, 0] must be a list of integers"),
    ("model.activation=gelu", "model.activation='gelu' must be 'relu' or 'tanh'"),
]


@pytest.mark.parametrize("override, message", REFUSED)
def test_bad_value_is_refused_naming_key_value_and_expectation(
    configs, override, message
):
    with pytest.raises(ValueError, match="bad config: " + re.escape(message)):
        check_config(with_override(configs["config_gym"], override))


@pytest.mark.parametrize(
    "name, override, message",
    [
        (
            "config_atari",
            "env.repeat_action_probability=2",
            "env.repeat_action_probability=2 must be a finite number in [0, 1]",
        ),
        (
            "config_atari",
            "env.num_threads=-1",
            "env.num_threads=-1 must be an integer >= 0",
        ),
        ("config_atari", "replay.ratio=inf", "replay.ratio=inf must be a finite"),
        (
            "config_mujoco",
            "model.fixed_scale=0",
            "model.fixed_scale=0 must be a finite number > 0, or null",
        ),
        (
            "config_mujoco",
            "model.num_samples=0",
            "model.num_samples=0 must be an integer >= 1",
        ),
        (
            "config_mujoco",
            "eval.max_steps=abc",
            "eval.max_steps='abc' must be an integer >= 1",
        ),
    ],
)
def test_atari_and_mujoco_settings_are_checked(configs, name, override, message):
    with pytest.raises(ValueError, match="bad config: " + re.escape(message)):
        check_config(with_override(configs[name], override))


def test_null_where_it_means_something_and_not_elsewhere(configs):
    for name in CONFIGS:  # the shipped configs pass
        check_config(configs[name])
    cfg = configs["config_gym"]
    for override in (
        "loss.critic_coeff=null",  # no critic term
        "loss.trust_region_delta=null",
        "optim.max_grad_norm=null",
        "replay.batch_segments=null",  # num_envs segments
        "eval.interval=null",
        "checkpoint.interval=null",
        "loss.ratio_clip=inf",  # no truncation: works
    ):
        check_config(with_override(cfg, override))
    # the evaluator loops range(max_steps): null cannot work
    with pytest.raises(ValueError, match="eval.max_steps=null must be an integer"):
        check_config(with_override(cfg, "eval.max_steps=null"))
    with pytest.raises(ValueError, match="optim.lr=null must be a finite number"):
        check_config(with_override(cfg, "optim.lr=null"))


def test_the_library_refuses_infinite_replay_ratio_and_zero_eval_steps():
    # refused before any of the pieces is touched
    with pytest.raises(ValueError, match="replay_ratio must be >= 0 and finite"):
        ACERTrainer(
            collector=None,
            loss_module=None,
            optimizer=None,
            total_frames=10,
            replay_ratio=float("inf"),
        )
    with pytest.raises(ValueError, match="max_steps must be >= 1, got 0"):
        GreedyEvaluator(None, None, max_steps=0)


def assert_refused(out, message: str) -> None:
    """``out`` (a finished example) was refused: status 1, and stderr holds the
    refusal's message alone (``message`` is its start), without Hydra's "Error
    executing job" or a traceback around it."""
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.lstrip().startswith(message), out.stderr[-3000:]
    for noise in ("Traceback", "Error executing job", "HYDRA_FULL_ERROR"):
        assert noise not in out.stderr, out.stderr[-3000:]


@pytest.mark.parametrize("script", ["acer_gym.py", "acer_atari.py", "acer_mujoco.py"])
def test_a_refusal_ends_with_its_message_alone(tmp_path, script):
    out = run_example(script, "optim.lr=abc", cwd=tmp_path)
    assert_refused(out, "bad config: optim.lr='abc' must be a finite number > 0")
    assert out.stderr.strip().count("\n") == 0  # one line


def test_the_debug_switch_shows_a_refusals_traceback(tmp_path):
    out = run_example(
        "acer_gym.py", "optim.lr=abc", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"}
    )
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "ConfigError: bad config: optim.lr=" in (
        out.stderr
    ), out.stderr[-3000:]


def test_report_refusals_lets_other_errors_through_with_their_traceback(capsys):
    @report_refusals
    def refuses():
        raise ConfigError("bad config: x=1 must be 2")

    @report_refusals
    def fails():
        raise RuntimeError("a bug")

    @report_refusals
    def refused_by_torchrl():  # a checkpoint TorchRL's own checks refuse
        raise CheckpointError("checkpoint c has no component 'x'")

    with pytest.raises(SystemExit) as exit_:
        refuses()
    assert exit_.value.code == 1
    assert capsys.readouterr().err == "bad config: x=1 must be 2\n"
    with pytest.raises(RuntimeError, match="a bug"):
        fails()
    with pytest.raises(SystemExit) as exit_:
        refused_by_torchrl()
    assert exit_.value.code == 1
    assert capsys.readouterr().err == "checkpoint c has no component 'x'\n"
    # the refusals of the checkpoint, the run directory and the environments are
    # refusals; the errors they stand for still catch them
    assert issubclass(ACERCheckpointError, (Refusal, ValueError, CheckpointError))
    assert issubclass(RunDirInUseError, (Refusal, RuntimeError))


TINY = [
    "env.num_envs=2",
    "collector.T=10",
    "replay.ratio=0",
    "eval.interval=null",
    "eval.episodes=1",
    "eval.max_steps=20",
    "logger.backend=null",
    "logger.progress_bar=false",
    "model.num_cells=[8]",
]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """The checkpoint of a 40-frame run of ``acer_gym.py``."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    out = run_example(
        "acer_gym.py",
        *TINY,
        "collector.total_frames=40",
        f"logger.run_dir={run}",
        cwd=run.parent,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return run / "checkpoints" / "last"


def _corrupted(checkpoint, tmp_path):
    """A copy of ``checkpoint`` with one byte of its largest file flipped."""
    corrupted = tmp_path / "corrupted"
    shutil.copytree(checkpoint, corrupted)
    files = [p for p in (corrupted / "components").rglob("*") if p.is_file()]
    largest = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[-100] ^= 0xFF
    largest.write_bytes(bytes(data))
    return corrupted


# (what is refused, the overrides given the checkpoint and a tmp_path, the start
# of the refusal); each run ended with Hydra's "Error executing job" and a
# traceback around the message
REFUSED_RUNS = {
    "another config": (
        lambda ckpt, tmp: [f"resume={ckpt}", "model.activation=tanh"],
        lambda ckpt, tmp: f"{ckpt} was written with another config",
    ),
    "a corrupted checkpoint": (
        lambda ckpt, tmp: [f"resume={_corrupted(ckpt, tmp)}"],
        lambda ckpt, tmp: f"{tmp / 'corrupted'} is corrupted",
    ),
    "no checkpoint": (
        lambda ckpt, tmp: ["resume=nothing.pt"],
        lambda ckpt, tmp: "resume: no checkpoint at nothing.pt",
    ),
    "an unknown environment": (
        lambda ckpt, tmp: ["env.name=CartPol-v1"],
        lambda ckpt, tmp: "env.name='CartPol-v1' is not a registered gymnasium id",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_RUNS))
def test_a_run_refused_ends_with_its_message_alone(tiny_checkpoint, tmp_path, case):
    overrides, message = REFUSED_RUNS[case]
    out = run_example(
        "acer_gym.py",
        *TINY,
        "collector.total_frames=80",
        f"logger.run_dir={tmp_path / 'b'}",
        *overrides(tiny_checkpoint, tmp_path),
        cwd=tmp_path,
    )
    assert_refused(out, message(tiny_checkpoint, tmp_path))
    if case == "another config":
        assert "model.activation: 'relu' in the checkpoint, 'tanh' now" in out.stderr


def test_a_run_directory_in_use_is_refused_with_its_message_alone(tmp_path):
    run = tmp_path / "run"
    lock_run_dir(run)  # held by this process
    try:
        out = run_example(
            "acer_gym.py",
            *TINY,
            "collector.total_frames=40",  # unrefused, it ends soon
            f"logger.run_dir={run}",
            cwd=tmp_path,
        )
    finally:
        os.close(hooks._RUN_DIR_LOCKS.pop(run.resolve()))
    assert_refused(out, f"run directory {run.resolve()} is in use")


def test_the_script_refuses_before_building_anything(tmp_path):
    out = run_example("acer_gym.py", "replay.ratio=fast", cwd=tmp_path)
    assert_refused(out, "bad config: replay.ratio='fast' must be a finite number >= 0")
    # no run directory, no environment (TorchRL logs its spec check when one is)
    assert not (tmp_path / "runs").exists()
    assert "check_env_specs" not in out.stdout + out.stderr


def test_run_directories_never_collide(configs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # every run starts in the same second
    monkeypatch.setattr(experiment.time, "strftime", lambda fmt: "20990101-000000")
    cfg = configs["config_gym"]
    dirs = []
    threads = [
        threading.Thread(target=lambda: dirs.append(run_dir_for(cfg))) for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(dirs)) == 6 and all(d.is_dir() for d in dirs)
    base = Path("runs/CartPole-v1/seed0-20990101-000000")
    assert sorted(dirs) == sorted(
        [base] + [base.with_name(f"{base.name}-{n}") for n in range(2, 7)]
    )
    # a run directory the user names is theirs: the same one each time, not made
    named = with_override(cfg, f"logger.run_dir={tmp_path / 'mine'}")
    assert run_dir_for(named) == run_dir_for(named) == tmp_path / "mine"
    assert not (tmp_path / "mine").exists()


def _env_workers(group: int) -> list[int]:
    """The live processes of a process group that multiprocessing spawned as
    workers (the gymnasium AsyncVectorEnv's; not its resource tracker)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == group:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        state, _, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == group and state != "Z" and b"spawn_main" in cmdline:
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_ctrl_c_with_parallel_envs_prints_the_resume_hint(tmp_path):
    """A terminal's Ctrl-C goes to the whole process group, the environments'
    worker processes included: one that died of it broke its pipe, and closing the
    environments raised BrokenPipeError instead of printing the resume hint.

    The signal reaches the workers first here, and the main process once they had
    time to act on it: the order a loaded machine may run them in, and the one
    that showed the fault every time (with the signal sent to the whole group at
    once, the main process sometimes closed the pipes before a worker died)."""
    run = tmp_path / "run"
    process = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLES / "acer_gym.py"),
            "env.parallel=true",
            "env.num_envs=1",
            "collector.T=5",
            "checkpoint.interval=5",  # a checkpoint file once training runs
            "replay.ratio=0",
            "eval.interval=null",
            "eval.episodes=1",
            "logger.backend=null",
            "logger.progress_bar=false",
            "model.num_cells=[8]",
            f"logger.run_dir={run}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's job
    )
    try:
        deadline = time.monotonic() + 300
        checkpoint = run / "checkpoints" / "last"
        while not checkpoint.exists() and process.poll() is None:
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()[1][-3000:]
        workers = _env_workers(process.pid)
        assert len(workers) == 2, workers  # training's and evaluation's
        for pid in workers:
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 5  # those that die of it do so at once
        while _env_workers(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends, to every process
        out, err = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert "BrokenPipeError" not in err and "Traceback" not in err, err[-3000:]
    assert f"resume with: resume={checkpoint}" in out, out[-3000:] + err[-3000:]
    assert process.returncode == 130
