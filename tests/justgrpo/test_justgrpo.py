"""justgrpo: task correctness against Python's own arithmetic, the samplers' order semantics, the
exactness of the AR likelihood under the dLLM (vs the rollout's own log-probs), the unbiased pass@k
estimator against brute-force enumeration, the flexibility-trap mechanism on a stub dLLM, the
smoke pipeline end to end, and bad-input errors at config load."""
from __future__ import annotations

import itertools
import json
from math import ceil

import numpy as np
import pytest
import torch

from stages.common.config import ConfigError, validate
from stages.common.tiny_transformer import TinyTransformer, TinyTransformerConfig
from stages.justgrpo import evaluate, prepare, train
from stages.justgrpo.dllm import ar_logprobs, decode, onestep_logprobs, reward_fn
from stages.justgrpo.task import (EOS, HASH, MASK, PLUS, VOCAB, VOCAB_SIZE, all_prompts, answers, extract_answer,
                                  guess_rate, is_fork, prompt_batch, render, solution, trace_valid, value, ORDERS)


def _toks(text: str, gen_len: int = 20) -> list[int]:
    """An independent tokenizer for hand-written traces."""
    ids = [VOCAB.index(ch) for ch in text]
    return ids + [EOS] * (gen_len - len(ids))


def test_task_values_and_solutions_match_python_arithmetic():
    rows = all_prompts()
    assert len(rows) == 10 ** 4 and len({tuple(r) for r in rows.tolist()}) == 10 ** 4
    assert rows[:3].tolist() == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2]] and rows[10].tolist() == [0, 0, 1, 0]
    # the left order writes each column in prompt order (b + d first), the right order swaps both columns
    assert [VOCAB[i] for i in solution(4, 7, 3, 8, "left", 20) if i != EOS] == list("7+8=15;4+3+1=8;#85")
    assert [VOCAB[i] for i in solution(4, 7, 3, 8, "right", 20) if i != EOS] == list("8+7=15;3+4+1=8;#85")
    assert len(solution(0, 1, 0, 2, "left", 24)) == 24
    assert render(solution(4, 7, 3, 8, "left", 20)) == "7+8=15;4+3+1=8;#85"       # EOS padding not shown
    assert render(torch.tensor([4, 7, PLUS, 3, 8, MASK])) == "47+38"
    with pytest.raises(ValueError, match="gen_len 17 is shorter than the 18-token solution"):
        solution(4, 7, 3, 8, "left", 17)
    prompts = prompt_batch(torch.as_tensor(rows))
    truth = [int(f"{a}{b}") + int(f"{c}{d}") for a, b, c, d in rows.tolist()]   # Python's own integers
    assert answers(prompts).tolist() == truth
    for (a, b, c, d), t, p in list(zip(rows.tolist(), truth, prompts))[::37]:
        assert value(a, b, c, d) == t
        assert "".join(VOCAB[i] for i in p.tolist()) == f"{a}{b}+{c}{d}"
        for order in ORDERS:
            sol = solution(a, b, c, d, order, 20)
            text = "".join(VOCAB[i] for i in sol if i != EOS)
            ones, tens, _ = text.split(";")
            lhs, rhs = ones.split("=")
            assert eval(lhs) == int(rhs) and sorted(map(int, lhs.split("+"))) == sorted((b, d))
            lhs, rhs = tens.split("=")
            assert eval(lhs) == int(rhs) == a + c + (b + d) // 10
            assert (lhs.count("+") == 2) == (b + d >= 10) and (lhs.count("+") < 2 or lhs.endswith("+1"))
            assert int(extract_answer(torch.tensor([sol]))[0]) == t
            assert bool(trace_valid(torch.tensor([sol]), p[None])[0])


def test_hand_written_traces_are_judged_step_by_step():
    p = prompt_batch(torch.tensor([[4, 7, 3, 8]]))               # 47 + 38 = 85
    cases = {"7+8=15;4+3+1=8;#85": (True, 85), "8+7=15;3+4+1=8;#85": (True, 85),
             "8+7=15;4+3+1=8;#85": (True, 85),                 # each column in either order
             "7+8=15;4+3=8;#85": (False, 85),                  # carry not written: a wrong step, right answer
             "7+8=15;4+3+1=9;#95": (False, 95),
             "7+8=16;4+3+1=8;#86": (False, 86),
             "7+8=15;4+3+1=8;#085": (False, -1),               # leading zero
             "7+9=16;4+3+1=8;#86": (False, 86),                # wrong digits copied
             "7+8=15;4+3+1=8;#8": (False, 8),
             "#85": (False, 85),
             "7+8=15;4+3+1=8;#85+": (False, 85),               # the answer ends at the first non-digit
             "#05": (False, -1)}
    for text, (valid, ans) in cases.items():
        g = torch.tensor([_toks(text)])
        assert bool(trace_valid(g, p)[0]) is valid, text
        assert int(extract_answer(g)[0]) == ans, text
    # a batch: a malformed row does not stop the judging of the rows after it
    batch = torch.tensor([_toks("#85"), _toks("7+8=15;4+3+1=8;#85"), _toks("8+7=15;3+4+1=8;#85")])
    assert trace_valid(batch, p.expand(3, -1)).tolist() == [False, True, True]
    bad = _toks("7+8=15;4+3+1=8;#85")
    bad[-1] = 3                                                  # a token after the EOS padding
    assert not bool(trace_valid(torch.tensor([bad]), p)[0])
    masked = _toks("7+8=15;4+3+1=8;#85")
    masked[2] = MASK
    assert not bool(trace_valid(torch.tensor([masked]), p)[0])


def test_forks_are_exactly_the_prompts_whose_orders_start_differently():
    prompts = prompt_batch(torch.as_tensor(all_prompts()))
    fork = is_fork(prompts)
    for r, f in zip(all_prompts().tolist()[::13], fork.tolist()[::13]):
        firsts = {solution(*r, o, 20)[0] for o in ORDERS}
        assert f == (len(firsts) == 2)


def test_guessing_is_rare():
    ans = np.array([int(f"{a}{b}") + int(f"{c}{d}") for a, b, c, d in all_prompts().tolist()])
    assert len(set(ans.tolist())) == 199
    assert guess_rate(ans) == pytest.approx(100 / 10 ** 4)      # 99 = i + (99 − i) for i = 0..99
    assert guess_rate(np.array([3, 3, 5, 7])) == 0.5


def test_extract_answer_and_reward():
    gen = torch.tensor([_toks("#85"), [HASH, MASK, 3, 3] + [EOS] * 16, _toks("1+2=3"), _toks("#1234")])
    assert extract_answer(gen).tolist() == [85, -1, -1, -1]
    p = prompt_batch(torch.tensor([[4, 7, 3, 8]] * 4))
    assert reward_fn(None, {"prompts": p, "tokens": gen}).tolist() == [1.0, -1.0, -1.0, -1.0]


def _model(seed=0, std=0.3):
    torch.manual_seed(seed)
    return TinyTransformer(TinyTransformerConfig(vocab_size=VOCAB_SIZE, d_model=24, n_layers=2, n_heads=2,
                                                 max_seq_len=25, causal=False, init_std=std)).eval()


def test_ar_likelihood_is_exact_for_block1_rollouts():
    """JustGRPO's loss likelihood equals the log-prob each token had when the AR rollout sampled it;
    the one-step surrogate does not (the gap the baseline ignores)."""
    m = _model()
    p = prompt_batch(torch.as_tensor(all_prompts()[[3, 50, 123, 4999, 17]]))
    g = torch.Generator().manual_seed(5)
    gen, info = decode(m, p, 16, 1, 1, 1.0, g)
    assert torch.equal(info["step"], torch.arange(16).expand(5, 16))  # strictly left to right
    torch.testing.assert_close(ar_logprobs(m, p, gen), info["logp"], atol=1e-5, rtol=1e-5)
    # brute force for one position: rebuild [prompt, y_<t, MASK...] by hand
    t = 6
    x = torch.cat([p[1], gen[1, :t], torch.full((16 - t,), MASK)])[None]
    logits = m(x)[0, 5 + t].clone()
    logits[MASK] = -1e4
    assert abs(float(torch.log_softmax(logits, -1)[gen[1, t]]) - float(ar_logprobs(m, p, gen)[1, t])) < 1e-5
    assert (onestep_logprobs(m, p, gen) - info["logp"]).abs().max() > 1e-2


@pytest.mark.parametrize("gen_len,block,k", [(14, 7, 1), (14, 7, 2), (14, 7, 4), (16, 16, 3), (15, 4, 4)])
def test_semi_ar_blocks_and_tokens_per_step(gen_len, block, k):
    m = _model(1)
    p = prompt_batch(torch.as_tensor(all_prompts()[:3]))
    gen, info = decode(m, p, gen_len, block, k, 0.0)
    sizes = [min(block, gen_len - b0) for b0 in range(0, gen_len, block)]
    assert info["n_steps"] == sum(ceil(s / k) for s in sizes)
    assert (gen != MASK).all()
    step = info["step"]
    for i, b0 in enumerate(range(block, gen_len, block)):          # block j only after block j-1 is done
        assert (step[:, b0:].min(1).values > step[:, :b0].max(1).values).all()
    counts = torch.stack([(step == s).sum(1) for s in range(info["n_steps"])], 1)
    assert counts.max() <= k


class StubDLLM(torch.nn.Module):
    """A 'dLLM' whose position 0 is a fork (two equally likely digits) and every other position
    is confident, whatever the context: low-confidence decoding must postpone the fork."""

    def forward(self, x):
        B, T = x.shape
        logits = torch.full((B, T, VOCAB_SIZE), -40.0)
        logits[:, :, 1] = 5.0
        logits[:, 5, 1] = 0.0
        logits[:, 5, 2] = 0.0
        return logits


def test_flexibility_trap_mechanism_on_stub():
    p = torch.zeros(64, 5, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    _, ar = decode(StubDLLM(), p, 14, 1, 1, 1.0, g)
    _, arb = decode(StubDLLM(), p, 14, 14, 1, 1.0, g)
    assert (ar["step"][:, 0] == 0).all()
    assert (arb["step"][:, 0] == 13).all()                          # the fork is decoded last
    assert torch.allclose(ar["entropy"][:, 0], torch.full((64,), float(np.log(2))), atol=1e-3)


def test_pass_at_k_matches_enumeration():
    for n, c, k in [(6, 2, 3), (7, 0, 2), (5, 5, 5), (8, 3, 1), (9, 4, 6)]:
        samples = [1] * c + [0] * (n - c)
        subsets = list(itertools.combinations(range(n), k))
        brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
        assert abs(evaluate.pass_at_k(n, np.array([c]), k)[0] - brute) < 1e-12


@pytest.mark.parametrize("cfg_cls,block,needle", [
    (prepare.Config, {"gen_len": 19}, "gen_len"),
    (prepare.Config, {"test_frac": 0.5, "dev_frac": 0.45}, "dev_frac"),
    (evaluate.Config, {"ks": [1, 2, 4], "claim_k": 8}, "claim_k"),
    (train.Config, {"pretrain": {"steps": 100, "eval_every": 200}}, "pretrain.eval_every"),
    (train.Config, {"pretrain": {"target_greedy_acc": 1.5}}, "target_greedy_acc"),
    (train.Config, {"rl": {"grpo": {"group_size": 1}}}, "rl.grpo.group_size"),
    (evaluate.Config, {"n_samples": 16, "ks": [1, 4, 64]}, "ks"),
    (evaluate.Config, {"tokens_per_step": [1, 8], "eval_block": 4}, "tokens_per_step"),
    (train.Config, {"model": {"d_model": 48, "n_heads": 5}}, "n_heads"),
    (prepare.Config, {"seeds": [1, 1]}, "seeds"),
])
def test_bad_params_name_the_key(cfg_cls, block, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        validate(cfg_cls, block, "papers.justgrpo.x")


def test_smoke_pipeline(smoke_run):
    out = smoke_run("justgrpo")
    metrics = json.loads((out["report"] / "metrics.json").read_text())
    names = {c["name"] for c in metrics["claims"]}
    assert {"ar_coverage_at_k", "justgrpo_beats_arbitrary_grpo", "gain_survives_parallel",
            "justgrpo_improves_base_trace", "base_trace_above_floor", "guessing_rare", "justgrpo_beats_continued"} <= names
    assert metrics["kernels"]["token_logprob"]["calls"] > 0
    assert (out["report"] / "figures" / "passk_curves.png").exists()
    ev = metrics["metrics"]
    assert set(ev["acc"]) == {"base", "justgrpo", "arbitrary", "continued"} and set(ev["acc"]["base"]) == {"tps1", "tps2", "tps4", "full_arbitrary"}
    # per-prompt 0/1 lists (paired verdicts), one per seed, on the evaluated test prompts
    items = ev["acc"]["justgrpo"]["tps1"]
    assert len(items) == len(ev["seeds"]) and all(len(v) == ev["eval_prompts"] and set(v) <= {0, 1} for v in items)
    assert set(ev["trace_acc"]) == set(ev["acc"])
    # trace-level correctness never exceeds answer-level on the same prompt (a valid trace has the right answer)
    for name in ev["acc"]:
        for t in ev["acc"][name]:
            for ans, tr in zip(ev["acc"][name][t], ev["trace_acc"][name][t]):
                assert all(x >= y for x, y in zip(ans, tr))
    # fork branches: per fork prompt 0/1, and taking both branches among valid traces implies among all samples
    assert {"fork_branches_ar_wider", "justgrpo_beats_arbitrary_trace"} <= names
    for smp in ("ar", "arbitrary"):
        for both, valid in zip(ev["fork"][smp]["both_orders"], ev["fork"][smp]["both_orders_valid"]):
            assert len(both) == ev["n_fork_prompts"] and all(b >= v for b, v in zip(both, valid))
    for smp in ("ar", "arbitrary"):
        for k, v in ev["passk"][smp]["trace"].items():
            assert all(t <= a + 1e-12 for t, a in zip(v, ev["passk"][smp]["answer"][k]))
    import polars as pl
    hist = pl.read_csv(out["train"] / "rl_history.csv")
    assert {"reward_mean", "reward_std", "dev_acc", "dev_trace_acc", "entropy", "kl_to_base"} <= set(hist.columns)
    assert "loss" not in hist.columns                              # the surrogate's value is not a learning signal
    assert hist.filter(pl.col("step") == 0)["kl_to_base"].abs().max() < 1e-5   # step 0: the policy is the base
    # the continued-pretraining control: dev accuracy at step 0 (the base: the RL arms' step-0 reading) and at the end
    ctrl = hist.filter(pl.col("arm") == "continued").sort("step")
    assert ctrl["step"].to_list() == [0, hist["step"].max()] and ctrl["reward_mean"].is_null().all()
    assert ctrl["dev_acc"][0] == hist.filter((pl.col("arm") == "justgrpo") & (pl.col("step") == 0))["dev_acc"][0]
    assert pl.read_csv(out["train"] / "pretrain_curve.csv").columns == ["step", "dev_greedy_acc", "dev_greedy_trace", "dev_trace_pass1"]
    # each split is stored in a seeded random order, so test[:n] and the dev slices are random samples of their
    # split (a sorted table made every verdict read the prompts with the smallest first operands)
    table = pl.read_parquet(out["prepare"] / "prompts.parquet")
    for split in ("train", "test"):
        keys = table.filter(pl.col("split") == split).select(["a", "b", "c", "d"]).rows()
        assert keys != sorted(keys) and len({k[0] for k in keys[:50]}) >= 5


def test_stop_rule_reads_greedy_answer_accuracy(monkeypatch):
    """The pretraining stop rule stops at the FIRST check whose dev greedy answer accuracy reaches the target
    (not greedy trace accuracy, not the T = 1 reading), checks only every ``every`` steps, and records all three."""
    import types
    script = {4: (0.5, 0.9), 8: (0.7, 0.1), 12: (0.8, 0.0), 16: (0.95, 0.0)}   # step -> (answer acc, trace acc)
    calls = []

    def fake_greedy(model, prompts, gen_len, block, tps, counter=None, batch=512):
        calls.append((block, tps))
        a, t = script[trainer.global_step]
        n = prompts.shape[0]
        return {"answer": [1] * round(a * n) + [0] * (n - round(a * n)),
                "trace": [1] * round(t * n) + [0] * (n - round(t * n))}

    from stages.justgrpo import dllm
    monkeypatch.setattr(dllm, "greedy_items", fake_greedy)            # what train's greedy_rates decodes with
    monkeypatch.setattr(train, "decode", lambda model, p, *a, **k: (torch.zeros(p.shape[0], 20, dtype=torch.long), {}))
    monkeypatch.setattr(train, "trace_valid", lambda gen, p: torch.tensor([True] * 3 + [False] * (p.shape[0] - 3)))
    prompts = torch.zeros(20, 6, dtype=torch.long)
    stop = train.StopAtTarget(prompts, 20, 5, 4, 0.75, 0, None)
    module = types.SimpleNamespace(model=torch.nn.Linear(1, 1), device=torch.device("cpu"))
    trainer = types.SimpleNamespace(global_step=0, should_stop=False)
    for step in range(1, 17):
        trainer.global_step = step
        stop.on_train_batch_end(trainer, module, None, None, step)
        if trainer.should_stop:
            break
    assert trainer.global_step == 12 and [r["step"] for r in stop.curve] == [4, 8, 12]
    assert calls == [(5, 1)] * 3                                    # semi-AR blocks of 5, one token per step
    assert [r["dev_greedy_acc"] for r in stop.curve] == [0.5, 0.7, 0.8]
    assert [r["dev_greedy_trace"] for r in stop.curve] == [0.9, 0.1, 0.0]
    assert all(abs(r["dev_trace_pass1"] - 0.15) < 1e-6 for r in stop.curve)
    never = train.StopAtTarget(prompts, 20, 5, 4, None, 0, None)      # target null: records, never stops
    trainer.global_step, trainer.should_stop = 16, False
    never.on_train_batch_end(trainer, module, None, None, 16)
    assert not trainer.should_stop and len(never.curve) == 1


def test_imperfect_teacher_drops_the_carry_only_where_there_is_one():
    """The pretraining teacher's slip (hand-written): 47+38 written without the carry is `7+8=15;4+3=7;#75`, an
    invalid trace whose answer is one ten short; a prompt without a carry is unchanged."""
    slip = solution(4, 7, 3, 8, "left", 20, drop_carry=True)
    assert render(slip) == "7+8=15;4+3=7;#75" and slip == _toks("7+8=15;4+3=7;#75")
    assert render(solution(4, 7, 3, 8, "right", 20, drop_carry=True)) == "8+7=15;3+4=7;#75"
    p = prompt_batch(torch.tensor([[4, 7, 3, 8]]))
    assert not bool(trace_valid(torch.tensor([slip]), p)[0]) and int(extract_answer(torch.tensor([slip]))[0]) == 75
    for order in ORDERS:                                              # 42+35: no carry, nothing to drop
        assert solution(4, 2, 3, 5, order, 20, drop_carry=True) == solution(4, 2, 3, 5, order, 20)


def test_solution_loader_drops_carries_at_the_teacher_rate():
    """Over many batches, the share of carry-prompt rows written without the carry is the teacher's rate (binomial
    4-sigma band), non-carry rows are always the canonical trace, and rate 0 writes every carry."""
    rows = torch.as_tensor(all_prompts())
    prompts = prompt_batch(rows)

    def slips(rate: float) -> tuple[int, int, int]:
        n_carry = n_drop = n_other_changed = 0
        for batch in train.SolutionLoader(prompts, 20, 256, 20, seed=3, carry_drop=rate):
            for row in batch.tolist():
                a, b, _, c, d = row[:5]
                text = render(torch.tensor(row[5:]))
                canonical = {render(solution(a, b, c, d, o, 20)) for o in ORDERS}
                if b + d >= 10:
                    n_carry += 1
                    n_drop += text not in canonical
                    ones, tens, _ = text.split(";")                   # a slip: the tens column without "+1"
                    assert text in canonical or (tens.count("+") == 1 and eval(tens.split("=")[0]) == a + c)
                else:
                    n_other_changed += text not in canonical
        return n_carry, n_drop, n_other_changed

    n, k, other = slips(0.35)
    assert n > 1500 and other == 0
    assert abs(k / n - 0.35) < 4 * (0.35 * 0.65 / n) ** 0.5
    n, k, other = slips(0.0)
    assert k == 0 and other == 0
