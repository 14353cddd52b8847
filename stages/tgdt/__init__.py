"""tgdt: TG-DT (text-guided decision transformer) in miniature."""
from stages.common.sources import Source

SOURCES = [Source(
    real="Minari datasets, one per task (e.g. mujoco/halfcheetah target-velocity tasks; episodes with "
         "observations/actions/rewards/terminations/infos), read by stages/common/minari_io.py",
    params_key="papers.tgdt.prepare.source",
    loader="stages.tgdt.minari_source:load_minari_tasks",
    fixture_test="tests/tgdt/test_real_source.py::test_minari_pointmass_tasks_into_prepare_rows",
    note="rows in prepare's table schema (HalfCheetah: gait clock appended, task reward recomputed from "
         "x_velocity); fixtures written by Minari's DataCollector on the project's point mass and HalfCheetah-v5. "
         "prepare reads it with source {kind: file, dataset: <Minari root>} and minari_tasks (per env, task name "
         "-> dataset id); no public Minari release has these per-task datasets, so params keep the scripted experts",
)]
