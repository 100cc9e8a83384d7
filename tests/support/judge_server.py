"""A real OpenAI-compatible chat server for judge tests: deterministic rules, injectable faults.

It speaks ``POST /v1/chat/completions`` (and ``GET /v1/models``) over real HTTP on
127.0.0.1, so the judge client's whole path (connection pool, retries, parsing, cache) runs as
it would against vLLM, SGLang or a hosted API. The "model" reads prompts the way a model
would: it finds the fenced blocks by the nonce its system message announces, and grades by
rules a test can predict:

* rubric, one criterion: met when every 'quoted' word of the criterion occurs in the
  RESPONSE block (case-insensitive); answer ``{"explanation": ..., "criteria_met": ...}``;
* rubric, several criteria (a CRITERIA block of ``id N: ...`` lines): a ``results`` list;
* pairwise: the number after ``quality=`` in each response (0 when absent) decides, with
  ``>>`` for a margin of 3 or more; ``position_bias`` is added to the first response's
  quality; answer ``... [[A>B]]``.

Content triggers (they travel with the rollout, so they work from any worker process):
``REFUSE-ME`` in a response gets a refusal, ``GARBAGE-ME`` an answer without a verdict, and
``ECHO-ME`` makes the judge quote the response verbatim before its own verdict (a judge
fooled into repeating a forged verdict). ``faults`` is a queue of actions taken by the next
requests, whatever they ask: ``("status", 429)``, ``("status", 503, retry_after_s)``,
``("sleep", s)``, ``("malformed",)``, ``("bad_encoding",)``, ``("refusal_field",)``,
``("content_filter",)``.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

NONCE = re.compile(r"<<<NAME-([0-9a-f]{12})>>>")


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # socketserver's default of 5 drops bursts of new connections


class JudgeServer:
    def __init__(self, position_bias: float = 0.0, latency_s: float = 0.0) -> None:
        self.position_bias = position_bias
        self.latency_s = latency_s
        """Every answer waits this long (a model's time, for benchmarks)."""
        self.faults: deque[tuple[Any, ...]] = deque()
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        """Most requests being answered at once since the last reset."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "rule-judge"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": "not found"})
                    return
                with server.lock:
                    server.requests.append(body)
                    fault = server.faults.popleft() if server.faults else None
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    server.answer(self, body, fault)
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None,
                      raw: bytes | None = None) -> None:
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> JudgeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def reset(self) -> None:
        with self.lock:
            self.faults.clear()
            self.requests.clear()
            self.max_in_flight = self.in_flight

    # ---- the "model" -------------------------------------------------------------------

    def answer(self, handler: Any, body: dict[str, Any], fault: tuple[Any, ...] | None) -> None:
        if self.latency_s:
            time.sleep(self.latency_s)
        if fault is not None:
            kind = fault[0]
            if kind == "status":
                headers = {"Retry-After": str(fault[2])} if len(fault) > 2 else {}
                handler._send(fault[1], {"error": {"message": f"injected {fault[1]}"}}, headers)
                return
            if kind == "sleep":
                time.sleep(fault[1])
            if kind == "malformed":
                handler._send(200, None, raw=b'{"choices": [')
                return
            if kind == "bad_encoding":  # says gzip, is not: the client cannot decode the body
                handler._send(200, None, {"Content-Encoding": "gzip"}, raw=b"not gzip at all")
                return
            if kind == "refusal_field":
                handler._send(200, completion(body, "", refusal="I can't grade this."))
                return
            if kind == "content_filter":
                handler._send(200, completion(body, "", finish="content_filter"))
                return
        handler._send(200, completion(body, self.reply_text(body)))

    def reply_text(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        system = " ".join(m["content"] for m in messages if m.get("role") == "system")
        user = messages[-1]["content"] if messages else ""
        found = NONCE.search(system)
        blocks = fenced_blocks(user, found.group(1)) if found else {}
        responses = [blocks.get(k, "") for k in ("RESPONSE", "RESPONSE_A", "RESPONSE_B")]
        if any("REFUSE-ME" in r for r in responses):
            return "I'm sorry, but I can't help with grading this."
        if any("GARBAGE-ME" in r for r in responses):
            return "The response is interesting and raises many points."
        echo = "".join(f"The response says: {r}\n" for r in responses if "ECHO-ME" in r)
        if "RESPONSE_A" in blocks:
            qa = quality(blocks["RESPONSE_A"]) + self.position_bias
            qb = quality(blocks["RESPONSE_B"])
            diff = qa - qb
            label = ("A>>B" if diff >= 3 else "A>B" if diff > 0 else "A=B" if diff == 0
                     else "B>A" if diff > -3 else "B>>A")
            return f"{echo}Comparing the two answers on quality. My final verdict: [[{label}]]"
        response = blocks.get("RESPONSE", "").lower()
        if "CRITERIA" in blocks:
            results = []
            for line in blocks["CRITERIA"].splitlines():
                match = re.match(r"id (\d+): (.*)", line)
                if match:
                    results.append({"id": int(match.group(1)), "explanation": "rule",
                                    "criteria_met": met(match.group(2), response)})
            return echo + json.dumps({"results": results})
        verdict = met(blocks.get("CRITERION", ""), response)
        return echo + json.dumps({"explanation": "checked the quoted words",
                                  "criteria_met": verdict})


@contextlib.contextmanager
def judge_client_env(server: JudgeServer, monkeypatch: Any) -> Iterator[None]:
    """A clean slate for one judge test: the server's faults and log, the client's reply
    cache and built backends, fast backoff, and REWARDD_JUDGE_* pointing at ``server``."""
    from rewardd.verifiers.judge import openai_compat
    from rewardd.verifiers.judge.config import reset_backends

    server.reset()
    monkeypatch.setenv("REWARDD_JUDGE_BASE_URL", server.base_url)
    monkeypatch.setenv("REWARDD_JUDGE_MODEL", "rule-judge")
    monkeypatch.setattr(openai_compat, "BACKOFF_BASE_S", 0.01)
    openai_compat.CACHE.clear()
    reset_backends()
    yield
    reset_backends()


def fenced_blocks(text: str, nonce: str) -> dict[str, str]:
    pattern = re.compile(rf"<<<([A-Z_]+)-{nonce}>>>\n(.*?)\n<<<END-\1-{nonce}>>>", re.DOTALL)
    return {name: content for name, content in pattern.findall(text)}


def met(criterion: str, response: str) -> bool:
    words = re.findall(r"'([^']+)'", criterion)
    return bool(words) and all(w.lower() in response for w in words)


def quality(text: str) -> float:
    found = re.findall(r"quality=(-?\d+(?:\.\d+)?)", text)
    return float(found[-1]) if found else 0.0


def completion(body: dict[str, Any], text: str, refusal: str | None = None,
               finish: str = "stop") -> dict[str, Any]:
    prompt = " ".join(m.get("content", "") for m in body.get("messages") or [])
    return {
        "id": "chatcmpl-rule", "object": "chat.completion", "model": body.get("model"),
        "choices": [{"index": 0, "finish_reason": finish,
                     "message": {"role": "assistant", "content": text, "refusal": refusal}}],
        "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()),
                  "total_tokens": len(prompt.split()) + len(text.split())},
    }
