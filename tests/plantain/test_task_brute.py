"""plantain task.py pinned on hand-worked traces: token ids, the arithmetic table mod 5, exact traces in
both formats, parser segments and every error message, plan-number parsing boundaries, the visibility
mask / TTFR, the answer-level judge on single-token corruptions, the reward with non-unit and default
weights, and prompt parsing. Expected values are written out by hand (comments show the working);
nothing here is computed by the code under test. Imports only task.py (the draft tests at the end also read
prepare's SFT rows and the plan-first plan prefix of model.py)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from stages.plantain import task as T
from stages.plantain.task import (ANS, EANS, EOS, ETHINK, MINUS, PLUS, THINK, TIMES, Problem, Segment, TraceError,
                                  apply_op, check_format, corrupt_plan, decode_text, encode_text, execute, make_trace,
                                  parse_segments, parse_trace, plan_pairs, problem_from_prompt, reward,
                                  sample_problem, ttfr_tokens, validate_plan, validate_trace, visible_mask)

# "+ 2 * 3 ( 3 )" = (+2) ∘ (×3) applied to 3: execution order ×3 then +2: 3·3 = 9 ≡ 4, 4 + 2 = 6 ≡ 1 (mod 5)
P1 = Problem(3, ((PLUS, 2), (TIMES, 3)))
TTA1 = "<think> 2 | #1 * 3 #2 + 2 | 3 #1 * 3 4 #2 + 2 1 </think> <ans> 1 </ans> <eos>"
PF1 = "<think> 2 </think> <ans> #1 * 3 #2 + 2 </ans> <think> 3 #1 * 3 4 #2 + 2 1 </think> <ans> 1 </ans> <eos>"
# "* 3 - 2 ( 0 )": 0 − 2 = −2 ≡ 3, then 3·3 = 9 ≡ 4
P2 = Problem(0, ((TIMES, 3), (MINUS, 2)))
PF2 = "<think> 2 </think> <ans> #1 - 2 #2 * 3 </ans> <think> 0 #1 - 2 3 #2 * 3 4 </think> <ans> 4 </ans> <eos>"


def E(text):
    return encode_text(text)


def test_vocabulary_ids_and_constants():
    # digits are their own ids (a value token IS the value), then ops, specials, plan markers
    assert T.VOCAB == [str(d) for d in range(10)] + ["+", "-", "*", "(", ")", "|", "<think>", "</think>", "<ans>",
                                                     "</ans>", "<eos>", "<pad>", "#1", "#2", "#3", "#4", "#5", "#6"]
    assert T.VOCAB_SIZE == 28 and T.TOK["7"] == 7 and T.TOK["#6"] == 27
    assert (PLUS, MINUS, TIMES, T.LPAR, T.RPAR, T.BAR) == (10, 11, 12, 13, 14, 15)
    assert (THINK, ETHINK, ANS, EANS, EOS, T.PAD) == (16, 17, 18, 19, 20, 21)
    assert T.MARK == [22, 23, 24, 25, 26, 27]
    assert T.MOD == 5 and T.MAX_OPS == 6 and T.PROMPT_LEN == 15 and T.CHANCE == pytest.approx(0.2)
    assert T.OPERANDS == {PLUS: [1, 2], MINUS: [1, 2], TIMES: [2, 3]}
    assert T.OPEN_TAGS == {16: "think", 18: "ans"} and T.CLOSE_TAGS == {17: "think", 19: "ans"}
    assert T.FORMATS == ("tta", "pf") and T.ERROR_KINDS == ("swap", "drop", "operand")


def test_apply_op_table_mod_5():
    # written out by hand: rows x = 0..4
    assert [apply_op(PLUS, 2, x) for x in range(5)] == [2, 3, 4, 0, 1]
    assert [apply_op(MINUS, 2, x) for x in range(5)] == [3, 4, 0, 1, 2]
    assert [apply_op(MINUS, 1, x) for x in range(5)] == [4, 0, 1, 2, 3]
    assert [apply_op(TIMES, 3, x) for x in range(5)] == [0, 3, 1, 4, 2]
    assert [apply_op(TIMES, 2, x) for x in range(5)] == [0, 2, 4, 1, 3]
    assert apply_op(PLUS, 1, 4) == 0 and apply_op(TIMES, 1, 3) == 3 and apply_op(PLUS, 0, 2) == 2


def test_problem_plan_answer_prompt_and_execute():
    assert P1.plan == [(TIMES, 3), (PLUS, 2)]
    assert execute(3, P1.plan) == [3, 4, 1] and P1.answer == 1
    assert execute(4, []) == [4]
    assert P2.answer == 4 and execute(0, P2.plan) == [0, 3, 4]
    assert decode_text(P1.prompt()) == "<pad> " * 8 + "+ 2 * 3 ( 3 )"
    assert len(P1.prompt()) == 15
    six = Problem(2, ((PLUS, 1),) * 6)
    assert decode_text(six.prompt()) == "+ 1 " * 6 + "( 2 )" and six.answer == (2 + 6) % 5


def test_decode_and_encode_text():
    assert decode_text([10, 3, 16, 27, 21]) == "+ 3 <think> #6 <pad>"
    assert E("* 9 ( </ans> #1") == [12, 9, 13, 19, 22]
    assert decode_text(np.array([0, 14])) == "0 )"
    with pytest.raises(TraceError, match=r"^token 0: unknown token 'x'$"):
        E("x 1")
    with pytest.raises(TraceError, match=r"^token 3: unknown token '10'$"):
        E("1 2 3 10")


def test_make_trace_exact_tokens_in_both_formats():
    assert decode_text(make_trace(P1, "tta")) == TTA1
    assert decode_text(make_trace(P1, "pf")) == PF1
    assert decode_text(make_trace(P2, "pf")) == PF2
    # a faulty plan is followed by the steps and the answer: plan [(+,2)] only: 3 + 2 = 5 ≡ 0
    assert decode_text(make_trace(P1, "pf", [(PLUS, 2)])) == \
        "<think> 2 </think> <ans> #1 + 2 </ans> <think> 3 #1 + 2 0 </think> <ans> 0 </ans> <eos>"
    with pytest.raises(ValueError, match=r"^format: 'ttx' is not one of \('tta', 'pf'\)$"):
        make_trace(P1, "ttx")


def test_parse_segments_positions():
    segs = parse_segments(E(PF1))
    # <think>0 2 </think>2 <ans>3 #1 * 3 #2 + 2 </ans>10 <think>11 … </think>21 <ans>22 1 </ans>24 <eos>
    assert segs == [Segment("think", 1, 2), Segment("ans", 4, 10), Segment("think", 12, 21), Segment("ans", 23, 24)]
    assert parse_segments(E("<think> </think> <eos> 5 5")) == [Segment("think", 1, 1)]    # stops at <eos>
    assert parse_segments(E("<eos>")) == []


@pytest.mark.parametrize("text,msg", [
    ("<think> 1 <ans> 2 </ans> <eos>", "position 2: <ans> opened inside <think> (opened at position 0)"),
    ("<ans> 1 <think> </think> <eos>", "position 2: <think> opened inside <ans> (opened at position 0)"),
    ("</think> <eos>", "position 0: </think> closes nothing"),
    ("<think> 1 </think> <ans> 2 </think> <eos>", "position 5: </think> closes <ans> opened at position 3"),
    ("<think> </think> <think> </ans> <eos>", "position 3: </ans> closes <think> opened at position 2"),
    ("<think> 1 </think> 3 <ans> 2 </ans> <eos>", "position 3: token '3' outside any segment"),
    ("<think> 1 </think> <ans> 2 <eos>", "position 5: <eos> inside an unclosed <ans> opened at position 3"),
    ("<think> 1 </think> <ans> 2 </ans>", "position 6: trace ends without <eos>"),
    ("<think> 1 </think> <ans> 2", "position 5: trace ends inside <ans> opened at position 3"),
    ("", "position 0: trace ends without <eos>"),
])
def test_parse_segments_error_messages(text, msg):
    with pytest.raises(TraceError) as ei:
        parse_segments(E(text))
    assert str(ei.value) == msg


def test_check_format_and_parse_trace():
    check_format(parse_segments(E(TTA1)), "tta")
    check_format(parse_segments(E(PF1)), "pf")
    with pytest.raises(TraceError) as ei:
        check_format(parse_segments(E(TTA1)), "pf")
    assert str(ei.value) == ("segments ['think', 'ans'] do not follow the pf format "
                             "['think', 'ans', 'think', 'ans']")
    with pytest.raises(TraceError) as ei:
        check_format(parse_segments(E(PF1)), "tta")
    assert str(ei.value) == "segments ['think', 'ans', 'think', 'ans'] do not follow the tta format ['think', 'ans']"
    tr = parse_trace(E(TTA1), "tta")
    assert tr["plan"] == [(TIMES, 3), (PLUS, 2)] and tr["answer"] == 1 and len(tr["segments"]) == 2
    tr = parse_trace(np.array(E(PF2)), "pf")
    assert tr["plan"] == [(MINUS, 2), (TIMES, 3)] and tr["answer"] == 4
    # answer token boundaries: '9' (id 9) is an answer, '+' (id 10) and two tokens are not
    assert parse_trace(E("<think> 2 </think> <ans> </ans> <think> </think> <ans> 9 </ans> <eos>"), "pf")["answer"] == 9
    assert parse_trace(E("<think> 2 </think> <ans> </ans> <think> </think> <ans> 0 </ans> <eos>"), "pf")["answer"] == 0
    assert parse_trace(E("<think> </think> <ans> + </ans> <eos>"), "tta")["answer"] is None
    assert parse_trace(E("<think> </think> <ans> 1 2 </ans> <eos>"), "tta")["answer"] is None
    assert parse_trace(E("<think> </think> <ans> </ans> <eos>"), "tta")["answer"] is None
    # tta plan = the middle of exactly three "|" parts; otherwise no plan (None)
    assert parse_trace(E("<think> 2 | #1 * 3 </think> <ans> 1 </ans> <eos>"), "tta")["plan"] is None
    assert parse_trace(E("<think> 2 | #1 * 3 | 3 | 4 </think> <ans> 1 </ans> <eos>"), "tta")["plan"] is None
    assert parse_trace(E("<think> | #1 - 1 | </think> <ans> 1 </ans> <eos>"), "tta")["plan"] == [(MINUS, 1)]
    assert parse_trace(E("<think> 2 | #1 * </think> <ans> 1 </ans> <eos>"), "tta")["plan"] is None
    assert parse_trace(E("<think> 2 | #1 * | </think> <ans> 1 </ans> <eos>"), "tta")["plan"] is None
    # only the thought is split at '|': a '|' in the answer segment does not complete a plan
    assert parse_trace(E("<think> | #1 - 1 </think> <ans> | </ans> <eos>"), "tta")["plan"] is None


def test_split_bar():
    assert T._split_bar([1, 15, 2, 3, 15, 15]) == [[1], [2, 3], [], []]
    assert T._split_bar([]) == [[]]
    assert T._split_bar([4, 5]) == [[4, 5]]


def test_plan_pairs_boundaries():
    assert plan_pairs([]) == []
    assert plan_pairs(E("#1 + 1 #2 * 9")) == [(PLUS, 1), (TIMES, 9)]          # operand 9: still a digit
    assert plan_pairs(E("#1 + 1 #2 * +")) is None                           # operand '+' (id 10) is not
    assert plan_pairs(E("#1 + 1 #2 *")) is None                             # not a multiple of 3
    assert plan_pairs(E("#1 + 1 #3 * 2")) is None                           # numbering must be 1, 2, …
    assert plan_pairs(E("#2 + 1")) is None
    assert plan_pairs(E("#1 3 1")) is None                                  # '3' is not an operation
    assert plan_pairs(E("#1 ( 1")) is None
    six = " ".join(f"#{k} - 2" for k in range(1, 7))
    assert plan_pairs(E(six)) == [(MINUS, 2)] * 6                           # exactly MAX_OPS items: allowed
    assert plan_pairs(E(six + " #1 - 2")) is None                           # 7 items: too long
    assert plan_pairs(E(six + " #6 - 2 #6 - 2")) is None


def test_visible_mask_and_ttfr():
    toks = E("<think> 1 </think> <ans> 2 3 </ans> <think> </think> <ans> 4 </ans> <eos>")
    assert visible_mask(toks) == [False, False, False, False, True, True, False, False, False, False, True,
                                  False, False]
    assert ttfr_tokens(toks) == 4
    assert ttfr_tokens(E(TTA1)) == 21                      # everything through "<ans>" (index 20) comes first
    assert ttfr_tokens(E(PF1)) == 4
    assert ttfr_tokens(E("<think> 1 </think> <ans> </ans> <eos>")) == 6   # nothing visible: all 6 tokens
    assert visible_mask([]) == [] and ttfr_tokens([]) == 0


def test_validate_plan():
    assert validate_plan(P1, [(TIMES, 3), (PLUS, 2)])
    assert validate_plan(P1, ((TIMES, 3), (PLUS, 2)))                        # any sequence
    assert not validate_plan(P1, [(PLUS, 2), (TIMES, 3)])                    # written order, not execution order
    assert not validate_plan(P1, None) and not validate_plan(P1, []) and not validate_plan(P1, [(TIMES, 3)])


def _sub(text, i, word):
    w = text.split()
    w[i] = word
    return " ".join(w)


def test_validate_trace_on_single_token_corruptions():
    assert validate_trace(P1, E(TTA1), "tta") and validate_trace(P1, E(PF1), "pf") and validate_trace(P2, E(PF2), "pf")
    assert not validate_trace(P1, E(PF1), "tta") and not validate_trace(P1, E(TTA1), "pf")
    assert not validate_trace(P2, E(PF1), "pf")                               # another problem's trace
    words = PF1.split()
    # every single-token change of a content token of the PF trace (plan, steps, answer) is rejected
    content = [i for i, w in enumerate(words) if w not in ("<think>", "</think>", "<ans>", "</ans>", "<eos>") and i != 1]
    for i in content:
        for w in ["0", "1", "2", "3", "4", "+", "-", "*", "#1", "#2", "#3", "|"]:
            if w != words[i]:
                assert not validate_trace(P1, E(_sub(PF1, i, w)), "pf"), (i, w)
    for i, w in enumerate(TTA1.split()):
        if w not in ("<think>", "</think>", "<ans>", "</ans>", "<eos>") and i != 1:   # position 1: n (not checked)
            for v in ["0", "1", "2", "3", "4", "*", "#2", "|"]:
                if v != w:
                    assert not validate_trace(P1, E(_sub(TTA1, i, v)), "tta"), (i, v)
    assert validate_trace(P1, E(_sub(TTA1, 1, "5")), "tta")                 # the pre-plan count is free text
    assert validate_trace(P1, E(_sub(PF1, 1, "0")), "pf")
    # dropping the steps' start value, an extra step, or the steps' '|'
    assert not validate_trace(P1, E(TTA1.replace("| 3 #1", "| #1")), "tta")
    assert not validate_trace(P1, E(PF1.replace("4 #2 + 2 1", "4 #2 + 2 1 #3 + 2 3")), "pf")
    assert not validate_trace(P1, E(TTA1.replace("+ 2 | 3", "+ 2 3")), "tta")
    assert not validate_trace(P1, E("<think> 2 | #1 * 3 #2 + 2 | 3 #1 * 3 4 #2 + 2 1 | </think> <ans> 1 </ans> <eos>"),
                              "tta")
    # an empty plan still needs the three '|' parts of the thought: "n | PLAN | x"
    empty = Problem(2, ())
    assert validate_trace(empty, E("<think> 0 | | 2 </think> <ans> 2 </ans> <eos>"), "tta")
    assert not validate_trace(empty, E("<think> 2 </think> <ans> 2 </ans> <eos>"), "tta")
    assert not validate_trace(empty, E("<think> 0 | 2 </think> <ans> 2 </ans> <eos>"), "tta")
    # the answer must be a digit token and equal the last step
    assert not validate_trace(P1, E(PF1.replace("<ans> 1 </ans>", "<ans> </ans>")), "pf")
    assert not validate_trace(P1, E(PF1.replace("<ans> 1 </ans>", "<ans> 6 </ans>")), "pf")


def test_reward_values():
    wc, wh = 0.7, 1.9
    assert reward(P1, E(PF1), "pf", wc, wh) == {"r": pytest.approx(1 + 0.7 + 1.9), "r_format": 1.0,
                                                "r_correct": 1.0, "r_helpful": 1.0}
    assert reward(P1, E(PF1), "pf") == {"r": 3.0, "r_format": 1.0, "r_correct": 1.0, "r_helpful": 1.0}
    assert reward(P1, E(TTA1), "tta", wc, wh) == {"r": pytest.approx(1.7), "r_format": 1.0, "r_correct": 1.0,
                                                  "r_helpful": 0.0}
    assert reward(P1, E(TTA1), "tta")["r"] == 2.0
    wrong_ans = PF1.replace("<ans> 1 </ans>", "<ans> 2 </ans>")
    assert reward(P1, E(wrong_ans), "pf", wc, wh) == {"r": pytest.approx(2.9), "r_format": 1.0, "r_correct": 0.0,
                                                      "r_helpful": 1.0}
    # helpful is judged on the plan only; correctness on the answer only (steps are not checked here)
    bad_plan = PF1.replace("#1 * 3 #2 + 2 </ans>", "#1 + 2 #2 * 3 </ans>")
    assert reward(P1, E(bad_plan), "pf", wc, wh) == {"r": pytest.approx(1.7), "r_format": 1.0, "r_correct": 1.0,
                                                     "r_helpful": 0.0}
    neither = bad_plan.replace("<ans> 1 </ans>", "<ans> + </ans>")
    assert reward(P1, E(neither), "pf", wc, wh) == {"r": 1.0, "r_format": 1.0, "r_correct": 0.0, "r_helpful": 0.0}
    zero = {"r": 0.0, "r_format": 0.0, "r_correct": 0.0, "r_helpful": 0.0}
    assert reward(P1, E(PF1), "tta", wc, wh) == zero
    assert reward(P1, E(PF1)[:-1], "pf", wc, wh) == zero


def test_problem_from_prompt_and_its_errors():
    assert problem_from_prompt(P1.prompt()) == P1
    assert problem_from_prompt(E("* 3 ( 4 )")) == Problem(4, ((TIMES, 3),))        # 5 tokens: the shortest
    assert problem_from_prompt(np.array(E("<pad> - 1 + 2 ( 0 )"))) == Problem(0, ((MINUS, 1), (PLUS, 2)))
    for text in ["( 4 )", "* 3 4 )", "* 3 ( 4 (", "* 3 1 ( 4 )", "* ( 4 ) )"]:
        with pytest.raises(TraceError) as ei:
            problem_from_prompt(E(text))
        assert str(ei.value) == f"prompt {text!r} is not 'o d … ( x )'"


def test_sample_problem_ranges():
    rng = np.random.default_rng(5)
    probs = [sample_problem(rng, 3, 4) for _ in range(300)]
    assert {len(p.ops) for p in probs} == {3, 4}                          # both ends of the inclusive range
    assert {p.x for p in probs} == {0, 1, 2, 3, 4}
    pairs = {od for p in probs for od in p.ops}
    assert pairs == {(PLUS, 1), (PLUS, 2), (MINUS, 1), (MINUS, 2), (TIMES, 2), (TIMES, 3)}
    assert all(isinstance(p.x, int) and all(isinstance(d, int) for _, d in p.ops) for p in probs)
    assert {len(sample_problem(rng, 6, 6).ops) for _ in range(20)} == {6}


def test_corrupt_plan_kinds_by_enumeration():
    plan = [(PLUS, 1), (TIMES, 2), (MINUS, 2), (PLUS, 2)]                # all items distinct
    swaps, drops, operands = set(), set(), set()
    for seed in range(60):
        rng = np.random.default_rng(seed)
        swaps.add(tuple(corrupt_plan(plan, "swap", rng)))
        drops.add(tuple(corrupt_plan(plan, "drop", rng)))
        operands.add(tuple(corrupt_plan(plan, "operand", rng)))
    assert swaps == {tuple(plan[:i] + [plan[i + 1], plan[i]] + plan[i + 2:]) for i in range(3)}
    assert drops == {tuple(plan[:i] + plan[i + 1:]) for i in range(4)}
    # one operand changed to another legal one, or to the identity (0 for ±, 1 for ×)
    alt = {PLUS: {1: [2, 0], 2: [1, 0]}, MINUS: {1: [2, 0], 2: [1, 0]}, TIMES: {2: [3, 1], 3: [2, 1]}}
    want = {tuple(plan[:i] + [(o, e)] + plan[i + 1:]) for i, (o, d) in enumerate(plan) for e in alt[o][d]}
    assert operands == want
    assert plan == [(PLUS, 1), (TIMES, 2), (MINUS, 2), (PLUS, 2)]          # the input is not modified
    # a swap needs two different neighbours: only index 1 here; with none it changes an operand instead
    rng = np.random.default_rng(0)
    same = [(PLUS, 1), (PLUS, 1), (TIMES, 3)]
    assert {tuple(corrupt_plan(same, "swap", rng)) for _ in range(20)} == {((PLUS, 1), (TIMES, 3), (PLUS, 1))}
    flat = [(TIMES, 3), (TIMES, 3)]
    got = {tuple(corrupt_plan(flat, "swap", rng)) for _ in range(40)}
    assert got == {((TIMES, 2), (TIMES, 3)), ((TIMES, 1), (TIMES, 3)), ((TIMES, 3), (TIMES, 2)),
                   ((TIMES, 3), (TIMES, 1))}
    assert all(isinstance(d, int) for p in got for _, d in p)


# --- pre-plan drafts (issue 47: TTFR the model decides) -------------------------------------------------------
# P1 = "+ 2 * 3 ( 3 )": plan ×3 then +2; a draft of 1 step is "3 #1 * 3 4", of 2 steps "3 #1 * 3 4 #2 + 2 1"
PF1_D1 = ("<think> 2 3 #1 * 3 4 </think> <ans> #1 * 3 #2 + 2 </ans> <think> 3 #1 * 3 4 #2 + 2 1 </think> "
          "<ans> 1 </ans> <eos>")
TTA1_D2 = ("<think> 2 3 #1 * 3 4 #2 + 2 1 | #1 * 3 #2 + 2 | 3 #1 * 3 4 #2 + 2 1 </think> <ans> 1 </ans> <eos>")


def test_draft_traces_by_hand_and_their_ttfr():
    assert T.draft_tokens(P1, 0) == [] and T.draft_tokens(P1, 2) == E("3 #1 * 3 4 #2 + 2 1")
    assert make_trace(P1, "pf", draft=1) == E(PF1_D1)
    assert make_trace(P1, "tta", draft=2) == E(TTA1_D2)
    assert make_trace(P1, "pf", draft=0) == E(PF1) and make_trace(P1, "tta") == E(TTA1)
    # TTFR: pf 4 + (1 + 4·1) = 9 ("<think> 2 3 #1 * 3 4 </think> <ans>"); tta 21 + (1 + 4·2) = 30
    assert ttfr_tokens(E(PF1_D1)) == 9 and ttfr_tokens(E(TTA1)) == 21 and ttfr_tokens(E(TTA1_D2)) == 30
    assert T.draft_length(E(PF1_D1), "pf") == 1 and T.draft_length(E(TTA1_D2), "tta") == 2
    assert T.draft_length(E(PF1), "pf") == 0 and T.draft_length(E(TTA1), "tta") == 0
    assert T.draft_length(E("<think> 2 3 #1 * </think> <ans>"), "pf") is None          # a broken item
    assert T.draft_length(E("<think> 2 3 #2 * 3 4 </think> <ans>"), "pf") is None      # wrong marker
    assert T.draft_length(E("<think> 2 3 #1 * 3 4"), "pf") is None                     # never closes
    assert T.draft_length(E("<think> #1 </think> <ans>"), "pf") is None                 # no operation count
    seven = " ".join(f"#{k} + 1 {k % 5}" for k in range(1, 7)) + " #6 + 1 0"           # 7 items: past MAX_OPS
    assert T.draft_length(E(f"<think> 6 0 {seven} </think> <ans>"), "pf") is None
    six = " ".join(f"#{k} + 1 {k % 5}" for k in range(1, 7))
    assert T.draft_length(E(f"<think> 6 0 {six} </think> <ans>"), "pf") == 6
    with pytest.raises(ValueError, match="draft: 3 steps"):
        T.draft_tokens(P1, 3)


def test_draft_traces_parse_judge_and_reward_like_the_plain_ones():
    for fmt, toks in (("pf", E(PF1_D1)), ("tta", E(TTA1_D2))):
        tr = parse_trace(toks, fmt)
        assert tr["plan"] == [(TIMES, 3), (PLUS, 2)] and tr["answer"] == 1
        assert validate_trace(P1, toks, fmt)
        # weights 0.7 / 1.9: pf 1 + 0.7 + 1.9 = 3.6; tta (no process reward) 1 + 0.7 = 1.7
        assert reward(P1, toks, fmt, 0.7, 1.9)["r"] == pytest.approx(3.6 if fmt == "pf" else 1.7)
    from stages.plantain.model import _plan_prefix

    assert _plan_prefix(E(PF1_D1)) == [(TIMES, 3), (PLUS, 2)] and _plan_prefix(E(PF1)) == [(TIMES, 3), (PLUS, 2)]
    assert _plan_prefix(E("<think> 2 3 #1 * 3 4 </think> <ans> #1 * 3")) is None           # plan not closed yet
    assert _plan_prefix(E("<think> 2 3 #1 * 3 4 </think> <think>")) is None


def test_corrupt_plan_keeps_the_drafted_operations():
    plan = [(TIMES, 3), (PLUS, 2), (MINUS, 1), (PLUS, 1)]
    rng = np.random.default_rng(4)
    for kind, keep in itertools.product(("swap", "drop", "operand"), range(4)):
        for _ in range(20):
            bad = corrupt_plan(plan, kind, rng, keep=keep)
            assert bad[:keep] == plan[:keep] and bad != plan
    # the last operation alone: a swap has no pair, so it changes the operand (+1 -> +2 or +0)
    assert corrupt_plan(plan, "swap", rng, keep=3)[3] in ((PLUS, 2), (PLUS, 0))
    assert corrupt_plan(plan, "drop", rng, keep=3) == plan[:3]
    with pytest.raises(ValueError, match="keep: 4"):
        corrupt_plan(plan, "swap", rng, keep=4)


def test_sft_errors_fall_with_the_draft_length():
    """prepare's SFT rows: draft j uniform on 0..n; an error with probability 0.8·(n − j)/n, never in the drafted
    prefix (4,000 problems of 4 operations: at j = 0 the rate is 0.8, at j = 2 0.4, at j = 4 exactly 0)."""
    from stages.plantain.prepare import problems_frame

    rng = np.random.default_rng(11)
    probs = [sample_problem(rng, 4, 4) for _ in range(4000)]
    f = problems_frame(probs, "sft", np.random.default_rng(5), 0.8, ["swap", "drop", "operand"])
    share = {j: float((f.filter(f["draft"] == j)["plan_error"] != "").mean()) for j in range(5)}
    assert abs(share[0] - 0.8) < 0.05 and abs(share[2] - 0.4) < 0.06 and share[4] == 0.0
    assert set(f["draft"].unique().to_list()) == {0, 1, 2, 3, 4}
    for r in f.head(300).iter_rows(named=True):
        p = Problem(r["x"], tuple(zip(r["ops"][::2], r["ops"][1::2])))
        assert T.draft_length(r["trace_pf"], "pf") == r["draft"] == T.draft_length(r["trace_tta"], "tta")
        plan = parse_trace(r["trace_pf"], "pf")["plan"]
        assert plan[:r["draft"]] == p.plan[:r["draft"]] and (plan == p.plan) == (r["plan_error"] == "")
    plain = problems_frame(probs[:50], "sft", np.random.default_rng(5), 0.8, ["swap"], drafts=False)
    assert (plain["draft"] == 0).all()
    assert (problems_frame(probs[:50], "test", np.random.default_rng(5), 0.8, ["swap"])["draft"] == 0).all()
