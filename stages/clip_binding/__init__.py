"""clip_binding: how embedding models bind concepts (additivity, binding-function complexity)."""
from stages.common.sources import Source

SOURCES = [Source(
    real="a real CLIP (transformers.CLIPModel checkpoint, e.g. openai/clip-vit-base-patch32): its text tower "
         "embeds captions of every 2-object scene and every object; the regressors and frozen probes run on them",
    params_key="papers.clip_binding.evaluate.source",
    loader="stages.clip_binding.clip:load_clip",
    fixture_test="tests/clip_binding/test_real_source.py::test_clip_world_matches_one_caption_at_a_time_and_pools_at_eos",
    note="open_clip is not installable here: transformers.CLIPModel instead; the fixture is a tiny randomly "
         "initialised CLIPModel saved with save_pretrained at test time. default/smoke: the trained encoders and "
         "the random-table control only; `full` adds the CLIP kind. Images (the paper's CLEVR renders) are not used.",
)]
