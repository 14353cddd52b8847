"""star_kv: STAR-KV adaptive low-rank KV-cache compression (hybrid SVD, learned soft thresholds,
low-rank-aware mixed precision, fused latent decode attention) on a Hugging Face Llama-family model (GQA)."""
from stages.common.sources import Source

SOURCES = [Source(
    real="Llama-3.1-8B-Instruct (any Llama-family HF causal LM with GQA/RoPE); KD on fineweb-edu, held-out PPL on "
         "WikiText-2 test and C4 validation (text column, jsonl/parquet)",
    params_key="papers.star_kv.prepare.source (tokenizer, KD corpus), .eval_sources; papers.star_kv.train.source "
               "(the teacher)",
    loader="stages.star_kv.prepare:load_text_tokens",
    fixture_test="tests/star_kv/test_real_source.py::test_star_kv_on_gqa_llama_fixture",
    note="full: a pretrained Llama-family teacher (no teacher training); smoke/default: a tiny GQA Llama trained here",
)]


def check_params(configs: dict) -> None:
    """Cross-stage rules, run at config load of every stage (stages.common.runner.check_cross_stage): the
    evaluate stage's high-precision ranks fit the train stage's toy model; a real teacher needs a real
    tokenizer/corpus from the same model."""
    tr, prep, ev = configs["train"], configs["prepare"], configs["evaluate"]
    if tr.source.kind == "toy":
        m = tr.model
        head_dim = m.d_model // m.n_heads
        if ev.hi_ranks_k > head_dim:
            raise ValueError(f"evaluate.hi_ranks_k: {ev.hi_ranks_k} is larger than head_dim {head_dim} "
                             f"(train.model d_model {m.d_model} / n_heads {m.n_heads})")
        if ev.hi_ranks_v > m.n_kv_heads * head_dim:
            raise ValueError(f"evaluate.hi_ranks_v: {ev.hi_ranks_v} is larger than the joint value rank limit "
                             f"{m.n_kv_heads * head_dim} (train.model n_kv_heads × head_dim)")
        if prep.source.kind != "toy":
            raise ValueError("prepare.source: a real corpus needs a real teacher (train.source) with its tokenizer")
    elif prep.source.kind == "toy" or (prep.source.tokenizer is None and prep.source.model != tr.source.model):
        raise ValueError(f"prepare.source.model: the corpus must be tokenized with the teacher's tokenizer "
                         f"(train.source.model {tr.source.model!r})")
