"""SCIQL — Style-Conditioned Implicit Q-Learning (offline RL that follows commanded styles), in miniature."""
from stages.common.sources import Source

SOURCES = [Source(
    real="Minari mujoco/halfcheetah datasets (the D4RL successor; episodes with observations/actions/rewards/"
         "terminations/infos), read by stages/common/minari_io.py",
    params_key="papers.sciql.prepare.source",
    loader="stages.sciql.minari_source:load_minari_episodes",
    fixture_test="tests/sciql/test_real_source.py::test_minari_halfcheetah_into_sciql_episodes",
    note="HalfCheetah episodes in the generators' format (gait clock appended, x_velocity from infos or "
         "qvel[0]); fixture written by Minari's DataCollector on the project's HalfCheetah-v5; full sets "
         "prepare.source {kind: file, dataset: mujoco/halfcheetah/medium-v0}; Circle2D is the official toy world "
         "(no release)",
)]
