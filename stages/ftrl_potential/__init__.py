"""ftrl_potential — FTRL can take exponential time to reach a Nash equilibrium in potential games
(Anagnostides, Panageas, Patris, Sandholm, ICML 2026), miniature reproduction.

Two-player identical-interest games built by size m (a derived chain gadget; the paper's own game
could not be retrieved), FTRL with entropic (MWU), Euclidean and log-barrier regularizers, constant
and vanishing step sizes, fictitious play, lazy alternating dynamics; exact ε-NE gaps; hitting
times T_ε with a cap (reported "≥ cap"); growth fits; a multi-player fictitious-play construction.

    python -m stages prepare ftrl_potential    # the games (chain, staircase, random, multi-player)
    python -m stages train ftrl_potential      # run every dynamic until an ε-NE or the cap (kernel)
    python -m stages evaluate ftrl_potential   # re-check every hit with the exact gap (kernel), fits
    python -m stages report ftrl_potential     # report.md, figures, claims

Modules: games (constructions: chain gadget, snake-in-the-box N-player games), dynamics (arms, starts;
the two-player hot loop is kernels.ftrl_dynamics), exact_fp (exact event-driven fictitious play: any
hitting time, the visited path), fits (growth fits with censored hitting times).
"""

from stages.common.sources import Source

SOURCES = [Source(
    real=None,
    note=("the paper's results are theorems about constructed potential games; the "
          "games here are built by stages/ftrl_potential/games.py (chain gadget, snake-in-the-box, baselines), "
          "there is no dataset or model to load."),
)]
