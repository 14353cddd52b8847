"""A loopback OpenAI-compatible chat-completions server around a Python "model" (messages -> text).

    with serve_model(model_fn, name="synth") as base_url:     # http://127.0.0.1:<port>/v1
        agent = OpenAICompatibleAgent(base_url, model="synth")

Used twice: the pipeline serves the program-synthesis agent (synth.py) through it, so that agent
sees exactly what any model behind the adapter sees (the HTTP messages: prompt, workflow,
prototype images); the tests serve a stub that replays a recorded reply. POST
``/v1/chat/completions`` (or ``/chat/completions``) with ``{"model", "messages"}``; the reply is the
standard ``{"choices": [{"message": {"role": "assistant", "content": ...}}]}``. Bodies over
``MAX_BODY`` bytes get 413; malformed JSON 400; the model raising gives 500 with its one-line reason.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

MAX_BODY = 64 * 2 ** 20
Model = Callable[[list[dict[str, Any]]], str]


def _handler(model: Model, name: str):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _send(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                return self._send(413, {"error": {"message": "request too large"}})
            try:
                req = json.loads(self.rfile.read(n))
                messages = req["messages"]
                if not isinstance(messages, list):
                    raise TypeError("messages must be a list")
            except (ValueError, KeyError, TypeError) as err:
                return self._send(400, {"error": {"message": f"bad request: {err}"}})
            try:
                content = model(messages)
            except Exception as err:  # noqa: BLE001 - the model's failure is the client's answer
                return self._send(500, {"error": {"message": (str(err).splitlines() or ["model error"])[0][:300]}})
            self._send(200, {"id": f"chatcmpl-{int(time.time() * 1000)}", "object": "chat.completion",
                             "model": req.get("model", name),
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": content}}]})

    return H


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass


@contextlib.contextmanager
def serve_model(model: Model, name: str = "local"):
    server = _Server(("127.0.0.1", 0), _handler(model, name))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
