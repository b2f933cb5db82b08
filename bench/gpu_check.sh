#!/usr/bin/env bash
# The GPU check: ACER on a GPU against the CPU, and the benchmarks with the learner
# on the GPU, in one go (under 8 minutes on a lent NVIDIA H200 machine).
#
#     bash bench/gpu_check.sh [--dry-run]
#
# Steps (each runs even if one before it failed; the exit status is 1 if any did):
#   1. tests/training/test_device.py with ACER_TEST_DEVICE=cuda (junit XML written beside
#      the results): loss forward+backward, trust region and Retrace equal to the
#      CPU's, replay in host memory feeding the GPU loss, short training runs;
#   2. bench/loss.py --device cuda: the loss's overhead over its bare networks;
#   3. bench/throughput.py --device cuda: Atari training throughput with the
#      learner on the GPU (environments on the CPU) against its compute bound;
#   4. the examples as a user runs them with device=cuda, briefly: acer_gym.py
#      (CartPole) with multiprocess collection, acer_atari.py (Breakout) with one
#      process and with collector processes (each to its final checkpoint; the
#      logged env steps per second, time/fps, compared);
#   then a summary, gpu_check-<UTC stamp>.json: commit, torch/CUDA versions, the
#   GPU's name, each step's status, test counts, the benchmarks' ratios and, per
#   example, whether it warned of CUDA tensors shared with collector workers.
# Results go to ${OUT:-bench/results} (the device tool returns $OUT), with a log of
# the whole run (gpu_check-<stamp>.log): five files.
#
# On a lent GPU machine (the device tool; it starts bare and reaches no network):
#   1. here, once: bash bench/gpu_wheels.sh  (fills the ignored .whl/ with the
#      wheels that machine lacks: torchrl, tensordict, gymnasium, ale-py, hydra...);
#   2. the device tool's run, with carry [".whl"], timeout_s 540 and the command
#          ACER_COMMIT=<the output of git rev-parse HEAD here> bash bench/gpu_check.sh
#      (the copy of the working tree there has no .git, or one at another commit:
#      ACER_COMMIT names the commit in the results; commit first so that it names
#      what ran);
#   3. the reply's files lie under its files_at: copy the JSON files into
#      bench/results/ (loss_cuda-*.json, throughput_cuda-*.json, gpu_check-*.json;
#      bench/report.py reads only the CPU loss-/throughput- files) and commit them
#      with the commit they were measured at in the message; the log and the junit
#      XML are for reading.
# Here: bash bench/gpu_check.sh --dry-run runs the same steps on the CPU with tiny
# sizes (ACER_TEST_DEVICE=cpu compares the CPU with itself) and writes its results
# to a temporary folder; tests/bench/test_gpu_check.py runs it.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
ROOT=$PWD

DRY=0
case "${1:-}" in
--dry-run) DRY=1 ;;
"") ;;
*)
    echo "usage: bash bench/gpu_check.sh [--dry-run]" >&2
    exit 2
    ;;
esac

PYTHON=${PYTHON:-python3}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
if ((DRY)); then
    DEVICE=cpu
    RESULTS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
    LOSS_ARGS=(--rounds 1 --B 2 --T 4)
    THROUGHPUT_ARGS=(--batches 1 --repeats 1 --envs 2 --T 4 --prefill 1)
    # seconds per step: this CPU is slow and shared
    TEST_LIMIT=420 LOSS_LIMIT=240 THROUGHPUT_LIMIT=300 EXAMPLE_LIMIT=300
    GYM_FRAMES=640 ATARI_FRAMES=480 ATARI_WORKERS=2
    ATARI_ARGS=(env.num_envs=2 replay.start=160 replay.capacity=2000 logger.log_interval=80)
else
    DEVICE=cuda
    RESULTS_DIR=${OUT:-bench/results}
    # Sizes, from timings on 2 loaded CPU cores: the tests take 60-90 s there
    # (their CPU side runs here too); Breakout steps at about 300 agent steps/s
    # (16 envs), so the throughput run's (3 + 12 x 3) batches of 16 x 20 steps
    # take about 40 s, its updates milliseconds each on the GPU; the loss
    # benchmark's rounds take seconds. Measured at 59b4d10: 23, 23 and 48 s. Each
    # limit is about twice its step's time, so the check (296 s at 59b4d10, the
    # install and the CUDA probe seconds) stays inside a 540 s call when one step
    # hangs.
    LOSS_ARGS=(--rounds 30)
    THROUGHPUT_ARGS=(--batches 12 --repeats 3)
    TEST_LIMIT=200 LOSS_LIMIT=100 THROUGHPUT_LIMIT=180
    # The examples: start-up takes seconds, the Atari checkpoint holds the replay
    # (20k frame-lean steps, about 150 MB); Breakout in one process runs about 500
    # agent steps/s (step 3), so 20k steps there take about 40 s, fewer with 4
    # collector processes of the 16 cores. Expected: about 2 minutes for the three.
    # Measured at 59b4d10: 34, 52 and 97 s (the 4 workers' start-up and the replay's
    # checkpoint)
    EXAMPLE_LIMIT=150
    GYM_FRAMES=20000 ATARI_FRAMES=20000 ATARI_WORKERS=4
    ATARI_ARGS=(replay.start=5000 replay.capacity=20000 logger.log_interval=1000)
fi
mkdir -p "$RESULTS_DIR"
RESULTS_DIR=$(cd "$RESULTS_DIR" && pwd)
export RESULTS_DIR # bench/_common.py's save() writes there
LOG=$RESULTS_DIR/gpu_check-$STAMP.log
JUNIT=$RESULTS_DIR/test_device-$STAMP.xml
STEPS=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_steps.XXXXXX")
touch "$STEPS/start"

main() {
    if [[ -z ${ACER_COMMIT:-} ]]; then
        ACER_COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
        if [[ $ACER_COMMIT != unknown && -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
            ACER_COMMIT+=-dirty
        fi
    fi
    export ACER_COMMIT

    echo "gpu_check $STAMP: device $DEVICE, commit $ACER_COMMIT, results in $RESULTS_DIR"
    ((DRY)) && echo "(dry run: the CPU, tiny sizes)"

    FAILED=()
    # step NAME LIMIT_S CMD...: runs CMD with its output in the log and in
    # $STEPS/NAME.out, its exit status in $STEPS/NAME.rc and its seconds in NAME.s
    step() {
        local name=$1 limit=$2
        shift 2
        echo
        echo "=== $name (limit ${limit} s): $*"
        local start=$SECONDS
        timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$STEPS/$name.out"
        local rc=${PIPESTATUS[0]}
        echo "$rc" >"$STEPS/$name.rc"
        echo $((SECONDS - start)) >"$STEPS/$name.s"
        ((rc == 124 || rc == 137)) && echo "=== $name: stopped at its ${limit} s limit"
        echo "=== $name: exit status $rc after $((SECONDS - start)) s"
        ((rc == 0)) || FAILED+=("$name")
    }

    if ((!DRY)); then
        if compgen -G ".whl/*.whl" >/dev/null; then
            step install_wheels 90 "$PYTHON" -m pip install -q --no-index --no-deps \
                --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
            export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
        else
            echo "no .whl/*.whl: run bench/gpu_wheels.sh here and carry .whl if imports fail"
        fi
        command -v nvidia-smi >/dev/null &&
            nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        step cuda_available 45 "$PYTHON" -c "import torch; assert torch.cuda.is_available(), \
    'torch sees no GPU'; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
    fi
    # torchrl_acer from this working tree (it is not installed on a lent machine)
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

    step tests "$TEST_LIMIT" env ACER_TEST_DEVICE="$DEVICE" "$PYTHON" -m pytest -q -rfEs \
        -p no:cacheprovider tests/training/test_device.py --junitxml="$JUNIT"
    step loss "$LOSS_LIMIT" "$PYTHON" bench/loss.py --device "$DEVICE" "${LOSS_ARGS[@]}"
    step throughput "$THROUGHPUT_LIMIT" "$PYTHON" bench/throughput.py --device "$DEVICE" \
        "${THROUGHPUT_ARGS[@]}"

    # example NAME SCRIPT OVERRIDES...: a short run of an example on $DEVICE, its run
    # directory (summary.json, logs) in $STEPS/NAME for the summary below
    example() {
        local name=$1 script=$2
        shift 2
        step "$name" "$EXAMPLE_LIMIT" "$PYTHON" "examples/$script" device="$DEVICE" \
            logger.progress_bar=false logger.run_dir="$STEPS/$name" \
            checkpoint.every_minutes=null "$@"
    }
    example example_gym_multiprocess acer_gym.py collector.backend=multiprocess \
        collector.num_workers=2 collector.total_frames="$GYM_FRAMES" eval.interval="$GYM_FRAMES"
    # compile=false: the example's default compiles the loss, a minute or more per
    # run, which these short runs of the device path cannot spare
    atari=(env.name=ALE/Breakout-v5 collector.total_frames="$ATARI_FRAMES" "${ATARI_ARGS[@]}"
        eval.interval="$ATARI_FRAMES" eval.episodes=2 eval.max_steps=1000 compile=false)
    example example_atari_single acer_atari.py "${atari[@]}"
    example example_atari_multiprocess acer_atari.py "${atari[@]}" \
        collector.backend=multiprocess collector.num_workers="$ATARI_WORKERS"

    echo
    SUMMARY=$RESULTS_DIR/gpu_check-$STAMP.json
    STAMP=$STAMP DEVICE=$DEVICE DRY=$DRY JUNIT=$JUNIT STEPS=$STEPS SUMMARY=$SUMMARY SECONDS_SO_FAR=$SECONDS \
        "$PYTHON" - <<'EOF'
import json, os, re, sys
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

env = os.environ
steps_dir = Path(env["STEPS"])
steps, saved = {}, {}
for rc_file in sorted(steps_dir.glob("*.rc")):
    name = rc_file.stem
    steps[name] = {
        "exit_status": int(rc_file.read_text()),
        "seconds": int((steps_dir / f"{name}.s").read_text()),
    }
    found = re.findall(r"^saved (.+\.json)$", (steps_dir / f"{name}.out").read_text(), re.M)
    if found:
        saved[name] = found[-1]


def versions():
    out = {"python": sys.version.split()[0], "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    for name in ("torchrl", "tensordict", "gymnasium", "ale_py"):
        try:
            out[name] = __import__(name).__version__
        except Exception as e:  # report, do not fail the summary
            out[name] = f"not importable: {type(e).__name__}: {e}"
    return out


tests = None
if Path(env["JUNIT"]).exists():
    root = ET.parse(env["JUNIT"]).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_tests"] = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    tests = counts

loss = throughput = None
if "loss" in saved:
    rows = json.loads(Path(saved["loss"]).read_text())["rows"]
    loss = {
        r["case"]: {
            "loss_over_bare": r["loss_over_bare"],
            "bare_ms": r["median_s"]["bare"] * 1e3,
            "loss_ms": r["median_s"]["loss"] * 1e3,
        }
        for r in rows
    }
if "throughput" in saved:
    r = json.loads(Path(saved["throughput"]).read_text())
    median = lambda xs: sorted(xs)[len(xs) // 2]
    throughput = {
        "median_ratio_loop_over_bound": r["median_ratio"],
        "loop_steps_per_s": median(r["loop_steps_per_s"]),
        "bound_steps_per_s": median(r["bound_steps_per_s"]),
        "time_in_updates": median(r["time_in_updates"]),
    }

examples = {}
for name in steps:
    run_dir = steps_dir / name
    if name.startswith("example_") and (run_dir / "summary.json").exists():
        run = json.loads((run_dir / "summary.json").read_text())
        fps_csv = run_dir / "logs" / "scalars" / "time" / "fps.csv"
        rows = fps_csv.read_text().split()[1:] if fps_csv.exists() else []
        fps = [float(row.split(",")[1]) for row in rows]
        examples[name] = {
            "frames": run["frames"],
            "updates": run["updates"],
            "final_eval_reward": run["final_eval"]["reward"],
            "fps_median": sorted(fps)[len(fps) // 2] if fps else None,
            "fps_logged": len(fps),
            # CUDA tensors shared with collector workers (weights pushed from the
            # GPU learner: each worker opens a CUDA context); none since 87d0ddd
            "cuda_ipc_warning": "CudaIPCTypes" in (steps_dir / f"{name}.out").read_text(),
        }

failed = [n for n, s in steps.items() if s["exit_status"] != 0]
summary = {
    "check": "gpu_check",
    "date": env["STAMP"],
    "dry_run": env["DRY"] == "1",
    "commit": env.get("ACER_COMMIT", "unknown"),
    "device": env["DEVICE"],
    "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    "cpu_count": os.cpu_count(),
    "versions": versions(),
    "seconds": int(env["SECONDS_SO_FAR"]),
    "steps": steps,
    "failed_steps": failed,
    "tests": tests,
    "loss_over_bare": loss,
    "throughput": throughput,
    "examples": examples,
    "files": {n: Path(p).name for n, p in saved.items()},
    "ok": not failed,
}
Path(env["SUMMARY"]).write_text(json.dumps(summary, indent=2) + "\n")
shown = ("tests", "loss_over_bare", "throughput", "examples")
print(json.dumps({k: summary[k] for k in shown}, indent=1))
EOF
    summary_rc=$?
    ((summary_rc == 0)) || FAILED+=(summary)

    echo
    echo "files written to $RESULTS_DIR:"
    find "$RESULTS_DIR" -maxdepth 1 -type f -newer "$STEPS/start" -printf '  %f (%s bytes)\n' | sort
    rm -rf "$STEPS"
    if ((${#FAILED[@]})); then
        echo "gpu_check: FAILED: ${FAILED[*]}"
        exit 1
    fi
    echo "gpu_check: all steps passed"
}

# the whole run's output also goes to the log, returned with the results
main 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
