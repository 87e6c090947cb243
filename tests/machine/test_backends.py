"""Backends as a type (machine/backends): names, variables, buffer rules, described machines of
every vendor, unified memory budgeted once, and the command's device flags per backend."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conformance_model import write_conformance_gguf
from hypothesis import given
from hypothesis import strategies as st

from quantpick.errors import QuantpickError, UsageError
from quantpick.machine import probe as hardware
from quantpick.machine.backends import (
    BackendKind,
    Vendor,
    all_backends,
    backend,
    default_backend,
    host_buffer_names,
    parse_device_name,
)
from quantpick.machine.catalog import find_gpu, lookup_gpu, unified_share
from quantpick.machine.describe import resolve_machine
from quantpick.machine.spec import Gpu, Host, Machine
from quantpick.model.ggml import row_size
from quantpick.model.gguf import layout_from_header, read_gguf_file
from quantpick.model.layout import ModelLayout
from quantpick.plan.memory import RunConfig, llama_devices
from quantpick.serve.command import ServerOptions, build_command

GiB = 1024**3
MiB = 1024**2


@pytest.fixture
def fake_host(monkeypatch: pytest.MonkeyPatch) -> Host:
    host = Host(ram_total_bytes=32 * GiB, ram_available_bytes=30 * GiB, cpu_cores=8, cpu_threads=16)
    monkeypatch.setattr(hardware, "probe_host", lambda **kwargs: host)
    monkeypatch.setattr("shutil.which", lambda name: None)
    return host


# --- the registry -------------------------------------------------------------------------------


def test_every_backend_is_registered_once_with_llama_cpps_device_prefix() -> None:
    prefixes = {b.kind: b.device_prefix for b in all_backends()}
    assert prefixes == {
        BackendKind.CUDA: "CUDA",  # ggml/include/ggml-cuda.h:17
        BackendKind.ROCM: "ROCm",  # ggml/include/ggml-cuda.h:11
        BackendKind.METAL: "MTL",  # ggml-metal-device.m:1302
        BackendKind.VULKAN: "Vulkan",  # ggml/include/ggml-vulkan.h:10
        BackendKind.SYCL: "SYCL",  # ggml/include/ggml-sycl.h:12
        BackendKind.CPU: "CPU",
    }


@given(st.sampled_from([b for b in all_backends() if b.kind is not BackendKind.CPU]),
       st.integers(0, 15))  # fmt: skip
def test_device_names_round_trip(b: object, index: int) -> None:
    name = b.device_name(index)  # type: ignore[attr-defined]
    assert parse_device_name(name) == (b, index)
    assert parse_device_name(name.lower()) == (b, index)  # ggml_backend_dev_by_name ignores case


def test_old_metal_device_name_parses_and_rpc_does_not() -> None:
    assert parse_device_name("Metal") == (backend("metal"), 0)
    assert parse_device_name("RPC0") is None
    assert parse_device_name("BLAS") is None


def test_aliases_and_unknown_backend() -> None:
    assert backend("hip") is backend("ROCm") is backend("rocm")
    assert backend("oneapi").kind is BackendKind.SYCL
    with pytest.raises(UsageError, match="unknown backend 'opencl'"):
        backend("opencl")


def test_vendor_defaults() -> None:
    assert default_backend(Vendor.AMD).kind is BackendKind.ROCM
    assert default_backend(Vendor.APPLE).kind is BackendKind.METAL
    assert default_backend(Vendor.INTEL).kind is BackendKind.SYCL
    assert default_backend(Vendor.NVIDIA).kind is BackendKind.CUDA


def test_visibility_variables() -> None:
    assert backend("cuda").visibility((1, 0)) == {"CUDA_VISIBLE_DEVICES": "1,0"}
    assert backend("rocm").visibility((1,)) == {"HIP_VISIBLE_DEVICES": "1"}
    assert backend("vulkan").visibility((0, 2)) == {"GGML_VK_VISIBLE_DEVICES": "0,2"}
    assert backend("sycl").visibility((0,)) == {"ONEAPI_DEVICE_SELECTOR": "level_zero:0"}
    assert backend("metal").visibility((0,)) == {}
    assert "ROCM_HOST" in host_buffer_names() and "CUDA_HOST" in host_buffer_names()


# --- buffer rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "padded", "alignment"),
    [("cuda", True, 128), ("rocm", True, 128), ("sycl", True, 128),
     ("metal", False, 32), ("vulkan", False, 64), ("cpu", False, 32)],
)  # fmt: skip
def test_buffer_rules_pad_quantized_rows_where_the_backend_does(
    key: str, padded: bool, alignment: int
) -> None:
    rule = backend(key).buffer
    # A Q4_K tensor of 2 rows of 2816 elements (2816 % 512 = 256): CUDA-like backends add a row's
    # worth of 256 elements (ggml-cuda.cu:903-920, ggml-sycl.cpp:1049-1063); the others do not.
    plain = row_size("Q4_K", 2816) * 2
    extra = row_size("Q4_K", 256) if padded else 0
    assert rule.alloc("Q4_K", 2816, plain) == -(-(plain + extra) // alignment) * alignment
    # Unquantized tensors are never padded.
    assert rule.alloc("F32", 2816, 2816 * 8) == -(-(2816 * 8) // alignment) * alignment


# --- described machines -------------------------------------------------------------------------


def test_mac_is_metal_unified_with_the_working_set(fake_host: Host) -> None:
    m = resolve_machine(gpus=["m4-max:64G"])
    (g,) = m.gpus
    assert (g.backend, g.unified) == ("Metal", True)
    assert g.total_bytes == 48 * GiB  # 3/4 of 64 GiB: 51539.61 MB in recorded logs
    assert m.host.ram_total_bytes == 64 * GiB  # the RAM the GPU shares
    assert llama_devices(m, RunConfig())[0].name == "MTL0"


@pytest.mark.parametrize(
    ("ram_gib", "logged_mb"),
    # recommendedMaxWorkingSetSize as ggml_metal_init printed it in public logs (docs/backends.md)
    [(16, 11453.25), (32, 22906.50), (36, 28991.03), (64, 51539.61), (128, 103079.22)],
)
def test_apple_share_reproduces_recorded_working_sets(ram_gib: int, logged_mb: float) -> None:
    share, _ = unified_share(lookup_gpu("m4-max"), ram_gib * GiB)
    assert abs(share / 1e6 - logged_mb) < 0.01


def test_radeon_is_rocm_and_vulkan_on_request(fake_host: Host) -> None:
    assert resolve_machine(gpus=["7900xtx"]).gpus[0].backend == "ROCm"
    m = resolve_machine(gpus=["4090"], backend_name="vulkan")
    assert m.gpus[0].backend == "Vulkan"
    assert llama_devices(m, RunConfig())[0].name == "Vulkan0"
    assert "--backend vulkan" in m.source


def test_strix_halo_and_gb10_are_unified(fake_host: Host) -> None:
    sh = resolve_machine(gpus=["strix-halo:128G"])
    assert sh.gpus[0].unified and sh.gpus[0].total_bytes == 64 * GiB  # TTM's half
    assert sh.host.ram_total_bytes == 128 * GiB
    gb = resolve_machine(gpus=["gb10"])
    assert gb.gpus[0].unified and gb.gpus[0].backend == "CUDA"
    assert resolve_machine(gpus=["arc-b580"]).gpus[0].backend == "SYCL"


def test_a_backend_that_cannot_drive_the_card_is_refused(fake_host: Host) -> None:
    with pytest.raises(UsageError, match="--backend metal cannot drive AMD Radeon RX 7900 XTX"):
        resolve_machine(gpus=["7900xtx"], backend_name="metal")
    with pytest.raises(UsageError, match="unknown backend"):
        resolve_machine(gpus=["7900xtx"], backend_name="directml")


def test_unknown_gpu_lists_near_matches() -> None:
    with pytest.raises(UsageError) as err:
        lookup_gpu("radeon-7900")
    assert err.value.hint is not None and "near: 7900xt, 7900xtx" in err.value.hint
    assert find_gpu("AMD Radeon RX 7900 XTX").key == "7900xtx"  # type: ignore[union-attr]


# --- unified memory is one pool -----------------------------------------------------------------


@pytest.fixture(scope="module")
def q4km(tmp_path_factory: pytest.TempPathFactory) -> ModelLayout:
    path = tmp_path_factory.mktemp("gguf") / "q4km.gguf"
    size = write_conformance_gguf(path)
    return layout_from_header(read_gguf_file(path), basis=f"gguf:{path}", file_bytes=size)


def _estimate_rows(layout: ModelLayout, unified: bool) -> tuple[int, int]:
    from quantpick.plan.memory import estimate

    gpu = Gpu(index=0, name="Apple M4 Max", total_bytes=48 * GiB, free_bytes=48 * GiB,
              backend="Metal", unified=unified)  # fmt: skip
    host = Host(ram_total_bytes=64 * GiB, ram_available_bytes=64 * GiB, cpu_cores=12)
    est = estimate(layout, Machine(gpus=(gpu,), host=host), RunConfig(ctx_size=4096))
    gpu_row, host_row = est.devices
    return gpu_row.total_bytes, host_row.free_bytes


def test_a_unified_gpus_buffers_come_out_of_the_hosts_ram(q4km: ModelLayout) -> None:
    gpu_total, host_free = _estimate_rows(q4km, unified=True)
    assert gpu_total > 20 * GiB and host_free == 64 * GiB - gpu_total
    # A discrete card of the same size leaves the host's RAM alone.
    assert _estimate_rows(q4km, unified=False)[1] == 64 * GiB


# --- the command per backend --------------------------------------------------------------------


def _command(key: str, config: RunConfig, caps: object = None) -> tuple[list[str], dict[str, str]]:
    cmd = build_command(
        config, model_path=Path("/m/model.gguf"), mmproj_path=None, manifest=None,
        block_count=40, server=ServerOptions(), capabilities=caps,  # type: ignore[arg-type]
        backend=backend(key),
    )  # fmt: skip
    return list(cmd.argv), cmd.env


def test_devices_are_named_by_the_backend_and_only_cuda_pins_pci_order() -> None:
    config = RunConfig(devices=(0, 1), tensor_split=(20.0, 21.0))
    argv, env = _command("rocm", config)
    assert argv[argv.index("--device") + 1] == "ROCm0,ROCm1"
    assert "CUDA_DEVICE_ORDER" not in env
    argv, env = _command(
        "vulkan", dataclasses.replace(config, override_tensors=(("x", "Vulkan1"),))
    )
    assert argv[argv.index("--device") + 1] == "Vulkan0,Vulkan1"
    assert "x=Vulkan1" in argv
    argv, env = _command("cuda", config)
    assert argv[argv.index("--device") + 1] == "CUDA0,CUDA1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_an_old_build_selects_with_the_backends_variable() -> None:
    from quantpick.serve.flags import parse_help, with_version

    data = Path(__file__).resolve().parents[1] / "data"
    help_text = "\n".join(
        line
        for line in (data / "llama-server-help-current.txt").read_text().splitlines()
        if "--device <" not in line
    )
    caps = with_version(
        parse_help(help_text), (data / "llama-server-version-current.txt").read_text()
    )
    _, env = _command("rocm", RunConfig(devices=(1,)), caps)
    assert env == {"HIP_VISIBLE_DEVICES": "1"}
    _, env = _command("vulkan", RunConfig(devices=(1,)), caps)
    assert env == {"GGML_VK_VISIBLE_DEVICES": "1"}
    with pytest.raises(QuantpickError, match="Metal has no variable"):
        _command("metal", RunConfig(devices=(0,)), caps)


def test_hardware_file_gpu_tables_take_a_backend(tmp_path: Path) -> None:
    from quantpick.machine.hardware_file import load_hardware_file

    fake = Host(ram_total_bytes=32 * GiB, ram_available_bytes=32 * GiB, cpu_cores=8)
    good = tmp_path / "box.toml"
    good.write_text('[[gpu]]\nname = "7900xtx"\nbackend = "vulkan"\n')
    assert load_hardware_file(good, default_host=lambda: fake).gpus[0].backend == "Vulkan"
    bad = tmp_path / "bad.toml"
    bad.write_text('[[gpu]]\nname = "7900xtx"\nbackend = "metal"\n')
    with pytest.raises(Exception, match="cannot drive AMD Radeon RX 7900 XTX"):
        load_hardware_file(bad, default_host=lambda: fake)


def test_vulkans_single_allocation_cap_is_noted(q4km: ModelLayout) -> None:
    from quantpick.plan.memory import estimate

    def notes(backend_label: str, ubatch: int) -> tuple[str, ...]:
        gpu = Gpu(index=0, name="AMD Radeon RX 7900 XTX", total_bytes=64 * GiB,
                  free_bytes=64 * GiB, backend=backend_label)  # fmt: skip
        host = Host(ram_total_bytes=64 * GiB, ram_available_bytes=64 * GiB, cpu_cores=8)
        config = RunConfig(ctx_size=262144, ubatch=ubatch, batch=ubatch)
        return estimate(q4km, Machine(gpus=(gpu,), host=host), config).notes

    # A 4096-token ubatch at 262144 cells: a 2 GiB f16 mask alone in the compute buffer.
    assert any("Vulkan0: a compute buffer of" in n for n in notes("Vulkan", 4096))
    assert not any("single allocation" in n for n in notes("Vulkan", 512))
    assert not any("single allocation" in n for n in notes("ROCm", 4096))  # no cap


def test_compose_runs_the_backends_image_with_its_device_files() -> None:
    from quantpick.serve.formats.compose import render_compose

    def compose(key: str) -> str:
        cmd = build_command(
            RunConfig(ctx_size=4096, devices=(1,)), model_path=Path("/m/model.gguf"),
            mmproj_path=None, manifest=None, block_count=40, server=ServerOptions(),
            capabilities=None, backend=backend(key),
        )  # fmt: skip
        return render_compose(cmd, "plan")

    rocm = compose("rocm")
    assert 'image: "ghcr.io/ggml-org/llama.cpp:server-rocm"' in rocm
    assert '"/dev/kfd"' in rocm and "nvidia" not in rocm
    assert '"ROCm0"' in rocm  # the one reserved GPU is the container's first
    assert 'image: "ghcr.io/ggml-org/llama.cpp:server-vulkan"' in compose("vulkan")
    assert 'driver: "nvidia"' in compose("cuda")
    with pytest.raises(UsageError, match="no Metal image"):
        compose("metal")


def test_a_drivers_known_alignment_replaces_the_assumed_one(q4km: ModelLayout) -> None:
    """Vulkan assumes 64-byte buffer alignment (the largest of the drivers); a GPU whose driver's
    minStorageBufferOffsetAlignment is known (RADV: 4) pads each tensor to that instead. Before:
    Gpu had no such field and every Vulkan device was padded to 64."""
    from quantpick.plan.memory import estimate

    def weights(alignment: int | None) -> int:
        gpu = Gpu(index=0, name="Radeon", total_bytes=64 * GiB, free_bytes=64 * GiB,
                  backend="Vulkan", buffer_alignment=alignment)  # fmt: skip
        host = Host(ram_total_bytes=64 * GiB, ram_available_bytes=64 * GiB, cpu_cores=8)
        return estimate(q4km, Machine(gpus=(gpu,), host=host), RunConfig()).devices[0].weights_bytes

    # every tensor of this model is a multiple of 64 bytes: 4 and 64 pad nothing; a 4 KiB
    # alignment pads each tensor to it (more, but less than 4 KiB a tensor)
    assert weights(4) == weights(64) == weights(None)
    grown = weights(4096) - weights(64)
    assert 0 < grown < 4096 * len(q4km.tensors) and weights(4096) % 4096 == 0
    assert weights(3) == weights(None)  # not a power of two: ignored


def test_a_weight_above_the_drivers_largest_tensor_stays_on_the_host(q4km: ModelLayout) -> None:
    """ggml-vulkan refuses an op on a tensor above the driver's storage-buffer range, and the
    loader keeps that weight in host memory (tests/test_vulkan_oracle.py: lavapipe, 128 MiB).
    Before Gpu.max_tensor_bytes: counted on the device."""
    from quantpick.model.ggml import CPU_BUFFER
    from quantpick.plan.memory import estimate

    host = Host(ram_total_bytes=64 * GiB, ram_available_bytes=64 * GiB, cpu_cores=8)

    def split(limit: int | None) -> tuple[int, int]:
        gpu = Gpu(index=0, name="Radeon", total_bytes=64 * GiB, free_bytes=64 * GiB,
                  backend="Vulkan", max_tensor_bytes=limit)  # fmt: skip
        devices = estimate(q4km, Machine(gpus=(gpu,), host=host), RunConfig()).devices
        return devices[0].weights_bytes, devices[1].weights_bytes

    on_gpu = [t for t in q4km.tensors if t.name != "token_embd.weight"]
    biggest = max(on_gpu, key=lambda t: t.n_bytes)
    gpu_all, host_all = split(None)
    gpu_cut, host_cut = split(biggest.n_bytes - 1)
    moved = [t for t in on_gpu if t.n_bytes == biggest.n_bytes]
    assert gpu_all - gpu_cut == sum(q4km.tensor_alloc(t, backend("vulkan").buffer) for t in moved)
    assert host_cut - host_all == sum(q4km.tensor_alloc(t, CPU_BUFFER) for t in moved)
    assert split(biggest.n_bytes) == (gpu_all, host_all)  # at the limit: still on the device


def test_each_backend_names_its_devices_and_host_buffer_as_llama_cpp_prints_them() -> None:
    """The names a backend module no longer spells out (its own name + index, `<name>_Host`)
    come out as llama.cpp prints them; Metal's MTL and the CPU's host buffer are the exceptions
    their modules state."""
    names = {b.kind.value: (b.device_name(0), b.host_buffer) for b in all_backends()}
    assert names == {
        "cuda": ("CUDA0", "CUDA_Host"),
        "rocm": ("ROCm0", "ROCm_Host"),
        "metal": ("MTL0", "Metal_Host"),
        "vulkan": ("Vulkan0", "Vulkan_Host"),
        "sycl": ("SYCL0", "SYCL_Host"),
        "cpu": ("CPU0", "CPU"),
    }
