"""Manifests: one GGUF repository described as data (sources, architecture, files), loaded and
validated from TOML. Bundled ones live in `manifests/`; users add theirs in the config directory
or in QUANTPICK_MANIFESTS.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Architecture:
    """The GGUF hyperparameters the memory model needs (GGUF key names in comments)."""

    name: str  # general.architecture, e.g. "qwen35moe"
    block_count: int  # {arch}.block_count, including MTP/NextN blocks
    nextn_predict_layers: int  # {arch}.nextn_predict_layers (0 when absent)
    context_length: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    key_length: int
    value_length: int
    expert_count: int
    expert_used_count: int
    expert_feed_forward_length: int
    expert_shared_feed_forward_length: int
    ssm_conv_kernel: int
    ssm_state_size: int
    ssm_group_count: int
    ssm_time_step_rank: int
    ssm_inner_size: int
    full_attention_interval: int
    vocab_size: int
    has_output_tensor: bool = True  # False: output tied to token_embd (loaded twice by llama.cpp)

    @property
    def n_layer(self) -> int:
        """Trunk layers (llama.cpp's n_layer()): block_count minus the NextN blocks."""
        return self.block_count - self.nextn_predict_layers

    def is_recurrent(self, il: int) -> bool:
        """llama.cpp qwen35moe: recurrent unless (il+1) % interval == 0; NextN blocks are not."""
        return il < self.n_layer and (il + 1) % self.full_attention_interval != 0

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(il for il in range(self.n_layer) if not self.is_recurrent(il))

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(il for il in range(self.n_layer) if self.is_recurrent(il))


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    min_p: float


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" | "modelscope" | "mirror"
    repo: str | None = None  # "owner/name" for hf and modelscope
    revision: str | None = None  # pinned commit (hf) / revision (modelscope)
    url_template: str | None = None  # mirror: "https://host/path/{file}" ({file}, {revision})
    name: str | None = None  # a label for mirrors


@dataclass(frozen=True)
class ModelFile:
    name: str  # file name in the repository (may include folders without ".." / absolute parts)
    quant: str  # "Q4_K_M", "IQ2_M", "BF16", "F16" (mmproj)
    size_bytes: int
    size_exact: bool  # False: from the card's decimal GB, the hub listing is the authority
    sha256: str | None = None
    bits_per_weight: float | None = None
    quality_rank: int | None = None  # higher is better; None for projectors
    role: str = "model"  # "model" | "mmproj"
    shard: int | None = None  # 1-based index of a split file ("-00001-of-00003")
    shard_count: int | None = None


@dataclass(frozen=True)
class Manifest:
    id: str
    display_name: str
    license: str | None
    architecture: Architecture
    sources: tuple[Source, ...]
    files: tuple[ModelFile, ...]
    sampling: Sampling | None = None
    reasoning: bool = False
    checksums_file: str | None = "SHA256SUMS"  # a coreutils sha256sum file in the repo, if any
    path: str | None = None  # where it was loaded from
    description: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def quant_files(self, quant: str) -> tuple[ModelFile, ...]:
        """The file(s) of one quant (several for a split GGUF), shard order."""
        want = quant.upper()
        found = [f for f in self.files if f.role == "model" and f.quant.upper() == want]
        return tuple(sorted(found, key=lambda f: f.shard or 0))

    @property
    def quants(self) -> tuple[str, ...]:
        """Model quants, best quality first."""
        seen: dict[str, int] = {}
        for f in self.files:
            if f.role == "model":
                seen[f.quant] = f.quality_rank if f.quality_rank is not None else -1
        return tuple(sorted(seen, key=lambda q: -seen[q]))

    @property
    def projector(self) -> ModelFile | None:
        projectors = [f for f in self.files if f.role == "mmproj"]
        return projectors[0] if projectors else None
