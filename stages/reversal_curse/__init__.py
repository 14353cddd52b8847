"""reversal_curse — breaking the reversal curse with the Identity Bridge (one-layer models).

    dvc repro report@reversal_curse                       # default profile
    python -m stages train reversal_curse --profile smoke # one stage, seconds
"""
from stages.common.sources import Source

SOURCES = [Source(
    real="a ~1B pretrained HF decoder (full: meta-llama/Llama-3.2-1B) fine-tuned on the synthetic facts written as "
         "sentences (prepare's facts table: pair, entity, relation, target, kind, split)",
    params_key="papers.reversal_curse.train.source (the decoder), papers.reversal_curse.train.hf (fine-tuning)",
    loader="stages.reversal_curse.hf_source:load_facts",
    fixture_test="tests/reversal_curse/test_real_source.py::test_reversal_facts_on_hf_llama",
    note="full: train also fine-tunes the decoder per seed x bridge arm (train/hf/results.json); evaluate/report "
         "still report the toy models only",
)]
