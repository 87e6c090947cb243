#!/usr/bin/env bash
# Builds the llama.cpp tools quantpick's real-tool tests use (llama-server, llama-fit-params,
# llama-bench, ggml-rpc-server, test-llama-archs, which writes a tiny model of every architecture
# the loader supports, and quantpick's own llama-memory-bytes, scripts/llamacpp-memory/, the same
# projection as llama-fit-params in bytes and with --kv-unified) from the pinned tree in scripts/llamacpp.pin, CPU + RPC, into a
# cache outside the clone. Prints the directory holding the binaries as the last line of stdout.
#
#   scripts/build-llamacpp.sh            # build, or reuse the cached build (seconds)
#   QUANTPICK_LLAMACPP_CACHE=DIR ...     # cache root (default: $XDG_CACHE_HOME/quantpick/llama.cpp)
#   LLAMACPP_SDIST_FILE=F.tar.gz ...     # use a sdist already on disk instead of PyPI
#   LLAMACPP_JOBS=N ...                  # parallel compile jobs (default: nproc)
#
# The cache key is the pinned version plus the CPU feature flags: a build made on a machine with
# AVX-512 is never reused on one without. GGML_NATIVE is off on purpose: on these VMs the CPU
# advertises AMX that the hypervisor does not grant, and -march=native binaries die with SIGILL
# (../shared/notes/llamacpp-build.md). Features are read from /proc/cpuinfo instead.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=llamacpp.pin
. "$here/llamacpp.pin"

tools=(llama-server llama-fit-params llama-bench ggml-rpc-server test-llama-archs llama-memory-bytes)
cache_root="${QUANTPICK_LLAMACPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quantpick/llama.cpp}"
jobs="${LLAMACPP_JOBS:-$(nproc 2>/dev/null || echo 2)}"

log() { printf 'build-llamacpp: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in cmake make c++ python3 tar sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is needed to build llama.cpp"
done

# --- CPU features -> cmake flags --------------------------------------------------------------
cpu_flags=""
if [ -r /proc/cpuinfo ]; then
    cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
fi
has() { case "$cpu_flags" in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
arch="$(uname -m)"
cmake_flags=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF           # self-contained binaries: the bin dir can be copied anywhere
    -DGGML_NATIVE=OFF
    -DGGML_RPC=ON
    -DGGML_CUDA=OFF
    -DLLAMA_OPENSSL=OFF               # no HTTPS client needed: tests never reach a hub
    -DLLAMA_USE_PREBUILT_UI=OFF       # the prebuilt web UI is a network download at configure time
    -DLLAMA_BUILD_TESTS=ON            # for test-llama-archs only (the one test target built)
    -DLLAMA_BUILD_EXAMPLES=OFF
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
key_text="$LLAMACPP_SDIST_VERSION $LLAMACPP_SDIST_SHA256 $arch ${cmake_flags[*]}"
# Our own tool's source: a change to it rebuilds that tool in the same tree (incrementally).
extra_src="$here/llamacpp-memory"
extra_hash="$(cat "$extra_src"/* | sha256sum | cut -c1-16)"
key="$LLAMACPP_SDIST_VERSION-b$LLAMACPP_BUILD_NUMBER-$(printf '%s' "$key_text" | sha256sum | cut -c1-12)"
dir="$cache_root/$key"
bin="$dir/bin"

cached_ok() {
    [ -f "$bin/.complete" ] || return 1
    for tool in "${tools[@]}"; do
        [ -x "$bin/$tool" ] || return 1
    done
    "$bin/llama-server" --version >/dev/null 2>&1 || return 1
    [ "$(cat "$bin/.llama-memory-bytes.src" 2>/dev/null)" = "$extra_hash" ] || return 1
}

mkdir -p "$dir"
# One build per key at a time: a second caller waits for the first, then reuses its result.
exec 9>"$dir/.lock"
if command -v flock >/dev/null; then
    flock 9
fi

if cached_ok; then
    log "reusing $bin (llama.cpp b$LLAMACPP_BUILD_NUMBER from $LLAMACPP_SDIST_NAME $LLAMACPP_SDIST_VERSION)"
    echo "$bin"
    exit 0
fi

start=$(date +%s)
log "building llama.cpp b$LLAMACPP_BUILD_NUMBER ($LLAMACPP_COMMIT) into $dir, $jobs jobs"

# --- the pinned source -------------------------------------------------------------------------
sdist="${LLAMACPP_SDIST_FILE:-}"
if [ -z "$sdist" ]; then
    sdist="$dir/llama_cpp_python-$LLAMACPP_SDIST_VERSION.tar.gz"
    if [ ! -f "$sdist" ]; then
        log "downloading the $LLAMACPP_SDIST_NAME $LLAMACPP_SDIST_VERSION sdist from PyPI"
        python3 -m pip download --quiet --no-deps --no-binary "$LLAMACPP_SDIST_NAME" \
            "$LLAMACPP_SDIST_NAME==$LLAMACPP_SDIST_VERSION" -d "$dir/download" >&2 \
            || die "pip could not download $LLAMACPP_SDIST_NAME==$LLAMACPP_SDIST_VERSION"
        mv "$dir/download/llama_cpp_python-$LLAMACPP_SDIST_VERSION.tar.gz" "$sdist"
        rm -rf "$dir/download"
    fi
fi
actual="$(sha256sum "$sdist" | cut -d' ' -f1)"
if [ "$actual" != "$LLAMACPP_SDIST_SHA256" ]; then
    die "$sdist has sha256 $actual, the pin says $LLAMACPP_SDIST_SHA256"
fi

src="$dir/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
    rm -rf "$src" "$dir/extract"
    mkdir -p "$dir/extract"
    tar xzf "$sdist" -C "$dir/extract" "llama_cpp_python-$LLAMACPP_SDIST_VERSION/vendor/llama.cpp"
    mv "$dir/extract/llama_cpp_python-$LLAMACPP_SDIST_VERSION/vendor/llama.cpp" "$src"
    rm -rf "$dir/extract"
fi

# quantpick's llama-memory-bytes builds inside the tree, as one more tool (tools/CMakeLists.txt)
rm -rf "$src/tools/quantpick-memory"
cp -r "$extra_src" "$src/tools/quantpick-memory"
grep -q 'add_subdirectory(quantpick-memory)' "$src/tools/CMakeLists.txt" \
    || printf '\nadd_subdirectory(quantpick-memory)\n' >> "$src/tools/CMakeLists.txt"

# --- configure and build -----------------------------------------------------------------------
build_log="$dir/build.log"
fail() {
    log "error: $1 failed; the last lines of $build_log:"
    tail -n 40 "$build_log" >&2
    exit 1
}
# The sdist has no git history, so the build number and commit are given, not discovered.
cmake -S "$src" -B "$dir/build" "${cmake_flags[@]}" \
    -DLLAMA_BUILD_NUMBER="$LLAMACPP_BUILD_NUMBER" -DLLAMA_BUILD_COMMIT="${LLAMACPP_COMMIT:0:9}" \
    >"$build_log" 2>&1 || fail "cmake configure"
cmake --build "$dir/build" --config Release -j "$jobs" --target "${tools[@]}" \
    >>"$build_log" 2>&1 || fail "cmake build"

rm -rf "$bin.new"
mkdir -p "$bin.new"
for tool in "${tools[@]}"; do
    cp "$dir/build/bin/$tool" "$bin.new/$tool"
done
"$bin.new/llama-server" --version >>"$build_log" 2>&1 || fail "llama-server --version"
printf '%s\n' "$extra_hash" > "$bin.new/.llama-memory-bytes.src"
touch "$bin.new/.complete"
rm -rf "$bin"
mv "$bin.new" "$bin"
log "built in $(( $(date +%s) - start )) s: $bin"
echo "$bin"
