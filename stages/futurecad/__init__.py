"""futurecad: FutureCAD — text-to-CAD with B-Rep grounding (BRepGround-mini, SFT + GSPO program model)."""
from stages.common.sources import Source

SOURCES = [Source(
    real="BRepGround grounding rows (HF jhlee11/BRepGround: STEP of the B-Rep before the operation, free-text "
         "queries, multi-hot face/edge labels) converted to a STEP directory + queries.jsonl; any STEP corpus "
         "(ABC/DeepCAD-style parts) with labelled queries in that schema",
    params_key="papers.futurecad.prepare.step_dir",
    loader="stages.futurecad.cad:load_step_dir",
    fixture_test="tests/futurecad/test_real_source.py::test_step_dir_fixture",
    note="default/smoke read the 4 STEP parts shipped in stages/futurecad/step_parts/ (made with CadQuery by "
         "tests/futurecad/make_step_fixtures.py) as an external evaluation set; `full` points step_dir at the real "
         "corpus. The procedural parts and programs stay the training data.",
)]
