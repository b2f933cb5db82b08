# Copyright (c) Meta Platforms, Inc. and affiliates.
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
"""Entries for the ``commands`` dict of
``.github/unittest/linux_sota/scripts/test_sota.py``: each runs a script end to
end at tiny settings (a few collected batches, replayed updates from the first
batch on, one short greedy evaluation)."""

ACER_ENTRIES = {
    "acer_atari": """python sota-implementations/acer/acer_atari.py \
  env.num_envs=2 \
  env.max_episode_steps=20 \
  collector.segment_length=5 \
  collector.total_frames=80 \
  replay.start=10 \
  replay.capacity=100 \
  replay.batch_segments=2 \
  logger.backend= \
  logger.test_interval=40 \
  logger.num_test_episodes=1
""",
    "acer_mujoco": """python sota-implementations/acer/acer_mujoco.py \
  env.num_envs=2 \
  collector.segment_length=10 \
  collector.total_frames=40 \
  replay.start=20 \
  replay.capacity=100 \
  replay.batch_segments=2 \
  logger.backend= \
  logger.test_interval=40 \
  logger.num_test_episodes=1
""",
}
