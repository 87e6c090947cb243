"""llama.cpp's backends as data, one module per backend, found through a registry (the way
architectures are: quantpick/arch). Pure: no I/O. A backend module owns what differs between
backends: llama.cpp's device names (CUDA0, ROCm0, MTL0, Vulkan0, SYCL0), the variable that hides
and orders its devices, how its buffers size a tensor (alignment, row padding, largest single
allocation), where its memory figures come from, whether its memory is the host's, and how close
its kernels come to the memory bus.

    backend("rocm").device_name(1)      # "ROCm1"
    parse_device_name("Vulkan0")        # (the Vulkan backend, 0)
    default_backend("amd")              # ROCm

Nothing outside this package spells a backend's device names or variables; the planner (plan/)
receives a Backend as data.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from quantpick.errors import UsageError
from quantpick.machine.backends import cpu, cuda, metal, rocm, sycl, vulkan
from quantpick.machine.backends.base import (
    NO_TERMS,
    Backend,
    BackendKind,
    Vendor,
    VendorTerms,
    weight_slowdown,
)

# The registry: each module's BACKEND, in llama.cpp's registration order
# (ggml/src/ggml-backend-reg.cpp: CUDA, Metal, SYCL, Vulkan, ..., CPU; ROCm is the CUDA backend
# built for HIP).
_REGISTRY: dict[BackendKind, Backend] = {
    m.BACKEND.kind: m.BACKEND for m in (cuda, rocm, metal, sycl, vulkan, cpu)
}

__all__ = ["NO_TERMS", "Backend", "BackendKind", "Vendor", "VendorTerms", "weight_slowdown"]


def all_backends() -> tuple[Backend, ...]:
    return tuple(_REGISTRY[k] for k in BackendKind if k in _REGISTRY)


def names() -> tuple[str, ...]:
    return tuple(b.key for b in all_backends())


def backend(name: str | BackendKind) -> Backend:
    """A backend by key ("rocm"), label ("ROCm"), or alias ("hip", "mtl", "vk", "oneapi");
    an unknown name is a UsageError listing the known ones."""
    if isinstance(name, BackendKind):
        return _REGISTRY[name]
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    for b in _REGISTRY.values():
        if key in (b.key, b.label.lower()):
            return b
    raise UsageError(f"unknown backend {name!r}", hint=f"one of: {', '.join(names())}")


_ALIASES = {"hip": "rocm", "mtl": "metal", "vk": "vulkan", "oneapi": "sycl", "nvidia": "cuda"}


def parse_device_name(name: str) -> tuple[Backend, int] | None:
    """A local device name as llama.cpp prints it -> (backend, index); None for anything else
    (RPC devices, BLAS, names of backends quantpick does not model)."""
    for b in all_backends():
        if b.kind is BackendKind.CPU:
            continue
        index = b.device_index(name)
        if index is not None:
            return b, index
    return None


def host_buffer_names() -> frozenset[str]:
    """Buffer-type names that put a tensor in host memory (-ot NAME=...), upper case."""
    return frozenset(
        {"CPU", "CPU_MAPPED", "HOST"} | {b.host_buffer.upper() for b in all_backends()}
    )


def default_backend(vendor: Vendor) -> Backend:
    """The backend a vendor's users usually run: CUDA on NVIDIA, ROCm on AMD, Metal on Apple,
    SYCL on Intel (llama.cpp's docs/build.md lists one per vendor)."""
    return backend(
        {
            Vendor.NVIDIA: BackendKind.CUDA,
            Vendor.AMD: BackendKind.ROCM,
            Vendor.APPLE: BackendKind.METAL,
            Vendor.INTEL: BackendKind.SYCL,
            Vendor.NONE: BackendKind.CPU,
        }[vendor]
    )


def default_gpu_backend() -> Backend:
    """The backend of a GPU that names none: NVML's GPUs, hardware files written before GPUs
    had a backend, an unknown card, a command for no machine in particular. CUDA: the only
    backend quantpick knew before backends were a type, and the NVIDIA default."""
    return default_backend(Vendor.NVIDIA)


def backend_of(name: str | None) -> Backend:
    """The backend a Gpu.backend field names; none or an unknown name: default_gpu_backend()."""
    if not name:
        return default_gpu_backend()
    try:
        return backend(name)
    except UsageError:
        return default_gpu_backend()


class _LocalGpu(Protocol):
    """What local_backend reads of a machine.spec.Gpu (a protocol: machine.spec imports this
    package for its default backend)."""

    @property
    def backend(self) -> str: ...

    @property
    def usable(self) -> bool: ...


def local_backend(gpus: Iterable[_LocalGpu]) -> Backend:
    """The backend of a machine's local GPUs (one llama-server build drives them): the first
    usable GPU's; none: the default's naming, which a command without GPUs never uses."""
    return backend_of(next((g.backend for g in gpus if g.usable), None))


def device_names_example() -> str:
    """Every GPU backend's first device name, for help texts: "CUDA0, ROCm0, MTL0, ..."."""
    return ", ".join(b.device_name(0) for b in all_backends() if b.kind is not BackendKind.CPU)


def device_env_prefixes() -> tuple[str, ...]:
    """Prefixes of the environment variables that choose or order llama.cpp's devices (each
    backend's visibility and order variables; GGML_ for ggml's own): the variables a cached
    projection depends on."""
    names = [b.visibility_env for b in all_backends() if b.visibility_env]
    names += [k for b in all_backends() for k, _ in b.order_env]
    return tuple(sorted({"GGML_", *(n.split("_", 1)[0] + "_" for n in names)}))
