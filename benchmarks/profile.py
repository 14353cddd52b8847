"""Profile one stage of one paper with py-spy: where its time goes, Python overhead vs torch ops.

    make profile SLUG=reversal_curse                     # train at the smoke profile
    make profile SLUG=opus STAGE=evaluate PROFILE=default
    python -m benchmarks.profile opus --stage train --profile smoke --rate 100

Runs ``python -m stages <stage> <slug> --profile <profile>`` under ``py-spy record --native`` in a
scratch root (``PAPERS_ROOT``: a temporary folder with this checkout's files linked in and its own
data/ and reports/, so the repository's DVC outputs are never touched); the upstream stages run
there first, unprofiled. Writes

    reports/profiles/<slug>-<stage>.txt   where the samples fall: imports, Python interpreter,
                                          torch kernels, torch dispatch/autograd C++, Python<->C++
                                          binding, other native code; top functions by self time
                                          and by inclusive time; this repository's own functions
    reports/profiles/<slug>-<stage>.svg   a flame graph of the same samples (hover: counts)

A sample is classified by its innermost frame (py-spy ``--native`` interleaves C/C++ frames with
Python ones): a Python frame or libpython is Python overhead (interpreter, GC), a frame in
libtorch_cpu/libc10/MKL/oneDNN is a torch op (split into kernels: at::native, BLAS, vectorized
loops; and the rest: dispatcher, autograd engine, allocator), libtorch_python/pybind11 is the
binding layer; any sample under an ``import`` is counted as import time first. Wall-clock on a
shared machine overstates; the shares are what to read. Caveat: py-spy samples wall time and its
native unwinding sometimes loses the Python frames above the garbage collector ("unattributed");
the GC share it reports is an upper bound (measured directly, ``gc.disable()`` during the imports
of a stage saves ~10-15% of their CPU time, less than py-spy's GC share suggests).
"""
from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from stages.common.config import PROFILES, STAGES, registered_papers
from stages.common.paths import ROOT

OUT_DIR = ROOT / "reports" / "profiles"
NOT_LINKED = {"data", "reports", "wandb", "dvc_plots", ".dvc", ".git", "mutants", "lightning_logs"}
FRAME = re.compile(r"^(?P<fn>.*) \((?P<where>[^()]*)\)$")
KERNEL_HINTS = ("at::native", "mkl_", "sgemm", "dgemm", "gemm", "dnnl", "Vectorized", "vectorized", "cpu_kernel",
                "_vec_", "at::vec", "sleef", "Sleef", "mkldnn", "openblas", "avx", "loop2d", "VectorizedLoop")
TORCH_LIBS = ("libtorch_cpu", "libtorch.so", "libc10", "libmkl", "libdnnl", "libgomp", "libiomp", "libtorch_cuda",
              "libcudnn", "libcublas")


def parse_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) format: ``frame;frame;...;leaf count`` per line, outermost first."""
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks.append((stack.split(";"), int(count)))
    return stacks


def split_frame(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame)
    return (m["fn"], m["where"]) if m else (frame, "")


def is_python(frame: str) -> bool:
    _, where = split_frame(frame)
    return ".py:" in where or where.startswith("<frozen") or where.startswith("<string")


def phase(stack: list[str]) -> str:
    """What the process was doing: importing modules, W&B tracking, or the stage's own work."""
    if any(f.startswith(("_find_and_load ", "_call_with_frames_removed ")) for f in stack):
        return "imports (module loading, incl. the code it runs)"
    if not any(is_python(f) for f in stack):
        return "unattributed (native stack without Python frames: py-spy lost the unwinding)"
    if any("stages/common/tracking.py" in f or "/wandb/" in f or f.endswith("(wandb)") for f in stack):
        return "W&B tracking (offline run set-up, logging, finish)"
    return "stage work (config, data, training/evaluation, writing)"


def category(stack: list[str]) -> str:
    """What kind of code the innermost frame is."""
    leaf = stack[-1]
    fn, where = split_frame(leaf)
    if fn.startswith(("gc_collect", "deduce_unreachable", "move_unreachable", "visit_decref", "visit_reachable")):
        return "Python garbage collector (gc_collect_main & co.)"
    if is_python(leaf) or "libpython" in where:
        return "Python interpreter (bytecode, object churn)"
    if "libtorch_python" in where or "pybind11" in fn:
        return "Python<->C++ binding (libtorch_python, pybind11)"
    if any(lib in where for lib in TORCH_LIBS):
        if any(h in fn for h in KERNEL_HINTS):
            return "torch kernels (at::native, BLAS, vectorized loops)"
        return "torch C++ overhead (dispatcher, autograd engine, allocator)"
    if where.startswith("libc.") or where.startswith("ld-linux") or "libstdc++" in where or "libm." in where:
        return "libc / libstdc++ (malloc, memcpy, syscalls)"
    lib = re.sub(r":\d+$", "", where) or "unknown"
    return f"other native code ({lib})"


def python_frames(stack: list[str]) -> list[str]:
    return [f for f in stack if is_python(f)]


def short(frame: str, width: int = 110) -> str:
    fn, where = split_frame(frame)
    where = re.sub(r"^.*?site-packages/", "", where)
    where = where.replace(str(ROOT) + "/", "")
    text = f"{fn} ({where})" if where else fn
    return text if len(text) <= width else text[: width - 1] + "…"


def drop_line(frame: str) -> str:
    """``fn (file.py:123)`` -> ``fn (file.py)``: a function's samples over all its lines."""
    fn, where = split_frame(frame)
    return f"{fn} ({where.rsplit(':', 1)[0]})" if ".py:" in where else frame


def summarize(stacks: list[tuple[list[str], int]], header: list[str], top: int = 25) -> str:
    total = sum(c for _, c in stacks) or 1
    phases: Counter[str] = Counter()
    cats: Counter[str] = Counter()
    work_cats: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack, c in stacks:
        ph, cat = phase(stack), category(stack)
        phases[ph] += c
        cats[cat] += c
        if ph.startswith("stage work"):
            work_cats[cat] += c
        self_time[drop_line(stack[-1])] += c
        seen = set()
        for f in stack:
            key = drop_line(f)
            _, where = split_frame(f)
            if key in seen or not is_python(f) or where.startswith("<frozen") or where.startswith("runpy"):
                continue
            seen.add(key)
            incl[key] += c
            rel = where.replace(str(ROOT) + "/", "")
            if rel.startswith(("stages/", "kernels/")):
                own[key] += c
    pct = lambda c, t=total: f"{100.0 * c / max(t, 1):6.1f}%"  # noqa: E731
    work = sum(work_cats.values())
    py = sum(c for k, c in work_cats.items() if k.startswith("Python"))
    ops = sum(c for k, c in work_cats.items() if k.startswith("torch"))
    lines = list(header) + ["", f"samples: {total}", "", "## Phases (a sample counts where its stack says it is)", ""]
    lines += [f"{pct(c)}  {k}" for k, c in phases.most_common()]
    lines += ["", "## Kind of code at the innermost frame, all samples", ""]
    lines += [f"{pct(c)}  {k}" for k, c in cats.most_common(12)]
    lines += ["", f"## Kind of code during the stage work only ({work} samples)", ""]
    lines += [f"{pct(c, work)}  {k}" for k, c in work_cats.most_common(12)]
    lines += ["", f"Python overhead vs torch ops, stage work only: Python (interpreter + GC + binding) "
              f"{100.0 * py / max(work, 1):.1f}%, torch ops (kernels + C++ overhead) {100.0 * ops / max(work, 1):.1f}%",
              "", f"## Top {top} functions by self time (innermost frame)", ""]
    lines += [f"{pct(c)}  {short(k)}" for k, c in self_time.most_common(top)]
    lines += ["", f"## Top {top} Python functions by inclusive time (import machinery left out)", ""]
    lines += [f"{pct(c)}  {short(k)}" for k, c in incl.most_common(top)]
    lines += ["", f"## This repository's functions (stages/, kernels/) by inclusive time, top {top}", ""]
    lines += [f"{pct(c)}  {short(k)}" for k, c in own.most_common(top)] or ["(none sampled)"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- flame graph (SVG)
def flame_svg(stacks: list[tuple[list[str], int]], title: str, width: int = 1600, min_frac: float = 0.004) -> str:
    """An icicle-style flame graph (root at the top); frames under ``min_frac`` of samples are dropped."""
    tree: dict = {"n": 0, "kids": defaultdict(lambda: None)}

    def node() -> dict:
        return {"n": 0, "kids": {}}

    tree = node()
    for stack, c in stacks:
        cur = tree
        cur["n"] += c
        for f in stack:
            cur = cur["kids"].setdefault(f, node())
            cur["n"] += c
    total = tree["n"] or 1
    row_h, top_pad = 16, 40
    rects: list[str] = []
    depth_max = 0

    def color(frame: str) -> str:
        cat = category([frame])
        hue = {"P": 50, "t": 10, "l": 200, "o": 280}.get(cat[0], 0)
        if cat.startswith("torch kernels"):
            hue = 0
        h = (hash(frame) % 20)
        return f"hsl({hue + h},70%,{60 + h % 10}%)"

    def walk(n: dict, name: str, x: float, depth: int) -> None:
        nonlocal depth_max
        w = n["n"] / total * width
        if name:
            depth_max = max(depth_max, depth)
            y = top_pad + (depth - 1) * row_h
            label = html.escape(short(name, 400))
            text = html.escape(short(name, max(int(w / 7), 1))) if w > 35 else ""
            rects.append(f'<g><title>{label}: {n["n"]} samples ({100.0 * n["n"] / total:.2f}%)</title>'
                         f'<rect x="{x:.1f}" y="{y}" width="{max(w - 0.5, 0.5):.1f}" height="{row_h - 1}" '
                         f'fill="{color(name)}"/>'
                         + (f'<text x="{x + 3:.1f}" y="{y + 12}">{text}</text>' if text else "") + "</g>")
        cx = x
        for kname, kid in sorted(n["kids"].items(), key=lambda kv: -kv[1]["n"]):
            if kid["n"] / total < min_frac:
                continue
            walk(kid, kname, cx, depth + 1)
            cx += kid["n"] / total * width

    walk(tree, "", 0.0, 0)
    height = top_pad + depth_max * row_h + 10
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="monospace" font-size="11">'
            f'<rect width="100%" height="100%" fill="#fafafa"/>'
            f'<text x="8" y="22" font-size="15">{html.escape(title)} — {total} samples; root at the top; '
            f'hover a frame for its share</text>' + "".join(rects) + "</svg>\n")


# ---------------------------------------------------------------------- running the stage
def scratch_root(tmp: Path) -> Path:
    """A root with every checkout file linked in but its own data/ and reports/."""
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (tmp / entry.name).symlink_to(entry)
    (tmp / "data").mkdir()
    (tmp / "reports").mkdir()
    return tmp


def run(cmd: list[str], env: dict, what: str) -> None:
    res = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        tail = "\n".join(res.stdout.splitlines()[-15:])
        raise SystemExit(f"error: {what} failed (exit {res.returncode}):\n{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("slug")
    ap.add_argument("--stage", default="train")
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--from-raw", type=Path, help="summarize an earlier run's .raw samples instead of recording")
    args = ap.parse_args(argv)
    papers = registered_papers()
    problems = [msg for bad, msg in (
        (args.slug not in papers, f"slug: unknown paper {args.slug!r} (registered: {', '.join(papers)})"),
        (args.stage not in STAGES, f"stage: unknown stage {args.stage!r} (one of {', '.join(STAGES)})"),
        (args.profile not in PROFILES, f"profile: unknown profile {args.profile!r} (one of {', '.join(PROFILES)})"),
        (not 1 <= args.rate <= 1000, f"rate: {args.rate} samples/s is outside 1..1000")) if bad]
    if problems:
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if args.from_raw is None and not Path(spy).exists():
        print("error: py-spy is not installed (it is pinned in requirements.lock: run `make install`)", file=sys.stderr)
        return 2
    if args.from_raw is not None and not args.from_raw.is_file():
        print(f"error: from-raw: {args.from_raw} is not a file", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{args.slug}-{args.stage}"
    raw = args.out / f"{name}.raw"  # the samples themselves (git-ignored): --from-raw re-summarizes them
    if args.from_raw is not None:
        stacks, wall = parse_raw(args.from_raw), None
    else:
        wall = record(args, spy, raw)
        stacks = parse_raw(raw)
    if not stacks:
        print("error: py-spy recorded no samples", file=sys.stderr)
        return 1
    header = [f"# Profile of `python -m stages {args.stage} {args.slug} --profile {args.profile}`", "",
              f"py-spy record --native --subprocesses --rate {args.rate}"
              + (f"; wall {wall:.1f} s under the profiler" if wall is not None else "")
              + f" on {os.cpu_count()} cores (a shared machine: wall overstates; read the shares)",
              f"regenerate: make profile SLUG={args.slug} STAGE={args.stage} PROFILE={args.profile}"]
    (args.out / f"{name}.txt").write_text(summarize(stacks, header))
    (args.out / f"{name}.svg").write_text(flame_svg(stacks, f"{args.stage}@{args.slug} ({args.profile})"))
    print(f"profile: wrote {args.out / (name + '.txt')} and {name}.svg")
    return 0


def record(args: argparse.Namespace, spy: str, raw: Path) -> float:
    """Run the upstream stages, then py-spy over the stage, in a scratch root; returns the wall time."""
    upstream = STAGES[: STAGES.index(args.stage)]
    with tempfile.TemporaryDirectory(prefix=f"profile-{args.slug}-") as tmp:
        root = scratch_root(Path(tmp))
        env = {**os.environ, "PAPERS_ROOT": str(root), "PYTHONUNBUFFERED": "1"}
        for stage in upstream:
            print(f"profile: running {stage}@{args.slug} --profile {args.profile} (unprofiled, upstream)", flush=True)
            run([sys.executable, "-m", "stages", stage, args.slug, "--profile", args.profile], env, f"{stage}@{args.slug}")
        cmd = [sys.executable, "-m", "stages", args.stage, args.slug, "--profile", args.profile]
        print(f"profile: py-spy record --native over {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        run([spy, "record", "--native", "--subprocesses", "--rate", str(args.rate), "--format", "raw",
             "--output", str(raw), "--", *cmd], env, f"py-spy over {args.stage}@{args.slug}")
        return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
