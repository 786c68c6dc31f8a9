"""Where a process of a job runs: its device and its share of its node's cores (its backend
says which node: backends/mpi/placement.py)."""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..console import count
from ..settings import ConfigError
from ..wire.messages import ProtocolError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Placement:
    node_rank: int  # the process's index among the node's processes
    node_silos: int  # silos hosted on this node (the server is not one)
    local_rank: int  # its index among the node's silo processes: its device (-1: the server)
    silos: int  # silos this process hosts
    cores: int  # cores this process may use

    @property
    def threads(self) -> int:
        """Torch (and BLAS) threads per silo, so that the node's silos × threads fit its cores."""
        if self.silos == 0:
            return 1
        return max(1, self.cores // max(1, self.node_silos))


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def device_for(local_rank: int, wanted: str = "auto") -> torch.device:
    """The device of a party under `runtime.device` (`wanted`): with `auto` or `cuda`,
    `cuda:(local_rank % device_count)` when torch sees a GPU and the party is a silo rank,
    else the CPU (the server needs no GPU and never initialises CUDA); `cpu` never asks
    CUDA, so a CPU run is the same with or without a GPU; `cuda` without a GPU is a
    ConfigError (`require_gpu`).

    Under SLURM with one GPU per task, CUDA_VISIBLE_DEVICES already holds a single device
    and device_count() is 1, so every silo takes cuda:0 of its own view. Several silos of a
    rank (`runtime.silos_per_rank`) share its device.
    """
    import torch

    if local_rank >= 0 and wanted != "cpu":
        require_gpu(wanted)
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            deterministic_cuda()
            return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    return torch.device("cpu")


def require_gpu(wanted: str, who: str = "this process") -> None:
    """`runtime.device: cuda` fails before any work where torch sees no GPU, in one line that
    says why (ConfigError); `auto` and `cpu` need no check, and no torch import here."""
    if wanted != "cuda":
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    if torch.version.cuda is None:
        reason = f"torch {torch.__version__} is a CPU-only build"
    else:
        try:
            torch.cuda.init()
            said = "no device"
        except Exception as err:  # noqa: BLE001 - torch's own reason: no driver, a driver too old for the build
            said = str(err).split(". ")[0].strip() or type(err).__name__
        reason = f"torch {torch.__version__} (CUDA {torch.version.cuda}) says: {said}"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            reason += f" (CUDA_VISIBLE_DEVICES={visible!r})"
    raise ConfigError(
        f"runtime.device: cuda, but {who} has no usable GPU: {reason} (run where a GPU is, with "
        "a torch build its driver supports: docs/how-to/gpus.md; or set runtime.device to auto "
        "or cpu)"
    )


def deterministic_cuda() -> None:
    """A run stays a function of its config and seed on a GPU too (same hardware): cuDNN picks
    deterministic kernels rather than the fastest of a timing race, and cuBLAS gets the fixed
    workspace its deterministic mode needs (read when its first handle is made, so set before
    any CUDA work). Operations without a deterministic kernel warn instead of failing."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


def select_device(placement: Placement, wanted: str = "auto") -> torch.device:
    """The device this rank's silos share, under `runtime.device` (`wanted`)."""
    return device_for(placement.local_rank, wanted)


# What a silo rank reports of its device at start, as raw bytes (no pickle): its CUDA index
# (little-endian int64, -1 for the CPU), an id of the GPU and the GPU's name (UTF-8, NUL-padded).
GPU_ID_BYTES, NAME_BYTES = 16, 72
DEVICE_RECORD_BYTES = 8 + GPU_ID_BYTES + NAME_BYTES
MAX_CUDA_INDEX = 1 << 16  # far more GPUs than a node holds: a larger index is a lie


@dataclass(frozen=True)
class DeviceReport:
    """Where a silo rank computes, for the console's first line and summary.json."""

    index: int  # CUDA index in the rank's own view of the GPUs; -1: the CPU
    name: str  # the GPU's name; "" on the CPU
    gpu: bytes  # an id of the GPU (a hash of its UUID): ranks that share one GPU report the same

    @classmethod
    def of(cls, device: torch.device) -> DeviceReport:
        """The report of a torch device that this process computes on."""
        if device.type != "cuda":
            return cls(-1, "", bytes(GPU_ID_BYTES))
        import torch

        props = torch.cuda.get_device_properties(device)
        # torch before 2.4 has no uuid: the host, the GPUs it shows the rank and the index tell GPUs apart
        uuid = getattr(props, "uuid", None)
        key = (
            str(uuid)
            if uuid is not None
            else f"{platform.node()} {os.environ.get('CUDA_VISIBLE_DEVICES')} {device.index}"
        )
        name = props.name.encode()[:NAME_BYTES].decode(errors="ignore")
        return cls(device.index, name, hashlib.blake2b(key.encode(), digest_size=GPU_ID_BYTES).digest())

    @property
    def label(self) -> str:
        """ "cpu" or "cuda:0 (NVIDIA H200)", as summary.json lists the silo ranks' devices."""
        return "cpu" if self.index < 0 else f"cuda:{self.index} ({self.name})"

    def encode(self) -> np.ndarray:
        record = np.zeros(DEVICE_RECORD_BYTES, dtype=np.uint8)
        name = self.name.encode()
        record[:8] = np.array([self.index], dtype="<i8").view(np.uint8)
        record[8 : 8 + GPU_ID_BYTES] = np.frombuffer(self.gpu, dtype=np.uint8)
        record[8 + GPU_ID_BYTES : 8 + GPU_ID_BYTES + len(name)] = np.frombuffer(name, dtype=np.uint8)
        return record

    @classmethod
    def decode(cls, record: np.ndarray, who: str) -> DeviceReport:
        """A peer's record, checked as the untrusted input it is (ProtocolError naming `who`)."""
        index = int(record[:8].view("<i8")[0])
        gpu = record[8 : 8 + GPU_ID_BYTES].tobytes()
        raw = record[8 + GPU_ID_BYTES :].tobytes().rstrip(b"\0")
        try:
            name = raw.decode()
        except UnicodeDecodeError:
            name = None
        cpu = index == -1 and name == "" and gpu == bytes(GPU_ID_BYTES)
        cuda = 0 <= index < MAX_CUDA_INDEX and name is not None and name.strip() != "" and name.isprintable()
        if not (cpu or cuda):
            raise ProtocolError(
                f"{who} reported device index {index} named {raw!r}: expected the CPU "
                f"(index -1, no name) or a CUDA index in [0, {MAX_CUDA_INDEX}) with a printable name"
            )
        return cls(index, name or "", gpu)


def describe_devices(reports: list[DeviceReport]) -> str:
    """Where the silos compute, as the console's first line says it: "on the CPU", "on 1 GPU
    (NVIDIA H200)" (however many ranks share it), "on 2 GPUs (NVIDIA H200) and the CPU (3 ranks)"."""
    gpus = {r.gpu: r.name for r in reports if r.index >= 0}
    on_cpu = sum(r.index < 0 for r in reports)
    if not gpus:
        return "on the CPU"
    where = f"on {count(len(gpus), 'GPU')} ({', '.join(dict.fromkeys(gpus.values()))})"
    return f"{where} and the CPU ({count(on_cpu, 'rank')})" if on_cpu else where
