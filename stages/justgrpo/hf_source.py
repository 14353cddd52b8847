"""justgrpo on a real masked-diffusion LM and GSM8K-format data (issue 41; the `full` profile's path).

Real setting: LLaDA-8B-Instruct (a local checkpoint folder; its own remote code is bidirectional) trained with
JustGRPO on GSM8K train and evaluated on GSM8K test. What this module gives the stages and the fixture test:

* ``load_gsm8k(ref)``: GSM8K records (the public ``openai/gsm8k`` ``main`` config schema: string columns
  ``question`` and ``answer``, the answer's worked solution ending in ``#### <number>``) from a jsonl/parquet
  file, folder or hub dataset through ``stages.common.hf.load_records``; the ground truth is the text after the
  last ``####``, stripped (official data/math.py:extract_answer_gsm8k; thousands commas stay and are dropped
  when ``math_equal`` parses numbers, as the official grader's digit parsing does). One-line ``SourceError``
  for a missing file, bad JSON, a missing column or a record without ``####``.
* ``extract_answer(text)`` / ``math_equal(pred, gt)`` / ``gsm8k_reward``: the official evaluation's answer
  extraction (parser.py:408 order: last ``\\boxed{}`` > text after "he answer is" > last number, commas
  stripped) and comparison (grader.py:70: numeric with rel_tol 1e-4, also accepting gt/100 and gt·100; string
  equality otherwise); reward +1 correct / −1 otherwise. As in the official code (grpo.py:17) the text scored
  is prompt + completion, so the last-number fallback can read a number of the question (``include_prompt``).
* ``DiffusionLM``: any HF model whose forward maps ids to per-position logits, used as a masked-diffusion LM
  with mask id ``mask_id`` (LLaDA: 126336; the MASK logit is excluded at decoding, as in dllm.gen_logits).
  ``bidirectional="4d_mask"`` passes an all-true (B, 1, L, L) attention mask so that a causal HF class
  (a tiny ``LlamaForCausalLM`` from config: what the tests use) attends both ways; ``"native"`` calls the
  model as is (LLaDA's own code is bidirectional).
* ``decode`` (LLaDA-style blocks, low-confidence remasking, Gumbel-max at T > 0), ``ar_logprobs`` (JustGRPO's
  exact AR likelihood: row t is [prompt, y_<t, MASK·(L−t)], logp_t read at position P+t) and
  ``onestep_logprobs`` (d1-style surrogate) over token ids of any vocabulary - the same algorithms as
  stages/justgrpo/dllm.py, which is tied to the toy's 17-token vocabulary and TinyTransformer.
* ``HFDLLMPolicy``: the ``stages.common.grpo.GRPOPolicy`` for that model: prompts of different lengths are
  rolled out one group at a time (the official code runs one prompt per device, so no padding enters the
  bidirectional attention); a batch of prompts is a LongTensor of row indices into the prompt table.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn as nn
from pydantic import Field

from kernels.record import KernelCounter as Counter
from kernels.token_logprob import token_logprob
from stages.common.config import StageConfig
from stages.common.sources import SourceConfig, SourceError, real_prepare_meta

NEG = -1.0e4
LLADA_MASK_ID = 126336


class DLLMConfig(StageConfig):
    """How the real checkpoint is used as a masked-diffusion LM (full profile)."""
    mask_token_id: int = Field(LLADA_MASK_ID, ge=0, le=10_000_000, description="the MASK id (LLaDA: 126336)")
    bidirectional: Literal["native", "4d_mask"] = Field(
        "native", description="native: the model attends both ways itself (LLaDA); 4d_mask: pass an all-true "
                              "4D attention mask to a causal HF class")
    trust_remote_code: bool = Field(True, description="LLaDA ships its modelling code with the checkpoint")
    gen_len: int = Field(256, ge=1, le=4096, description="generation length (official: 256)")
    eval_block: int = Field(32, ge=1, le=4096, description="semi-AR block of the greedy evaluation (official: 32)")
    include_prompt: bool = Field(True, description="score prompt + completion text (official grpo.py:17)")


# ----------------------------------------------------------------------------------------------
# GSM8K records, answer extraction and comparison (official parser.py / grader.py)
# ----------------------------------------------------------------------------------------------
def gsm8k_ground_truth(answer: str) -> str | None:
    """The text after the last '####', stripped (None when there is none or it is empty)."""
    if "####" not in answer:
        return None
    gt = answer.split("####")[-1].strip()
    return gt or None


def load_gsm8k(ref: str, *, key: str = "source.dataset", split: str = "train", revision: str | None = None,
               limit: int | None = None) -> list[dict[str, str]]:
    """GSM8K-format records -> [{"question", "answer", "gt"}] in file order (see the module docstring)."""
    from stages.common.hf import load_records

    ds = load_records(ref, columns={"question": "string", "answer": "string"}, key=key, split=split,
                      revision=revision, limit=limit)
    out = []
    for i, row in enumerate(ds):
        q, a = row["question"], row["answer"]
        if not isinstance(q, str) or not q.strip():
            raise SourceError(f"{key}: {ref} record {i} has an empty question")
        gt = gsm8k_ground_truth(a) if isinstance(a, str) else None
        if gt is None:
            raise SourceError(f"{key}: {ref} record {i} answer has no '#### <number>' final answer")
        out.append({"question": q, "answer": a, "gt": gt})
    return out


_NUMBER = re.compile(r"-?\d*\.?\d+")


def _last_boxed(text: str) -> str | None:
    i = text.rfind("\\boxed")
    if i < 0:
        return None
    rest = text[i + len("\\boxed"):]
    if not rest.startswith("{"):
        return rest.strip().split("$")[0].strip() or None           # "\boxed 42"
    depth, out = 0, []
    for ch in rest:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                break
        out.append(ch)
    return "".join(out).strip() if depth == 0 else None


def _strip(ans: str) -> str:
    ans = ans.strip().replace(",", "").replace("$", "").replace("\\!", "").strip()
    ans = re.sub(r"\\text\{\s*([^}]*)\}", r"\1", ans).strip()
    return ans.rstrip(".").strip()


def extract_answer(text: str) -> str:
    """ALGO (official parser.py:408 order): the last \\boxed{...}; else the text after the last "he answer is"
    (its first number when it holds one); else the last number of the text (commas stripped); '' if none."""
    boxed = _last_boxed(text) if "boxed" in text else None
    if boxed is not None:
        return _strip(boxed)
    if "he answer is" in text:
        tail = text.split("he answer is")[-1].replace(",", "")
        nums = _NUMBER.findall(tail)
        return nums[0] if nums else _strip(tail.split("\n")[0])
    nums = _NUMBER.findall(text.replace(",", ""))
    return nums[-1] if nums else ""


def _number(s: str) -> float | None:
    s = _strip(s)
    pct = s.endswith("%")
    s = s.rstrip("%").strip()
    try:
        v = float(s)
    except ValueError:
        return None
    return v / 100 if pct else v


def math_equal(pred: str, gt: str, rel_tol: float = 1e-4) -> bool:
    """ALGO (official grader.py:70): numbers equal to rel_tol (also gt/100 and gt·100); else equal strings."""
    p, g = _number(pred), _number(gt)
    if p is not None and g is not None:
        return any(math.isclose(p, ref, rel_tol=rel_tol) for ref in (g, g / 100, g * 100))
    return _strip(pred).lower() == _strip(gt).lower() and _strip(pred) != ""


def gsm8k_reward(texts: Sequence[str], gts: Sequence[str]) -> torch.Tensor:
    """+1 when the extracted answer equals the ground truth, −1 otherwise (official data/math.py:23)."""
    return torch.tensor([1.0 if math_equal(extract_answer(t), g) else -1.0 for t, g in zip(texts, gts)])


def chat_prompt(tokenizer, question: str) -> str:
    """The bare question in the tokenizer's chat template (official: no format instruction); a tokenizer
    without a template (the tiny test tokenizer) gets the bare question."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
    return question


# ----------------------------------------------------------------------------------------------
# the HF model as a masked-diffusion LM
# ----------------------------------------------------------------------------------------------
class DiffusionLM(nn.Module):
    """logits(x) = model(x).logits with the MASK logit set to NEG (never predicted)."""

    def __init__(self, model: nn.Module, mask_id: int, bidirectional: Literal["native", "4d_mask"] = "native"):
        super().__init__()
        vocab = model.get_output_embeddings().weight.shape[0] if hasattr(model, "get_output_embeddings") \
            and model.get_output_embeddings() is not None else None
        if vocab is not None and not 0 <= mask_id < vocab:
            raise SourceError(f"mask_token_id: {mask_id} is outside the model's vocabulary (size {vocab})")
        self.model, self.mask_id, self.bidirectional = model, int(mask_id), bidirectional

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bidirectional == "4d_mask":
            B, Lx = x.shape
            full = torch.ones(B, 1, Lx, Lx, dtype=torch.bool, device=x.device)
            logits = self.model(input_ids=x, attention_mask=full).logits
        else:
            logits = self.model(input_ids=x).logits
        return logits.index_fill(-1, torch.tensor([self.mask_id], device=x.device), NEG)


def load_dllm(source: SourceConfig, dcfg: DLLMConfig, *, key: str = "source") -> DiffusionLM:
    """The real checkpoint (local folder or cached hub name) as a DiffusionLM (trust_remote_code for LLaDA)."""
    from transformers import AutoModelForCausalLM

    from stages.common.hf import TORCH_DTYPES
    from stages.common.sources import resolve_ref

    if source.kind == "toy" or source.model is None:
        raise SourceError(f"{key}.model: a masked-diffusion checkpoint needs kind hf/file with a model")
    ref = resolve_ref(source.model, f"{key}.model", revision=source.revision)
    kw = dict(dtype=TORCH_DTYPES[source.dtype], local_files_only=ref.local, trust_remote_code=dcfg.trust_remote_code)
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(ref.ref, **kw)
        except ValueError:                         # a checkpoint that maps only AutoModel (the official eval.py uses it)
            from transformers import AutoModel
            model = AutoModel.from_pretrained(ref.ref, **kw)
    except (OSError, ValueError) as err:
        raise SourceError(f"{key}.model: {source.model} is not a loadable model "
                          f"({str(err).splitlines()[0][:200]})") from None
    return DiffusionLM(model.eval(), dcfg.mask_token_id, dcfg.bidirectional)


@torch.no_grad()
def decode(dlm: DiffusionLM, prompts: torch.Tensor, gen_len: int, block_len: int, tokens_per_step: int,
           temperature: float, generator: torch.Generator | None = None, counter: Counter | None = None):
    """ALGO (LLaDA generate.py, as dllm.decode): blocks of ``block_len`` left to right; each step predicts every
    masked position of the block (Gumbel-max at T > 0 in float64: argmax exp(l)/(−log u)^T; argmax at T = 0),
    confidence = untempered softmax(l)[x̂]; the ``tokens_per_step`` most confident are committed.
    ``prompts`` (B, P) unpadded (one length). Returns (gen (B, L), dec_step (B, L))."""
    counter = counter or Counter()
    B, P = prompts.shape
    dev = prompts.device
    x = torch.cat([prompts, torch.full((B, gen_len), dlm.mask_id, dtype=prompts.dtype, device=dev)], 1)
    dec_step = torch.full((B, gen_len), -1, dtype=torch.long, device=dev)
    pos = torch.arange(gen_len, device=dev)
    step = 0
    for b0 in range(0, gen_len, block_len):
        in_block = (pos >= b0) & (pos < min(b0 + block_len, gen_len))
        while True:
            masked = (x[:, P:] == dlm.mask_id) & in_block[None]
            remaining = int(masked[0].sum())
            if remaining == 0:
                break
            logits = dlm(x)[:, P:].double()
            if temperature > 0:
                u = torch.rand(logits.shape, generator=generator, device=dev, dtype=torch.float64).clamp_min(1e-300)
                x0 = (logits / temperature - torch.log(-torch.log(u))).argmax(-1)
            else:
                x0 = logits.argmax(-1)
            logp = token_logprob(logits.float(), x0, backend=counter.backend)
            counter()
            conf = torch.where(masked, logp.exp(), torch.full_like(logp, -1.0))
            chosen = conf.topk(min(tokens_per_step, remaining), dim=1).indices
            sel = torch.zeros_like(masked).scatter_(1, chosen, True)
            x[:, P:] = torch.where(sel, x0, x[:, P:])
            dec_step = torch.where(sel, torch.full_like(dec_step, step), dec_step)
            step += 1
    return x[:, P:], dec_step


def ar_logprobs(dlm: DiffusionLM, prompts: torch.Tensor, gen: torch.Tensor, counter: Counter | None = None,
                temperature: float = 1.0) -> torch.Tensor:
    """ALGO: JustGRPO's exact AR likelihood: for each t, input [prompt, y_<t, MASK·(L−t)],
    logp_t = log_softmax(logits[P+t] / T)[y_t] (the block-1 rollout's context). prompts (B, P), gen (B, L)."""
    counter = counter or Counter()
    B, Lg = gen.shape
    P = prompts.shape[1]
    dev = gen.device
    keep = torch.arange(Lg, device=dev)[None, :] < torch.arange(Lg, device=dev)[:, None]     # row t: pos < t
    ctx = torch.where(keep[None], gen[:, None, :], torch.full_like(gen[:, None, :], dlm.mask_id))
    inp = torch.cat([prompts[:, None, :].expand(B, Lg, P), ctx], -1).reshape(B * Lg, P + Lg)
    logits = dlm(inp).view(B, Lg, P + Lg, -1)
    t = torch.arange(Lg, device=dev)
    counter()
    return token_logprob(logits[:, t, P + t], gen, temperature=temperature, backend=counter.backend)


def onestep_logprobs(dlm: DiffusionLM, prompts: torch.Tensor, gen: torch.Tensor,
                     counter: Counter | None = None) -> torch.Tensor:
    """ALGO: d1-style one-step surrogate: logp_t ≈ log p(y_t | prompt, all completion tokens masked)."""
    counter = counter or Counter()
    P = prompts.shape[1]
    logits = dlm(torch.cat([prompts, torch.full_like(gen, dlm.mask_id)], 1))[:, P:]
    counter()
    return token_logprob(logits, gen, backend=counter.backend)


class HFDLLMPolicy(nn.Module):
    """justgrpo: AR-order rollout (block 1, T = 1) + exact AR likelihood; arbitrary: low-confidence
    arbitrary-order rollout + one-step surrogate. ``prompt_table``: one LongTensor of ids per prompt."""

    def __init__(self, dlm: DiffusionLM, prompt_table: Sequence[torch.Tensor], gen_len: int,
                 arm: Literal["justgrpo", "arbitrary"] = "justgrpo", counter: Counter | None = None):
        super().__init__()
        if not prompt_table or any(p.dim() != 1 or p.numel() == 0 for p in prompt_table):
            raise ValueError("HFDLLMPolicy: prompt_table must hold non-empty 1-D id tensors")
        self.model, self.table, self.gen_len, self.arm = dlm, [p.long() for p in prompt_table], gen_len, arm
        self.counter = counter or Counter()

    def _groups(self, idx: torch.Tensor):
        """Runs of equal prompt index (rows are prompt-major)."""
        idx = idx.tolist()
        start = 0
        for i in range(1, len(idx) + 1):
            if i == len(idx) or idx[i] != idx[start]:
                yield idx[start], start, i
                start = i

    @torch.no_grad()
    def rollout(self, prompts: torch.Tensor, group_size: int, generator: torch.Generator):
        dev = next(self.model.parameters()).device
        idx = prompts.long().cpu().repeat_interleave(group_size)
        block = 1 if self.arm == "justgrpo" else self.gen_len
        toks = []
        for p, a, b in self._groups(idx):
            rows = self.table[p].to(dev)[None].expand(b - a, -1).contiguous()
            gen, _ = decode(self.model, rows, self.gen_len, block, 1, 1.0, generator, self.counter)
            toks.append(gen)
        tokens = torch.cat(toks, 0)
        # loss covers every position, EOS fill included (official grpo.py:34-50)
        return {"prompt": idx.to(dev), "tokens": tokens, "mask": torch.ones(tokens.shape, device=dev)}

    def token_logprobs(self, roll) -> torch.Tensor:
        fn = ar_logprobs if self.arm == "justgrpo" else onestep_logprobs
        out = []
        for p, a, b in self._groups(roll["prompt"].cpu()):
            rows = self.table[p].to(roll["tokens"].device)[None].expand(b - a, -1)
            out.append(fn(self.model, rows, roll["tokens"][a:b], self.counter))
        return torch.cat(out, 0)


def make_reward_fn(tokenizer, prompt_texts: Sequence[str], gts: Sequence[str], include_prompt: bool = True
                   ) -> Callable[[torch.Tensor, dict], torch.Tensor]:
    """GRPO reward over HFDLLMPolicy rollouts: decode (special tokens dropped), extract, ±1."""
    def reward_fn(prompts, roll):
        idx = roll["prompt"].tolist()
        comps = tokenizer.batch_decode(roll["tokens"].tolist(), skip_special_tokens=True)
        texts = [(prompt_texts[i] if include_prompt else "") + c for i, c in zip(idx, comps)]
        return gsm8k_reward(texts, [gts[i] for i in idx]).to(roll["tokens"].device)
    return reward_fn


@torch.no_grad()
def greedy_accuracy(dlm: DiffusionLM, tokenizer, prompt_table: Sequence[torch.Tensor], prompt_texts: Sequence[str],
                    gts: Sequence[str], gen_len: int, block_len: int, include_prompt: bool = True,
                    counter: Counter | None = None, tokens_per_step: int = 1) -> tuple[float, list[int]]:
    """The official evaluation: T = 0, blocks of ``block_len``, 1 token per step (``tokens_per_step`` > 1:
    parallel decoding), one greedy sample per question, batch 1. Returns (accuracy, per-item 0/1 list)."""
    dev = next(dlm.parameters()).device
    hits = []
    for p, text, gt in zip(prompt_table, prompt_texts, gts):
        gen, _ = decode(dlm, p.to(dev)[None], gen_len, block_len, tokens_per_step, 0.0, None, counter)
        comp = tokenizer.decode(gen[0].tolist(), skip_special_tokens=True)
        hits.append(int(math_equal(extract_answer((text if include_prompt else "") + comp), gt)))
    return (sum(hits) / len(hits) if hits else float("nan")), hits


# ----------------------------------------------------------------------------------------------
# the stages' real path (selected when source.kind != "toy"; full profile only)
# ----------------------------------------------------------------------------------------------
GSM8K_TABLE = "gsm8k.parquet"


def prepare_real(cfg, ctx) -> None:
    """prepare (full): GSM8K train (``source``) and test (``eval_source``) records -> gsm8k.parquet
    (question, answer, gt, split) + meta.json (kind "gsm8k")."""
    import polars as pl

    from stages.common.paths import write_json

    key = f"papers.{ctx.slug}.{ctx.stage}"
    parts = {}
    for split, src, name in (("train", cfg.source, "source"), ("test", cfg.eval_source, "eval_source")):
        if src.kind == "toy" or src.dataset is None:
            raise SourceError(f"{key}.{name}.dataset: the real path needs GSM8K {split} records (kind hf/file)")
        parts[split] = load_gsm8k(src.dataset, key=f"{key}.{name}.dataset", split=src.split,
                                  revision=src.revision, limit=cfg.limit)
    rows = [dict(r, split=s) for s, recs in parts.items() for r in recs]
    pl.DataFrame(rows).write_parquet(ctx.out / GSM8K_TABLE)
    write_json(ctx.out / "meta.json", {"kind": "gsm8k", "seeds": list(cfg.seeds), "n_train": len(parts["train"]),
                                       "n_test": len(parts["test"]),
                                       "source": cfg.source.model_dump(mode="json"),
                                       "eval_source": cfg.eval_source.model_dump(mode="json")})


def train_real(cfg, ctx) -> None:
    """train (full): per seed and arm, GRPO from the pretrained dLLM checkpoint (no masked-diffusion
    pretraining: the checkpoint is the base) with the official ±1 GSM8K reward; greedy GSM8K accuracy (T = 0,
    block ``dllm.eval_block``) on the first ``rl.eval_prompts`` test questions every ``rl.eval_every`` steps.
    Writes rl_history.csv, models.json and one save_pretrained folder per arm and seed."""
    import polars as pl

    from kernels.record import KernelRecord
    from stages.common.device import pick_device
    from stages.common.grpo import GRPOModule, PromptLoader
    from stages.common.hf import source_tokenizer
    from stages.common.paths import write_json
    from stages.common.trainer import make_trainer

    key = f"papers.{ctx.slug}.{ctx.stage}"
    meta = real_prepare_meta(ctx, "gsm8k", "a real dLLM needs prepare's real GSM8K records")
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    table = pl.read_parquet(ctx.input("prepare") / GSM8K_TABLE)
    train, test = table.filter(pl.col("split") == "train"), table.filter(pl.col("split") == "test")
    tok = source_tokenizer(cfg.source, f"{key}.source")

    def prompts(frame):
        texts = [chat_prompt(tok, q) for q in frame["question"].to_list()]
        ids = [torch.tensor(tok(t, add_special_tokens=False)["input_ids"], dtype=torch.long) for t in texts]
        return texts, ids, frame["gt"].to_list()

    tr_texts, tr_ids, tr_gts = prompts(train)
    te_texts, te_ids, te_gts = prompts(test.head(cfg.rl.eval_prompts))
    rec = KernelRecord(device)
    counter = Counter(rec)
    tcfg = cfg.trainer.model_copy(update={"accelerator": "gpu" if device.type == "cuda" else cfg.trainer.accelerator})
    d = cfg.dllm
    history = []
    for seed in meta["seeds"]:
        for arm in cfg.rl.arms:
            dlm = load_dllm(cfg.source, d, key=f"{key}.source").to(device)   # a fresh base per arm and seed
            policy = HFDLLMPolicy(dlm, tr_ids, d.gen_len, arm, counter)

            def eval_fn(module, step):
                acc, _ = greedy_accuracy(module.policy.model, tok, te_ids, te_texts, te_gts, d.gen_len,
                                         d.eval_block, d.include_prompt, counter)
                return {"acc_gsm8k": acc}

            module = GRPOModule(policy, make_reward_fn(tok, tr_texts, tr_gts, d.include_prompt), cfg.rl.grpo,
                                lr=cfg.rl.lr, seed=seed, eval_fn=eval_fn, eval_every=cfg.rl.eval_every)
            trainer = make_trainer(tcfg, ctx.tracker, max_steps=cfg.rl.steps)
            trainer.fit(module, PromptLoader(torch.arange(len(tr_ids)), cfg.rl.prompts_per_step, cfg.rl.steps,
                                             seed=seed))
            if cfg.rl.steps % cfg.rl.eval_every:
                module.history[-1].update(eval_fn(module, cfg.rl.steps))
            dlm.model.save_pretrained(ctx.out / f"{arm}_s{seed}")
            history += [dict(h, arm=arm, seed=seed) for h in module.history]
    rec.save(ctx.out)
    pl.DataFrame(history, infer_schema_length=None).write_csv(ctx.out / "rl_history.csv")
    write_json(ctx.out / "models.json", {"kind": "hf", "seeds": meta["seeds"], "arms": list(cfg.rl.arms),
                                         "gen_len": d.gen_len, "source": cfg.source.model_dump(mode="json"),
                                         "dllm": d.model_dump(mode="json"), "rl": cfg.rl.model_dump(mode="json")})


def evaluate_real(cfg, ctx, info: dict) -> None:
    """evaluate (full): the toy evaluation's two analyses on the real dLLM, written in the same eval.json schema
    (so the report's claims read them unchanged). (1) Flexibility trap on the pretrained checkpoint: pass@k
    (unbiased estimator, T = 1, ``n_samples`` per question) on the first ``passk_prompts`` GSM8K test questions
    under AR order (block 1) vs low-confidence arbitrary order (one block of ``gen_len``), 1 token per step; GSM8K
    has no labelled fork tokens, so the fork entries are null (the fork claim is then inconclusive). (2) Greedy
    accuracy (T = 0, blocks of ``eval_block``) of the checkpoint and each RL arm's saved model at every
    ``tokens_per_step``, on the first ``eval_prompts`` test questions, with per-question 0/1 lists."""
    import numpy as np
    import polars as pl

    from kernels.record import KernelRecord
    from stages.common.device import generator, pick_device
    from stages.common.hf import source_tokenizer
    from stages.common.paths import write_json
    from stages.justgrpo.evaluate import pass_at_k

    key = f"papers.{ctx.slug}.{ctx.stage}"
    real_prepare_meta(ctx, "gsm8k", "a real dLLM needs prepare's real GSM8K records")
    if max(cfg.tokens_per_step) > cfg.eval_block:
        raise ValueError(f"tokens_per_step: {max(cfg.tokens_per_step)} exceeds eval_block {cfg.eval_block}")
    torch.set_num_threads(cfg.torch_threads)
    device = pick_device(cfg.device)
    source = SourceConfig(**info["source"])
    dcfg = DLLMConfig(**info["dllm"])
    gen_len = int(info["gen_len"])
    tok = source_tokenizer(source, "papers.justgrpo.train.source")
    test = pl.read_parquet(ctx.input("prepare") / GSM8K_TABLE).filter(pl.col("split") == "test")
    texts = [chat_prompt(tok, q) for q in test["question"].to_list()]
    ids = [torch.tensor(tok(t, add_special_tokens=False)["input_ids"], dtype=torch.long) for t in texts]
    gts = test["gt"].to_list()
    n_pk, n_acc = min(cfg.passk_prompts, len(ids)), min(cfg.eval_prompts, len(ids))
    if n_pk == 0:
        raise SourceError(f"{key}: prepare's GSM8K test split is empty")
    seeds = info["seeds"]
    for seed in seeds:                                      # every saved arm before the costly sampling
        for arm in info["arms"]:
            if not (ctx.input("train") / f"{arm}_s{seed}" / "config.json").is_file():
                raise SourceError(f"evaluate@justgrpo: train output {arm}_s{seed} is missing; re-run train")
    rec = KernelRecord(device)
    counter = Counter(rec)
    metrics: dict = {"kind": "hf", "seeds": seeds, "ks": cfg.ks, "claim_k": cfg.claim_k, "n_samples": cfg.n_samples, "passk": {}, "fork": {},
                     "acc": {}, "acc_items": {}, "n_fork_prompts": 0, "passk_prompts": n_pk, "eval_prompts": n_acc}
    passk_rows, acc_rows = [], []
    blocks = {"ar": 1, "arbitrary": gen_len}
    base = load_dllm(source, dcfg, key="papers.justgrpo.train.source").to(device)
    for seed in seeds:
        for sampler, block in blocks.items():
            g = generator(device, cfg.seed + seed)
            c = []
            with torch.no_grad():
                for q in range(n_pk):
                    hits = 0
                    for b0 in range(0, cfg.n_samples, cfg.sample_batch):
                        b = min(cfg.sample_batch, cfg.n_samples - b0)
                        gen, _ = decode(base, ids[q].to(device)[None].expand(b, -1).contiguous(), gen_len, block, 1,
                                        1.0, g, counter)
                        comps = tok.batch_decode(gen.tolist(), skip_special_tokens=True)
                        hits += sum(math_equal(extract_answer((texts[q] if dcfg.include_prompt else "") + comp),
                                               gts[q]) for comp in comps)
                    c.append(hits)
            curve = {k: float(pass_at_k(cfg.n_samples, np.asarray(c), k).mean()) for k in cfg.ks}
            for k, v in curve.items():
                passk_rows.append({"seed": seed, "sampler": sampler, "k": k, "pass_at_k": v})
                metrics["passk"].setdefault(sampler, {}).setdefault(f"pass{k}", []).append(v)
            fk = metrics["fork"].setdefault(sampler, {})
            for name in ("fork_entropy", "nonfork_entropy", "fork_decode_step"):
                fk.setdefault(name, []).append(None)         # no labelled fork tokens in GSM8K
        for name in ["base"] + list(info["arms"]):
            if name == "base" and seed != seeds[0]:          # greedy (T = 0) on one checkpoint: the same every seed
                for tps in cfg.tokens_per_step:
                    metrics["acc"]["base"][f"tps{tps}"].append(metrics["acc"]["base"][f"tps{tps}"][0])
                    metrics["acc_items"]["base"][f"tps{tps}"].append(metrics["acc_items"]["base"][f"tps{tps}"][0])
                    acc_rows.append({"seed": seed, "model": "base", "tokens_per_step": tps,
                                     "acc": metrics["acc"]["base"][f"tps{tps}"][0]})
                continue
            model = base if name == "base" else load_dllm(
                SourceConfig(kind="file", model=str(ctx.input("train") / f"{name}_s{seed}"), dtype=source.dtype),
                dcfg, key=f"train output {name}_s{seed}").to(device)
            for tps in cfg.tokens_per_step:
                acc, items = greedy_accuracy(model, tok, ids[:n_acc], texts[:n_acc], gts[:n_acc], gen_len,
                                             cfg.eval_block, dcfg.include_prompt, counter, tokens_per_step=tps)
                acc_rows.append({"seed": seed, "model": name, "tokens_per_step": tps, "acc": acc})
                metrics["acc"].setdefault(name, {}).setdefault(f"tps{tps}", []).append(acc)
                metrics["acc_items"].setdefault(name, {}).setdefault(f"tps{tps}", []).append(items)
            if name != "base":
                del model
    rec.save(ctx.out)
    pl.DataFrame(passk_rows).write_csv(ctx.out / "passk.csv")
    pl.DataFrame(acc_rows).write_csv(ctx.out / "accuracy.csv")
    write_json(ctx.out / "eval.json", metrics)
