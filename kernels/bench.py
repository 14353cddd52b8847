"""Benchmark every kernel against its torch reference and print the time ratio.

    python -m kernels.bench                 # all kernels, on CUDA when available
    python -m kernels.bench --small         # tiny shapes (CPU, or TRITON_INTERPRET=1 smoke)
    python -m kernels.bench --only fused_linear_ce --json out.json

On a GPU it also reports achieved bandwidth and FLOP rate against the device's peak (given with
--peak-gbs/--peak-tflops; defaults are an H100/H200 SXM's). On the CPU the Triton path only
exists under the interpreter, so the ratio there measures the interpreter, not the kernel.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import time
from pathlib import Path

import torch

import kernels
from kernels.dispatch import interpreting


def kernel_modules(only: list[str] | None = None):
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.name in ("bench", "dispatch", "testing") or (only and info.name not in only):
            continue
        module = importlib.import_module(f"kernels.{info.name}")
        if hasattr(module, "BENCHMARKS") or hasattr(module, "bench_rows"):
            yield info.name, module


def time_fn(fn, inputs, device: str, reps: int) -> float:
    """Median seconds per call."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(lambda: fn(*inputs), warmup=10, rep=max(reps * 10, 50)) / 1e3
    times = []
    fn(*inputs)
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*inputs)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="kernel module names")
    ap.add_argument("--small", action="store_true", help="use each module's BENCHMARKS_SMALL")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="device memory bandwidth, GB/s")
    ap.add_argument("--peak-tflops", type=float, default=67.0, help="device fp32 peak, TFLOP/s")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    triton_runs = device == "cuda" or interpreting()
    rows = []
    for name, module in kernel_modules(args.only):
        if hasattr(module, "bench_rows"):  # a kernel that times its own paths (e.g. several baselines)
            for row in module.bench_rows(device, small=args.small, reps=args.reps, peak_gbs=args.peak_gbs):
                rows.append(row)
                print(json.dumps(row))
            continue
        cases = getattr(module, "BENCHMARKS_SMALL" if args.small else "BENCHMARKS")
        for label, make, kern, ref, nbytes, flops in cases:
            inputs = make(device)
            t_ref = time_fn(ref, inputs, device, args.reps)
            row = {"kernel": name, "case": label, "device": device, "reference_s": t_ref}
            if triton_runs:
                t_k = time_fn(kern, inputs, device, args.reps)
                row.update(kernel_s=t_k, ratio_kernel_over_reference=t_k / t_ref)
                if device == "cuda":
                    row.update(achieved_gbs=nbytes / t_k / 1e9, achieved_tflops=flops / t_k / 1e12,
                               bandwidth_fraction=nbytes / t_k / 1e9 / args.peak_gbs,
                               flop_fraction=flops / t_k / 1e12 / args.peak_tflops)
            else:
                row["note"] = "Triton path unavailable on CPU without TRITON_INTERPRET=1"
            rows.append(row)
            print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
