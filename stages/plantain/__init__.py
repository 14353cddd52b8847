"""plantain: PLANTAIN plan-first interleaved reasoning (SFT + GRPO, TTFR, Rewind-and-Repeat)."""
from stages.common.sources import Source

SOURCES = [Source(
    real="Qwen3-4B (instruction LM) SFT'd on plan-first traces (MATH-500-style jsonl: problem, answer + the teacher's "
         "<think>/<answer> trace; no public PLANTAIN set, schema read from the author's repo), GRPO, evaluated on "
         "MATH-500 test",
    params_key="papers.plantain.prepare.source / .eval_source (records); papers.plantain.train.source (the LM)",
    loader="stages.plantain.hf_source:load_plantain_records",
    fixture_test="tests/plantain/test_real_source.py::test_plantain_sft_grpo_rr_on_tiny_hf_model",
    note="full: prepare, train (SFT + GRPO per format) and evaluate (pass@1, TTFR, R&R -> metrics.json) run the real "
         "path with the rule-based plan judge standing in for the LLM judge; report's claims are toy-only",
)]
