"""Every fault case of issue #15 ("long runs that cannot be lost"), tried from the
command line as a user would, and what the user sees.

    python bench/fault_cases.py [--jobs 2] [--only 5,6,13]

Each case runs ``examples/acer_gym.py`` in a subprocess with Hydra overrides (a
tiny CartPole run: a few hundred to a few thousand env steps, no evaluation but the
final one, no logger, a 16-cell MLP, one torch thread), in a temporary directory,
never in the repository. Faults that a command line cannot cause are injected by a
harness, shown as such in the table: ``python -c "$HARNESS" examples/acer_gym.py
...``, where ``$HARNESS`` imports ``fault_harness`` (written by this script to a
temporary ``HELPERS/`` directory; its source is in the result file) and runs the
example with ``runpy``. ``fault_harness`` registers ``FaultyCartPole-v1``, CartPole-v1
whose copies count their env steps together and from step ``$FAULT_AT`` on inject
``$FAULT`` (a NaN reward once, NaN rewards on every step, a NaN observation once
mid-episode, an exception); with ``$SLOW_SAVE`` it makes each checkpoint take 3 s
once a flag file exists (a second Ctrl-C while the checkpoint is written), and with
``$START_AT`` it holds a run, just before it picks its run directory, until that
time (only when two runs typed together never picked it in the same second). Signals
are sent as a terminal or a scheduler would: Ctrl-C is SIGINT to the process group
(each run is started in its own session), SIGTERM and ``kill -9`` to the process.

Results: ``bench/results/fault_cases-<UTC time>.json`` (``_common.save``: commit,
machine, every case with its command, exit status, the decisive lines, the checks
made against what README "Long runs" and the issue describe, and the tails of its
cleaned output) and a Markdown table next to it (``.md``, same stem):
``case | command | exit status | what the user sees``, with the cases that did not
behave as described listed under it. Output is cleaned: ANSI codes and torchrl's
INFO lines are dropped, temporary paths shortened (``RUN`` the case's run
directory, ``TMP`` its temporary directory, ``HELPERS`` the harness's); commands
are shown as typed from the repository root. Lines starting ``[check]`` are what
the script found afterwards (a file's size, a hash), not the program's output.

Case 9 (``env.parallel=true``, Ctrl-C) is tried ``TRIES_9`` (3) times: it fails
only now and then. Cases run ``--jobs`` at a time (2); about 10 minutes on a loaded
2-core machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from _common import checkpoint_frames, save  # noqa: E402

EXAMPLE = ROOT / "examples" / "acer_gym.py"
PY = sys.executable

# the quiet part of every run: no evaluation but a short final one, no progress bar
QUIET = [
    "eval.interval=null",
    "eval.episodes=2",
    "eval.max_steps=100",
    "logger.progress_bar=false",
    "threads=1",
]
# ... and a tiny network, no logger (the cases where neither matters)
TINY = [*QUIET, "logger.backend=null", "model.num_cells=[16]"]
LONG = "collector.total_frames=1000000"  # a run that goes on until stopped

TRIES_9 = 3  # env.parallel=true + Ctrl-C: an intermittent hang or worker traceback

HARNESS = (
    "import fault_harness, runpy, sys; sys.argv = sys.argv[1:]; "
    'runpy.run_path(sys.argv[0], run_name="__main__")'
)

FAULT_HARNESS = '''\
"""Fault injection for bench/fault_cases.py, which writes this file to HELPERS/.

FaultyCartPole-v1: CartPole-v1 whose copies (in this process) count their env steps
together and, from step $FAULT_AT on, inject $FAULT:
    reward       a NaN reward, once
    rewards      NaN rewards on every step
    observation  a NaN observation once, mid-episode (the policy acts on it)
    raise        a RuntimeError (an environment that crashes)
The count includes the few steps TorchRL's spec checks take at start.

$SLOW_SAVE=<flag file>: once that file exists, every torch.save (a checkpoint)
first touches <flag file>.saving and sleeps 3 s.

$START_AT=<epoch seconds>: just before the example picks its run directory,
wait until then (runs started together that should pick it in the same second).
"""

import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch


class Fault(gym.Wrapper):
    steps = 0
    fired = False

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        Fault.steps += 1
        kind = os.environ.get("FAULT")
        if kind and Fault.steps >= int(os.environ.get("FAULT_AT", "0")):
            if kind == "reward" and not Fault.fired:
                reward, Fault.fired = float("nan"), True
            elif kind == "rewards":
                reward = float("nan")
            elif kind == "observation" and not Fault.fired:
                if not (terminated or truncated):
                    obs, Fault.fired = np.full_like(obs, np.nan), True
            elif kind == "raise":
                raise RuntimeError(
                    f"the simulator crashed (injected at env step {Fault.steps})"
                )
        return obs, reward, terminated, truncated, info


def make_faulty_cartpole(**kwargs):
    return Fault(gym.make("CartPole-v1", **kwargs))


gym.register(id="FaultyCartPole-v1", entry_point=make_faulty_cartpole)

if os.environ.get("START_AT"):  # hold the run until then, just before it picks
    import torchrl_acer.training.experiment as _experiment  # its run directory

    _run_dir_for = _experiment.run_dir_for

    def _held_run_dir_for(cfg):
        time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
        return _run_dir_for(cfg)

    _experiment.run_dir_for = _held_run_dir_for

if os.environ.get("SLOW_SAVE"):
    _flag = Path(os.environ["SLOW_SAVE"])
    _save = torch.save

    def _slow_save(*args, **kwargs):
        if _flag.exists():
            _flag.with_name(_flag.name + ".saving").touch()
            time.sleep(3)
        return _save(*args, **kwargs)

    torch.save = _slow_save
'''

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)(:|$)")
WARNING = re.compile(r"^\S.*?:\d+: (\w*Warning: .*)$")
STDOUT_LINE = re.compile(
    r"^(resume|resumed from|interrupted|checkpoint:|final greedy evaluation|"
    r"logs:|plot:)"
)
SIGNAL_LINE = re.compile(r"^SIG[A-Z]+: ")


# -- running commands ------------------------------------------------------------


@dataclass
class Paths:
    """The replacements that shorten what is shown, longest first."""

    subs: list[tuple[str, str]] = field(default_factory=list)

    def add(self, path, name: str) -> None:
        path = str(path)
        self.subs.append((path, name))
        real = os.path.realpath(path)
        if real != path:
            self.subs.append((real, name))
        self.subs.sort(key=lambda s: -len(s[0]))

    def __call__(self, text: str) -> str:
        for path, name in self.subs:
            text = text.replace(path, name)
        return text


@dataclass
class Run:
    argv: list[str]
    env: dict
    returncode: int | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0


class Process:
    """A command started in its own session (its own process group, as a terminal's
    job), its output going to files (no pipe to fill while it runs)."""

    def __init__(self, argv, cwd: Path, env: dict | None = None, tag: str = "run"):
        cwd.mkdir(parents=True, exist_ok=True)
        self.run = Run(list(argv), dict(env or {}))
        self.out_path = cwd / f".{tag}.stdout"
        self.err_path = cwd / f".{tag}.stderr"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.run.env}
        full_env.pop("HYDRA_FULL_ERROR", None)
        self.start = time.monotonic()
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.popen = subprocess.Popen(
                self.run.argv,
                cwd=cwd,
                env=full_env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_for(self, path: Path, timeout: float = 240, test=None) -> bool:
        """Until ``path`` exists (and ``test(path)`` holds) while the process runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            if path.exists() and (test is None or _quietly(test, path)):
                return True
            time.sleep(0.05)
        return False

    def signal(self, signum: int, group: bool = False) -> None:
        try:
            if group:
                os.killpg(self.popen.pid, signum)
            else:
                self.popen.send_signal(signum)
        except ProcessLookupError:
            pass

    def finish(self, timeout: float = 300) -> Run:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.run.timed_out = True
            self.signal(signal.SIGKILL, group=True)
            self.popen.wait()
        # whatever it left in its group (environment workers): ours to end
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.run.returncode = self.popen.returncode
        self.run.seconds = round(time.monotonic() - self.start, 1)
        self.run.stdout = self.out_path.read_text(errors="replace")
        self.run.stderr = self.err_path.read_text(errors="replace")
        return self.run


def _quietly(test, path) -> bool:
    try:
        return bool(test(path))
    except Exception:
        return False


def run(argv, cwd: Path, env=None, timeout: float = 300, tag: str = "run") -> Run:
    return Process(argv, cwd, env, tag).finish(timeout)


def example(*overrides) -> list[str]:
    return [PY, str(EXAMPLE), *overrides]


def harness(*overrides) -> list[str]:
    return [PY, "-c", HARNESS, str(EXAMPLE), *overrides]


def harness_env(helpers: Path, **env) -> dict:
    return {
        "PYTHONPATH": os.pathsep.join([str(helpers), str(ROOT / "examples")]),
        **env,
    }


def shown(run_or_argv, paths: Paths, env: dict | None = None) -> str:
    """The command as typed at the repository root, ``$TINY``/``$QUIET``/``$HARNESS``
    standing for their words."""
    argv = list(run_or_argv.argv if isinstance(run_or_argv, Run) else run_or_argv)
    env = run_or_argv.env if isinstance(run_or_argv, Run) else (env or {})
    words = []
    i = 0
    while i < len(argv):
        for name, seq in (("$TINY", TINY), ("$QUIET", QUIET)):
            if argv[i : i + len(seq)] == seq:
                words.append(name)
                i += len(seq)
                break
        else:
            word = argv[i]
            if word == PY:
                words.append("python")
            elif word == HARNESS:
                words.append('"$HARNESS"')
            elif word == str(EXAMPLE):
                words.append("examples/acer_gym.py")
            else:
                words.append(shlex.quote(paths(word)))
            i += 1
    prefix = []
    for key, value in env.items():
        if key == "PYTHONPATH":
            value = "HELPERS:examples"
        prefix.append(f"{key}={shlex.quote(paths(str(value)))}")
    return " ".join(prefix + words)


def clean(text: str, paths: Paths) -> list[str]:
    lines = []
    for line in ANSI.sub("", text).splitlines():
        if "[torchrl][INFO]" in line:
            continue
        lines.append(paths(line.rstrip()))
    return lines


def decisive(run: Run, paths: Paths) -> list[str]:
    """The lines that tell what happened: warnings (deduplicated), signal messages,
    the resume / interrupt / summary lines, and the error that ended the run (its
    message and notes, without Hydra's traceback)."""
    out, err = clean(run.stdout, paths), clean(run.stderr, paths)
    seen, lines = set(), []
    for line in err:
        m = WARNING.match(line)
        if m and m.group(1) not in seen:
            seen.add(m.group(1))
            lines.append(m.group(1))
        elif SIGNAL_LINE.match(line):
            lines.append(line)
    follows = False  # the indented lines a matched line introduces (a list)
    for line in out:
        if STDOUT_LINE.match(line) or (follows and line[:1].isspace()):
            lines.append(line)
            follows = True
        else:
            follows = False
    starts = [i for i, line in enumerate(err) if EXCEPTION.match(line)]
    if starts:
        for line in err[starts[-1] :]:
            if line.strip() and not line.startswith("Set the environment variable"):
                lines.append(line)
    if run.timed_out:
        lines.append("[check] TIMED OUT: killed by this script")
    return lines


def traceback_shown(run: Run) -> bool:
    return "Traceback (most recent call last)" in run.stderr


def traceback_header(run: Run) -> str:
    """How a printed traceback is introduced: by Hydra's error report, or the line
    above it (``Process Worker<AsyncVectorEnv>-0:``, ``Exception ignored in ...``);
    empty when none is printed."""
    if not traceback_shown(run):
        return ""
    if "Error executing job" in run.stderr:
        return "after Hydra's `Error executing job` and a Traceback"
    lines = ANSI.sub("", run.stderr).splitlines()
    first = lines.index("Traceback (most recent call last):")
    above = lines[first - 1].strip() if first > 0 else ""
    return f"a Traceback under `{above}`" if above else "a Traceback"


def exit_status(rc: int | None) -> str:
    if rc is None:
        return "-"
    if rc < 0:
        return f"{128 - rc} ({signal.Signals(-rc).name})"
    return str(rc)


def sha256_tree(root: Path) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def csv_rows_past(logs: Path, checkpoint) -> int:
    """Rows of the CSV logs (``step,value``, after the header) past the
    checkpoint's frames (a path, read, or a number); partial rows count."""
    from torchrl_acer.training.experiment import CSV_HEADER

    frames = (
        checkpoint if isinstance(checkpoint, int) else checkpoint_frames(checkpoint)
    )
    n = 0
    for csv in logs.rglob("*.csv"):
        for line in csv.read_text().splitlines(keepends=True):
            if line == CSV_HEADER:
                continue
            step = line.partition(",")[0]
            if not line.endswith("\n") or not step.isdigit() or int(step) > frames:
                n += 1
    return n


def csv_steps_increase(logs: Path) -> bool:
    """Whether each CSV log's steps go strictly up (no step logged twice)."""
    from torchrl_acer.training.experiment import CSV_HEADER

    for csv in logs.rglob("*.csv"):
        rows = csv.read_text().splitlines(keepends=True)
        steps = [int(line.partition(",")[0]) for line in rows if line != CSV_HEADER]
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            return False
    return True


def checkpoint_files(path: Path) -> list[Path]:
    """The files of the checkpoint directory at ``path``, largest first."""
    files = [f for f in path.rglob("*") if f.is_file()]
    return sorted(files, key=lambda f: (-f.stat().st_size, str(f)))


def checkpoint_bytes(path: Path) -> int:
    """Bytes on disk of the checkpoint directory at ``path``: its files' sizes."""
    return sum(f.stat().st_size for f in checkpoint_files(path))


def staged_left(ckpt: Path) -> list[str]:
    """What a save leaves beside ``checkpoints/last`` while it writes (its staging
    directory, the previous checkpoint while the new one is renamed in): nothing
    once a save has finished."""
    return sorted(p.name for p in ckpt.parent.iterdir() if p.name != ckpt.name)


# -- cases -------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    name: str
    command: str
    exit: str
    sees: list[str]
    checks: dict[str, bool]
    traceback: str = ""  # how a printed traceback is introduced; "" if none
    setup: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""
    size_bytes: int | None = None
    note: str = ""  # what is worth knowing though no check fails

    @property
    def ok(self) -> bool:
        return all(self.checks.values())


def row(case, name, run: Run, paths: Paths, checks, extra=(), setup=()) -> Row:
    return Row(
        case=case,
        name=name,
        command=shown(run, paths),
        exit=exit_status(run.returncode),
        sees=[*decisive(run, paths), *extra],
        checks={k: bool(v) for k, v in checks.items()},
        traceback=traceback_header(run),
        setup=[
            {"command": shown(s, paths), "exit": exit_status(s.returncode)}
            for s in setup
        ],
        seconds=run.seconds,
        stdout_tail="\n".join(clean(run.stdout, paths))[-3000:],
        stderr_tail="\n".join(clean(run.stderr, paths))[-3000:],
    )


@dataclass
class Ctx:
    tmp: Path
    helpers: Path

    def case_dir(self, name: str) -> tuple[Path, Paths]:
        d = self.tmp / name
        d.mkdir(parents=True, exist_ok=True)
        paths = Paths()
        paths.add(self.helpers, "HELPERS")
        paths.add(d / "run", "RUN")
        paths.add(d, "TMP")
        paths.add(str(ROOT) + "/", "")
        paths.add(PY, "python")
        return d, paths


def nan_faults(ctx: Ctx, case: str) -> list[Row]:
    """1-4: faults inside the environment, through the harness."""
    fault, at, frames, name = {
        "1": ("reward", 300, 960, "NaN reward once mid-run"),
        "2": ("rewards", 300, 6000, "NaN rewards on every step from step 300 on"),
        "3": ("observation", 400, 960, "NaN observation mid-episode, policy acts"),
        "4": ("raise", 400, 960, "environment raises mid-run"),
    }[case]
    d, paths = ctx.case_dir(f"c{case}")
    r = run(
        harness(
            "env.name=FaultyCartPole-v1",
            *TINY,
            f"collector.total_frames={frames}",
            f"logger.run_dir={d / 'run'}",
        ),
        d,
        harness_env(ctx.helpers, FAULT=fault, FAULT_AT=str(at)),
    )
    err, out = r.stderr, r.stdout
    # FailureCheckpoint's note on the error: where what was trained was saved
    saved_note = f"what was trained was saved to {d / 'run' / 'checkpoints' / 'last'}"
    checks = {
        "1": {
            "exit 0": r.returncode == 0,
            "warns 'non-finite batch not trained on'": "non-finite batch not trained on"
            in err,
            "final evaluation printed": "final greedy evaluation" in out,
        },
        "2": {
            "exit 1": r.returncode == 1,
            "10 batches in a row": "10 collected batches in a row were non-finite"
            in err,
            "names the frames": re.search(r"stopped at \d+ frames", err),
            "names what the batch held": "non-finite rewards" in err,
        },
        "3": {
            "exit 1": r.returncode == 1,
            "names the observations": "the policy was given non-finite observations "
            "while collecting" in err,
            "checkpoint note naming it": saved_note in err,
        },
        "4": {
            "exit 1": r.returncode == 1,
            "its own error": "RuntimeError: the simulator crashed" in err,
            "checkpoint note naming it": saved_note in err,
        },
    }[case]
    extra = []
    ckpt = d / "run" / "checkpoints" / "last"
    if ckpt.exists():
        extra.append(f"[check] RUN/checkpoints/last: {checkpoint_frames(ckpt)} frames")
    else:
        extra.append("[check] no RUN/checkpoints/last")
    out = row(case, name, r, paths, checks, extra)
    if case == "2" and not ckpt.exists():
        out.note = (
            "the run stops without writing a checkpoint (unlike cases 3 and 4): the "
            "finite training before the streak is kept only by an earlier periodic "
            "checkpoint (checkpoint.every_minutes, 10 by default), though the error "
            "says the parameters are those of the last finite update"
        )
    return [out]


def signal_case(ctx: Ctx, case: str, attempt: str = "") -> list[Row]:
    """5, 6, 9: SIGTERM, Ctrl-C, Ctrl-C with env.parallel=true, once the first
    checkpoint exists (``attempt``: which of several tries, for the name)."""
    d, paths = ctx.case_dir(f"c{case}_{attempt.split()[1]}" if attempt else f"c{case}")
    ckpt = d / "run" / "checkpoints" / "last"
    extra_args = {
        "5": [],
        "6": [],
        "9": ["env.parallel=true", "env.num_envs=2"],
    }[case]
    p = Process(
        example(
            *TINY,
            *extra_args,
            LONG,
            "checkpoint.interval=320",
            f"logger.run_dir={d / 'run'}",
        ),
        d,
    )
    started = p.wait_for(ckpt)
    time.sleep(1.0)  # mid-run, past the first checkpoint
    signum = signal.SIGTERM if case == "5" else signal.SIGINT
    p.signal(signum, group=case != "5")
    r = p.finish(120)  # a stop takes seconds; longer is a hang
    how = {
        "5": "; then kill -TERM <pid> once RUN/checkpoints/last exists",
        "6": "; then Ctrl-C (SIGINT to its process group) once last exists",
        "9": "; then Ctrl-C (SIGINT to its process group, env workers included) "
        "once last exists",
    }[case]
    name = {
        "5": "SIGTERM mid-run",
        "6": "Ctrl-C mid-run",
        "9": "env.parallel=true, Ctrl-C to the process group",
    }[case] + (f" ({attempt})" if attempt else "")
    checks = {
        "first checkpoint appeared": started,
        f"exit {128 + signum}": r.returncode == 128 + signum,
        "resume hint": f"resume with: resume={ckpt}" in r.stdout,
        "no Traceback": not traceback_shown(r),
    }
    if case == "9":
        checks["no BrokenPipeError"] = "BrokenPipeError" not in r.stderr
    extra = []
    if ckpt.exists():
        extra.append(f"[check] last holds {checkpoint_frames(ckpt)} frames")
    out = row(case, name, r, paths, checks, extra)
    out.command += how
    return [out]


def double_sigint(ctx: Ctx) -> list[Row]:
    """7: a second Ctrl-C while the stop's checkpoint is written (slowed by the
    harness), then the checkpoint read back."""
    d, paths = ctx.case_dir("c7")
    ckpt = d / "run" / "checkpoints" / "last"
    flag = d / "slow"
    paths.add(flag, "TMP/slow")
    p = Process(
        harness(*TINY, LONG, "checkpoint.interval=320", f"logger.run_dir={d / 'run'}"),
        d,
        harness_env(ctx.helpers, SLOW_SAVE=str(flag)),
    )
    started = p.wait_for(ckpt)
    flag.touch()  # from now on each checkpoint takes 3 s
    p.signal(signal.SIGINT, group=True)
    saving = p.wait_for(flag.with_name("slow.saving"), timeout=120)
    time.sleep(0.5)
    p.signal(signal.SIGINT, group=True)
    r = p.finish(240)
    first = row(
        "7",
        "second Ctrl-C while the stop's checkpoint is written (3 s, harness)",
        r,
        paths,
        {
            "first checkpoint appeared": started,
            "second signal sent during the save": saving,
            "exit 130": r.returncode == 130,
            # GracefulStop's, through torchrl's logger (on stdout)
            "second signal's message": "SIGINT: a checkpoint is being written; "
            "it is completed first" in r.stdout + r.stderr,
            "resume hint": f"resume with: resume={ckpt}" in r.stdout,
            "no Traceback": not traceback_shown(r),
            "no staging left beside last": not staged_left(ckpt),
        },
    )
    first.command += (
        "; then touch TMP/slow and Ctrl-C once last exists, and Ctrl-C again "
        "0.5 s into the checkpoint's write"
    )
    read = run(
        [
            PY,
            "-c",
            f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
            "from _common import read_checkpoint; "
            f"m, s = read_checkpoint({str(ckpt)!r}, 'trainer_state'); "
            "files = m['metadata']['torchrl_acer']['files']; "
            'print("read back:", s["trainer_state"]["collected_frames"], "frames,", '
            'len(files), "files,", sum(f["bytes"] for f in files.values()), '
            '"bytes, sha256 verified")',
        ],
        d,
        tag="read",
    )
    stopped = re.search(r"interrupted \(SIGINT\) at (\d+) frames", r.stdout)
    second = row(
        "7",
        "... its checkpoint read back",
        read,
        paths,
        {
            "ACERCheckpoint.verify and the read succeed": read.returncode == 0,
            "holds the frames the run stopped at": stopped is not None
            and f"read back: {stopped.group(1)} frames" in read.stdout,
        },
        extra=[line for line in clean(read.stdout, paths) if line],
    )
    return [first, second]


def quick_double_sigint(ctx: Ctx) -> list[Row]:
    """7b: two Ctrl-C 50 ms apart, no harness: what a user pressing twice sees."""
    d, paths = ctx.case_dir("c7b")
    ckpt = d / "run" / "checkpoints" / "last"
    p = Process(
        example(*TINY, LONG, "checkpoint.interval=320", f"logger.run_dir={d / 'run'}"),
        d,
    )
    started = p.wait_for(ckpt)
    time.sleep(0.5)
    p.signal(signal.SIGINT, group=True)
    time.sleep(0.05)
    p.signal(signal.SIGINT, group=True)
    r = p.finish(240)
    extra = []
    complete = False
    try:
        extra.append(f"[check] last read back: {checkpoint_frames(ckpt)} frames")
        complete = True
    except Exception as err:
        extra.append(f"[check] last unreadable: {err}")
    out = row(
        "7b",
        "two Ctrl-C 50 ms apart (no harness)",
        r,
        paths,
        {
            "first checkpoint appeared": started,
            "exit 130": r.returncode == 130,
            "resume hint": f"resume with: resume={ckpt}" in r.stdout,
            "no Traceback": not traceback_shown(r),
            "checkpoint complete": complete,
        },
        extra,
    )
    out.command += "; then Ctrl-C twice, 50 ms apart, once last exists"
    return [out]


def kill9_then_resume(ctx: Ctx) -> list[Row]:
    """8: kill -9 mid-run (CSV logs), then resume from the last checkpoint."""
    d, paths = ctx.case_dir("c8")
    ckpt = d / "run" / "checkpoints" / "last"
    common = [
        *QUIET,
        "logger.backend=csv",
        "logger.log_interval=160",
        "model.num_cells=[16]",
        "checkpoint.interval=320",
        f"logger.run_dir={d / 'run'}",
    ]
    logs = d / "run" / "logs"
    p = Process(example(*common, LONG), d)
    started = p.wait_for(ckpt, test=lambda f: checkpoint_frames(f) >= 640)
    # killed once the CSV logs hold rows past the checkpoint (as a crash leaves them)
    p.wait_for(ckpt, timeout=60, test=lambda f: csv_rows_past(logs, f))
    p.signal(signal.SIGKILL)
    killed = p.finish(60)
    frames = checkpoint_frames(ckpt)
    past = csv_rows_past(logs, ckpt)
    first = row(
        "8",
        "kill -9 mid-run (CSV logs)",
        killed,
        paths,
        {"killed": killed.returncode == -signal.SIGKILL, "checkpoint there": started},
        extra=[
            f"[check] RUN/checkpoints/last: {frames} frames, complete; "
            f"RUN/logs holds {past} CSV rows past {frames} frames"
        ],
    )
    first.command += (
        "; then kill -9 <pid> once last holds >= 640 frames and the CSV logs "
        "hold rows past it"
    )
    if "leaked semaphore" in killed.stderr:
        first.note = (
            "after kill -9, multiprocessing's resource tracker (a child process that "
            "outlives it) prints a leaked-semaphore UserWarning"
        )
    total = frames + 640
    r = run(
        example(*common, f"collector.total_frames={total}", f"resume={ckpt}"),
        d,
        tag="resume",
    )
    dropped = f"resume: dropped {past} log rows written after {frames}"
    second = row(
        "8",
        f"... resumed (collector.total_frames raised to {total}, a safe change)",
        r,
        paths,
        {
            "exit 0": r.returncode == 0,
            "resumes at the checkpoint": f"resumed from {ckpt} at {frames} frames"
            in r.stdout,
            f"drops the {past} rows past it": dropped in r.stdout
            if past
            else "log rows written after" not in r.stdout,
            "every CSV's steps only go up after it": csv_steps_increase(logs),
            "ends at the total": f"after {total} env steps" in r.stdout,
        },
    )
    return [first, second]


def finished_and_copied(ctx: Ctx) -> list[Row]:
    """10, 11: resume a finished run (default run directory); resume from a copy of
    its checkpoint, without and with logger.run_dir."""
    d, paths = ctx.case_dir("c10")
    base = run(example(*TINY, "collector.total_frames=320"), d, tag="base")
    runs = sorted((d / "runs" / "CartPole-v1").glob("seed0-*"))
    if base.returncode != 0 or len(runs) != 1:
        return [
            row("10", "setup failed", base, paths, {"setup run": False}),
        ]
    run_dir = runs[0]
    paths.add(run_dir.resolve(), "RUN")
    paths.add(str(run_dir.relative_to(d)), "RUN")
    ckpt = run_dir / "checkpoints" / "last"
    before = sha256_tree(d / "runs")
    r10 = run(
        example(*TINY, "collector.total_frames=320", f"resume={ckpt.relative_to(d)}"),
        d,
        tag="finished",
    )
    after = sha256_tree(d / "runs")
    rows = [
        row(
            "10",
            "resume a finished run (RUN: a finished 320-frame run in runs/)",
            r10,
            paths,
            {
                "exit 0": r10.returncode == 0,
                "says finished, nothing changed": "is a finished run" in r10.stdout
                and "nothing changed" in r10.stdout,
                "run directory unchanged (every file's bytes)": before == after,
            },
            extra=[
                "[check] summary.json and every other file of RUN byte-identical"
                if before == after
                else "[check] RUN CHANGED: "
                + ", ".join(
                    k
                    for k in before.keys() | after.keys()
                    if before.get(k) != after.get(k)
                )
            ],
            setup=[base],
        )
    ]
    # a copy outside any run's checkpoints/ folder: make_trainer cannot tell
    # which run it belongs to (experiment.checkpoint_run_dir)
    copy = d / "elsewhere" / "last"
    shutil.copytree(ckpt, copy)
    r11 = run(
        example(*TINY, "collector.total_frames=640", f"resume={copy}"),
        d,
        tag="copy",
    )
    rows.append(
        row(
            "11",
            "resume from a copy of RUN's checkpoints/last (cp -r to TMP/elsewhere/)",
            r11,
            paths,
            {
                "refused": r11.returncode != 0,
                "cannot tell its run": "cannot tell which run directory it belongs to"
                in r11.stderr,
                "names logger.run_dir": "set logger.run_dir" in r11.stderr,
            },
        )
    )
    original = sha256_tree(run_dir)
    r11b = run(
        example(
            *TINY,
            "collector.total_frames=640",
            f"resume={copy}",
            f"logger.run_dir={d / 'other'}",
        ),
        d,
        tag="copy_run_dir",
    )
    rows.append(
        row(
            "11",
            "... the same copy with logger.run_dir set",
            r11b,
            paths,
            {
                "exit 0": r11b.returncode == 0,
                "writes into logger.run_dir": "checkpoint: "
                f"{d / 'other' / 'checkpoints' / 'last'}" in r11b.stdout,
                "the original run untouched": sha256_tree(run_dir) == original,
            },
        )
    )
    return rows


def changed_config(ctx: Ctx) -> list[Row]:
    """12: resume with another activation or width: refused with the key diff; the
    activation allowed by name."""
    d, paths = ctx.case_dir("c12")
    ckpt = d / "run" / "checkpoints" / "last"
    base_args = [*QUIET, "logger.backend=null", f"logger.run_dir={d / 'run'}"]
    base = run(
        example(*base_args, "model.num_cells=[16]", "collector.total_frames=320"),
        d,
        tag="base",
    )
    more = ["collector.total_frames=640", f"resume={ckpt}"]
    tanh = run(
        example(*base_args, "model.num_cells=[16]", *more, "model.activation=tanh"),
        d,
        tag="tanh",
    )
    wide = run(example(*base_args, "model.num_cells=[32]", *more), d, tag="wide")
    allowed = run(
        example(
            *base_args,
            "model.num_cells=[16]",
            *more,
            "model.activation=tanh",
            "resume_allow_config_change=[model.activation]",
        ),
        d,
        tag="allowed",
    )
    setup = [base]
    return [
        row(
            "12",
            "resume with model.activation=tanh (RUN: relu, 320 frames)",
            tanh,
            paths,
            {
                "refused": tanh.returncode != 0,
                "key diff": "model.activation: 'relu' in the checkpoint, 'tanh' now"
                in tanh.stderr,
                "names the way to allow it": "resume_allow_config_change"
                in tanh.stderr,
            },
            setup=setup,
        ),
        row(
            "12",
            "resume with model.num_cells=[32]",
            wide,
            paths,
            {
                "refused": wide.returncode != 0,
                "key diff": "model.num_cells: [16] in the checkpoint, [32] now"
                in wide.stderr,
            },
        ),
        row(
            "12",
            "... tanh with resume_allow_config_change=[model.activation]",
            allowed,
            paths,
            {
                "exit 0": allowed.returncode == 0,
                "resumed": "resumed from" in allowed.stdout,
                "ends at 640": "after 640 env steps" in allowed.stdout,
            },
        ),
    ]


def damaged_checkpoints(ctx: Ctx) -> list[Row]:
    """13: 8 bytes flipped in the middle of the largest file of checkpoints/last;
    that file cut in half."""
    d, paths = ctx.case_dir("c13")
    ckpt = d / "run" / "checkpoints" / "last"
    base = run(
        example(*TINY, "collector.total_frames=320", f"logger.run_dir={d / 'run'}"),
        d,
        tag="base",
    )
    damaged = checkpoint_files(ckpt)[0]  # the largest: the replay's, likely
    name = damaged.relative_to(ckpt)
    data = damaged.read_bytes()
    rows = []
    flipped = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + 8):
        flipped[i] ^= 0xFF
    for label, content, why in [
        (
            f"8 bytes flipped in the middle of last/{name}",
            bytes(flipped),
            "is corrupted",
        ),
        (f"last/{name} cut in half", data[: len(data) // 2], "is truncated"),
    ]:
        damaged.write_bytes(content)
        r = run(
            example(*TINY, "collector.total_frames=640", f"resume={ckpt}"),
            d,
            tag=why.split()[-1],
        )
        rows.append(
            row(
                "13",
                f"resume from a damaged checkpoint: {label}",
                r,
                paths,
                {
                    "refused": r.returncode != 0,
                    f"says it {why}": why in r.stderr,
                    "names the checkpoint": f"{ckpt} {why}" in r.stderr,
                    "names the file": str(name) in r.stderr,
                    "nothing written": damaged.read_bytes() == content,
                },
                setup=[base],
            )
        )
    damaged.write_bytes(data)
    return rows


def bad_config(ctx: Ctx, override: str) -> list[Row]:
    """14: a value that cannot work, refused before anything is built."""
    key = override.split("=")[0]
    d, paths = ctx.case_dir(f"c14_{key}")
    r = run(example(override), d)
    return [
        row(
            "14",
            f"bad config {override}",
            r,
            paths,
            {
                "refused": r.returncode != 0,
                "names the setting": f"bad config: {key}=" in r.stderr,
                "nothing created": not (d / "runs").exists(),
            },
        )
    ]


def spaces(ctx: Ctx, env_name: str) -> list[Row]:
    """15, 16: a continuous task, and observation spaces that are no Box."""
    case, want = {
        "Pendulum-v1": ("15", "acer_mujoco.py"),
        "Blackjack-v1": ("16", "observation space Tuple"),
        "FrozenLake-v1": ("16", "observation space Discrete"),
    }[env_name]
    d, paths = ctx.case_dir(f"c{case}_{env_name}")
    r = run(example(f"env.name={env_name}"), d)
    return [
        row(
            case,
            f"env.name={env_name}",
            r,
            paths,
            {"refused": r.returncode != 0, f"says '{want}'": want in r.stderr},
        )
    ]


def same_second(ctx: Ctx, tries: int = 2) -> list[Row]:
    """17: two runs of one seed started together, no logger.run_dir. Tried as typed
    ``tries`` times; when the two never pick their directory in the same second
    (their imports take a few seconds on a loaded machine), once more with the
    harness holding both, just before they pick it, until the same second."""
    plain = example(*TINY, "collector.total_frames=160")
    attempts = [(plain, None)] * tries + [
        (harness(*TINY, "collector.total_frames=160"), "START_AT")
    ]
    for attempt, (argv, sync) in enumerate(attempts, 1):
        d, paths = ctx.case_dir(f"c17_{attempt}")
        env = None
        if sync:
            start_at = f"{int(time.time()) + 30}.05"  # after both have imported
            env = harness_env(ctx.helpers, START_AT=start_at)
        a, b = Process(argv, d, env, tag="a"), Process(argv, d, env, tag="b")
        ra, rb = a.finish(), b.finish()
        dirs = sorted(p.name for p in (d / "runs" / "CartPole-v1").glob("seed0-*"))
        stamps = {re.match(r"seed0-(\d{8}-\d{6})", n).group(1) for n in dirs}
        if len(stamps) == 1:
            break
    seen = [
        f"run a: {line}" for line in clean(ra.stdout, paths) if "checkpoint:" in line
    ] + [f"run b: {line}" for line in clean(rb.stdout, paths) if "checkpoint:" in line]
    cmd = shown(ra, paths)
    if sync:
        cmd = cmd.replace(f"START_AT={start_at}", "START_AT=<a second ahead>")
    return [
        Row(
            case="17",
            name="two runs of seed 0 started at once, no logger.run_dir"
            + (
                f" (the harness holds both until the same second before they pick "
                f"their directory: {tries} plain tries picked in different seconds)"
                if sync
                else ""
            ),
            command=f"{cmd} & {cmd} & wait",
            exit=f"{exit_status(ra.returncode)}, {exit_status(rb.returncode)}",
            sees=[*seen, f"[check] runs/CartPole-v1/: {', '.join(dirs)}"],
            checks={
                "both exit 0": ra.returncode == rb.returncode == 0,
                "two distinct directories": len(dirs) == 2,
                f"started in the same second (try {attempt} of {len(attempts)})": len(
                    stamps
                )
                == 1,
            },
            traceback=traceback_header(ra) or traceback_header(rb),
            seconds=max(ra.seconds, rb.seconds),
            stderr_tail="\n".join(clean(ra.stderr + rb.stderr, paths))[-3000:],
        )
    ]


def checkpoint_size(ctx: Ctx, env_name: str, frames: int) -> list[Row]:
    """18: bytes on disk of checkpoints/last (its files) after a short run with the
    default replay."""
    d, paths = ctx.case_dir(f"c18_{env_name.replace('/', '_')}")
    ckpt = d / "run" / "checkpoints" / "last"
    args = [*QUIET, "logger.backend=null"]
    if env_name != "CartPole-v1":
        args.append(f"env.name={env_name}")
    r = run(
        example(
            *args, f"collector.total_frames={frames}", f"logger.run_dir={d / 'run'}"
        ),
        d,
    )
    size = checkpoint_bytes(ckpt) if ckpt.exists() else None
    out = row(
        "18",
        f"checkpoint size, {env_name} after {frames} env steps (default model and "
        f"replay capacity)",
        r,
        paths,
        {"exit 0": r.returncode == 0, "checkpoint written": size is not None},
        extra=[
            f"[check] RUN/checkpoints/last: {size:,} bytes ({size / 1e6:.2f} MB)"
            if size
            else "[check] no checkpoint"
        ],
    )
    out.command += "; then du -sb --apparent-size RUN/checkpoints/last"
    out.size_bytes = size
    return [out]


def jobs(ctx: Ctx) -> list[tuple[str, Callable[[], list[Row]]]]:
    """(case, job), the slow ones first; the tries of case 9 (each with four
    environment worker processes) not side by side."""
    tries = [
        ("9", lambda k=k: signal_case(ctx, "9", f"try {k} of {TRIES_9}"))
        for k in range(1, TRIES_9 + 1)
    ]
    out = [
        ("8", lambda: kill9_then_resume(ctx)),
        *tries[:1],
        ("2", lambda: nan_faults(ctx, "2")),
        ("10", lambda: finished_and_copied(ctx)),
        *tries[1:2],
        ("12", lambda: changed_config(ctx)),
        ("13", lambda: damaged_checkpoints(ctx)),
        *tries[2:],
        ("7", lambda: double_sigint(ctx)),
        ("7b", lambda: quick_double_sigint(ctx)),
        ("5", lambda: signal_case(ctx, "5")),
        ("6", lambda: signal_case(ctx, "6")),
        ("17", lambda: same_second(ctx)),
        ("18", lambda: checkpoint_size(ctx, "CartPole-v1", 480)),
        ("18", lambda: checkpoint_size(ctx, "MinAtar/Breakout-v1", 800)),
        ("1", lambda: nan_faults(ctx, "1")),
        ("3", lambda: nan_faults(ctx, "3")),
        ("4", lambda: nan_faults(ctx, "4")),
        ("15", lambda: spaces(ctx, "Pendulum-v1")),
        ("16", lambda: spaces(ctx, "Blackjack-v1")),
        ("16", lambda: spaces(ctx, "FrozenLake-v1")),
    ]
    for override in (
        "replay.ratio=inf",
        "eval.max_steps=0",
        "loss.critic_coeff=-1",
        "loss.entropy_coeff=-0.01",
        "replay.batch_segments=0",
        "optim.lr=abc",
        "env.num_envs=two",
    ):
        out.append(("14", lambda o=override: bad_config(ctx, o)))
    return out


# -- the table ---------------------------------------------------------------------


def _case_key(case: str):
    m = re.match(r"(\d+)(\w*)", case)
    return int(m.group(1)), m.group(2)


def md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[Row], json_name: str, commit: str, seconds: float) -> str:
    lines = [
        "# Fault cases of issue #15, tried from the command line",
        "",
        f"`python bench/fault_cases.py` (commit {commit}, {seconds:.0f} s); the data: "
        f"`{json_name}`. Commands as typed at the repository root, with",
        "",
        "```bash",
        f"QUIET={shlex.quote(' '.join(QUIET))}",
        f"TINY={shlex.quote(' '.join(TINY))}",
        f"HARNESS={shlex.quote(HARNESS)}",
        "```",
        "",
        "`HELPERS/fault_harness.py` registers `FaultyCartPole-v1` (CartPole-v1 "
        "injecting `$FAULT` from its copies' `$FAULT_AT`-th env step on) and, with "
        "`$SLOW_SAVE`, makes each checkpoint take 3 s once that file exists; its "
        "source is in the JSON. `RUN` is the case's run directory, `TMP` its "
        "temporary directory. `[check]` lines are what the script found afterwards, "
        "not program output. Exit status 137 (SIGKILL) is the shell's 128 + 9.",
        "",
        "| case | command | exit status | what the user sees (the decisive line(s)) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        sees = "<br>".join(f"`{md_cell(s)}`" for s in r.sees) or "(nothing)"
        if r.traceback:
            sees += f"<br>({md_cell(r.traceback)})"
        lines.append(
            f"| {r.case} {md_cell(r.name)} | `{md_cell(r.command)}` | {r.exit} | "
            f"{sees} |"
        )
    noted = [r for r in rows if r.note]
    if noted:
        lines += ["", "## Notes", ""]
        lines += [f"- case {r.case} ({r.name}): {r.note}" for r in noted]
    bad = [r for r in rows if not r.ok]
    lines += ["", "## Not as the README or the issue describe", ""]
    if not bad:
        lines.append("None: every check held.")
    for r in bad:
        failed = ", ".join(k for k, v in r.checks.items() if not v)
        lines.append(f"- case {r.case} ({r.name}): {failed}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    parser.add_argument("--only", default="", help="comma-separated case numbers")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = parser.parse_args()
    only = {c.strip() for c in args.only.split(",") if c.strip()}

    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="fault_cases-"))
    helpers = tmp / "helpers"
    helpers.mkdir()
    (helpers / "fault_harness.py").write_text(FAULT_HARNESS)
    ctx = Ctx(tmp, helpers)
    todo = [(c, job) for c, job in jobs(ctx) if not only or c in only]
    rows: list[Row] = []
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [(c, pool.submit(job)) for c, job in todo]
            for case, future in futures:
                try:
                    got = future.result()
                except Exception as err:  # a case that broke the script: a row too
                    got = [
                        Row(
                            case,
                            "the script failed on this case",
                            "-",
                            "-",
                            [f"{type(err).__name__}: {err}"],
                            {"ran": False},
                        )
                    ]
                for r in got:
                    print(
                        f"[{'ok' if r.ok else 'DIFFERS'}] {r.case} {r.name}: "
                        f"exit {r.exit}",
                        flush=True,
                    )
                rows += got
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    rows.sort(key=lambda r: _case_key(r.case))  # stable: a case's rows keep order
    seconds = time.monotonic() - start
    payload = {
        "seconds": round(seconds, 1),
        "tiny_overrides": {"QUIET": QUIET, "TINY": TINY},
        "harness": HARNESS,
        "fault_harness_py": FAULT_HARNESS,
        "cases": [
            {
                "case": r.case,
                "name": r.name,
                "command": r.command,
                "exit_status": r.exit,
                "sees": r.sees,
                "traceback_shown": r.traceback,  # how it is introduced; "" if none
                "checks": r.checks,
                "as_described": r.ok,
                "note": r.note,
                "setup": r.setup,
                "seconds": r.seconds,
                **(
                    {"checkpoint_bytes": r.size_bytes}
                    if r.size_bytes is not None
                    else {}
                ),
                "stdout_tail": r.stdout_tail,
                "stderr_tail": r.stderr_tail,
            }
            for r in rows
        ],
    }
    path = save("fault_cases", payload)
    commit = json.loads(path.read_text())["commit"]
    md = path.with_suffix(".md")
    md.write_text(markdown(rows, path.name, commit, seconds))
    print(f"wrote {path} and {md} ({seconds:.0f} s)")


if __name__ == "__main__":
    main()
