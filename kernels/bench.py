"""Benchmark every kernel: one table, one row per benchmark case.

    python -m kernels.bench                 # every kernel; CPU: small cases, CUDA: full-size cases
    python -m kernels.bench --size full     # the GPU-sized cases (slow on a CPU)
    python -m kernels.bench --only fused_linear_ce --json out.json

Columns:
- ``torch ms``: the kernel's torch reference (median of --reps calls).
- ``naive ms`` and ``naive/torch`` (CPU): the same reference called one item at a time in a Python
  loop (``kernels/naive.py``): what the vectorized reference buys over the first code one writes.
- ``Triton ms``, ``Triton/torch`` (< 1: the kernel is faster), achieved ``GB/s`` and ``% peak BW``
  (CUDA only): bytes an ideal kernel moves (declared per case) / time / the device's peak memory
  bandwidth (looked up from the device name, or --peak-gbs), i.e. the fraction of the memory
  roofline reached; ``TFLOP/s`` likewise against --peak-tflops when given.
- ``max rel. err.`` (wherever the Triton path runs): the kernel's largest deviation from its torch reference on the
  benchmark's own inputs, over every output and (for inputs that require grad) every input gradient under one
  seeded cotangent, relative to the reference's largest magnitude — on CUDA the check that the compiled kernel
  computes what the reference computes at the timed shapes (``--no-check`` skips it).
Without CUDA the Triton columns are skipped with the reason printed (under TRITON_INTERPRET=1 they
time the interpreter, which says nothing about the kernel's speed). No time is ever asserted on.
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
from kernels.naive import naive_baseline

NOT_KERNELS = ("bench", "dispatch", "testing", "record", "naive")

# peak HBM/GDDR bandwidth, GB/s, by a substring of torch.cuda.get_device_name() (first match wins)
PEAK_GBS = [("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100", 3350.0), ("GH200", 4000.0), ("B200", 8000.0),
            ("A100-SXM4-80GB", 2039.0), ("A100 80GB PCIe", 1935.0), ("A100", 1555.0), ("L40S", 864.0),
            ("L40", 864.0), ("L4", 300.0), ("A10G", 600.0), ("A10", 600.0), ("V100", 900.0), ("T4", 320.0),
            ("RTX 4090", 1008.0), ("RTX 3090", 936.0)]


def kernel_modules(only: list[str] | None = None):
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.name in NOT_KERNELS or (only and info.name not in only):
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


def peak_bandwidth(device: str, override: float | None) -> tuple[float | None, str]:
    if override is not None:
        return override, f"--peak-gbs {override:g}"
    if device != "cuda":
        return None, "no CUDA device"
    name = torch.cuda.get_device_name()
    for key, gbs in PEAK_GBS:
        if key in name:
            return gbs, f"{name}: {gbs:g} GB/s (datasheet)"
    return None, f"{name}: peak bandwidth unknown (pass --peak-gbs)"


def output_tensors(out) -> list[torch.Tensor]:
    """The tensors in a function's output (a tensor, or dicts/lists/tuples of them), in order; [] for None."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in output_tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in output_tensors(v)]
    return []


def parity(kern, ref, inputs) -> dict:
    """Kernel vs reference on the same inputs: the largest absolute deviation over every floating output and,
    when inputs require grad, every input gradient (the one a fwd+bwd case's own backward leaves in ``.grad``, else
    from one seeded cotangent on every output), and that deviation relative to the reference's largest magnitude.
    Empty when neither returns a tensor."""
    def run(fn):
        xs = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
              for x in inputs]
        outs = output_tensors(fn(*xs))
        leaves = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
        grads = [x.grad for x in leaves if x.grad is not None]    # a fwd+bwd case: fn ran the backward itself
        if leaves and not grads and any(o.requires_grad for o in outs):
            gen = torch.Generator(device=outs[0].device).manual_seed(0)
            loss = sum((o.float() * torch.randn(o.shape, generator=gen, device=o.device)).sum()
                       for o in outs if o.requires_grad)
            grads = [g for g in torch.autograd.grad(loss, leaves, allow_unused=True) if g is not None]
        return [o.detach() for o in outs] + grads

    got, want = run(kern), run(ref)
    if len(got) != len(want):
        raise AssertionError(f"kernel returned {len(got)} tensors (outputs + grads), reference {len(want)}")
    pairs = [(a.double(), b.double()) for a, b in zip(got, want) if b.is_floating_point() and b.numel()]
    if not pairs:
        exact = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(got, want))
        return {"max_abs_err": 0.0 if exact else float("inf"), "rel_err": 0.0 if exact else float("inf")} if got else {}
    err = max(float((a - b).abs().max()) for a, b in pairs)
    scale = max(float(b.abs().max()) for _, b in pairs)
    return {"max_abs_err": err, "rel_err": err / scale if scale > 0 else err}


def bench_case(name, case, device, reps, triton_runs, naive, peak_gbs, peak_tflops, check: bool = False) -> dict:
    label, make, kern, ref, nbytes, flops = case
    inputs = make(device)
    row = {"kernel": name, "case": label, "device": device, "reference_s": time_fn(ref, inputs, device, reps)}
    if check and triton_runs:
        row.update(parity(kern, ref, inputs))
    if naive:
        fn = naive_baseline(name, ref)
        if fn is None:
            row["naive_note"] = f"no naive baseline registered in kernels/naive.py for {name}"
        else:
            row["naive_s"] = time_fn(fn, inputs, device, max(1, reps // 2))
            row["ratio_naive_over_reference"] = row["naive_s"] / row["reference_s"]
    if triton_runs:
        t_k = time_fn(kern, inputs, device, reps)
        row.update(kernel_s=t_k, ratio_kernel_over_reference=t_k / row["reference_s"])
        if device == "cuda":
            row.update(achieved_gbs=nbytes / t_k / 1e9, achieved_tflops=flops / t_k / 1e12)
            if peak_gbs:
                row["bandwidth_fraction"] = nbytes / t_k / 1e9 / peak_gbs
            if peak_tflops:
                row["flop_fraction"] = flops / t_k / 1e12 / peak_tflops
        else:
            row["kernel_note"] = "Triton interpreter (TRITON_INTERPRET=1): times the interpreter, not the kernel"
    return row


def _ms(row: dict, key: str) -> str:
    return f"{1e3 * row[key]:.3g}" if key in row else "—"


def _x(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    return fmt.format(row[key]) if key in row else "—"


def table(rows: list[dict]) -> str:
    cols = ["kernel", "case", "torch ms", "naive ms", "naive/torch", "Triton ms", "Triton/torch", "GB/s", "% peak BW",
            "max rel. err."]
    body = [[r["kernel"], r["case"] if len(r["case"]) <= 60 else r["case"][:59] + "…", _ms(r, "reference_s"),
             _ms(r, "naive_s"), _x(r, "ratio_naive_over_reference"), _ms(r, "kernel_s"),
             _x(r, "ratio_kernel_over_reference"), _x(r, "achieved_gbs", "{:.0f}"),
             _x(r, "bandwidth_fraction", "{:.1%}") if "bandwidth_fraction" in r else "—",
             _x(r, "rel_err", "{:.1e}")] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    return "\n".join([line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="kernel module names")
    ap.add_argument("--size", choices=("auto", "small", "full"), default="auto",
                    help="auto: full-size cases on CUDA, BENCHMARKS_SMALL on the CPU")
    ap.add_argument("--small", action="store_true", help="same as --size small")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--naive", choices=("auto", "yes", "no"), default="auto",
                    help="time the per-item naive baseline (auto: on the CPU only)")
    ap.add_argument("--peak-gbs", type=float, default=None, help="device memory bandwidth, GB/s (default: by name)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="device peak, TFLOP/s, for the flop fraction")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--no-check", action="store_true", help="skip the kernel-vs-reference parity column")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = args.small or args.size == "small" or (args.size == "auto" and device == "cpu")
    naive = args.naive == "yes" or (args.naive == "auto" and device == "cpu")
    triton_runs = device == "cuda" or interpreting()
    peak_gbs, peak_note = peak_bandwidth(device, args.peak_gbs)
    only = set(args.only or [])
    rows = []
    failed = []
    for name, module in kernel_modules(args.only):
        only.discard(name)
        if hasattr(module, "bench_rows"):  # a kernel that times its own paths (several baselines)
            cases = [(name, lambda: module.bench_rows(device, small=small, reps=args.reps, peak_gbs=peak_gbs,
                                                      check=not args.no_check))]
        else:
            cases = [(case[0], lambda case=case: [bench_case(name, case, device, args.reps, triton_runs, naive,
                                                             peak_gbs, args.peak_tflops, check=not args.no_check)])
                     for case in getattr(module, "BENCHMARKS_SMALL" if small else "BENCHMARKS")]
        for label, run in cases:
            try:
                rows.extend(run())
            except Exception as err:       # one broken case must not hide the others: named here, exit status 1
                failed.append(f"{name} / {label}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    if only:
        ap.error(f"--only: no kernel module with BENCHMARKS named {sorted(only)}")
    print(f"device: {device}; cases: {'BENCHMARKS_SMALL' if small else 'BENCHMARKS'}; median of {args.reps} calls")
    print(table(rows))
    if device != "cuda":
        why = ("Triton columns time the interpreter (TRITON_INTERPRET=1), not the kernel" if interpreting()
               else "Triton columns skipped: no CUDA device here (Triton kernels run on CUDA)")
        print(f"note: {why}; GB/s and % peak BW skipped: {peak_note}")
    else:
        print(f"peak bandwidth: {peak_note}")
    if naive:
        print("note: naive = the torch reference called one item at a time in a Python loop (kernels/naive.py); "
              "naive/torch > 1: the vectorized reference is that many times faster")
    if args.json:
        args.json.write_text(json.dumps(rows + [{"failed": f} for f in failed], indent=2))
    for f in failed:
        print(f"FAILED {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
