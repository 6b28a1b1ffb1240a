"""The engine adapter interface: turn a LaunchSpec into a command, and know the engine's ways.

One file per engine (embedded, command, vllm, sglang), one small interface, a registry by name
in `moelab.engines`. An adapter never renames the engine's flags: `spec.args` pass through as
they are, and the adapter only adds what it must (host, port) when the user did not.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from moelab.spec import LaunchSpec


def with_host_port(args: list[str], host: str, port: int) -> list[str]:
    """args plus `--host H --port P` where the user did not give them (their values always win)."""
    have = {a.split("=", 1)[0] for a in args}
    extra = [] if "--host" in have else ["--host", host]
    extra += [] if "--port" in have else ["--port", str(port)]
    return [*args, *extra]


class EngineAdapter(ABC):
    name: ClassVar[str]

    @abstractmethod
    def command(self, spec: LaunchSpec, port: int) -> tuple[list[str], dict[str, str]]:
        """(argv, extra environment) that start the server on spec.host:port."""

    def health_path(self) -> str:
        return "/health"

    def version(self) -> str | None:
        """Installed engine version, or None when it is not installed here."""
        return None

    # Log lines that mark the launch phase, first match wins: (regex, phase name). The embedded
    # engine says `moelab.engine phase=<name>`; the others are the usual SGLang/vLLM/uvicorn lines.
    phase_patterns: ClassVar[tuple[tuple[str, str], ...]] = (
        (r"moelab\.engine phase=(?P<phase>\w+)", ""),
        (r"Load(?:ing)? (?:model )?weights?|Loading safetensors|Starting to load model", "loading_weights"),
        (r"Capturing (?:cuda )?graphs?|Capture cuda graph|[Ww]arm(?:ing)? ?up|autotun", "warmup"),
        (r"Uvicorn running on|Application startup complete|The server is fired up|Starting vLLM API server",
         "serving"),
    )

    def phase_of(self, line: str) -> str | None:
        """The launch phase a log line announces, or None."""
        for rx, phase in self.phase_patterns:
            m = re.search(rx, line)
            if m:
                return m.groupdict().get("phase") or phase
        return None

    def completion_path(self) -> str:
        """OpenAI-compatible endpoint the readiness check generates one token from."""
        return "/v1/completions"

    def port_in(self, args: list[str]) -> int | None:
        """The port the engine's own arguments set (`--port N`), which moelab then watches and probes."""
        v = LaunchSpec(args=args).flag("--port")
        return int(v) if v is not None and v.isdigit() and 0 < int(v) < 65536 else None

    def display_command(self, args: list[str], argv: list[str]) -> list[str]:
        """The launch command as a user would type it again: the port moelab chose for a trial is
        dropped (the engine's default applies) unless the user's own arguments set it."""
        if self.port_in(args) is not None:
            return list(argv)
        out, skip = [], False
        for a in argv:
            if skip:
                skip = False
            elif a == "--port":
                skip = True
            elif not a.startswith("--port="):
                out.append(a)
        return out

    def api_key_in(self, args: list[str]) -> str | None:
        """The API key the engine's own arguments set (`--api-key K`): the one moelab must send."""
        return LaunchSpec(args=args).flag("--api-key")

    def model_path(self, args: list[str]) -> str | None:
        """The model the arguments name, when the adapter can tell."""
        return None

    def flag_check(self, spec: LaunchSpec):
        """A Verdict (phase preflight) when the engine would reject spec.args before starting
        (unknown flag or value in its flag catalogue), else None. Adapters without a catalogue
        accept everything. MOELAB_NO_FLAG_CHECK=1 turns the check off (the engine then decides)."""
        return None

    def source_profile(self) -> str | None:
        """The profile `moelab audit` reads this engine's source with (engines/sources/<name>.yaml)."""
        return self.name if (Path(__file__).parent / "sources" / f"{self.name}.yaml").exists() else None

    def engine_python(self) -> str | None:
        """The interpreter this engine is installed for here (the audit reads its source), or None."""
        return None

    # -- what the rest of moelab asks an engine (no engine name is compared outside engines/) ----
    needs_command: ClassVar[bool] = False  # a study must give `command:` (the server line itself)
    # vLLM refuses to start when one max-length sequence does not fit the KV cache; others cap it
    refuses_short_kv: ClassVar[bool] = False
    # which flag selects which kind of backend (the support matrix's kinds), in the engine's names
    kind_flags: ClassVar[dict[str, str]] = {}
    # the flag that caps how many requests run at once (None: the engine has none moelab knows); the
    # report tells a point held by that cap from one held by KV room for the next request
    running_limit_flag: ClassVar[str | None] = None

    def model_args(self, model: str | None) -> list[str]:
        """The engine's own argument(s) that pass `model` (a path, a hub name or a preset)."""
        return ["--model-path", model] if model else []

    def gpus_needed(self, args: list[str]) -> int:
        """How many GPUs a launch with `args` occupies (its ranks): what a packed study gives it."""
        return 1

    def split(self, argv: list[str]) -> list[str] | None:
        """The engine's own arguments when `argv` is this engine's full command line
        (`vllm serve M ...`), else None."""
        return None

    def flag_names(self) -> frozenset[str] | None:
        """Every option string the engine accepts, or None when moelab cannot know."""
        return None

    def check_launch(self, spec: LaunchSpec, hw=None):
        """A failed preflight Verdict that makes launching pointless, else None: the flag
        catalogue, the support matrix and the memory forecast where the engine has them."""
        v = self.flag_check(spec)
        return v if v is not None and not v.ok else None
