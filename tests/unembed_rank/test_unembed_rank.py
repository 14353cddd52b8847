"""unembed_rank: geometry metrics against hand-computed / independent references, the analyses on
constructed data, the core effect at tiny scale, the smoke pipeline, bad input."""
from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
import scipy.stats
import torch

from stages.unembed_rank import analysis as A
from stages.unembed_rank.geometry import erank, erank_pct, isotropy, mean_cosine


def test_erank_known_values():
    # diag(3, 1): p = (3/4, 1/4) -> exp(H) by hand; σ² variant p = (9/10, 1/10)
    w = torch.diag(torch.tensor([3.0, 1.0]))
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert erank(w) == pytest.approx(math.exp(h), rel=1e-10)
    h2 = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert erank(w, "sigma2") == pytest.approx(math.exp(h2), rel=1e-10)
    assert erank(torch.eye(7) * 2.5) == pytest.approx(7.0)            # flat spectrum: full rank
    u = torch.randn(50, 1, dtype=torch.float64)
    assert erank(u @ torch.randn(1, 9, dtype=torch.float64)) == pytest.approx(1.0, abs=1e-6)  # rank one


def test_erank_matches_scipy_entropy_and_invariances():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(37, 11, generator=g, dtype=torch.float64) * 1.7
    s = np.linalg.svd(w.numpy(), compute_uv=False)
    assert erank(w) == pytest.approx(math.exp(scipy.stats.entropy(s / s.sum())), rel=1e-9)
    q, _ = torch.linalg.qr(torch.randn(37, 37, generator=g, dtype=torch.float64))
    assert erank(q @ w) == pytest.approx(erank(w), rel=1e-9)            # orthogonal invariance
    assert erank(3.3 * w) == pytest.approx(erank(w), rel=1e-9)          # scale invariance
    assert 1.0 <= erank(w, "sigma2") <= erank(w) <= 11                  # σ² spectrum is more peaked
    assert erank_pct(w) == pytest.approx(100 * erank(w) / 11)


def test_cosine_and_isotropy_references():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(20, 6, generator=g, dtype=torch.float64)
    x = w / w.norm(dim=1, keepdim=True)
    brute = np.mean([float(x[i] @ x[j]) for i in range(20) for j in range(20) if i != j])
    assert mean_cosine(w) == pytest.approx(brute, rel=1e-9)
    # isotropy: a ±-symmetric orthonormal frame is perfectly isotropic; a shared offset breaks it
    frame = torch.cat([torch.eye(4), -torch.eye(4)]).double() * 0.7
    assert isotropy(frame) == pytest.approx(1.0, abs=1e-9)
    assert isotropy(frame + 2.0) < 0.5


def test_partial_spearman_removes_a_confounder():
    rng = np.random.default_rng(0)
    z = rng.normal(size=400)                                             # the hyperparameter
    a, b = 2 * z + 0.3 * rng.normal(size=400), -1.5 * z + 0.3 * rng.normal(size=400)
    assert A.spearman(a, b) < -0.8
    rho, p = A.partial_spearman(a, b, z[:, None])
    assert abs(rho) < 0.15 and p > 0.01
    c = b - 0.8 * (a - 2 * z)                                            # a real residual link survives
    rho2, p2 = A.partial_spearman(a, c, z[:, None])
    assert rho2 < -0.5 and p2 < 1e-6


def test_eta_squared_and_delta_r2():
    rows = [{"batch_size": bs, "weight_decay": wd, "lr": 1e-3, "seed": s, "erank": 10 * i + 3 * j + 0.01 * s,
             "val_loss": 1.0 + 0.1 * i - 0.05 * j + 0.001 * ((s * 7 + i * 3 + j) % 5)}
            for i, bs in enumerate([8, 32, 128]) for j, wd in enumerate([0.0, 1.0]) for s in range(4)]
    f = pl.DataFrame(rows)
    assert A.eta_squared(f, "erank", ["batch_size", "weight_decay"]) > 0.999
    assert A.eta_squared(f, "erank", ["weight_decay"]) < 0.2
    d = A.delta_r2(f, "erank", "val_loss")
    assert d["r2_base"] > 0.9 and d["delta_r2"] < 0.05                 # erank adds nothing beyond hparams
    rng = np.random.default_rng(5)
    e, noise = rng.normal(size=f.height), rng.normal(size=f.height)
    base = 0.3 * f["batch_size"].log().to_numpy() - 0.2 * f["weight_decay"].to_numpy()
    g = f.with_columns(erank=pl.Series(f["erank"].to_numpy() + e))
    linked = A.delta_r2(g.with_columns(val_loss=pl.Series(base + 0.05 * e)), "erank", "val_loss")
    unlinked = A.delta_r2(g.with_columns(val_loss=pl.Series(base + 0.05 * noise)), "erank", "val_loss")
    assert linked["rel_delta_r2"] > 0.8 and unlinked["rel_delta_r2"] < 0.1


def test_saturation_rule():
    hist = pl.DataFrame({"run": ["a"] * 6 + ["b"] * 6, "step": list(range(6)) * 2,
                         "frac": [0.0, .2, .4, .6, .8, 1.0] * 2,
                         "val_loss": [3.0, 2, 1.5, 1.2, 1.0, 1.1, 3, 2, 1.5, 1.2, 1.0, 0.95],
                         "erank": [90.0, 80, 70, 60, 55, 40, 90, 85, 80, 75, 70, 72]})
    s = A.saturation(hist).sort("run")
    assert s["saturated"].to_list() == [True, False]
    assert s["erank_change_last20"].to_list() == pytest.approx([-15.0, 2.0])


def test_core_effect_batch_size_drives_unembedding_rank():
    """Tiny scale, equal tokens: small-batch training (more optimizer steps) ends with a clearly lower
    erank(W_U) than large-batch training, on every seed, by more than the seed-to-seed spread (the
    effect claims 1-2 rest on); fails if the hyperparameters stop driving the rank."""
    from kernels.record import KernelRecord
    from stages.common.trainer import TrainerConfig, make_trainer
    from stages.unembed_rank.corpus import Snapshot
    from stages.unembed_rank.lm import GridRun, WindowBatches, eval_windows
    from stages.unembed_rank.train import Config, model_config

    # the same bytes on every interpreter: the pinned snapshot's first in-domain files
    corpus = torch.tensor(list(b"".join(f.read_bytes() for f in Snapshot().files["stdlib_py"][:3])[:30000]),
                          dtype=torch.uint8)
    T, tokens = 16, 32 * 16 * 6
    cfg = Config(model={"d_model": 16, "n_layers": 1, "n_heads": 2, "seq_len": T}, batch_sizes=[4, 32],
                 tokens=tokens, n_evals=2)
    val = eval_windows(corpus, T, 8)
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the stage's setting: a tiny model is fastest on one thread
    for bs in (4, 32):
        for seed in (0, 1):
            steps = tokens // (bs * T)
            torch.manual_seed(seed)
            m = GridRun(model_config(cfg), name="t", lr=1e-2, weight_decay=0.1, steps=steps, warmup_frac=0.1,
                        final_lr_frac=0.1, eval_steps=[steps], val=val, ood=val, rec=KernelRecord("cpu"))
            tr = make_trainer(TrainerConfig(enable_progress_bar=False), None, max_steps=steps)
            tr.fit(m, torch.utils.data.DataLoader(WindowBatches(corpus, bs, T, steps, seed), batch_size=None))
            out[bs, seed] = m.history[-1]["erank"]
    torch.set_num_threads(threads)
    gap = [out[32, s] - out[4, s] for s in (0, 1)]
    spread = max(abs(out[4, 0] - out[4, 1]), abs(out[32, 0] - out[32, 1]))
    assert min(gap) > max(2 * spread, 5.0), (out, gap)


def test_smoke_pipeline_end_to_end(smoke_run):
    outs = smoke_run("unembed_rank")
    doc = json.loads((outs["report"] / "metrics.json").read_text())
    from stages.unembed_rank.report import CLAIMS

    assert [c["name"] for c in doc["claims"]] == [c.name for c in CLAIMS]
    assert doc["kernels"]["fused_linear_ce"]["calls"] > 0
    assert doc["kernels"]["fused_linear_ce"]["parity_max_abs_err"] < 1e-3
    res = pl.read_csv(outs["evaluate"] / "results.csv")
    # smoke: bs {4, 8} × wd {0, 1} × final {0.1, 0} × width {16, 8}, seed 0 = 16 equal-token runs (4 main), equal
    # steps 8 adds bs4@8 for each wd (bs8@8 is the equal-token run), the probe 2 runs: 20 distinct runs
    assert res.height == 20 and res["erank"].is_between(0, 100).all()
    assert [int(res[f"in_{d}"].sum()) for d in ("main", "tokens", "steps", "sat")] == [4, 16, 4, 2]
    assert set(res.filter(pl.col("in_steps"))["steps"].to_list()) == {8}
    hist = pl.read_csv(outs["train"] / "history.csv")
    assert hist["run"].n_unique() == 20 and set(hist["d_model"].unique().to_list()) == {8, 16}
    assert (outs["report"] / "figures" / "trajectories.png").exists()
    assert (outs["report"] / "figures" / "saturation_probe.png").exists()
    # dense early logging (smoke dense_steps 8): every step 1..8 of the main-block / equal-steps runs that is not a
    # regular point, none for the other runs; merged, each such run has every step 0..min(8, steps)
    dense = pl.read_csv(outs["train"] / "history_dense.csv")
    dense_runs = set(res.filter(pl.col("in_main") | pl.col("in_steps"))["run"].to_list())
    assert set(dense["run"].unique().to_list()) <= dense_runs and dense["step"].is_between(1, 8).all()
    fine = A.merge_dense(hist, dense)
    for r in dense_runs:
        steps = fine.filter(pl.col("run") == r)["step"].to_list()
        n = int(res.filter(pl.col("run") == r)["steps"][0])
        assert set(range(min(8, n) + 1)) <= set(steps) and steps == sorted(steps)
    an = json.loads((outs["evaluate"] / "analysis.json").read_text())
    assert an["matched_loss"]["max_gap"] == 0.15 and "matched_loss_steps" in an


def test_run_specs_designs_by_hand():
    """Default-like grid, counted by hand: main block 3 bs × 2 wd × 2 seeds = 12; other cells (final 0 at width
    32, both finals at width 16) 3 × 6 × 1 seed = 18; equal steps at the largest batch's step count shares the 4
    bs-128 runs and adds 2 × 2 × 2 = 8; probe 1 × 2 × 1 = 2 → 40 distinct runs."""
    from stages.unembed_rank.train import Config, run_specs

    cfg = Config(seeds=[0, 1], extra_seeds=[5], batch_sizes=[8, 32, 128], weight_decays=[0.0, 1.0],
                 final_lr_fracs=[0.1, 0.0], d_models=[32, 16], tokens=131072, n_evals=4,
                 model={"d_model": 32, "n_layers": 1, "n_heads": 4, "seq_len": 64},
                 equal_steps={"steps": 16}, saturation={"steps": 40, "batch_sizes": [8], "weight_decays": [0.0, 1.0],
                                                        "seeds": [3], "d_model": 16, "train_bytes": 4000})
    specs = run_specs(cfg)
    names = [s["name"] for s in specs]
    assert len(names) == len(set(names)) == 40
    count = lambda flag: sum(s[f"in_{flag}"] for s in specs)  # noqa: E731
    assert [count(d) for d in ("main", "tokens", "steps", "sat")] == [12, 30, 12, 2]
    shared = [s for s in specs if s["in_main"] and s["in_steps"]]
    assert len(shared) == 4 and {s["batch_size"] for s in shared} == {128} and {s["steps"] for s in shared} == {16}
    for s in specs:
        assert s["tokens"] == s["steps"] * s["batch_size"] * 64
        if s["in_tokens"]:
            assert s["tokens"] == 131072
            assert (s["seed"] in (0, 1)) == (s["final_lr_frac"] == 0.1 and s["d_model"] == 32) == s["in_main"]
        if s["in_steps"]:
            assert s["steps"] == 16 and s["d_model"] == 32 and s["final_lr_frac"] == 0.1
    assert {(s["d_model"], s["seed"], s["probe"]) for s in specs if s["in_sat"]} == {(16, 3, True)}
    # equal steps at 64 on weight decay 0 only: bs 32 runs (64 steps at equal tokens) are shared, bs 8 / 128 added
    cfg2 = cfg.model_copy(update={"equal_steps": cfg.equal_steps.model_copy(update={"steps": 64,
                                                                                    "weight_decays": [0.0]})})
    st = [s for s in run_specs(cfg2) if s["in_steps"]]
    assert len(st) == 3 * 2 and {s["weight_decay"] for s in st} == {0.0}
    assert {(s["batch_size"], s["in_main"]) for s in st} == {(8, False), (32, True), (128, False)}
    assert len(run_specs(cfg2)) == 12 + 18 + 4 + 2


def test_probe_batch_larger_than_its_slice_is_a_config_error(smoke_run, tmp_path):
    from stages.common.config import ConfigError
    from stages.common.runner import StageContext
    from stages.unembed_rank import train

    smoke_run("unembed_rank", stages=("prepare",))
    cfg = train.Config(batch_sizes=[4], tokens=4 * 64 * 10, n_evals=2,
                       saturation={"steps": 4, "train_bytes": 650, "batch_sizes": [11], "d_model": 16})
    ctx = StageContext(slug="unembed_rank", stage="train", profile="smoke", out=tmp_path / "o", root=smoke_run.root)
    (tmp_path / "o").mkdir()
    with pytest.raises(ConfigError, match=r"train\.saturation\.batch_sizes: batch size 11 .*10 training windows"):
        train.run(cfg, ctx)
    assert not (tmp_path / "o" / "models.pt").exists()


@pytest.mark.parametrize("override,key", [
    ({"batch_sizes": []}, "batch_sizes"),
    ({"weight_decays": [0.1, -0.5]}, "weight_decays"),
    ({"batch_sizes": [8, 8]}, "batch_sizes"),
    ({"tokens": 1000}, "tokens"),
    ({"equal_steps": {"steps": 3}}, "equal_steps"),
    ({"d_models": [32, 12]}, "d_models"),
    ({"final_lr_fracs": [0.1, 1.5]}, "final_lr_fracs"),
])
def test_bad_config_names_key(override, key):
    from stages.common.config import ConfigError, validate
    from stages.unembed_rank.train import Config

    with pytest.raises(ConfigError, match=rf"papers\.unembed_rank\.train(\.|: ){key}"):
        validate(Config, override, "papers.unembed_rank.train")


def test_batch_larger_than_dataset_is_a_config_error(smoke_run, tmp_path):
    from stages.common.config import ConfigError
    from stages.common.runner import StageContext
    from stages.unembed_rank import train

    outs = smoke_run("unembed_rank", stages=("prepare",))
    bs = np.load(outs["prepare"] / "train.npy").size // 65 + 1   # one more than the 65-byte windows
    cfg = train.Config(batch_sizes=[bs], tokens=bs * 64 * 10, n_evals=2)
    ctx = StageContext(slug="unembed_rank", stage="train", profile="smoke", out=tmp_path / "o", root=smoke_run.root)
    (tmp_path / "o").mkdir()
    with pytest.raises(ConfigError, match=r"papers\.unembed_rank\.train\.batch_sizes: batch size .* larger than the dataset"):
        train.run(cfg, ctx)
    assert not (tmp_path / "o" / "models.pt").exists()


def test_matched_loss_interpolates_the_first_crossing_by_hand():
    """Run a crosses loss 2.0 halfway between its points 1 and 2 (erank 80 → 60 ⇒ 70, step 10 → 20 ⇒ 15);
    run b starts below the level (its first point); run c never reaches it (NaN). Level = worst final loss."""
    hist = pl.DataFrame({"run": ["a"] * 3 + ["b"] * 3, "step": [0, 10, 20] * 2, "tokens": [0, 100, 200] * 2,
                         "val_loss": [3.0, 2.5, 1.5, 1.8, 1.7, 2.0], "erank": [90.0, 80, 60, 50, 40, 45]})
    at = A.first_crossing(hist, 2.0).sort("run")
    assert at["erank"].to_list() == pytest.approx([70.0, 50.0])
    assert at["step"].to_list() == pytest.approx([15.0, 0.0])
    assert math.isnan(A.first_crossing(hist.filter(pl.col("run") == "a"), 1.0)["erank"][0])
    res = pl.DataFrame({"run": ["a", "b"], "seed": [0, 0], "batch_size": [4, 64], "weight_decay": [0.0, 0.1]})
    m = A.matched_loss(hist, res)
    assert m["level"] == 2.0                                 # b's final loss is the worst
    assert m["bs_min"] == pytest.approx([70.0]) and m["bs_max"] == pytest.approx([50.0])
    assert m["steps_bs_min"] == pytest.approx([15.0]) and m["wd_max"] == pytest.approx([50.0])
    assert m["bs_range"] == pytest.approx([20.0]) and m["n_guarded"] == 0


def test_first_crossing_guard_by_hand():
    """a's crossing of 2.0 is bracketed by losses 2.5 and 1.5 (gap 1.0 nats): interpolated under a guard of 1.0,
    non-finite under 0.6 (and then the matched-loss cell mean too); b starts below (gap 0, never guarded).
    Adding a dense point at step 15 (loss 2.1, erank 85) narrows a's bracket to 2.1 → 1.5 (gap 0.6): the guard of
    0.61 then passes and the value follows the dense points: 85 + (0.1/0.6)·(60 − 85) = 80.833…, step 15 + 5/6·... ."""
    hist = pl.DataFrame({"run": ["a"] * 3 + ["b"] * 3, "step": [0, 10, 20] * 2, "tokens": [0, 100, 200] * 2,
                         "frac": [0.0, 0.5, 1.0] * 2,
                         "val_loss": [3.0, 2.5, 1.5, 1.8, 1.7, 2.0], "erank": [90.0, 80, 60, 50, 40, 45]})
    at = A.first_crossing(hist, 2.0, max_gap=1.0).sort("run")
    assert at["gap"].to_list() == pytest.approx([1.0, 0.0]) and at["erank"].to_list() == pytest.approx([70.0, 50.0])
    at = A.first_crossing(hist, 2.0, max_gap=0.6).sort("run")
    assert math.isnan(at["erank"][0]) and math.isnan(at["step"][0]) and at["erank"][1] == pytest.approx(50.0)
    res = pl.DataFrame({"run": ["a", "b"], "seed": [0, 0], "batch_size": [4, 64], "weight_decay": [0.0, 0.1]})
    m = A.matched_loss(hist, res, max_gap=0.6)
    assert math.isnan(m["bs_min"][0]) and m["bs_max"] == pytest.approx([50.0]) and m["n_guarded"] == 1
    assert math.isnan(m["bs_range"][0])
    dense = pl.DataFrame({"run": ["a"], "step": [15], "tokens": [150], "frac": [0.75], "val_loss": [2.1],
                          "erank": [85.0]})
    fine = A.merge_dense(hist, dense)
    assert fine.filter(pl.col("run") == "a")["step"].to_list() == [0, 10, 15, 20]
    at = A.first_crossing(fine, 2.0, max_gap=0.61).sort("run")
    assert at["gap"][0] == pytest.approx(0.6)
    assert at["erank"][0] == pytest.approx(85 + (0.1 / 0.6) * (60 - 85))
    assert at["step"][0] == pytest.approx(15 + (0.1 / 0.6) * 5)


def test_hparam_effect_ranges_by_hand():
    """One seed, bs {8, 32} × wd {0, 1}: erank 40, 30 (bs 8) and 80, 78 (bs 32). Batch means 35 / 79 → range 44;
    weight-decay means 60 / 54 → range 6; min_axis_range 6. A second seed shifted by +1 has the same ranges."""
    res = pl.DataFrame({"seed": [0] * 4 + [1] * 4, "batch_size": [8, 8, 32, 32] * 2, "weight_decay": [0.0, 1.0] * 4,
                        "erank": [40.0, 30, 80, 78, 41, 31, 81, 79]})
    e = A.hparam_effects(res, "erank")
    assert e["bs_range"] == pytest.approx([44.0, 44.0]) and e["wd_range"] == pytest.approx([6.0, 6.0])
    assert e["min_axis_range"] == pytest.approx([6.0, 6.0]) and e["bs_max"] == pytest.approx([79.0, 80.0])
    one_wd = A.hparam_effects(res.filter(pl.col("weight_decay") == 0.0), "erank")
    assert one_wd["bs_range"] == pytest.approx([40.0, 40.0]) and math.isnan(one_wd["min_axis_range"][0])


def test_saturation_gap_is_undefined_without_saturated_runs():
    res = pl.DataFrame({"erank": [10.0, 20, 30, 40], "saturated": [False] * 4, "weight_decay": [0.0, 0.0, 1.0, 1.0],
                        "erank_change_last20": [0.0, -1, 1, 0]})
    c = A.saturation_counts(res)
    assert c["n_sat"] == 0 and c["low_nosat"] == 2 and math.isnan(c["erank_gap_nosat_minus_sat"])
    assert math.isnan(c["erank_gap_within_wd"]) and c["n_wd_levels_mixed"] == 0
    c = A.saturation_counts(res.with_columns(saturated=pl.Series([True, False, False, True])))
    assert c["erank_gap_nosat_minus_sat"] == pytest.approx(25.0 - 25.0)
    # within wd 0: nosat 20 − sat 10 = 10; within wd 1: nosat 30 − sat 40 = −10; mean 0 over 2 mixed levels
    assert c["erank_gap_within_wd"] == pytest.approx(0.0) and c["n_wd_levels_mixed"] == 2
    # saturation aligned with weight decay (wd 0 all saturated, wd 1 none): pooled gap 20, within-level undefined
    c = A.saturation_counts(res.with_columns(saturated=pl.Series([True, True, False, False])))
    assert c["low_sat"] == 2 and c["erank_gap_nosat_minus_sat"] == pytest.approx(35.0 - 15.0)
    assert math.isnan(c["erank_gap_within_wd"]) and c["n_wd_levels_mixed"] == 0
    c = A.saturation_counts(res.with_columns(saturated=pl.Series([True, False, False, False])))
    assert c["erank_gap_within_wd"] == pytest.approx(10.0) and c["n_wd_levels_mixed"] == 1


# the default corpus digests of the committed runs (read on 2026-12-04 from that run's interpreter, pyenv CPython
# 3.11.7, with corpus: live); the pinned snapshot must give them on any interpreter
COMMITTED_DEFAULT_DIGESTS = {"train": "f61aeb80dc9f9c45", "val": "2b995035f1a04873", "ood": "6023d67e10af4a87"}


def test_snapshot_corpus_gives_the_committed_default_bytes(run_stage):
    import json

    meta = json.loads((run_stage("unembed_rank", "prepare") / "meta.json").read_text())
    assert meta["corpus"].startswith("snapshot of CPython 3.11.7")
    assert {k: meta["splits"][k]["sha256_16"] for k in COMMITTED_DEFAULT_DIGESTS} == COMMITTED_DEFAULT_DIGESTS
    assert meta["splits"]["val"]["bytes"] == 40_000 and meta["splits"]["train"]["files"] == 11
    assert [f for f in ("__future__.py", "_pydecimal.py") if f in meta["splits"]["train"]["first_files"]] == ["__future__.py"]
    assert np.load(run_stage.root / "unembed_rank-prepare" / "train.npy").size == 400_000


@pytest.mark.parametrize("cfg,match", [
    ({"train_bytes": 2_000_000}, r"prepare\.train_bytes: 2000000 bytes requested, \d+ available \(the pinned "
                                 r"snapshot holds the first 40 files; set papers\.unembed_rank\.prepare\.corpus: live"),
    ({"val_bytes": 400_000}, r"prepare\.val_bytes: 400000 bytes requested"),
    ({"ood_glob": "*.c"}, r"prepare\.ood_glob: the pinned snapshot holds only '\*\.h' files \(got '\*\.c'\)"),
    ({"val_every": 41}, r"prepare\.val_every: 41 puts the first val file at position 41 of the sorted list; the pinned "
                        r"snapshot holds its first 40 files; set papers\.unembed_rank\.prepare\.corpus: live"),
])
def test_snapshot_limits_are_config_errors(run_stage, cfg, match):
    from stages.common.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        run_stage("unembed_rank", "prepare", **cfg)
    assert not any((run_stage.root / "unembed_rank-prepare").iterdir())    # nothing half-written


def test_live_corpus_reads_this_interpreter(run_stage):
    import json
    import platform

    meta = json.loads((run_stage("unembed_rank", "prepare", corpus="live", train_bytes=20_000) / "meta.json").read_text())
    assert meta["corpus"] == f"live stdlib of Python {platform.python_version()}"
    assert meta["splits"]["train"]["bytes"] == 20_000


def test_seed_groups_cells_differ_only_in_seed():
    from stages.unembed_rank.train import Config, run_specs, seed_groups

    cfg = Config(seeds=[0, 1, 2], batch_sizes=[8, 32], weight_decays=[0.0, 1.0], tokens=8 * 64 * 20, n_evals=2,
                 d_models=[32, 16], final_lr_fracs=[0.1, 0.0], extra_seeds=[0],
                 equal_steps={"steps": 4}, saturation={"steps": 4, "seeds": [0, 1], "batch_sizes": [8]})
    specs = run_specs(cfg)
    cells = seed_groups(specs)
    assert sorted(s["name"] for c in cells for s in c) == sorted(s["name"] for s in specs)   # each run once
    for c in cells:
        assert len({s["seed"] for s in c}) == len(c)
        assert all({k: v for k, v in s.items() if k not in ("name", "seed")}
                   == {k: v for k, v in c[0].items() if k not in ("name", "seed")} for s in c)
    # main block 2×2 cells × 3 seeds, equal-steps 2×2 cells × 3 seeds, probe 2 cells × 2 seeds; extra cells alone
    assert sorted(len(c) for c in cells).count(3) == 8 and sorted(len(c) for c in cells).count(2) == 2
    assert seed_groups(specs, vectorize=False) == [[s] for s in specs]
    capped = seed_groups(specs, max_batch=8)      # the batch-32 cells' seeds train one after another
    assert all(len(c) == 1 for c in capped if c[0]["batch_size"] == 32)
    assert [c for c in capped if c[0]["batch_size"] == 8] == [c for c in cells if c[0]["batch_size"] == 8]


def test_vectorized_seeds_equal_seed_after_seed(smoke_run, tmp_path):
    """The stage with the seeds of each cell as one ensemble writes what it writes seed after seed: the same
    history rows (every metric of every evaluation point) and the same trained weights, to float rounding."""
    import polars as pl

    from stages.common.runner import StageContext, load_config
    from stages.unembed_rank import train

    smoke_run("unembed_rank", stages=("prepare",))
    _, cfg, _ = load_config("unembed_rank", "train", "smoke")
    cfg = cfg.model_copy(update={"seeds": [0, 3]})
    outs = {}
    for vec in (True, False):
        out = tmp_path / f"vec{vec}"
        out.mkdir()
        train.run(cfg.model_copy(update={"vectorize_seeds": vec}),
                  StageContext(slug="unembed_rank", stage="train", profile="smoke", out=out, root=smoke_run.root))
        outs[vec] = out
    assert len(train.seed_groups(train.run_specs(cfg))) < len(train.run_specs(cfg))   # some cell is an ensemble
    a, b = (pl.read_csv(outs[v] / "history.csv") for v in (True, False))
    assert a.columns == b.columns and a["run"].to_list() == b["run"].to_list() and a.height > 0
    for col in ("val_loss", "ood_loss", "train_loss", "erank", "h_erank", "isotropy"):
        x, y = a[col].to_numpy().astype(float), b[col].to_numpy().astype(float)
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=col)
    da, db = (pl.read_csv(outs[v] / "history_dense.csv") for v in (True, False))
    assert da["run"].to_list() == db["run"].to_list()
    np.testing.assert_allclose(da["val_loss"].to_numpy(), db["val_loss"].to_numpy(), rtol=1e-5)
    import json
    ka, kb = (json.loads((outs[v] / "kernels.json").read_text()) for v in (True, False))
    assert ka["fused_linear_ce"]["calls"] == kb["fused_linear_ce"]["calls"] > 0
    sa, sb = (torch.load(outs[v] / "models.pt") for v in (True, False))
    assert list(sa) == list(sb)
    for name in sa:
        assert sa[name].keys() == sb[name].keys()
        for k in sa[name]:
            torch.testing.assert_close(sa[name][k], sb[name][k], rtol=1e-5, atol=1e-6)


def test_ensemble_runs_the_triton_kernel_outside_vmap():
    """On a GPU the members' losses go through the Triton path (an autograd Function with no vmap rule), called
    outside the vmap once per member; under TRITON_INTERPRET=1 that path trains the same members as the torch
    reference (two steps, two members)."""
    from kernels.dispatch import interpreting, triton_available
    from kernels.record import KernelRecord
    from stages.common.tiny_transformer import TinyTransformerConfig
    from stages.unembed_rank.lm import GridEnsemble, SeedWindowBatches

    if not (triton_available() and interpreting()):
        pytest.skip("needs triton under TRITON_INTERPRET=1")

    class Record(KernelRecord):
        def __init__(self, backend):
            super().__init__("cpu")
            self._backend = backend

        @property
        def backend(self):
            return self._backend

    mcfg = TinyTransformerConfig(vocab_size=256, d_model=8, n_layers=1, n_heads=2, max_seq_len=8, causal=True,
                                 positional="rope", norm="rmsnorm", mlp="swiglu", tie_embeddings=False)
    corpus = torch.arange(600, dtype=torch.uint8) * 7 % 251
    data = SeedWindowBatches(corpus, 2, 8, 2, [10_000, 10_003])
    weights = {}
    for backend in ("torch", "triton"):
        rec = Record(backend)
        ens = GridEnsemble(mcfg, [0, 3], names=["a", "b"], lr=3e-2, weight_decay=0.1, steps=2, warmup_frac=0.5,
                           final_lr_frac=0.1, eval_steps=[2], val=corpus[:18].view(2, 9).long(),
                           ood=corpus[18:36].view(2, 9).long(), rec=rec)
        opt = ens.configure_optimizers()["optimizer"]
        for i in range(2):
            opt.zero_grad()
            ens.training_step(data[i], i).backward()
            opt.step()
        assert rec.to_dict()["fused_linear_ce"]["calls"] == 4          # once per member and step
        weights[backend] = ens.unembed.detach().clone()
    torch.testing.assert_close(weights["triton"], weights["torch"], rtol=1e-4, atol=1e-5)
    assert not torch.equal(weights["torch"][0], weights["torch"][1])
