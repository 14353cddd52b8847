"""Mutation testing of the core method modules with mutmut (``make mutants``; slow, not in CI).

Each core module is mutated on its own and checked only against its own tests, in a scratch copy
of the checkout (mutmut rewrites sources under ``mutants/``). The kill rate per module is printed
and written to ``reports/mutation.json``; the README's table is copied from it. Goal: >= 80% per
module. The registry lives beside each paper's tests, in ``tests/<area>/mutation.json`` (the module, the
pytest args selecting its own tests, and its equivalent mutants: a change that cannot alter behaviour,
listed by name with the reason and not counted).

    python -m tests.mutation                          # every module in CORE
    python -m tests.mutation stages/common/claims.py  # one module
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mutmut.stats import status_by_exit_code

ROOT = Path(__file__).resolve().parents[1]

def _registry_files(root: Path) -> list[tuple[Path, dict]]:
    """(path relative to root, its "modules" mapping) of every ``tests/<area>/mutation.json``."""
    out = []
    for path in sorted((root / "tests").glob("*/mutation.json")):
        rel = path.relative_to(root)
        try:
            out.append((rel, json.loads(path.read_text())["modules"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"error: {rel}: not a mutation registry ({exc})") from None
    return out


def load_registry(root: Path = ROOT) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Core modules and their equivalent mutants, from every ``tests/<area>/mutation.json``.

    Each file belongs to its paper's test folder::

        {"modules": {"stages/<slug>/<module>.py": {
            "tests": ["tests/<slug>/test_x.py", "-k", "not smoke"],   # pytest args: that module's own tests
            "equivalent": {"<mutant name>": "why this change cannot alter behaviour"}}}}
    """
    core: dict[str, list[str]] = {}
    equivalent: dict[str, str] = {}
    for rel, modules in _registry_files(root):
        for module, entry in modules.items():
            if module in core:
                raise SystemExit(f"error: {rel}: {module} is registered twice")
            if not (root / module).is_file() or not entry.get("tests"):
                raise SystemExit(f"error: {rel}: {module}: no such module, or no tests listed")
            core[module] = list(entry["tests"])
            for name, why in (entry.get("equivalent") or {}).items():
                if not str(why).strip():
                    raise SystemExit(f"error: {rel}: equivalent mutant {name} has no reason")
                equivalent[f"{module}::{name}"] = why
    return core, equivalent


# core module -> the pytest args selecting the tests that own it; "<module>::<mutant>" -> why equivalent
CORE, EQUIVALENT = load_registry()


def _copy_checkout(dest: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not rel.startswith(("data/", "reports/", "wandb/")):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _scratch(workdir: Path, module: str) -> Path:
    """A module's scratch checkout, named by its path (several papers have a model.py)."""
    return workdir / module.replace("/", "_").removesuffix(".py")


def module_env(module: str, root: Path = ROOT) -> dict[str, str]:
    """Extra environment of a module's mutant runs: its registry entry's optional ``"env"`` (e.g.
    ``{"NUMBA_DISABLE_JIT": "1"}`` for compiled loops, which mutmut can only mutate and run as plain Python)."""
    for _, modules in _registry_files(root):
        if module in modules:
            return {str(k): str(v) for k, v in (modules[module].get("env") or {}).items()}
    return {}


def run_module(module: str, tests: list[str], workdir: Path) -> dict:
    work = _scratch(workdir, module)
    work.mkdir(parents=True)
    _copy_checkout(work)
    pyproject = (work / "pyproject.toml").read_text()
    pyproject += ("\n[tool.mutmut]\n"
                  f"source_paths = [\"{module}\"]\n"
                  "also_copy = [\"stages\", \"kernels\", \"flows\", \"params.yaml\", \"tests\"]\n"
                  f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
                  "pytest_add_cli_args = [\"-x\", \"-q\", \"-p\", \"no:cacheprovider\", \"-o\", \"addopts=\"]\n"
                  # workers fork from a server that has only collected the tests: polars' and torch's thread
                  # pools are not fork-safe, and a child forked after they started hangs on a futex until
                  # the wall limit, which mutmut reads as a "timeout" (counted as killed)
                  "process_isolation = \"forkserver\"\n")
    (work / "pyproject.toml").write_text(pyproject)
    # one OpenMP/MKL thread as well: no thread pool for a forked worker to inherit half-started
    env = {**os.environ, "TRITON_INTERPRET": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", **module_env(module)}
    with open(work / "mutmut.log", "w") as log:  # kept with --keep: why mutants were "not run"
        subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "2"], cwd=work, env=env,
                       stdout=log, stderr=subprocess.STDOUT)
    return score(module, work)


def score(module: str, work: Path) -> dict:
    """The result of a finished mutmut run in ``work`` (its mutants/**/*.meta), equivalents left out."""
    counts = {"killed": 0, "timeout": 0, "survived": 0, "no_tests": 0, "other": 0, "equivalent": 0}
    survivors, uncovered = [], []
    for meta in (work / "mutants").rglob("*.meta"):
        data = json.loads(meta.read_text())
        for name, code in (data.get("exit_code_by_key") or {}).items():
            if f"{module}::{name}" in EQUIVALENT:
                counts["equivalent"] += 1
                continue
            kind = EXIT_KIND.get(code, "other")
            counts[kind] += 1
            if kind == "survived":
                survivors.append(name)
            elif kind == "no_tests":
                uncovered.append(name)
    return {"module": module, **counts, "kill_rate": kill_rate(counts), "survivors": sorted(survivors),
            "uncovered": sorted(uncovered)}


# mutmut's own verdict per exit code, folded into the counts here. Its score is (killed + timeout) /
# (all - skipped): a mutant no selected test executes ("no tests") counts against the module, as here.
# "other" (skipped, not checked, interrupted, killed by a signal other than the CPU limit) is reported and
# left out.
EXIT_KIND = {code: {"killed": "killed", "caught by type check": "killed", "survived": "survived",
                    "no tests": "no_tests", "timeout": "timeout"}.get(status, "other")
             for code, status in status_by_exit_code.items()}


def normalize(r: dict) -> dict:
    """An entry written before no-test mutants were told apart: every mutant it did not run counts as one no
    test covers (so its rate is a lower bound)."""
    if "no_tests" not in r:
        r = {**r, "no_tests": r.get("other", 0), "other": 0, "uncovered": []}
        if r["no_tests"]:
            r["note"] = ("measured before no-test mutants were told apart: every mutant not run is counted as one "
                         "no test covers (a lower bound)")
        r["kill_rate"] = kill_rate(r)
    return r


def kill_rate(r: dict) -> float:
    decided = r["killed"] + r["timeout"] + r["survived"] + r.get("no_tests", 0)
    return round((r["killed"] + r["timeout"]) / decided, 3) if decided else float("nan")


def table(results: dict) -> str:
    rows = ["| core module | kill rate: (killed + timeouts) / (decided + no test) | killed | timeouts | survived | "
            "no test covers it | equivalent (listed) | left out |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for module in sorted(set(CORE) | set(results)):
        r = normalize(results[module]) if module in results else None
        if r is None:
            rows.append(f"| `{module}` | not measured yet | | | | | | |")
            continue
        total = r["killed"] + r["timeout"] + r["survived"] + r["no_tests"]
        mark = " ¹" if r.get("note") else ""
        rows.append(f"| `{module}` | {r['kill_rate']:.1%}{mark} ({r['killed'] + r['timeout']}/{total}) | {r['killed']} | "
                    f"{r['timeout']} | {r['survived']} | {r['no_tests']} | {r.get('equivalent', 0)} | {r['other']} |")
    if any(r.get("note") for r in results.values()):
        rows.append("\n¹ measured before mutants that no test executes were told apart from ones mutmut did not run: "
                    "all of those are counted as not killed, so the rate is a lower bound.")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="core modules (default: all of CORE)")
    parser.add_argument("--keep", metavar="DIR", help="keep the scratch checkouts (mutants, mutmut.log) under DIR")
    parser.add_argument("--rescore", metavar="DIR", help="record the result of a run kept with --keep DIR again "
                        "(after editing the equivalent list) without re-running mutmut")
    parser.add_argument("--table", action="store_true", help="print the README's kill-rate table from reports/mutation.json")
    args = parser.parse_args(argv)
    out = ROOT / "reports" / "mutation.json"
    if args.table:
        print(table(json.loads(out.read_text())))
        return 0
    modules = args.modules or list(CORE)
    unknown = [m for m in modules if m not in CORE]
    if unknown:
        print(f"error: {unknown[0]}: not a core module (known: {', '.join(CORE)})", file=sys.stderr)
        return 2
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    status = 0
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory(prefix="mutants-")) as tmp:
        for module in modules:
            res = (score(module, _scratch(Path(args.rescore), module)) if args.rescore
                   else run_module(module, CORE[module], Path(tmp)))
            if res["killed"] + res["timeout"] + res["survived"] + res["no_tests"] == 0:  # interrupted: no rate
                print(f"error: {module}: mutmut decided no mutant (see mutmut.log with --keep); nothing recorded",
                      file=sys.stderr)
                status = 1
                continue
            print(f"{module}: {res['kill_rate']:.0%} killed ({res['killed']} killed, {res['timeout']} timeout, "
                  f"{res['survived']} survived, {res['no_tests']} no test, {res['other']} left out)", flush=True)
            with open(out.with_suffix(".lock"), "w") as lock:  # several runs may finish at once
                fcntl.flock(lock, fcntl.LOCK_EX)
                previous = {m: normalize(r) for m, r in (json.loads(out.read_text()) if out.exists() else {}).items()}
                previous[module] = res  # written after each module: a long run keeps what it finished
                out.write_text(json.dumps(previous, indent=2, sort_keys=True) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
