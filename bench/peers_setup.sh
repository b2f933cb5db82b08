#!/usr/bin/env bash
# The venv of the peers of bench/time_to_solve.py, bench/lunar_lander.py,
# bench/minatar_peers.py and bench/recurrent_peer.py (Stable-Baselines3, sb3-contrib,
# DI-engine; MinAtar for minatar_peers.py's games), apart from the project's: none is a
# dependency of torchrl-acer.
#   bash bench/peers_setup.sh          # creates .venv-bench (ignored by git) from scratch
#   VENV=/tmp/peers PYTHON=python3.11 TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#     bash bench/peers_setup.sh
# torch 2.13.0 CPU as in the project's venv: where the package index offers the CUDA
# build under that version, TORCH_INDEX_URL names the CPU one.
# DI-engine 0.5.3 pins setuptools<=66.1.1, which conflicts with torch 2.13: it goes in
# with --no-deps, and its runtime requirements are installed by hand below (its wandb
# pin is left out: nothing the benchmark imports uses it). LunarLander, gymnasium's and
# dizoo's (old gym's LunarLander-v2), needs Box2D: its wheel, as the project's box2d extra.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-bench}
PY=${PYTHON:-python3.11}
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
common=(numpy==1.26.4 pandas==2.2.3 gymnasium==1.4.0 torch==2.13.0)
"${PIP[@]}" stable-baselines3==2.9.2 sb3-contrib==2.9.2 "${common[@]}"
"${PIP[@]}" --no-deps di-engine==0.5.3
"${PIP[@]}" "${common[@]}" \
  DI-treetensor==0.5.0 DI-toolkit==0.3.0 easydict==1.14 tensorboardX==2.6.5 PyYAML==6.0.4 \
  enum-tools==0.13.0 tabulate==0.10.0 click==8.5.1 requests==2.34.2 einops==0.8.2 \
  Flask==2.0.3 Werkzeug==2.0.3 URLObject==3.0.0 responses==0.26.3 pynng==0.9.0 sniffio==1.3.1 \
  redis==8.1.0 mpire==2.10.2 hickle==5.0.3 trueskill==0.4.5 yapf==0.29.0 gym==0.25.1 \
  Box2D==2.3.10 pygame==2.6.1
"${PIP[@]}" minatar==1.0.15 "${common[@]}"
"$VENV/bin/python" - <<'EOF'
import ding, gymnasium, numpy, sb3_contrib, stable_baselines3, torch
from ding.policy import ACERPolicy  # noqa: F401  the path time_to_solve.py takes
from ding.worker import BaseLearner, create_serial_collector  # noqa: F401
from dizoo.box2d.lunarlander.config.lunarlander_acer_config import main_config
from dizoo.box2d.lunarlander.envs.lunarlander_env import LunarLanderEnv
from easydict import EasyDict

gymnasium.make("LunarLander-v3").reset(seed=0)  # the task lunar_lander.py trains on
from minatar.gym import register_envs

register_envs()  # minatar_peers.py's games, as ours registers them
gymnasium.make("MinAtar/Breakout-v1").reset(seed=0)
# dizoo's own env: old gym's LunarLander-v2, with dizoo's config over the env's defaults
dizoo_env = LunarLanderEnv(EasyDict({**LunarLanderEnv.default_config(), **main_config.env}))
dizoo_env.seed(0)
dizoo_env.reset()
dizoo_env.step(numpy.array([0]))
dizoo_env.close()
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(
    f"torch {torch.__version__}, stable-baselines3 {stable_baselines3.__version__}, "
    f"DI-engine {ding.__version__}, gymnasium {gymnasium.__version__}, "
    f"numpy {numpy.__version__}"
)
EOF
