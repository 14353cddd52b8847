"""Helpers for the flow tests: the paper they run, and a git repo copy of this checkout at the
smoke profile (``tests.repo_copy.copy_repo``: nothing in the copy touches this checkout)."""
from __future__ import annotations

from tests.repo_copy import copy_repo  # noqa: F401  (re-exported for the flow tests)

SLUG = "reversal_curse"  # the paper the flow tests run (smoke profile)
