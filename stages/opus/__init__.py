"""opus: OPUS online data selection (ghost per-sample gradients, optimizer-induced preconditioner, CountSketch,
redundancy-penalised Boltzmann sampling)."""
from stages.common.sources import Source

SOURCES = [Source(
    real="a pretrained Llama/Qwen-family HF causal LM (full: Qwen/Qwen2.5-0.5B) on a FineWeb / FineWeb-Edu parquet "
         "shard (text, id, dump, url, ... columns), proxy + validation from a benchmark target set (text column)",
    params_key="papers.opus.train.source (model + web corpus), papers.opus.train.proxy_source (target set)",
    loader="stages.opus.hf_source:load_web_corpus",
    fixture_test="tests/opus/test_real_source.py::test_opus_on_hf_llama_fineweb_fixture",
    note="full: train@opus also runs the hf.arms from the pretrained checkpoint (train/hf/runs.json); "
         "evaluate/report still report the toy arms only",
)]
