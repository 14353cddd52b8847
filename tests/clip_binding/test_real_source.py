"""clip_binding's real-CLIP path (issue 42) on a tiny randomly initialised CLIPModel saved in the real
`save_pretrained` layout at test time: nothing is downloaded."""
from __future__ import annotations

import pytest
import torch

from stages.common.sources import SourceConfig, SourceError
from stages.clip_binding.clip import WORDS, clip_world, load_clip, object_phrase, save_fixture, scene_caption, text_features
from stages.clip_binding.scenes import World

pytestmark = pytest.mark.real_source


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    return save_fixture(tmp_path_factory.mktemp("clip") / "tiny-clip", seed=3)


def test_captions_name_each_objects_concepts():
    w = World(2, 5, 2)
    # object id = c1 · v + c2: object 13 = (2, 3) -> colour 2, shape 3
    assert object_phrase(w, 13) == f"a {WORDS[0][2]} {WORDS[1][3]}"
    assert scene_caption(w, 13, 4) == f"a {WORDS[0][2]} {WORDS[1][3]} and a {WORDS[0][0]} {WORDS[1][4]}"
    assert len({object_phrase(w, o) for o in range(w.n_objects)}) == w.n_objects     # distinct objects, distinct text
    w3 = World(3, 4, 2)   # object 17 = (1, 0, 1): size word first, shape last
    assert object_phrase(w3, 17) == f"a {WORDS[2][1]} {WORDS[0][1]} {WORDS[1][0]}"


def test_clip_world_matches_one_caption_at_a_time_and_pools_at_eos(fixture_dir):
    from transformers import CLIPModel

    model, tok = load_clip(SourceConfig(kind="hf", model=str(fixture_dir)))
    assert isinstance(model, CLIPModel)
    w = World(2, 4, 2)
    a, b = torch.tensor([0, 5, 9, 15]), torch.tensor([15, 5, 2, 0])
    Y, P = clip_world(model, tok, w, a, b)
    assert Y.shape == (4, 16) and P.shape == (w.n_objects, 16)
    # batched (padded) features equal the unpadded one-caption forward through the text tower by hand
    for i in range(4):
        enc = tok([scene_caption(w, int(a[i]), int(b[i]))], return_tensors="pt")
        ids = enc["input_ids"]
        assert ids[0, 0] == 3 and ids[0, -1] == 4                              # <s> ... </s>
        with torch.no_grad():
            hidden = model.text_model(input_ids=ids).last_hidden_state          # (1, L, d)
            want = model.text_projection(hidden[0, -1])                         # pooled at </s>
        torch.testing.assert_close(Y[i], want, rtol=1e-5, atol=1e-5)
    # order matters: (a, b) and (b, a) are different captions, and the same object twice is one phrase twice
    assert not torch.allclose(Y[0], Y[3])
    torch.testing.assert_close(P[7], text_features(model, tok, [object_phrase(w, 7)])[0])


def test_loader_refusals_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceError, match="evaluate.source.model"):
        load_clip(SourceConfig(kind="hf", model="nobody-here/not-a-clip-model-xyz"))
    with pytest.raises(SourceError, match="does not exist"):
        load_clip(SourceConfig(kind="hf", model=str(tmp_path / "missing" / "clip")))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{}")
    with pytest.raises(SourceError, match="not a CLIP checkpoint"):
        load_clip(SourceConfig(kind="hf", model=str(tmp_path / "junk")))
    with pytest.raises(SourceError, match="no CLIP model"):
        load_clip(SourceConfig())


def test_zero_padding_to_clip_width_leaves_r2_and_probe_scores_unchanged():
    """evaluate pads the trained/control embeddings with zero columns to CLIP's width (one regressor bank)."""
    from kernels.record import KernelRecord
    from stages.clip_binding.complexity import r2_score
    from stages.clip_binding.evaluate import _pad, probe_accuracy

    g = torch.Generator().manual_seed(5)
    y, pred = torch.randn(2, 30, 6, generator=g), torch.randn(2, 30, 6, generator=g)
    mean = torch.randn(2, 1, 6, generator=g)
    torch.testing.assert_close(r2_score(_pad(y, 11), _pad(pred, 11), _pad(mean, 11)), r2_score(y, pred, mean))
    assert _pad(y, 11)[..., 6:].abs().sum() == 0
    probes, a, b = torch.randn(1, 9, 6, generator=g), torch.randint(0, 9, (30,), generator=g), torch.randint(0, 9, (30,), generator=g)
    rec = KernelRecord(torch.device("cpu"))
    want = probe_accuracy(pred[:1], probes, a, b, 9, rec, rec.backend)
    got = probe_accuracy(_pad(pred[:1], 11), _pad(probes, 11), a, b, 9, rec, rec.backend)
    assert got == want and 0.0 <= want[0] <= 1.0


def test_full_profile_pipeline_on_the_clip_fixture(fixture_dir, tmp_path):
    """The `full` profile's CLIP branch end to end (issue 42): prepare/train/evaluate/report at smoke sizes with
    `source` naming the saved CLIP checkpoint; complexity_inputs embeds every scene caption with its text tower and
    the same regressors and probes run on them as on the trained encoders; the report shows the CLIP rows."""
    import json

    import yaml

    from stages.common.paths import ROOT
    from stages.common.runner import run_stage

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    p = params["papers"]["clip_binding"]
    for stage in ("prepare", "train", "evaluate"):
        p[stage]["profiles"]["full"] = dict(p[stage]["profiles"]["smoke"])
    p["evaluate"]["profiles"]["full"]["source"] = {"kind": "file", "model": str(fixture_dir)}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    for stage in ("prepare", "train", "evaluate", "report"):
        run_stage("clip_binding", stage, "full", root=tmp_path, params_path=tmp_path / "params.yaml")
    metrics = json.loads((tmp_path / "reports/clip_binding/metrics.json").read_text())
    m = metrics["metrics"]
    clip, trained = m["complexity"]["clip"], m["complexity"]["trained"]
    assert set(clip) == set(trained)                                   # the same families and summaries
    for fam in ("mlp", "best_r2", "best_probe_acc"):
        v = clip[fam]["f50"]["r2"] if fam == "mlp" else clip[fam]["f50"]
        assert len(v) == 3 and all(isinstance(x, float) for x in v)    # one value per seed's split
    assert len(m["additivity"]["clip"]) == 3 and -1.0 <= m["additivity"]["clip"][0] <= 1.0
    assert "| clip | mlp |" in (tmp_path / "reports/clip_binding/report.md").read_text()   # the results table
