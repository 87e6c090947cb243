#!/usr/bin/env bash
# OPTIONAL, never run by CI: builds the pinned llama.cpp tree with its Vulkan backend, for
# scripts/record_vulkan_oracle.py, which records llama-fit-params' projection on Mesa's software
# Vulkan driver (lavapipe) into tests/data/vulkan-oracle.json.gz. The tests read that fixture;
# they never need this build.
#
#   scripts/build-llamacpp-vulkan.sh SRC BUILD_DIR   # SRC: an unpacked pinned tree (the one
#                                                    # scripts/build-llamacpp.sh unpacks into its cache)
#   LLAMACPP_JOBS=N ...                              # parallel compile jobs (default: 2)
#   ALLOC_TRACE=1 ...                                # the graph allocator traces to stderr
#
# ALLOC_TRACE=1 (give it its own BUILD_DIR) turns on ggml-alloc.c's AT_PRINTF, each line
# prefixed with its allocator's address, plus a line per reserve naming each buffer ("[ADDR]
# buffer N Vulkan0") and one per reset: the traces plan/host_replay.py's templates were read from
# (docs/compute.md "A host layer's splits"). Replay one buffer with
# scripts/replay_alloc_trace.py TRACE --buffer Vulkan0 --alignment 16; GGML_SCHED_DEBUG=2 with
# -v prints the scheduler's splits on any build.
#
# Needs cmake, a C++ compiler, glslc, the Vulkan and SPIR-V headers, the loader and a driver
# (Debian/Ubuntu: glslc libvulkan-dev spirv-headers mesa-vulkan-drivers). Takes about 35 minutes on two cores,
# most of it compiling the Vulkan shaders. Prints the directory holding llama-fit-params and
# llama-memory-bytes as the last line of stdout.
#
# SRC is copied, never modified: the copy gets one guard. Debian 12's Vulkan headers (1.3.239)
# lack vk::LayerSettingEXT (VK_EXT_layer_settings), which ggml_vk_instance_init
# (ggml/src/ggml-vulkan/ggml-vulkan.cpp:5214 at b11312) uses only to pass validation-layer
# settings; without the extension the block is compiled out and the instance is created without
# them (the validation layer is off unless GGML_VULKAN_VALIDATE is set at build time anyway).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src_in="${1:?usage: build-llamacpp-vulkan.sh SRC BUILD_DIR}"
out="${2:?usage: build-llamacpp-vulkan.sh SRC BUILD_DIR}"
jobs="${LLAMACPP_JOBS:-2}"
# shellcheck source=llamacpp.pin
. "$here/llamacpp.pin"

for tool in cmake c++ glslc python3; do
    command -v "$tool" >/dev/null || { echo "build-llamacpp-vulkan: $tool is needed" >&2; exit 1; }
done
[ -f "$src_in/CMakeLists.txt" ] || { echo "build-llamacpp-vulkan: $src_in is not a llama.cpp tree" >&2; exit 1; }

mkdir -p "$out"
src="$out/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
    rm -rf "$src.tmp"
    cp -r "$src_in" "$src.tmp"
    rm -rf "$src.tmp/build" "$src.tmp/bin"
    mv "$src.tmp" "$src"
fi
# quantpick's llama-memory-bytes, as in scripts/build-llamacpp.sh
rm -rf "$src/tools/quantpick-memory"
cp -r "$here/llamacpp-memory" "$src/tools/quantpick-memory"
grep -q 'add_subdirectory(quantpick-memory)' "$src/tools/CMakeLists.txt" \
    || printf '\nadd_subdirectory(quantpick-memory)\n' >> "$src/tools/CMakeLists.txt"

if [ "${ALLOC_TRACE:-0}" = 1 ]; then
    python3 "$here/alloc_trace_patch.py" "$src/ggml/src/ggml-alloc.c"
fi

# The VK_EXT_layer_settings guard (see above); idempotent.
python3 - "$src/ggml/src/ggml-vulkan/ggml-vulkan.cpp" <<'EOF'
import sys
path = sys.argv[1]
text = open(path, encoding="utf-8").read()
start = "    VkBool32 enable_best_practice = layer_settings;\n"
end = "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);\n"
if "QUANTPICK_LAYER_SETTINGS_GUARD" not in text:
    i, j = text.index(start), text.index(end)
    guarded = (
        "#ifdef VK_EXT_layer_settings  // QUANTPICK_LAYER_SETTINGS_GUARD\n"
        + text[i:j + len(end)]
        + "#else\n"
        "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n"
        "#endif\n"
    )
    text = text[:i] + guarded + text[j + len(end):]
    open(path, "w", encoding="utf-8").write(text)
EOF

arch="$(uname -m)"
cpu_flags=""
if [ -r /proc/cpuinfo ]; then
    cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
fi
has() { case "$cpu_flags" in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
# The flags of scripts/build-llamacpp.sh, plus Vulkan.
cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_RPC=OFF
    -DGGML_CUDA=OFF -DGGML_VULKAN=ON -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
)
if [ "$arch" = x86_64 ]; then
    cmake_flags+=(
        -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)"
        -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)"
        -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512_vbmi)"
        -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)"
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    )
fi
cmake -S "$src" -B "$out/build" "${cmake_flags[@]}" \
    -DLLAMA_BUILD_NUMBER="$LLAMACPP_BUILD_NUMBER" -DLLAMA_BUILD_COMMIT="${LLAMACPP_COMMIT:0:9}" >&2
cmake --build "$out/build" --config Release -j "$jobs" --target llama-fit-params llama-memory-bytes >&2
echo "$out/build/bin"
