"""INDUCTION: finite-structure concept synthesis (prepare / train / evaluate / report)."""
from stages.common.sources import Source

SOURCES = [Source(
    real=("SerafimBatzoglou/concept-synth benchmarks/induction release (MIT): "
          "data/induction_fullobs_benchmarked36_generated_iid_holdout_v1.jsonl (released holdout worlds of the new36 "
          "FullObs tasks), data/induction_{fullobs,ci,ec}_v1.yaml.gz and induction_fullobs_benchmarked36_v1.yaml.gz "
          "(benchmark records), eval/*_challenge100_round1_report.json (published LLM results per task), "
          "vendored under stages/induction/upstream/ with LICENSE and SOURCE.md (commit)"),
    params_key="papers.induction.prepare.upstream_dir",
    loader="stages.induction.concept_synth:load_upstream_dir",
    fixture_test="tests/induction/test_concept_synth.py::test_fixture_loads_upstream_schema",
    note=("read by every profile when vendored (upstream: auto); the synthetic generator suites run alongside; "
          "nothing is downloaded"),
)]
