"""unembed_rank: effective rank of the unembedding matrix vs language-model performance.

    python -m stages prepare unembed_rank    # byte-level corpus (stdlib Python = in-domain, C headers = OOD)
    python -m stages train unembed_rank      # equal tokens (bs x wd x final LR x width), equal steps, saturation probe
    python -m stages evaluate unembed_rank   # final losses through the fused linear+CE kernel, geometry, analyses
    python -m stages report unembed_rank     # report.md, claims, figures
"""
from stages.common.sources import Source

SOURCES = [
    Source(
        real="HF causal-LM checkpoints at several sizes (full: the Pythia suite 14m-1b, step143000): erank of lm_head / "
             "the tied embedding, ID loss on Pile-10K (text column), OOD loss on Paloma Dolma code (jsonl)",
        params_key="papers.unembed_rank.evaluate.checkpoints, .eval_source, .ood_source",
        loader="stages.unembed_rank.hf_source:unembedding",
        fixture_test="tests/unembed_rank/test_real_source.py::test_unembedding_geometry_of_hf_checkpoints",
        note="full: evaluate also reads the checkpoints (evaluate/hf/checkpoints.json); report shows the toy grid only",
    ),
    Source(
        real="the batch x weight-decay x lr sweep on real text (Pile-10K, GPT-NeoX tokenizer) with a tiny OLMo-style "
             "HF Llama, OOD Paloma Dolma code",
        params_key="papers.unembed_rank.train.source, .ood_source, .hf",
        loader="stages.unembed_rank.hf_source:load_text_tokens",
        fixture_test="tests/unembed_rank/test_real_source.py::test_sweep_on_fixture_corpus",
        note="full: train also runs the sweep on the real corpus (train/hf/); evaluate/report analyse the toy grid only",
    ),
]
