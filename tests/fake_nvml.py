"""A fake `pynvml` module: configurable GPUs and failures, no driver needed.

Install it where `hardware.probe_gpus()` will `import pynvml`:

    fake = FakeNvml([rtx_3090(), tesla_t4()])
    monkeypatch.setitem(sys.modules, "pynvml", fake)

Error classes mirror nvidia-ml-py: NVMLError(value) with subclasses per error code; the
library-not-found case raises from nvmlInit() like a machine without libnvidia-ml.so.1.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, NamedTuple

NVML_CLOCK_MEM = 2  # as in nvidia-ml-py
GiB = 1024**3


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value

    def __str__(self) -> str:
        return self.args[0]


class NVMLError_Uninitialized(NVMLError):  # noqa: N801 - nvidia-ml-py's spelling
    def __init__(self) -> None:
        super().__init__(1, "Uninitialized")


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(3, "Not Supported")


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(9, "Driver Not Loaded")


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(12, "NVML Shared Library Not Found")


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(15, "GPU is lost")


class Memory(NamedTuple):
    total: int
    free: int
    used: int


@dataclass
class FakeGpu:
    name: str
    total: int
    free: int
    bus_width: int | None
    mem_clock: int | None
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    pcie_gen: int | None = 4
    pcie_width: int | None = 16
    cc: tuple[int, int] | None = (8, 6)
    # NVML function name -> exception class raised by that call for this GPU
    fail: dict[str, type[NVMLError]] = field(default_factory=dict)
    # compute processes on this GPU: pid -> bytes (nvmlDeviceGetComputeRunningProcesses)
    processes: dict[int, int] = field(default_factory=dict)


class ProcessInfo(NamedTuple):
    """nvidia-ml-py's c_nvmlProcessInfo_t as read: usedGpuMemory None where the driver cannot
    tell (NVML_VALUE_NOT_AVAILABLE, e.g. on Windows WDDM)."""

    pid: int
    usedGpuMemory: int | None  # noqa: N815 - nvidia-ml-py's spelling


def rtx_3090(**changes: Any) -> FakeGpu:
    gpu = FakeGpu("NVIDIA GeForce RTX 3090", 24 * GiB, 23 * GiB, 384, 9751,
                  uuid="GPU-3090", pcie_gen=4, pcie_width=16, cc=(8, 6))  # fmt: skip
    return _with(gpu, changes)


def tesla_t4(**changes: Any) -> FakeGpu:
    gpu = FakeGpu("Tesla T4", 15360 * 1024**2, 14900 * 1024**2, 256, 5001,
                  uuid="GPU-T4", pcie_gen=3, pcie_width=16, cc=(7, 5))  # fmt: skip
    return _with(gpu, changes)


def nvidia_h200(**changes: Any) -> FakeGpu:
    """A real H200 as NVML reported it (driver 580.159.04, 2026-12-04; re-record with
    nvidia-ml-py's nvmlDeviceGetMemoryInfo / GetMemoryBusWidth / GetMaxClockInfo(MEM) /
    GetMaxPcieLinkGeneration / Width / GetCudaComputeCapability on the card)."""
    gpu = FakeGpu("NVIDIA H200", 150754820096, 150109880320, 6016, 3201,
                  uuid="GPU-H200", pcie_gen=5, pcie_width=16, cc=(9, 0))  # fmt: skip
    return _with(gpu, changes)


def _with(gpu: FakeGpu, changes: dict[str, Any]) -> FakeGpu:
    for key, value in changes.items():
        setattr(gpu, key, value)
    return gpu


class FakeNvml(types.ModuleType):
    """The subset of pynvml that quantpick.machine.probe calls, plus bookkeeping for asserts."""

    NVML_CLOCK_MEM = NVML_CLOCK_MEM
    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: type[NVMLError] | None = None,
        driver: str = "550.54.14",
        count_error: type[NVMLError] | None = None,
    ) -> None:
        super().__init__("pynvml")
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.count_error = count_error
        self.driver = driver
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0

    # --- lifecycle ---
    def nvmlInit(self) -> None:  # noqa: N802
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialized = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._check()
        self.shutdown_calls += 1
        self.initialized = False

    def _check(self) -> None:
        if not self.initialized:
            raise NVMLError_Uninitialized()

    def _gpu(self, handle: int, call: str) -> FakeGpu:
        self._check()
        gpu = self.gpus[handle]
        if call in gpu.fail:
            raise gpu.fail[call]()
        return gpu

    @staticmethod
    def _value(value: Any) -> Any:
        if value is None:
            raise NVMLError_NotSupported()
        return value

    # --- system ---
    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._check()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._check()
        if self.count_error is not None:
            raise self.count_error()
        return len(self.gpus)

    # --- per device ---
    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        self._gpu(index, "nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[ProcessInfo]:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [ProcessInfo(pid, used) for pid, used in gpu.processes.items()]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Memory:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return Memory(total=gpu.total, free=gpu.free, used=gpu.total - gpu.free)

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:  # noqa: N802
        return self._value(self._gpu(handle, "nvmlDeviceGetMemoryBusWidth").bus_width)

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock_type: int) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMaxClockInfo")
        if clock_type != NVML_CLOCK_MEM:
            raise AssertionError(f"quantpick asked for clock type {clock_type}, not memory")
        return self._value(gpu.mem_clock)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:  # noqa: N802
        return self._value(self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:  # noqa: N802
        return self._value(self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:  # noqa: N802
        return self._value(self._gpu(handle, "nvmlDeviceGetCudaComputeCapability").cc)
