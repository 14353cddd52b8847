"""Argument checks that run before Prefect is imported (importing it, or starting a temporary server,
takes seconds): an unknown paper or profile is one line on stderr and exit 2, at once."""
from __future__ import annotations

import sys


def precheck_paper_cli(argv: list[str]) -> None:
    """`python -m flows.paper_flow <slug> [--profile P]`: exit 2 with one line on a bad slug or profile."""
    from stages.common.config import PROFILES, ConfigError, read_params

    args = [a for a in argv if not a.startswith("-")]
    profile = "default"
    for i, a in enumerate(argv):
        if a == "--profile" and i + 1 < len(argv):
            profile = argv[i + 1]
            args = [x for x in args if x != profile]
        elif a.startswith("--profile="):
            profile = a.split("=", 1)[1]
    try:
        papers = read_params()["papers"]
        if args and args[0] not in papers:
            raise ConfigError(f"papers.{args[0]}: unknown paper (registered: {', '.join(sorted(papers))})")
        if profile not in PROFILES:
            raise ConfigError(f"profile: must be one of {', '.join(PROFILES)} (got {profile!r})")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
