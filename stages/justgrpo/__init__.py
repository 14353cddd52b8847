"""justgrpo: GRPO in autoregressive order for masked diffusion LMs (the flexibility trap)."""
from stages.common.sources import Source

SOURCES = [Source(
    real="LLaDA-8B-Instruct (masked-diffusion LM, local checkpoint or cached hub name) with GRPO on GSM8K train, "
         "greedy block-32 accuracy on GSM8K test (openai/gsm8k `main` schema: question, answer ending `#### n`)",
    params_key="papers.justgrpo.prepare.source / .eval_source (GSM8K train/test); papers.justgrpo.train.source "
               "(the dLLM) and .dllm",
    loader="stages.justgrpo.hf_source:load_gsm8k",
    fixture_test="tests/justgrpo/test_real_source.py::test_justgrpo_step_on_tiny_hf_dllm",
    note="full: prepare and train run the real path (GRPO from the checkpoint, no pretraining); evaluate's "
         "pass@k / parallel-decoding analysis is not wired for a real dLLM (it stops with one line)",
)]
