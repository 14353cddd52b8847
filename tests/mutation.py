"""Mutation testing of the core method modules with mutmut (``make mutants``; slow, not in CI).

Each core module is mutated on its own and checked only against its own tests, in a scratch copy
of the checkout (mutmut rewrites sources under ``mutants/``). The kill rate per module is printed
and written to ``reports/mutation.json``; the README's table is copied from it. Goal: >= 80% per
module. Equivalent mutants (a change that cannot alter behaviour) are listed by name in
``EQUIVALENT`` with the reason, and not counted.

    python -m tests.mutation                          # every module in CORE
    python -m tests.mutation stages/common/claims.py  # one module
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# core module -> the tests that own it
CORE: dict[str, list[str]] = {
    "stages/common/claims.py": ["tests/common/test_claims_and_reporting.py"],
    "stages/l2g_net/gft.py": ["tests/l2g_net/test_gft.py", "tests/l2g_net/test_gft_inputs.py"],
    "stages/cv_stability/stability.py": ["tests/cv_stability/test_method.py", "tests/cv_stability/test_identities.py"],
    "stages/reversal_curse/measures.py": ["tests/reversal_curse"],
    "stages/fair_bandits/scm.py": ["tests/fair_bandits/test_scm.py", "tests/fair_bandits/test_scm_world.py"],
    "stages/unembed_rank/geometry.py": ["tests/unembed_rank"],
    "stages/opus/selection.py": ["tests/opus/test_selection.py", "tests/opus/test_selection_math.py",
                                 "tests/opus/test_selection_brute.py"],
    "stages/induction/semantics.py": ["tests/induction/test_semantics.py"],
    "stages/sciql/algos.py": ["tests/sciql"],
    "stages/ftrl_potential/dynamics.py": ["tests/ftrl_potential"],
    "stages/backdoor_awareness/method.py": ["tests/backdoor_awareness"],
}

# "<module>::<mutant name>": why it cannot change behaviour
EQUIVALENT: dict[str, str] = {}


def _copy_checkout(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not rel.startswith(("data/", "reports/", "wandb/")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_module(module: str, tests: list[str], workdir: Path) -> dict:
    work = workdir / Path(module).stem
    work.mkdir(parents=True)
    _copy_checkout(work)
    pyproject = (work / "pyproject.toml").read_text()
    pyproject += ("\n[tool.mutmut]\n"
                  f"source_paths = [\"{module}\"]\n"
                  "also_copy = [\"stages\", \"kernels\", \"flows\", \"params.yaml\", \"tests\"]\n"
                  f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
                  "pytest_add_cli_args = [\"-x\", \"-q\", \"-p\", \"no:cacheprovider\", \"-o\", \"addopts=\"]\n")
    (work / "pyproject.toml").write_text(pyproject)
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1", "WANDB_MODE": "disabled"}
    with open(work / "mutmut.log", "w") as log:  # kept with --keep: why mutants were "not run"
        subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "2"], cwd=work, env=env,
                       stdout=log, stderr=subprocess.STDOUT)
    counts = {"killed": 0, "survived": 0, "timeout": 0, "other": 0}
    survivors = []
    for meta in (work / "mutants").rglob("*.meta"):
        data = json.loads(meta.read_text())
        for name, code in (data.get("exit_code_by_key") or {}).items():
            if f"{module}::{name}" in EQUIVALENT:
                continue
            if code == 1 or code == 3:
                counts["killed"] += 1
            elif code == 0:
                counts["survived"] += 1
                survivors.append(name)
            elif code in (-24, 24, 36, 152, 255):
                counts["timeout"] += 1
            else:
                counts["other"] += 1
    decided = counts["killed"] + counts["survived"] + counts["timeout"]
    rate = (counts["killed"] + counts["timeout"]) / decided if decided else float("nan")
    return {"module": module, **counts, "kill_rate": round(rate, 3), "survivors": sorted(survivors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="core modules (default: all of CORE)")
    parser.add_argument("--keep", metavar="DIR", help="keep the scratch checkouts (mutants, mutmut.log) under DIR")
    args = parser.parse_args(argv)
    modules = args.modules or list(CORE)
    unknown = [m for m in modules if m not in CORE]
    if unknown:
        print(f"error: {unknown[0]}: not a core module (known: {', '.join(CORE)})", file=sys.stderr)
        return 2
    out = ROOT / "reports" / "mutation.json"
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="mutants-")) as tmp:
        for module in modules:
            res = run_module(module, CORE[module], Path(tmp))
            print(f"{module}: {res['kill_rate']:.0%} killed ({res['killed']} killed, {res['timeout']} timeout, "
                  f"{res['survived']} survived, {res['other']} not run)", flush=True)
            previous = json.loads(out.read_text()) if out.exists() else {}
            previous[module] = res  # written after each module: a long run keeps what it finished
            out.write_text(json.dumps(previous, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
