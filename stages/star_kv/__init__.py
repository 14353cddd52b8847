"""star_kv: STAR-KV adaptive low-rank KV-cache compression (hybrid SVD, learned soft thresholds,
low-rank-aware mixed precision, fused latent decode attention) on the shared tiny transformer."""
