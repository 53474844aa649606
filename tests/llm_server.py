"""A real OpenAI-compatible HTTP server for tests: POST /v1/chat/completions, scripted replies.

    >>> with ScriptedServer(["```cuda\\n...```", Fail(429, retry_after="1"), Stall(5.0)]) as srv:
    ...     cfg = LLMConfig(model="m", base_url=srv.base_url)
    ...     ...
    ...     srv.requests[0]["messages"]      # what the client sent

Each request takes the next script item: a str is the reply content (with usage), Reply gives
full control (usage=None omits the usage block), Fail answers an HTTP error, Stall sleeps before
answering (to trip client timeouts). An exhausted script answers 500 so tests fail loudly.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    content: str
    usage: dict | None = None     # None: no usage block (the client must estimate)
    finish_reason: str = "stop"


@dataclass
class Fail:
    status: int
    retry_after: str | None = None
    message: str = "scripted failure"


@dataclass
class Stall:
    seconds: float


class ScriptedServer:
    def __init__(self, script: list, default=None, delay: float = 0.0):
        self.script = list(script)
        self.default = default      # served when the script is exhausted (None: HTTP 500)
        self.delay = delay          # seconds before every answer (to observe concurrency)
        self.active = self.max_active = 0
        self.requests: list[dict] = []   # JSON bodies received, in arrival order
        self.headers: list[dict] = []     # request headers, names lower-cased
        self.times: list[float] = []     # time.monotonic() of each arrival
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()            # wakes stalled handlers
        self._httpd.shutdown()
        self._httpd.server_close()

    def next_item(self, body: dict, headers: dict):
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self.times.append(time.monotonic())
            return self.script.pop(0) if self.script else self.default


def _handler(server: ScriptedServer):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            item = server.next_item(body, {k.lower(): v for k, v in self.headers.items()})
            with server._lock:
                server.active += 1
                server.max_active = max(server.max_active, server.active)
            try:
                self._answer(body, item)
            finally:
                with server._lock:
                    server.active -= 1

        def _answer(self, body: dict, item):
            if server.delay and server._stop.wait(server.delay):
                return
            if isinstance(item, Stall):
                if server._stop.wait(item.seconds):
                    return
                item = "stalled reply"
            if item is None:
                return self._send(500, {"error": {"message": "script exhausted"}})
            if isinstance(item, Fail):
                extra = {"Retry-After": item.retry_after} if item.retry_after else {}
                return self._send(item.status, {"error": {"message": item.message}}, extra)
            reply = item if isinstance(item, Reply) else Reply(item, usage=_usage(body, item))
            self._send(200, _completion(body, reply))

        def _send(self, status: int, payload: dict, headers: dict | None = None):
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass   # the client gave up (timeout tests)

        def log_message(self, *args):   # keep pytest output clean
            pass

    return Handler


def _usage(body: dict, content: str) -> dict:
    # Deterministic, checkable counts: one token per 4 characters, like the client's estimate.
    prompt = sum(len(m.get("content", "")) for m in body.get("messages", [])) // 4
    completion = len(content) // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _completion(body: dict, reply: Reply) -> dict:
    out = {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
           "model": body.get("model", ""),
           "choices": [{"index": 0, "finish_reason": reply.finish_reason,
                        "message": {"role": "assistant", "content": reply.content}}]}
    if reply.usage is not None:
        out["usage"] = reply.usage
    return out
