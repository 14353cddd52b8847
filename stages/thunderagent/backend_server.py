"""The project's tiny engine behind a small OpenAI-compatible HTTP server (a test/demo backend for the proxy).

    python -m stages.thunderagent.backend_server --port 8001 [--capacity 8192] [--max-model-len 2048]
        [--max-tokens-limit 512] [--gated]

Endpoints (shapes as vLLM's OpenAI server):
- POST /v1/chat/completions ({"messages": [...], "max_tokens": n, "stream": false}) and POST /v1/completions
  ({"prompt": "...", "max_tokens": n}): greedy decoding of exactly max_tokens tokens (the tiny model has no EOS);
  usage {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens = 0}.
- POST /tokenize ({"messages": [...]} or {"prompt": "..."}) → {"count", "max_model_len", "tokens"}.
- GET /metrics (Prometheus text, including vllm:cache_config_info{block_size, num_gpu_blocks} — what the
  proxy reads as this backend's KV capacity, as the official ThunderAgent does with vLLM), /health, /v1/models.

Tokenizer: one token per character of the message contents, concatenated in order (roles and chat
template add nothing), id = code point mod the vocabulary; generated ids are rendered as printable ASCII,
one character each — so token counts are exact and a client can build contexts of a given size.
Requests run one at a time (a lock; torch with one thread); no cross-request prefix cache (every call
prefills its whole prompt). ``--gated`` (tests): a reply is held until POST /gate/open {"key": <x-request-id>}
(POST /gate/control {"gating": false} turns that off, {"reset": true} clears the log); GET /served lists the
x-request-id of every request in arrival order.
Bad requests get a JSON error with status 400 (never a traceback).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from aiohttp import web

VOCAB = 128


def tokenize_text(text: str) -> list[int]:
    return [ord(c) % VOCAB for c in text]


def render(ids: list[int]) -> str:
    return "".join(chr(33 + i % 94) for i in ids)


def prompt_text(body: dict) -> str:
    """The text the tokenizer sees: the concatenated message contents (chat) or the prompt (completions)."""
    if "messages" in body:
        msgs = body["messages"]
        if not isinstance(msgs, list):
            raise ValueError("messages: must be a list")
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts += [x.get("text", "") for x in c if isinstance(x, dict) and isinstance(x.get("text", ""), str)]
            elif c is not None:
                raise ValueError("messages[].content: must be a string or a list of text parts")
        return "".join(parts)
    p = body.get("prompt")
    if not isinstance(p, str):
        raise ValueError("prompt: must be a string (or give messages)")
    return p


class Backend:
    def __init__(self, args):
        import torch

        from stages.thunderagent.engine import OnlineEngine, engine_model_config

        torch.set_num_threads(1)
        self.args = args
        self.engine = OnlineEngine(args.capacity, engine_model_config(args.max_model_len), seed=args.seed)
        self.lock = asyncio.Lock()
        self.gates: dict[str, asyncio.Event] = {}
        self.gating = bool(args.gated)
        self.served: list[str] = []
        self.running = 0
        self.done = 0
        self.started = time.time()

    def gate(self, key: str) -> asyncio.Event:
        return self.gates.setdefault(key, asyncio.Event())

    async def read_body(self, request: web.Request) -> dict:
        if request.content_length is not None and request.content_length > self.args.max_body_bytes:
            raise ValueError(f"body larger than {self.args.max_body_bytes} bytes")
        raw = await request.content.read(self.args.max_body_bytes + 1)
        if len(raw) > self.args.max_body_bytes:
            raise ValueError(f"body larger than {self.args.max_body_bytes} bytes")
        from stages.thunderagent.workload import json_depth_ok

        text = raw.decode("utf-8", errors="strict")
        if not json_depth_ok(text, 32):
            raise ValueError("JSON nested deeper than 32 levels")
        body = json.loads(text)
        if not isinstance(body, dict):
            raise ValueError("body: must be a JSON object")
        return body

    async def completions(self, request: web.Request) -> web.Response:
        chat = request.path.endswith("/chat/completions")
        try:
            body = await self.read_body(request)
            text = prompt_text(body)
            max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.args.max_tokens_limit:
                raise ValueError(f"max_tokens: must be an integer in [1, {self.args.max_tokens_limit}]")
            if body.get("stream"):
                raise ValueError("stream: not supported by this test backend")
            ids = tokenize_text(text)
            if not ids:
                raise ValueError("the prompt is empty")
            if len(ids) + max_tokens > self.args.max_model_len:
                raise ValueError(f"prompt ({len(ids)}) + max_tokens ({max_tokens}) exceeds max_model_len "
                                 f"{self.args.max_model_len}")
        except (ValueError, UnicodeDecodeError) as err:
            return web.json_response({"error": {"message": str(err).splitlines()[0][:300], "type": "BadRequestError"}},
                                     status=400)
        key = request.headers.get("x-request-id", "")
        self.served.append(key)
        self.running += 1
        try:
            async with self.lock:
                loop = asyncio.get_running_loop()
                out = await loop.run_in_executor(None, self.engine.generate, ids, max_tokens)
            if self.gating:
                await self.gate(key).wait()
        finally:
            self.running -= 1
        self.done += 1
        content = render(out)
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(out), "total_tokens": len(ids) + len(out),
                 "prompt_tokens_details": {"cached_tokens": 0}}
        rid = f"cmpl-{self.done}"
        if chat:
            return web.json_response({"id": rid, "object": "chat.completion", "created": int(time.time()),
                                      "model": self.args.model_name, "usage": usage,
                                      "choices": [{"index": 0, "finish_reason": "length",
                                                   "message": {"role": "assistant", "content": content}}]})
        return web.json_response({"id": rid, "object": "text_completion", "created": int(time.time()),
                                  "model": self.args.model_name, "usage": usage,
                                  "choices": [{"index": 0, "text": content, "finish_reason": "length"}]})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            ids = tokenize_text(prompt_text(await self.read_body(request)))
        except (ValueError, UnicodeDecodeError) as err:
            return web.json_response({"error": {"message": str(err).splitlines()[0][:300]}}, status=400)
        return web.json_response({"count": len(ids), "max_model_len": self.args.max_model_len, "tokens": ids})

    async def metrics(self, request: web.Request) -> web.Response:
        bs = self.engine.pool.bs
        lines = ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                 "# TYPE vllm:cache_config_info gauge",
                 f'vllm:cache_config_info{{block_size="{bs}",num_gpu_blocks="{self.engine.pool.n_blocks}"}} 1.0',
                 "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running {self.running}",
                 "# TYPE vllm:request_success_total counter", f"vllm:request_success_total {self.done}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.args.model_name, "object": "model"}]})

    async def gate_open(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.gate(str(body.get("key", ""))).set()
        return web.json_response({"ok": True})

    async def served_list(self, request: web.Request) -> web.Response:
        return web.json_response({"served": self.served})

    async def test_control(self, request: web.Request) -> web.Response:
        """--gated only: {"gating": bool} switches reply gating, {"reset": true} clears the served log."""
        body = await request.json()
        if "gating" in body:
            self.gating = bool(body["gating"])
        if body.get("reset"):
            self.served.clear()
            self.gates.clear()
        return web.json_response({"gating": self.gating, "served": len(self.served)})


def make_app(args) -> web.Application:
    b = Backend(args)
    app = web.Application(client_max_size=args.max_body_bytes + 1)
    app.router.add_post("/v1/chat/completions", b.completions)
    app.router.add_post("/v1/completions", b.completions)
    app.router.add_post("/tokenize", b.tokenize)
    app.router.add_get("/metrics", b.metrics)
    app.router.add_get("/health", b.health)
    app.router.add_get("/v1/models", b.models)
    if args.gated:
        app.router.add_post("/gate/open", b.gate_open)
        app.router.add_post("/gate/control", b.test_control)
    app.router.add_get("/served", b.served_list)
    return app


def main(argv: list[str] | None = None) -> int:
    class P(argparse.ArgumentParser):
        def error(self, message):
            print(f"backend_server: {message}", file=sys.stderr)
            raise SystemExit(2)

    ap = P(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--capacity", type=int, default=8192, help="KV pool in tokens (advertised in /metrics)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-tokens-limit", type=int, default=512)
    ap.add_argument("--max-body-bytes", type=int, default=8 * 2**20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-name", default="tiny-gpt")
    ap.add_argument("--gated", action="store_true", help="hold replies until /gate/open (tests)")
    args = ap.parse_args(argv)
    for name, lo, hi in (("port", 1, 65535), ("capacity", 32, 10**7), ("max_model_len", 16, 65536),
                         ("max_tokens_limit", 1, 65536), ("max_body_bytes", 1024, 2**30)):
        v = getattr(args, name)
        if not lo <= v <= hi:
            print(f"backend_server: --{name.replace('_', '-')}: must be in [{lo}, {hi}] (got {v})", file=sys.stderr)
            return 2
    web.run_app(make_app(args), host=args.host, port=args.port, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
