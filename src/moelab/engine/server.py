"""The OpenAI-compatible HTTP server (aiohttp) in front of the engine loop.

Routes: GET /health, /version, /v1/models, /stats (the engine's step counters and batch sizes),
/metrics (Prometheus text: running and waiting requests, KV cache use, tokens, TTFT, decode steps);
POST /v1/completions, /v1/chat/completions (streaming SSE or not). With `--api-key` every route
but /health wants `Authorization: Bearer KEY` (401 otherwise), as vLLM and SGLang do. Each request becomes one
`Sequence` per prompt; the engine thread hands events back through one `call_soon_threadsafe`
per step into the request's asyncio.Queue. A client that goes away aborts its sequences.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from moelab.engine import protocol as P
from moelab.engine.runtime import Engine, Event, phase
from moelab.engine.scheduler import Overloaded, Sequence


def _error(e: P.ApiError) -> web.Response:
    return web.json_response(e.body(), status=e.status)


@web.middleware
async def _json_http_errors(request: web.Request, handler):
    """Unknown routes and wrong methods answer in OpenAI's error JSON too, not aiohttp's text."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error(P.ApiError(e.status, f"{request.method} {request.path}: {e.reason}"))


def _require_key(key: str):
    import hmac

    @web.middleware
    async def check(request: web.Request, handler):
        if request.path != "/health":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return _error(P.ApiError(401, "missing or wrong API key: send Authorization: Bearer KEY"))
        return await handler(request)

    return check


class Server:
    def __init__(self, engine: Engine, model_name: str, info: dict[str, Any], api_key: str | None = None) -> None:
        self.engine, self.model_name, self.info = engine, model_name, info
        self.api_key = api_key
        self.ctx = engine.context_len
        self.created = P.now()
        from moelab.engine.metrics import EngineMetrics

        self.metrics = engine.metrics = EngineMetrics(engine, model_name)

    def app(self) -> web.Application:
        middlewares = [_json_http_errors] + ([_require_key(self.api_key)] if self.api_key else [])
        app = web.Application(client_max_size=16 << 20, middlewares=middlewares)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        loop = asyncio.get_running_loop()

        def dispatch(events: list[tuple[Sequence, Event]]) -> None:
            for seq, ev in events:
                seq.sink.put_nowait(ev)

        self.engine.deliver = lambda evs: loop.call_soon_threadsafe(dispatch, evs)
        self.engine.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.engine.stop)

    async def health(self, request: web.Request) -> web.Response:
        if self.engine.stats["error"]:
            return web.json_response({"status": "error", "error": self.engine.stats["error"]}, status=503)
        return web.json_response({"status": "ok"})

    async def version(self, request: web.Request) -> web.Response:
        from moelab import __version__

        return web.json_response({"version": __version__, "engine": "moelab-embedded"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "moelab",
             "max_model_len": self.ctx}]})

    async def stats(self, request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response({**e.stats, **e.sched.stats(),
                                  "batch_size_histogram": {str(k): v for k, v in sorted(e.batch_hist.items())},
                                  **{k: self.info[k] for k in ("resolved", "kv_cache_tokens", "model_config", "expert_bytes",
                                                                "cuda_graph_batch_sizes", "parallel", "memory")
                                     if k in self.info}})

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise P.ApiError(400, "the request body is not valid JSON") from None
            if not isinstance(body, dict):
                raise P.ApiError(400, "the request body must be a JSON object")
            if self.engine.stats["error"]:
                raise P.ApiError(500, f"the engine stopped after an error: {self.engine.stats['error']}")
            P.check_model(body, self.model_name)
            parsed = (P.parse_chat if chat else P.parse_completion)(body, self.engine.tok, self.ctx)
        except P.ApiError as e:
            return _error(e)
        rid = P.new_id("chatcmpl" if chat else "cmpl")
        queue: asyncio.Queue[Event] = asyncio.Queue()
        seqs = [Sequence(f"{rid}-{i}", ids, params, sink=queue, extra={"index": i})
                for i, (ids, params) in enumerate(zip(parsed.prompts, parsed.params))]
        try:
            for s in seqs:
                self.engine.submit(s, stream=parsed.stream)
        except Overloaded as e:
            self._abort(seqs)
            return _error(P.ApiError(503, f"The server is overloaded: {e}", code="overloaded"))
        except ValueError as e:
            self._abort(seqs)
            return _error(P.ApiError(400, str(e), "max_tokens", "kv_cache_exceeded"))
        try:
            if parsed.stream:
                return await self._stream(request, rid, chat, seqs, queue, parsed.include_usage)
            return await self._whole(rid, chat, seqs, queue)
        finally:
            self._abort([s for s in seqs if s.finish_reason is None])

    def _abort(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            self.engine.abort(s)

    def _envelope(self, rid: str, chat: bool, chunk: bool) -> dict[str, Any]:
        obj = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
        return {"id": rid, "object": obj, "created": P.now(), "model": self.model_name}

    def _usage(self, seqs: list[Sequence]) -> dict[str, int]:
        return P.usage(sum(len(s.prompt_ids) for s in seqs), sum(len(s.output_ids) for s in seqs))

    async def _whole(self, rid: str, chat: bool, seqs: list[Sequence], queue: asyncio.Queue) -> web.Response:
        done = 0
        while done < len(seqs):
            ev = await queue.get()
            if ev.finish_reason == "error":
                return _error(P.ApiError(500, f"the engine failed: {self.engine.stats['error']}"))
            done += ev.finish_reason is not None
        choices = []
        for i, s in enumerate(seqs):
            entries = s.extra["logprobs"]
            text = s.extra["text"].text
            c: dict[str, Any] = {"index": i, "finish_reason": s.finish_reason}
            if chat:
                c["message"] = {"role": "assistant", "content": text}
                c["logprobs"] = P.chat_logprobs(self.engine.tok, entries) if s.params.logprobs is not None else None
            else:
                c["text"] = text
                c["logprobs"] = (P.completion_logprobs(self.engine.tok, entries)
                                 if s.params.logprobs is not None else None)
            choices.append(c)
        return web.json_response({**self._envelope(rid, chat, False), "choices": choices,
                                  "usage": self._usage(seqs)}, dumps=json.dumps)

    async def _stream(self, request: web.Request, rid: str, chat: bool, seqs: list[Sequence],
                      queue: asyncio.Queue, include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(obj: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps(obj)}\n\n".encode())

        env = self._envelope(rid, chat, True)
        try:
            if chat:
                await send({**env, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]})
            done = 0
            while done < len(seqs):
                ev = await queue.get()
                if ev.finish_reason == "error":
                    await send(P.ApiError(500, f"the engine failed: {self.engine.stats['error']}").body())
                    break
                done += ev.finish_reason is not None
                s = seqs[ev.index]
                lp = None
                if s.params.logprobs is not None:
                    lp = (P.chat_logprobs if chat else P.completion_logprobs)(self.engine.tok, ev.tokens)
                c: dict[str, Any] = {"index": ev.index, "logprobs": lp, "finish_reason": ev.finish_reason}
                if chat:
                    c["delta"] = {"content": ev.text} if ev.text or ev.finish_reason is None else {}
                else:
                    c["text"] = ev.text
                await send({**env, "choices": [c], **({"usage": None} if include_usage else {})})
            if include_usage:
                await send({**env, "choices": [], "usage": self._usage(seqs)})
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self._abort(seqs)
            raise
        return resp


async def serve(engine: Engine, model_name: str, info: dict[str, Any], host: str, port: int,
                on_ready=None, api_key: str | None = None) -> None:
    """Listen until SIGTERM/SIGINT, then stop the engine and return (exit 0 is the caller's)."""
    import signal

    server = Server(engine, model_name, info, api_key)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        phase("ready", f"serving {model_name} on http://{host}:{port} (startup {info.get('startup_s')}s)")
        if on_ready:
            on_ready()
        await stop.wait()
        phase("shutdown", "signal received; stopping")
    finally:
        await runner.cleanup()
