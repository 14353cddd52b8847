"""The simulator's per-step cost model: GPU constants from their sources, and its fit to the real engine.

    iteration time = a + b·(KV tokens read by the batch) + p·(prefill tokens) + q·(prefill tokens · context)

GPU constants (``gpu_cost_model``) are arithmetic on published numbers; each input names its source, and
the two efficiencies are ASSUMED (no GPU run here):

- H100 SXM5 80 GB: HBM3 3.35 TB/s, 989.4 TFLOP/s dense BF16 — NVIDIA H100 Tensor Core GPU datasheet
  (1,979 TFLOP/s is the sparse figure; dense is half).
- Model: SWE-agent-LM-32B, the model of the official profiling runs
  (ThunderAgent-org/ThunderAgent SWE-agent-profile/config/vllm_batch_32B.yaml: tensor_parallel 2,
  gpu_memory_utilization 0.8, --num_workers 1..64), a Qwen2.5-Coder-32B fine-tune: the Qwen2.5-32B shape
  (config.json: 64 layers, 40 query heads, 8 KV heads, head dim 128; 32.5 B parameters, model card), BF16.
- Deployment: TP = 2 (official config) — weights, KV heads and FLOPs split over 2 GPUs.
- ASSUMED: decode reads weights and KV at 70% of HBM bandwidth; prefill runs at 40% MFU.

    a = weight bytes / (TP · BW · η_bw)        = 2·32.5e9 / (2 · 3.35e12 · 0.7)  ≈ 13.9 ms
    b = KV bytes per token / (TP · BW · η_bw)  = 2·64·8·128·2 B / (2 · 3.35e12 · 0.7) ≈ 5.6e-8 s
    p = 2·params / (TP · FLOPS · MFU)           ≈ 8.2e-5 s per prefill token
    q = 4·layers·heads·head_dim / (TP · FLOPS · MFU) ≈ 1.7e-9 s per (prefill token × context token)

The KV capacity per backend is not derived here: it is a swept/assumed parameter of the workload
(papers.thunderagent.prepare.kv_capacity_tokens; the official TP = 2 config at 0.8 utilisation would
leave ≈ 2·(0.8·80 − 32.5) GB ≈ 63 GB ≈ 240k tokens, the experiment uses a smaller pool so that the
concurrency sweep stays affordable: what matters is demand/capacity, shown on the sweep's x axis).

The same form is fitted to the project's real engine (``fit_cost_model``): the tiny GPT with a paged KV
cache replays simulator traces on this CPU; each prefill and each decode chunk is timed (thread CPU
time, robust to other processes on a shared machine, and wall time), a, b, p, q (+ a per-prefill constant
r, the CPU engine's Python overhead) are fitted by non-negative least squares on the training traces,
and the error is reported on held-out traces (other workloads), per operation and in total.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class GpuSpec:
    name: str = "NVIDIA H100 SXM5 80GB"
    hbm_bytes_per_s: float = 3.35e12
    bf16_dense_flops: float = 989.4e12
    memory_bytes: float = 80e9
    source: str = "NVIDIA H100 Tensor Core GPU datasheet (HBM3 3.35 TB/s; BF16 1,979 TFLOPS with sparsity)"


@dataclass(frozen=True)
class ModelSpec:
    name: str = "SWE-agent-LM-32B (Qwen2.5-32B shape)"
    params: float = 32.5e9
    layers: int = 64
    heads: int = 40
    kv_heads: int = 8
    head_dim: int = 128
    bytes_per_param: int = 2
    source: str = ("official SWE-agent-profile/config/vllm_batch_32B.yaml (model, TP 2, gpu_memory_utilization 0.8); "
                   "Qwen2.5-32B config.json and model card (shape, 32.5B parameters)")


@dataclass(frozen=True)
class Deployment:
    tensor_parallel: int = 2                 # official vllm_batch_32B.yaml
    bw_efficiency: float = 0.7               # ASSUMED fraction of HBM bandwidth reached by decode
    mfu: float = 0.4                         # ASSUMED model-FLOPs utilisation of prefill
    gpu_memory_utilization: float = 0.8      # official vllm_batch_32B.yaml


def gpu_cost_model(gpu: GpuSpec = GpuSpec(), model: ModelSpec = ModelSpec(), dep: Deployment = Deployment()):
    """(CostModel, derivation dict) from the cited specs; see the module docstring."""
    from stages.thunderagent.sim import CostModel

    bw = dep.tensor_parallel * gpu.hbm_bytes_per_s * dep.bw_efficiency
    flops = dep.tensor_parallel * gpu.bf16_dense_flops * dep.mfu
    weight_bytes = model.params * model.bytes_per_param
    kv_bytes = 2 * model.layers * model.kv_heads * model.head_dim * model.bytes_per_param
    cm = CostModel(a=weight_bytes / bw, b=kv_bytes / bw, p=2 * model.params / flops,
                   q=4 * model.layers * model.heads * model.head_dim / flops)
    kv_pool = dep.tensor_parallel * (dep.gpu_memory_utilization * gpu.memory_bytes - weight_bytes / dep.tensor_parallel)
    derivation = {"gpu": asdict(gpu), "model": asdict(model), "deployment": asdict(dep),
                  "weight_bytes": weight_bytes, "kv_bytes_per_token": kv_bytes,
                  "official_config_kv_pool_tokens": kv_pool / kv_bytes,
                  "assumed": ["deployment.bw_efficiency", "deployment.mfu"],
                  "cost_model": asdict(cm)}
    return cm, derivation


# ------------------------------------------------------------------------------ fit to the real engine
FEATURES = ("iters", "kv_read", "prefill", "prefill_ctx", "prefill_calls")


def op_features(op: dict) -> list[float]:
    return [float(op.get(f, 0.0)) for f in FEATURES]


def fit_cost_model(train_ops: list[dict], key: str = "cpu_s") -> dict:
    """Non-negative least squares of per-operation time on (iterations, KV read, prefill tokens,
    prefill·context, prefill calls) → a, b, p, q, r. Columns are scaled for conditioning."""
    from scipy.optimize import nnls

    X = np.array([op_features(o) for o in train_ops], dtype=float)
    y = np.array([o[key] for o in train_ops], dtype=float)
    scale = np.maximum(X.max(0), 1e-12)
    coef, _ = nnls(X / scale, y)
    coef = coef / scale
    return dict(zip(("a", "b", "p", "q", "r"), (float(c) for c in coef)))


def predict(coef: dict, ops: list[dict]) -> np.ndarray:
    X = np.array([op_features(o) for o in ops], dtype=float)
    return X @ np.array([coef[k] for k in ("a", "b", "p", "q", "r")])


def heldout_errors(coef: dict, ops: list[dict], key: str = "cpu_s") -> dict:
    """Per-operation and total error of the fitted model on held-out operations (one trace or several)."""
    y = np.array([o[key] for o in ops], dtype=float)
    pred = predict(coef, ops)
    ss = float(((y - y.mean()) ** 2).sum())
    return {"n_ops": len(ops), "measured_total_s": float(y.sum()), "predicted_total_s": float(pred.sum()),
            "total_rel_err": float(abs(pred.sum() - y.sum()) / max(y.sum(), 1e-12)),
            "op_median_abs_rel_err": float(np.median(np.abs(pred - y) / np.maximum(y, 1e-9))),
            "op_r2": 1 - float(((pred - y) ** 2).sum()) / ss if ss > 0 else 0.0}
