"""What every stdlib fake engine in tests/fakes/ shares: one OpenAI-compatible HTTP handler base.

A fake engine is a real server process (stdlib only, so it behaves like an engine and not like
moelab). Each one subclasses `OpenAIHandler` for its own answers and calls `serve`:
  - quiet request logs (the fake's log is its scripted engine log),
  - JSON answers (`_json`), the request body (`_body`),
  - GET /health and /v1/models (`models_entry` names the model),
  - an optional API key that every route but /health demands as a bearer token (`api_key`),
  - SSE events (`_event`), over chunked encoding when the handler speaks HTTP/1.1.
"""
from __future__ import annotations

import json
import os
import signal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OpenAIHandler(BaseHTTPRequestHandler):
    model_id = "fake-moe"
    api_key: str | None = None

    def log_message(self, fmt, *args):
        pass

    def models_entry(self) -> dict:
        return {"id": self.model_id, "object": "model"}

    def _json(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")

    def _refused(self) -> bool:
        """Answer 401 (and say so) when an API key is set and this request does not carry it."""
        if self.api_key and self.path != "/health" and \
                self.headers.get("Authorization") != f"Bearer {self.api_key}":
            self._json(401, {"error": {"message": "Unauthorized", "type": "invalid_request_error"}})
            return True
        return False

    def do_GET(self):
        if self._refused():
            return
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [self.models_entry()]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if self.protocol_version == "HTTP/1.1":
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _write(self, data: bytes) -> None:
        if self.protocol_version == "HTTP/1.1":  # chunked: the stream ends with a zero-length chunk
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:  # HTTP/1.0: the stream ends with the connection
            self.wfile.write(data)
        self.wfile.flush()

    def _event(self, obj: dict | str) -> None:
        """One SSE event: a JSON object, or the literal `[DONE]`."""
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        self._write(f"data: {payload}\n\n".encode())

    def _end_stream(self) -> None:
        self._event("[DONE]")
        if self.protocol_version == "HTTP/1.1":
            self._write(b"")


def serve(handler: type[OpenAIHandler], port: int, banner: str | None = None, on_term=None) -> None:
    """Serve on 127.0.0.1:port until SIGTERM (which runs `on_term`, then exits 0)."""
    httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
    httpd.daemon_threads = True

    def term(*_):
        if on_term:
            on_term()
        os._exit(0)

    signal.signal(signal.SIGTERM, term)
    if banner:
        print(banner, flush=True)
    httpd.serve_forever()
