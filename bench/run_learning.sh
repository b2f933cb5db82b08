#!/usr/bin/env bash
# The learning benchmarks of the README, in order (hours on a 2-core CPU).
#   [JOBS=1] bash bench/run_learning.sh [cartpole|cartpole_main|cartpole_ablations|minatar|minatar_more|minatar_asterix_ablations|minatar_seaquest_ablations|minatar_multiprocess|minatar_recurrent|cartpole_pomdp|cue_recall|minatar_ablations|ablation_plots|pendulum|halfcheetah|halfcheetah_sweep|halfcheetah_scale03|halfcheetah_learned_scale|halfcheetah_plot|atari|lunar_lander|lunar_lander_sb3|lunar_lander_preset|summary_plot]...
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
L="$PY bench/learning.py"
common="eval.interval=960 eval.episodes=5"
cartpole_main() {
  $L cartpole_v0 --seeds 0 1 2 3 4 --threshold 195 \
    --protocol "CartPole-v0, env steps, greedy eval mean of 5 episodes every 960 env steps" \
    -- env.name=CartPole-v0 collector.total_frames=40000 eval.max_steps=200 $common
  $L cartpole_v1 --seeds 0 1 2 3 4 --threshold 500 \
    --protocol "CartPole-v1, env steps, greedy eval mean of 5 episodes every 960 env steps" \
    -- env.name=CartPole-v1 collector.total_frames=100000 $common
}
cartpole_ablations() {
  for task in "v0 195 40000 200" "v1 500 100000 500"; do
    set -- $task
    $L cartpole_$1_no_replay --seeds 0 1 2 3 4 --threshold $2 \
      --protocol "ablation: replay.ratio=0 (on-policy, A3C-like)" \
      -- env.name=CartPole-$1 collector.total_frames=$3 eval.max_steps=$4 replay.ratio=0 $common
    $L cartpole_$1_no_trust_region --seeds 0 1 2 3 4 --threshold $2 \
      --protocol "ablation: loss.trust_region_delta=null" \
      -- env.name=CartPole-$1 collector.total_frames=$3 eval.max_steps=$4 loss.trust_region_delta=null $common
  done
}
cartpole() {
  cartpole_main
  cartpole_ablations
}
minatar_run() {  # name game extra-overrides...
  local name=$1 game=$2; shift 2
  $L $name --seeds 0 1 2 ${JOBS:+--jobs $JOBS} \
    --protocol "MinAtar/$game-v1, 1M env steps (frames), greedy eval mean of 10 episodes every 50k steps" \
    -- env.name=MinAtar/$game-v1 collector.total_frames=1000000 eval.interval=50000 \
       eval.episodes=10 eval.max_steps=10000 logger.log_interval=10000 "$@"
}
minatar() {
  minatar_run minatar_breakout Breakout
  minatar_run minatar_space_invaders SpaceInvaders
}
minatar_more() {  # the other three games; run again to continue stopped seeds
  minatar_run minatar_asterix Asterix
  minatar_run minatar_freeway Freeway
  minatar_run minatar_seaquest Seaquest
}
minatar_asterix_ablations() {  # #19: Asterix is still rising at 1M (entropy falls steadily,
  # the trust region is inactive): more replay per collected step, and more exploration
  minatar_run minatar_asterix_ratio8 Asterix replay.ratio=8 checkpoint.interval=100000
  minatar_run minatar_asterix_entropy003 Asterix loss.entropy_coeff=0.03 checkpoint.interval=100000
}
minatar_seaquest_ablations() {  # #19: the trained policies never surface
  # (bench/seaquest_deaths.py); does more exploration find the surface?
  minatar_run minatar_seaquest_entropy003 Seaquest loss.entropy_coeff=0.03 checkpoint.interval=100000
}
minatar_multiprocess() {  # #16: learning unchanged by the backend (2 async worker processes)
  minatar_run minatar_breakout_multiprocess Breakout \
    collector.backend=multiprocess collector.num_workers=2 collector.sync=false
}
minatar_recurrent() {  # #18: the MinAtar net with an LSTM core, stored state + burn-in 5
  minatar_run minatar_breakout_lstm Breakout model.recurrent=lstm loss.burn_in=5 \
    checkpoint.interval=100000
}
variants_run() {  # prefix threshold protocol task-overrides... -- "name overrides..."...
  # 5 seeds of each variant of one task, as prefix_name
  local prefix=$1 threshold=$2 protocol=$3 task=() variant name extra
  shift 3
  while [ "$1" != "--" ]; do task+=("$1"); shift; done
  shift
  for variant in "$@"; do
    read -r name extra <<< "$variant"
    # shellcheck disable=SC2086  # extra: overrides without brackets, split on purpose
    $L ${prefix}_$name --seeds 0 1 2 3 4 ${JOBS:+--jobs $JOBS} --threshold $threshold \
      --protocol "$protocol" -- "${task[@]}" $extra
  done
}
cartpole_pomdp() {  # #18: CartPole-v1 without velocities; run again to continue stopped seeds
  # rewards x 0.1 (returns logged unscaled) in every variant: with CartPole's action
  # values of ~100 the Q head's gradients swamped the shared recurrent trunk (README)
  variants_run cartpole_pomdp 475 \
    "CartPole-v1 observing cart position and pole angle only (entries 0, 2), rewards x 0.1 for learning, 300k env steps, greedy eval mean of 5 episodes every 5k env steps (unscaled returns)" \
    env.name=CartPole-v1 "env.observation_indices=[0,2]" env.reward_scale=0.1 \
    collector.total_frames=300000 eval.interval=5000 eval.episodes=5 checkpoint.interval=50000 -- \
    "lstm_burn_in model.recurrent=lstm loss.burn_in=5" \
    "lstm_zero model.recurrent=lstm loss.recurrent_state=zero" \
    "feedforward" \
    "lstm_stored model.recurrent=lstm"
}
cue_recall() {  # #18: a cue to recall 15 steps later, in segments of T = 20 steps
  # a segment started inside an episode holds decisions whose cue it does not hold:
  # only a state that carries the cue (stored, or burned in over it) can learn there
  variants_run cue_recall 0.9 \
    "CueRecall-v0 (delay 15: 16-step episodes, return +1 or -1 at the last step), 100k env steps, greedy eval mean of 20 episodes every 5k env steps" \
    env.name=CueRecall-v0 collector.total_frames=100000 eval.interval=5000 \
    eval.episodes=20 eval.max_steps=100 checkpoint.interval=50000 -- \
    "lstm_stored model.recurrent=lstm" \
    "lstm_zero model.recurrent=lstm loss.recurrent_state=zero" \
    "lstm_burn_in model.recurrent=lstm loss.burn_in=5" \
    "feedforward"
}
minatar_ablations() {
  for game in Breakout SpaceInvaders; do
    slug=$(echo $game | sed 's/SpaceInvaders/space_invaders/; s/Breakout/breakout/')
    minatar_run minatar_${slug}_no_replay $game replay.ratio=0
    minatar_run minatar_${slug}_no_trust_region $game loss.trust_region_delta=null
  done
}
atari() {  # hours: one seed of 1M agent steps
  $L atari_breakout --seeds 0 --jobs 1 --example acer_atari \
    --protocol "ALE/Breakout-v5, 1M agent steps, training return and greedy eval of 8 games every 250k" \
    -- env.name=ALE/Breakout-v5 collector.total_frames=1000000 checkpoint.interval=100000
}
plot_runs() {  # out title group:label...; one curve (median and range over seeds) per group
  local out=$1 title=$2 pair seeds runs=() args=(); shift 2
  for pair in "$@"; do
    seeds=(bench/runs/${pair%%:*}/seed*/)  # the trailing slash skips the seed logs
    runs+=("${seeds[@]}")
    args+=(--label "${pair#*:}" --group ${#seeds[@]})
  done
  $PY -m torchrl_acer.training.plot "${runs[@]}" --out "$out" --title "$title" "${args[@]}"
}
compare_plot() {  # out title name:label...; as plot_runs, from the committed results alone
  local out=$1 title=$2; shift 2
  $PY bench/summary_figure.py --compare "$@" --out "$out" --title "$title"
}
ablation_plots() {  # the README's ablation figures, from the runs above
  local name
  for name in cartpole_v0 cartpole_v1 minatar_breakout minatar_space_invaders; do
    plot_runs bench/results/${name}_ablations.png "$name: ACER and its ablations" \
      "$name:ACER" "${name}_no_replay:replay ratio 0" "${name}_no_trust_region:no trust region"
  done
  compare_plot bench/results/minatar_asterix_ablations.png "MinAtar Asterix: ACER and its ablations" \
    "minatar_asterix:ACER (replay ratio 4, entropy 0.01)" "minatar_asterix_ratio8:replay ratio 8" \
    "minatar_asterix_entropy003:entropy 0.03"
  compare_plot bench/results/minatar_seaquest_ablations.png "MinAtar Seaquest: ACER and more exploration" \
    "minatar_seaquest:ACER (entropy 0.01)" "minatar_seaquest_entropy003:entropy 0.03"
}
halfcheetah_run() {  # name extra-overrides...; about 30 core-minutes per 1M-step run
  local name=$1; shift
  $L $name --seeds ${SEEDS:-0 1 2} --jobs 3 --example acer_mujoco \
    --protocol "HalfCheetah-v5, 1M env steps, greedy eval (policy mean) of 5 episodes every 10k env steps${*:+; $*}" \
    -- env.name=HalfCheetah-v5 collector.total_frames=1000000 checkpoint.interval=100000 "$@"
}
halfcheetah() {  # the example's defaults (fixed scale 0.1, δ = 2) and the two ablations
  halfcheetah_run halfcheetah_scale01_delta2 model.fixed_scale=0.1 loss.trust_region_delta=2.0
  halfcheetah_run halfcheetah_scale01_delta2_no_sdn model.fixed_scale=0.1 loss.trust_region_delta=2.0 \
    model.dueling=false
  halfcheetah_run halfcheetah_scale01_no_trust_region model.fixed_scale=0.1 loss.trust_region_delta=null
}
halfcheetah_sweep() {  # scale 0.1 with δ = 1 (the default before): replay ratio 4 and 8, a plain Q critic
  halfcheetah_run halfcheetah_scale01 model.fixed_scale=0.1 loss.trust_region_delta=1.0
  halfcheetah_run halfcheetah_scale01_ratio8 model.fixed_scale=0.1 loss.trust_region_delta=1.0 \
    replay.ratio=8
  SEEDS=${SEEDS:-0 1} halfcheetah_run halfcheetah_scale01_no_sdn model.fixed_scale=0.1 \
    loss.trust_region_delta=1.0 model.dueling=false
}
halfcheetah_scale03() {  # the paper's fixed scale 0.3 (δ = 1), replay ratio 4 and 16, and its ablations
  halfcheetah_run halfcheetah model.fixed_scale=0.3 loss.trust_region_delta=1.0
  halfcheetah_run halfcheetah_ratio16 model.fixed_scale=0.3 loss.trust_region_delta=1.0 replay.ratio=16
  SEEDS=${SEEDS:-0} halfcheetah_run halfcheetah_no_sdn model.fixed_scale=0.3 loss.trust_region_delta=1.0 \
    model.dueling=false
  SEEDS=${SEEDS:-0} halfcheetah_run halfcheetah_no_trust_region model.fixed_scale=0.3 \
    loss.trust_region_delta=null
}
halfcheetah_learned_scale() {  # #19: a learned scale from 0.1, with an entropy bonus against
  # its collapse; seeds 0 and 1 first, compared at 300k with the defaults (fixed 0.1), then
  # SEEDS="0 1 2 3 4" if not behind; run again to continue stopped seeds
  SEEDS=${SEEDS:-0 1} halfcheetah_run halfcheetah_learned_scale model.fixed_scale=null \
    model.initial_scale=0.1 loss.entropy_coeff=0.001
}
halfcheetah_plot() {  # the README's HalfCheetah figures, from the runs above
  compare_plot bench/results/halfcheetah_learned_scale_vs_fixed.png \
    "HalfCheetah-v5: fixed σ = 0.1 (defaults) and a learned scale" \
    "halfcheetah_scale01_delta2=learning-halfcheetah_scale01_delta2-20261201T030720Z.json:fixed σ = 0.1, δ = 2 (defaults)" \
    "halfcheetah_learned_scale:learned scale from 0.1, entropy 0.001, δ = 2"
  plot_runs bench/results/halfcheetah.png "HalfCheetah-v5: ACER (fixed scale 0.1, δ = 2) and its ablations" \
    "halfcheetah_scale01_delta2:ACER" "halfcheetah_scale01_delta2_no_sdn:no dueling network" \
    "halfcheetah_scale01_no_trust_region:no trust region"
  plot_runs bench/results/halfcheetah_sweep.png "HalfCheetah-v5: ACER's scale, δ and replay ratio" \
    "halfcheetah_scale01_delta2:scale 0.1, δ = 2, ratio 4 (defaults)" \
    "halfcheetah_scale01:scale 0.1, δ = 1, ratio 4" "halfcheetah_scale01_ratio8:scale 0.1, δ = 1, ratio 8" \
    "halfcheetah:scale 0.3, δ = 1, ratio 4"
  plot_runs bench/results/halfcheetah_ablations.png "HalfCheetah-v5: ACER (fixed scale 0.3) and its ablations" \
    "halfcheetah:ACER, replay ratio 4" "halfcheetah_ratio16:ACER, replay ratio 16" \
    "halfcheetah_no_sdn:ratio 4, no dueling network" \
    "halfcheetah_no_trust_region:ratio 4, no trust region"
}
lunar_lander() {  # #19: ours against DI-engine 0.5.3's ACER (dizoo's config), 1M env steps a run;
  # needs bash bench/peers_setup.sh and the box2d extra; run again to continue stopped runs
  $PY bench/lunar_lander.py --seeds 0 1 2 3 4 ${JOBS:+--jobs $JOBS}
}
lunar_lander_sb3() {  # #34: Stable-Baselines3 A2C, PPO, DQN (rl_zoo3 2.9.2's settings) and
  # TorchRL's PPO (the zoo's PPO settings), 500k env steps a run (ours and DI-engine are read
  # at 500k of lunar_lander's runs); needs bash bench/peers_setup.sh; run again to continue
  # (finished runs are kept)
  $PY bench/lunar_lander.py --candidates sb3_a2c sb3_ppo sb3_dqn torchrl_ppo --seeds 0 1 2 3 4 \
    --budget 500000 --runs-dir bench/runs/lunar_lander_500k --result-name lunar_lander_sb3 \
    ${JOBS:+--jobs $JOBS}
}
lunar_lander_preset() {  # #34: ours with preset=lunar_lander on the reporting seeds, to 500k env
  # steps, under lunar_lander_sb3's evaluation (report.py reads it beside the peers)
  $L lunar_lander_preset --seeds 0 1 2 3 4 --threshold 200 --jobs ${JOBS:-2} \
    --protocol "LunarLander-v3, env steps, greedy eval (argmax) mean of 10 episodes of at most 1000 steps every 10k env steps; preset=lunar_lander on the reporting seeds" \
    -- preset=lunar_lander env.name=LunarLander-v3 collector.total_frames=500000 \
       eval.interval=10000 eval.episodes=10 eval.max_steps=1000 logger.progress_bar=false
}
summary_plot() {  # the README's one-page figure: every task's main curve, from the result files
  $PY bench/summary_figure.py
}
pendulum() {
  $L pendulum --seeds 0 1 2 3 4 --threshold -200 --example acer_mujoco \
    --protocol "Pendulum-v1, env steps, greedy eval (policy mean) of 5 episodes every 5k env steps" \
    -- env.name=Pendulum-v1 collector.total_frames=150000 model.num_cells=[64,64] \
       model.fixed_scale=null loss.trust_region_delta=1.0 replay.ratio=32 optim.lr=1e-3 \
       eval.interval=5000 eval.max_steps=200 logger.log_interval=5000
}
for part in "${@:-cartpole minatar minatar_ablations}"; do
  for p in $part; do $p; done
done
