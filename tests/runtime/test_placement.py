"""Which device a party computes on under `runtime.device`, with torch's view of CUDA mocked
(so the GPU paths run on a machine without one), and the device reports a silo rank sends
at start: checked as untrusted input, and summed up for the console's first line."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cfl_mpi.config import ConfigError
from cfl_mpi.runtime import placement
from cfl_mpi.runtime.placement import DEVICE_RECORD_BYTES, DeviceReport, describe_devices, device_for, require_gpu
from cfl_mpi.wire.messages import ProtocolError


@pytest.fixture
def two_gpus(monkeypatch) -> list[str]:
    """torch sees two GPUs; the deterministic switches (process-wide) are recorded, not set."""
    switched: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(placement, "deterministic_cuda", lambda: switched.append("deterministic"))
    return switched


def test_auto_spreads_silo_ranks_over_the_gpus_and_keeps_the_server_on_the_cpu(two_gpus):
    assert [str(device_for(r, "auto")) for r in (-1, 0, 1, 2)] == ["cpu", "cuda:0", "cuda:1", "cuda:0"]
    assert str(device_for(3)) == "cuda:1"  # auto is the default
    assert two_gpus == ["deterministic"] * 4


def test_cpu_is_forced_even_where_cuda_is_available(two_gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("runtime.device: cpu asked torch for CUDA"))
    assert [str(device_for(r, "cpu")) for r in (-1, 0, 1)] == ["cpu"] * 3
    assert two_gpus == []  # nothing process-wide changes: a CPU run is the same with a GPU present


def test_cuda_takes_the_gpu_where_there_is_one(two_gpus):
    assert str(device_for(1, "cuda")) == "cuda:1"
    require_gpu("cuda", "rank 2")


TOO_OLD = (
    "The NVIDIA driver on your system is too old (found version 11040). Please update your GPU driver by "
    "downloading and installing a new version from the URL: http://www.nvidia.com/Download/index.aspx"
)


@pytest.mark.parametrize(
    "build, words",
    [
        (None, "torch {} is a CPU-only build"),
        (
            "12.6",
            "torch {} (CUDA 12.6) says: The NVIDIA driver on your system is too old (found version 11040) "
            "(CUDA_VISIBLE_DEVICES='') (",
        ),
    ],
)
def test_cuda_without_a_gpu_is_one_config_error_that_says_why(monkeypatch, build, words):
    def init() -> None:
        raise RuntimeError(TOO_OLD)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "init", init)
    monkeypatch.setattr(torch.version, "cuda", build)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for call, who in (
        (lambda: require_gpu("cuda", "rank 3 on node7"), "rank 3 on node7"),
        (lambda: device_for(0, "cuda"), "this process"),
    ):
        with pytest.raises(ConfigError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"runtime.device: cuda, but {who} has no usable GPU: ") and "\n" not in message
        assert words.format(torch.__version__) in message and "runtime.device to auto or cpu" in message
    require_gpu("auto")  # auto and cpu need no GPU
    assert str(device_for(0, "auto")) == "cpu"


def test_device_reports_travel_as_raw_bytes_and_are_checked():
    gpu = DeviceReport(1, "NVIDIA H200", bytes(range(16)))
    for report in (gpu, DeviceReport.of(torch.device("cpu"))):
        record = report.encode()
        assert record.dtype == np.uint8 and record.shape == (DEVICE_RECORD_BYTES,)
        assert DeviceReport.decode(record, "rank 1") == report
    assert [gpu.label, DeviceReport.of(torch.device("cpu")).label] == ["cuda:1 (NVIDIA H200)", "cpu"]
    bad = {
        "an index out of range": DeviceReport(1 << 20, "NVIDIA H200", bytes(16)).encode(),
        "a GPU without a name": DeviceReport(0, "", bytes(16)).encode(),
        "the CPU with a name": DeviceReport(-1, "NVIDIA H200", bytes(16)).encode(),
        "a control character": DeviceReport(0, "GPU\x1b[2J", bytes(16)).encode(),
    }
    broken = gpu.encode()
    broken[8 + 16] = 0xFF  # not UTF-8
    bad["bytes that are not UTF-8"] = broken
    for record in bad.values():
        with pytest.raises(ProtocolError, match="^rank 4 reported device index"):
            DeviceReport.decode(record, "rank 4")


def test_a_gpu_report_names_the_gpu_and_tells_gpus_apart(monkeypatch):
    """By UUID; torch before 2.4 has none, and the report still names the GPU."""
    props = {i: SimpleNamespace(name="NVIDIA H200", uuid=f"GPU-{i}") for i in (0, 1)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props[device.index])
    first, second = (DeviceReport.of(torch.device(f"cuda:{i}")) for i in (0, 1))
    assert first.label == "cuda:0 (NVIDIA H200)" and first.gpu != second.gpu
    assert DeviceReport.of(torch.device("cuda:0")) == first
    assert describe_devices([first, second, first]) == "on 2 GPUs (NVIDIA H200)"
    assert DeviceReport.decode(second.encode(), "rank 2") == second
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(name="Tesla V100"))
    old = DeviceReport.of(torch.device("cuda:0"))
    assert old.label == "cuda:0 (Tesla V100)" and old.gpu != bytes(16)


def test_the_console_counts_gpus_not_ranks():
    cpu = DeviceReport(-1, "", bytes(16))
    h200, other = (DeviceReport(0, "NVIDIA H200", bytes([k]) * 16) for k in (1, 2))
    assert describe_devices([cpu, cpu]) == "on the CPU"
    assert describe_devices([h200] * 8) == "on 1 GPU (NVIDIA H200)"
    assert describe_devices([h200, other, cpu]) == "on 2 GPUs (NVIDIA H200) and the CPU (1 rank)"
    assert describe_devices([h200, DeviceReport(1, "NVIDIA A100", bytes(16))]) == "on 2 GPUs (NVIDIA H200, NVIDIA A100)"
