"""Benchmark (not a test): STAR-KV's decode attention over the low-rank latent cache, at the paper's shapes.

    python -m benchmarks.decode_speed              # CPU here: the torch paths; CUDA: the Triton kernel too
    python -m benchmarks.decode_speed --json out.json

One decode step (one query per sequence) of Llama-3.1-8B-like attention (Hq 32, Hkv 8, head_dim 128,
32,768 cached tokens, the ranks of the paper's C = 0.6 run) by every path ``kernels.lowrank_attention.bench_rows``
times, printed as ratios:

- CPU: the fused algorithm in torch (latents read once, keys never materialised) vs materialise-K/V + SDPA
  vs SDPA on a dense cache (batch 1, fp32);
- CUDA: the Triton kernel (fp16 latents) vs SDPA on a dense fp16 cache (the paper's baseline, batch 16)
  and vs materialise + SDPA, with the fraction of the memory roofline it reaches.

The paper reports up to 6.9x for its kernel over SDPA on GPU; a CPU ratio says nothing about that number.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kernels.lowrank_attention import PAPER_SHAPE, PAPER_SPEEDUP, bench_rows


def table(row: dict) -> str:
    ms = {k: row[k] * 1e3 for k in ("dense_sdpa_s", "materialize_sdpa_s", "latent_torch_s", "triton_s") if k in row}
    lines = [f"decode step at the paper's shapes ({row['case']}), device {row['device']}",
             "| path | ms | vs dense SDPA |", "| --- | --- | --- |"]
    names = {"dense_sdpa_s": "SDPA on the dense cache", "materialize_sdpa_s": "materialise K/V from latents + SDPA",
             "latent_torch_s": "fused algorithm in torch (latents only)", "triton_s": "Triton kernel (latents only)"}
    for k, v in ms.items():
        lines.append(f"| {names[k]} | {v:.4g} | {ms['dense_sdpa_s'] / v:.3g}x |")
    if "bandwidth_fraction" in row:
        lines.append(f"\nTriton kernel: {row['achieved_gbs']:.4g} GB/s, {100 * row['bandwidth_fraction']:.3g}% of peak")
    lines.append(f"\nThe paper: up to {PAPER_SPEEDUP}x for its kernel over SDPA on GPU (batch 16). "
                 + (row.get("gpu_entry", "") or ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="device memory bandwidth, GB/s (CUDA only)")
    ap.add_argument("--json", type=Path, help="also write the row here")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = bench_rows(device, small=False, reps=args.reps, peak_gbs=args.peak_gbs)
    print(f"shape: {PAPER_SHAPE} (CPU: batch 1)")
    for row in rows:
        print(table(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
