"""GPU facts (one table) and which GPUs this host has.

The launcher pins each worker to its GPUs with CUDA_VISIBLE_DEVICES=<index>[,<index>...] (one,
or a group of `--gpus-per-worker` for an engine that spans them with tensor parallelism). The index comes
from nvidia-smi, which numbers GPUs in PCI bus order, while CUDA numbers them fastest
first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; `pin_env` sets both so the two agree.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass

from fleet.errors import ConfigError

log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class GpuSpec:
    """Vendor datasheet figures for one GPU model (decimal units, dense: no sparsity)."""

    name: str
    hbm_gb: float  #: device memory, GB (1e9 bytes)
    hbm_tb_s: float  #: memory bandwidth, TB/s (1e12 bytes/s)
    bf16_tflops: float  #: dense BF16 tensor throughput, TFLOP/s
    memory_mib: int = 0  #: device memory as nvidia-smi reports it (what SGLang sizes pools from)


#: The one table of GPU facts; `fleet plan --gpu` takes these keys.
GPU_TABLE: dict[str, GpuSpec] = {
    "b200": GpuSpec("NVIDIA B200", hbm_gb=192, hbm_tb_s=8.0, bf16_tflops=2250, memory_mib=183359),
    "h200": GpuSpec("NVIDIA H200", hbm_gb=141, hbm_tb_s=4.8, bf16_tflops=989, memory_mib=143771),
    "h100": GpuSpec("NVIDIA H100 SXM", hbm_gb=80, hbm_tb_s=3.35, bf16_tflops=989, memory_mib=81559),
    "rtx-pro-6000": GpuSpec(
        "NVIDIA RTX PRO 6000 Blackwell", hbm_gb=96, hbm_tb_s=1.8, bf16_tflops=504, memory_mib=97887
    ),
}

# nvidia-smi names, lower-cased, mapped to table keys; first match wins.
_NAME_HINTS: tuple[tuple[str, str], ...] = (
    ("b200", "b200"),
    ("h200", "h200"),
    ("h100", "h100"),
    ("rtx pro 6000", "rtx-pro-6000"),
)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver reports it."""

    index: int
    name: str
    memory_mib: int

    @property
    def kind(self) -> str | None:
        """The GPU_TABLE key for this GPU, when it is one we know."""
        return kind_from_name(self.name)


def gpu_spec(kind: str) -> GpuSpec:
    """Look up a GPU by table key; tolerant of case, '_' and an 'nvidia-' prefix."""
    key = kind.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")
    try:
        return GPU_TABLE[key]
    except KeyError:
        known = ", ".join(GPU_TABLE)
        raise ConfigError(f"unknown GPU kind {kind!r}; known: {known}") from None


def kind_from_name(name: str) -> str | None:
    low = name.lower()
    return next((key for hint, key in _NAME_HINTS if hint in low), None)


def gpu_memory_mib(kind: str | None = None) -> int | None:
    """Memory of the named GPU kind, else of this host's smallest GPU; None when neither."""
    if kind:
        return gpu_spec(kind).memory_mib
    gpus, _ = query_gpus()
    return min(g.memory_mib for g in gpus) if gpus else None


def pin_env(indexes: int | list[int]) -> dict[str, str]:
    """Environment that makes GPUs `indexes` (nvidia-smi numbering) the only ones a process sees."""
    group = [indexes] if isinstance(indexes, int) else indexes
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, group)), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def gpu_groups(indexes: list[int], per_worker: int) -> list[list[int]]:
    """The GPUs split into groups of `per_worker`, in order (one worker each); a count that does not
    divide them is refused, since the GPUs left over would idle."""
    if per_worker < 1:
        raise ConfigError(f"--gpus-per-worker {per_worker}: a worker needs at least one GPU")
    if len(indexes) % per_worker:
        raise ConfigError(
            f"--gpus-per-worker {per_worker} does not divide the {len(indexes)} GPUs given "
            f"({', '.join(map(str, indexes))}): use a divisor of {len(indexes)}"
        )
    return [indexes[i : i + per_worker] for i in range(0, len(indexes), per_worker)]


def _query_nvidia_smi() -> tuple[list[GpuInfo], str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not on PATH"
    cmd = [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"nvidia-smi failed: {e}"
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()
        return [], f"nvidia-smi exited {out.returncode}: {why[0] if why else 'no output'}"
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        mem = parts[-1].split()[0]  # "183359 MiB"
        gpus.append(GpuInfo(int(parts[0]), ", ".join(parts[1:-1]), int(mem) if mem.isdigit() else 0))
    return gpus, "nvidia-smi" if gpus else "nvidia-smi lists no GPU"


def _query_nvml() -> tuple[list[GpuInfo], str]:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return [], "NVML (pynvml) not importable"
    try:
        pynvml.nvmlInit()
        try:
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else name
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
                gpus.append(GpuInfo(i, name, int(mem)))
            return gpus, "NVML" if gpus else "NVML lists no GPU"
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # pynvml.NVMLError and friends: no driver, no device
        return [], f"NVML failed: {e}"


def query_gpus() -> tuple[list[GpuInfo], str]:
    """GPUs from nvidia-smi, else NVML, with a word on where they came from (or why none)."""
    gpus, smi_why = _query_nvidia_smi()
    if gpus:
        return gpus, smi_why
    gpus, nvml_why = _query_nvml()
    if gpus:
        return gpus, nvml_why
    return [], f"{smi_why}; {nvml_why}"


def detect_gpus() -> list[int]:
    """Indexes of this host's GPUs; empty when neither nvidia-smi nor NVML finds one."""
    gpus, why = query_gpus()
    if not gpus:
        log.debug("no GPU detected: %s", why)
    return [g.index for g in gpus]


def gpu_spec_indexes(spec: str) -> list[int] | None:
    """`all` (None) or a comma list like `0,1,4`, read without looking at the host: a command line is
    checked as it is parsed, also where it is written for another host (a compose file's)."""
    text = spec.strip().lower()
    if text == "all":
        return None
    indexes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ConfigError(f"--gpus {spec!r}: {part!r} is not a GPU index (use 'all' or e.g. 0,1,4)")
        index = int(part)
        if index in indexes:
            raise ConfigError(f"--gpus {spec!r}: GPU {index} is listed twice")
        indexes.append(index)
    return indexes


def parse_gpu_spec(spec: str, available: list[int] | None = None) -> list[int]:
    """`all` or a comma list like `0,1,4` -> GPU indexes present on this host.

    `available` defaults to what `query_gpus` finds; tests and callers that already
    detected pass it in.
    """
    indexes = gpu_spec_indexes(spec)
    why = ""
    if available is None:
        gpus, why = query_gpus()
        available = [g.index for g in gpus]
    if indexes is None:
        if not available:
            raise ConfigError(
                f"--gpus all: no GPU found on this host ({why or 'none detected'}); for CPU engines use --workers N"
            )
        return sorted(available)
    missing = [i for i in indexes if i not in available]
    if missing:
        have = ", ".join(map(str, sorted(available))) or "none"
        raise ConfigError(
            f"--gpus {spec!r}: GPU {', '.join(map(str, missing))} not present on this host (present: {have})"
        )
    return indexes
