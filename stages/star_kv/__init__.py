"""star_kv: STAR-KV adaptive low-rank KV-cache compression (hybrid SVD, learned soft thresholds,
low-rank-aware mixed precision, fused latent decode attention) on the shared tiny transformer."""


def check_params(configs: dict) -> None:
    """Cross-stage rules, run at config load of every stage (stages.common.runner.check_cross_stage):
    the evaluate stage's high-precision ranks cannot exceed what the train stage's model has."""
    model = configs["train"].model
    head_dim = model.d_model // model.n_heads
    ev = configs["evaluate"]
    if ev.hi_ranks_k > head_dim:
        raise ValueError(f"evaluate.hi_ranks_k: {ev.hi_ranks_k} is larger than head_dim {head_dim} "
                         f"(train.model d_model {model.d_model} / n_heads {model.n_heads})")
    if ev.hi_ranks_v > model.d_model:
        raise ValueError(f"evaluate.hi_ranks_v: {ev.hi_ranks_v} is larger than the joint value rank limit "
                         f"d_model {model.d_model} (train.model)")
