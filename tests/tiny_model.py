"""Write a tiny, loadable qwen35moe GGUF with random weights (a test fixture of quantpick's own).

Same architecture and tensor set as Qwen3.6-35B-A3B (hybrid DeltaNet / attention blocks, routed +
shared experts), scaled down to a few MiB, with a byte-level BPE vocabulary and a ChatML template.
Tensor shapes mirror llama.cpp's qwen35moe loader (notes llamacpp-memory.md section 1.3/1.4).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf_fixtures import TINY, add_hparams, tensor_list

ARCH = "qwen35moe"
ALIGN = 32  # GGUF default general.alignment
# A draft of TINY: the same tokenizer and vocabulary (what llama.cpp's
# common_speculative_are_compatible compares), half the width and layers, fewer experts.
TINY_DRAFT: dict[str, int] = dict(TINY, n_embd=128, n_layer=4, n_expert=8, n_expert_used=2,
                                  n_ff_exp=64, n_ff_shexp=64)  # fmt: skip


def _qtype(name: str, ne: tuple[int, ...]) -> T:
    # Vectors, the conv kernel, the router and ssm_a stay F32 as in real files; matrices Q8_0.
    if len(ne) == 1 or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight", "ssm_a")):
        return T.F32
    return T.Q8_0


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE vocabularies)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def write_tiny_model(
    path: Path,
    *,
    seed: int = 0,
    reshape: dict[str, tuple[int, ...]] | None = None,
    mtp: bool = False,
    hparams: dict[str, int] | None = None,
    odd_token: int | None = None,
    sidecar: bool = False,
) -> int:
    """Write the model to `path`; returns its size in bytes. `reshape`: tensors written with
    another shape (ne order), a file whose header parses but which llama.cpp refuses. `mtp`: with
    an MTP/NextN block (one more block, nextn_predict_layers = 1), as Qwen3.6 GGUFs carry.
    `hparams`: other sizes than TINY (TINY_DRAFT: a smaller model of the same vocabulary, a
    draft for speculative decoding). `odd_token`: that filler token's text changed (a vocabulary of
    the same size that llama.cpp's draft check refuses). `sidecar`: an MTP-only file (an `mtp-`
    sidecar: the NextN block, the embeddings and the output head, no trunk blocks), which
    llama.cpp loads as a draft model (src/models/qwen35moe.cpp:39 mtp_only)."""
    h = TINY if hparams is None else hparams
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name("quantpick-tiny-qwen35moe")
    add_hparams(w, h, mtp=mtp or sidecar)

    vocab = h["n_vocab"]
    byte_map = _bytes_to_unicode()
    byte_tokens = [byte_map[b] for b in range(256)]
    merged = ["Ġt", "Ġa", "he", "in"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    filler = [f"<unused_{i}>" for i in range(vocab - 256 - len(merged) - len(specials))]
    if odd_token is not None:
        filler[odd_token - 256 - len(merged)] = "<odd>"
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(byte_tokens + merged + filler + specials)
    w.add_token_types([1] * (256 + len(merged)) + [5] * len(filler) + [3] * len(specials))
    w.add_token_merges(["Ġ t", "Ġ a", "h e", "i n"])
    w.add_eos_token_id(vocab - len(specials) + 2)  # <|im_end|>
    w.add_bos_token_id(vocab - len(specials))
    w.add_pad_token_id(vocab - len(specials))
    w.add_add_bos_token(False)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )

    entries: list[tuple[str, T, int]] = []
    for name, ne in tensor_list(h, mtp=mtp or sidecar):
        if sidecar and name.startswith("blk.") and int(name.split(".")[1]) < h["n_layer"]:
            continue
        ne = (reshape or {}).get(name, ne)
        qt = _qtype(name, ne)
        block, type_size = gguf.GGML_QUANT_SIZES[qt]
        n = int(np.prod(ne))
        nbytes = n // block * type_size
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes, raw_dtype=qt)
        entries.append((name, qt, nbytes))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    f.write(b"\0" * ((-f.tell()) % ALIGN))
    rng = np.random.default_rng(seed)
    for name, qt, nbytes in entries:
        if qt == T.F32:
            arr = rng.standard_normal(nbytes // 4).astype(np.float32) * 0.02
            if name.endswith("norm.weight"):
                arr[:] = 1.0  # RMS-norm gains of 1 keep activations finite
            f.write(arr.tobytes())
        else:  # Q8_0 blocks: f16 scale + 32 int8
            blocks = nbytes // 34
            d = np.full(blocks, 0.0005, dtype=np.float16).view(np.uint8).reshape(blocks, 2)
            q = rng.integers(-20, 20, size=(blocks, 32), dtype=np.int8).view(np.uint8)
            f.write(np.concatenate([d, q], axis=1).tobytes())
        f.write(b"\0" * ((-f.tell()) % ALIGN))
    f.flush()
    size = f.tell()
    w.close()
    return size
