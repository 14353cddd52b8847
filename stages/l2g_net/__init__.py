"""l2g_net — L2G-Net: exact local-to-global factorization of the graph Fourier transform (miniature).

Modules: gft (the factorization: parts, cut sparsification, rank-one Cauchy updates), graphs (generators),
heterophilous (the benchmarks' `.npz` loader), model (L2G-Net and its baselines), scaling (the scaling study,
also standalone), kernel_path (the Cauchy factors through kernels/cauchy_apply).
"""
from stages.common.sources import Source

SOURCES = [Source(
    real="the heterophilous benchmarks of Platonov et al. 2023 (minesweeper at full; roman-empire, amazon-ratings, "
         "tolokers, questions load alike): yandex-research/heterophilous-graphs data/<name>.npz with node features, "
         "labels, edges and 10 train/val/test splits",
    params_key="papers.l2g_net.prepare.task.source",
    loader="stages.l2g_net.heterophilous:load_heterophilous_npz",
    fixture_test="tests/l2g_net/test_heterophilous.py::test_heterophilous_fixture_factorization_and_l2g_net",
    note="default and smoke generate Minesweeper (Platonov et al.'s construction) at 24 x 24; full reads the "
         "published 100 x 100 file from data/raw/heterophilous/ (not downloaded here)",
)]
