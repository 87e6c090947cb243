#!/usr/bin/env python3
"""Collect benchmarks/data/quality-families.json: published mean KLD per GGUF quant type across
model families, one row per (source, model, quant), each row with its source URL at a commit.

    python scripts/collect_quality_families.py --thireus GITDIR --llama-readme FILE [--out FILE]

--thireus: a git directory of github.com/Thireus/GGUF-Tool-Suite (read with `git show`, at HEAD).
    Per model, `models/<m>/group0/`: every quantizable tensor set to one type ("pure" quants, the
    doc "Benchmarking models - How.md"), ik_llama.cpp's llama-perplexity -c 512 on
    imatrix-calibration-corpus-v02.txt, KLD against the baseline run named in
    `bench_ppl_kld_result.baseline.<qtype>.<chunks>.txt` (bf16 for most; a quantized baseline for
    the largest models: the row says which). Rows come from `kld_results_partial.csv` when the model
    has one (what was benchmarked); the types that only `kld_results.csv` carries were filled in by
    `group0_enricher.py` (the model's notes.txt) and are kept with "extrapolated": true, never
    fitted. Only llama.cpp mainline types are kept (ik_llama.cpp-only types and row-interleaved
    repacks are not files quantpick plans). bpw: `bpw_kld_results*.csv`, else bytes x 8 / elements
    of that type's `tensors.<qtype>.map`. Architecture, parameter count and general.basename come
    from the baseline log (llama.cpp's metadata dump and `model params`).
--llama-readme: llama.cpp tools/perplexity/README.md (the LLaMA-3-8B table; bpw = GiB x 2^30 x 8
    / the parameter count that makes the f16 row 16 bits per weight).
MagicQuant's Qwen3-4B-Instruct-2507 table is the one in magiccodingman/MagicQuant wiki/overview.md
@3b068a35 (copied below verbatim, parsed here); its bpw uses the parameter count of Thireus's
log of the same model, and its sizes are GiB (the row's bpw_note says why).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

THIREUS_REPO = "Thireus/GGUF-Tool-Suite"
# llama.cpp mainline types (ggml.h): what a GGUF from a hub can hold. Thireus spells them in
# ik_llama.cpp's lower case ("q4_K", "iq4_xs").
MAINLINE = (
    "bf16", "q8_0", "q6_K", "q5_1", "q5_K", "q5_0", "q4_1", "q4_K", "q4_0", "iq4_nl", "iq4_xs",
    "q3_K", "iq3_s", "iq3_xxs", "q2_K", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_m", "iq1_s",
)  # fmt: skip
FAILED = "404"  # collect_ppl_results.sh writes 404 where a run produced no result
# GLM-5.2 ships no baseline log: its architecture is taken from GLM-5.1's (the same GLM-5
# family, llama.cpp's GlmMoeDsaForCausalLM -> glm-dsa) and its parameter count from its maps.
ARCH_WITHOUT_LOG = {"GLM-5.2": ("glm-dsa", "GLM-5.1")}

MAGICQUANT_URL = (
    "https://github.com/magiccodingman/MagicQuant/blob/"
    "3b068a35059114c0f6df900993dec92412d27c19/wiki/overview.md"
)
MAGICQUANT_TABLE = """
| LM-Q8_0                                                                                   | llama.cpp  | Q8_0         | 0.001339 |      3.99 |
| MQ-Q6_K_1                                                                                 | MagicQuant | Q6_K         | 0.001817 |      3.58 |
| UD-Q6_K_XL                                                                                | Unsloth    | UD-Q6_K_XL   | 0.002111 |      3.41 |
| LM-Q6_K                                                                                   | llama.cpp  | Q6_K         | 0.004640 |      3.08 |
| [<u>MQ-Q5_K_1</u>](#winner-notes "Replaced: MQ-Q5_K")                                     | MagicQuant | Q5_K         | 0.006632 |      2.88 |
| [<u>UD-Q5_K_XL</u>](#winner-notes "Replaced: LM-Q5_K, LM-Q5_K_S")                         | Unsloth    | UD-Q5_K_XL   | 0.009839 |      2.73 |
| [<u>MQ-Q4_K_M_1</u>](#winner-notes "Replaced: MQ-Q4_K_M, UD-Q4_K_XL, LM-Q4_K_M + 1 more") | MagicQuant | Q4_K_M       | 0.020346 |      2.44 |
| [<u>LM-Q4_K_S</u>](#winner-notes "Replaced: LM-IQ4_NL")                                   | llama.cpp  | Q4_K_S       | 0.029803 |      2.22 |
| LM-IQ4_XS                                                                                 | llama.cpp  | IQ4_XS       | 0.031300 |      2.11 |
| UD-Q3_K_XL                                                                                | Unsloth    | UD-Q3_K_XL   | 0.072278 |      1.98 |
"""  # noqa: E501  (verbatim from the source)
LLAMA_README_URL = "https://github.com/ggml-org/llama.cpp/blob/b11312/tools/perplexity/README.md"


def _git(gitdir: Path, *args: str) -> str:
    out = subprocess.run(["git", f"--git-dir={gitdir}", *args], capture_output=True, check=False)
    return out.stdout.decode("utf-8", "replace") if out.returncode == 0 else ""


def _csv(text: str) -> dict[str, list[str]]:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return {ln.split(",")[0]: ln.split(",")[1:] for ln in lines[1:]}


def _canonical_type(qtype: str) -> str:
    return qtype.upper()  # "q4_K" -> "Q4_K", "iq4_xs" -> "IQ4_XS"


def _baseline_type(measured: dict[str, list[str]]) -> str:
    """The run every KLD is measured against: the type at KLD 0 (bf16 unless another is; the
    enricher writes bf16 = 0 even where the baseline was quantized)."""
    zero = [q for q, v in measured.items() if v and v[0] == "0"]
    return next((q for q in zero if q != "bf16"), "bf16")


def _baseline_log(gitdir: Path, model: str, baseline: str) -> tuple[str, str] | None:
    """(path, text) of the log of the baseline run (group0's first, then the model folder's)."""
    names = _git(gitdir, "ls-tree", "-r", "--name-only", "HEAD", f"models/{model}/").splitlines()
    logs = [n for n in names if re.search(r"bench_ppl_kld_result\.baseline\.[^.]+\.\d+\.txt$", n)]
    # the baseline's own log first, group0's before the model folder's, the 250-chunk run first
    logs.sort(
        key=lambda n: (f".baseline.{baseline}." not in n, "/group0/" not in n, ".250." not in n, n)
    )
    for path in logs:
        text = _git(gitdir, "show", f"HEAD:{path}")
        if "general.architecture" in text:
            return path, text
    return None


def _meta(text: str, key: str) -> str | None:
    m = re.search(rf"{re.escape(key)}\s+str\s+=\s+(.+)", text)
    return m[1].strip() if m else None


def _params(text: str) -> float | None:
    m = re.search(r"model params\s+=\s+([\d.]+) ([MBT])", text)
    if not m:
        return None
    return float(m[1]) * {"M": 1e6, "B": 1e9, "T": 1e12}[m[2]]


def _map_elements(gitdir: Path, model: str, qtype: str) -> int:
    text = _git(gitdir, "show", f"HEAD:models/{model}/group0/tensors.{qtype}.map")
    return sum(int(m[1]) for m in re.finditer(r":elements=(\d+):", text))


def _map_bpw(gitdir: Path, model: str, qtype: str) -> float | None:
    text = _git(gitdir, "show", f"HEAD:models/{model}/group0/tensors.{qtype}.map")
    nbytes = elements = 0
    for m in re.finditer(r":elements=(\d+):bytes=(\d+)", text):
        elements += int(m[1])
        nbytes += int(m[2])
    return nbytes * 8 / elements if elements else None


def thireus_rows(gitdir: Path) -> list[dict]:
    commit = _git(gitdir, "rev-parse", "HEAD").strip()
    blob = f"https://github.com/{THIREUS_REPO}/blob/{commit}"
    models = sorted(
        {
            p.split("/")[1]
            for p in _git(gitdir, "ls-tree", "-r", "--name-only", "HEAD", "models/").splitlines()
            if p.endswith("/group0/kld_results.csv")
        }
    )
    rows: list[dict] = []
    for model in models:
        g0 = f"models/{model}/group0"
        full = _csv(_git(gitdir, "show", f"HEAD:{g0}/kld_results.csv"))
        partial_text = _git(gitdir, "show", f"HEAD:{g0}/kld_results_partial.csv")
        partial = _csv(partial_text) if partial_text else None
        measured_file = "kld_results_partial.csv" if partial is not None else "kld_results.csv"
        measured = partial if partial is not None else full
        ppl_name = "ppl_results_partial.csv" if partial is not None else "ppl_results.csv"
        ppl = _csv(_git(gitdir, "show", f"HEAD:{g0}/{ppl_name}"))
        bpw_csv: dict[str, list[str]] = {}
        bpw_name = None
        for name in ("bpw_kld_results_partial.csv", "bpw_kld_results.csv"):
            text = _git(gitdir, "show", f"HEAD:{g0}/{name}")
            if text:
                bpw_csv, bpw_name = _csv(text), name
                break
        notes = _git(gitdir, "show", f"HEAD:{g0}/notes.txt")
        baseline = _baseline_type(measured)
        log = _baseline_log(gitdir, model, baseline)
        arch_note = None
        if log is not None:
            log_path, log_text = log
            arch = _meta(log_text, "general.architecture")
            params = _params(log_text)
        else:
            arch, sibling = ARCH_WITHOUT_LOG[model]
            arch_note = f"no baseline log: architecture from {sibling}'s log"
            log_path, log_text = f"{g0}/tensors.q8_0.map", ""
            params = float(_map_elements(gitdir, model, "q8_0"))
            arch_note += "; params = elements of tensors.q8_0.map"
        for qtype in MAINLINE:
            value = full.get(qtype, [None])[0]
            in_measured = qtype in measured and measured[qtype][0] not in (FAILED, "")
            if value in (None, "", FAILED) and not in_measured:
                continue
            kld = float(measured[qtype][0]) if in_measured else float(value)  # type: ignore[arg-type]
            bpw = None
            bpw_note = None
            if qtype in bpw_csv and bpw_csv[qtype][0] not in (FAILED, ""):
                bpw = float(bpw_csv[qtype][0])
                bpw_note = f"{g0}/{bpw_name}"
                if bpw > 32:  # a failed size read (iq2_s "404" in some files)
                    bpw = None
            if bpw is None:
                bpw = _map_bpw(gitdir, model, qtype)
                bpw_note = f"bytes x 8 / elements of {g0}/tensors.{qtype}.map" if bpw else None
            ppl_value = ppl.get(qtype, [None])[0]
            rows.append(
                {
                    "id": f"thireus-{model}-{qtype}".lower(),
                    "curve": f"thireus/{model}",
                    "source": "thireus",
                    "model": model,
                    "arch": arch,
                    "arch_note": arch_note,
                    "basename": _meta(log_text, "general.basename"),
                    "size_label": _meta(log_text, "general.size_label"),
                    "params": round(params) if params else None,
                    "quant_type": _canonical_type(qtype),
                    "recipe": "pure: every quantizable tensor of this type",
                    "bpw": round(bpw, 6) if bpw else None,
                    "bpw_note": bpw_note,
                    "mean_kld": kld,
                    "ppl": float(ppl_value) if ppl_value not in (None, "", FAILED) else None,
                    "baseline": baseline,
                    "extrapolated": not in_measured,
                    "harness": "ik_llama.cpp llama-perplexity -c 512, imatrix-calibration-"
                    "corpus-v02.txt, KLD vs the baseline run",
                    "source_url": f"{blob}/{g0}/"
                    + (measured_file if in_measured else "kld_results.csv"),
                    "meta_url": f"{blob}/{log_path}",
                    "commit": commit,
                    "source_note": (
                        "filled in by group0_enricher.py, not benchmarked: "
                        + " ".join(notes.split())[:300]
                        if not in_measured
                        else None
                    ),
                }
            )
    return rows


def llama3_rows(readme: Path) -> list[dict]:
    lines = readme.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| Quantization | imatrix |"))
    table = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip("|").split("|")]
        table.append(cells)
    f16_gib = next(float(c[2]) for c in table if c[0] == "f16")
    params = f16_gib * 2**30 * 8 / 16  # the f16 file at 16 bits per weight
    rows = []
    for quant, imatrix, gib, ppl, _dppl, kld, *_ in table:
        if quant == "f16":
            continue
        rows.append(
            {
                "id": f"llama3-{quant}-{imatrix}".lower().replace(" ", ""),
                "curve": "llamacpp/Meta-Llama-3-8B" + ("" if imatrix == "None" else " (imatrix)"),
                "source": "llamacpp",
                "model": "Meta-Llama-3-8B",
                "arch": "llama",
                "basename": None,
                "size_label": "8B",
                "params": round(params),
                "quant_type": quant.upper(),
                "recipe": f"llama.cpp's {quant} mix, imatrix {imatrix}",
                "bpw": round(float(gib) * 2**30 * 8 / params, 4),
                "bpw_note": "Model size [GiB] x 2^30 x 8 / params, params from the f16 row "
                f"({f16_gib} GiB at 16 bits per weight)",
                "mean_kld": float(kld.split("±")[0]),
                "ppl": float(ppl.split("±")[0]),
                "baseline": "f16",
                "extrapolated": False,
                "harness": "llama.cpp llama-perplexity, wikitext-2 test, -c 512 (revision "
                "f364eb6f, RTX 4090)",
                "source_url": LLAMA_README_URL,
                "meta_url": None,
                "commit": "b11312",
                "source_note": None,
            }
        )
    return rows


def magicquant_rows(thireus: list[dict]) -> list[dict]:
    params = next(r["params"] for r in thireus if r["model"] == "Qwen3-4B-Instruct-2507")
    rows = []
    for ln in MAGICQUANT_TABLE.strip().splitlines():
        cells = [c.strip() for c in ln.strip("|").split("|")]
        name = re.sub(r"\[<u>(.*?)</u>\].*", r"\1", cells[0])
        provider, family, kld, size_gb = cells[1], cells[2], cells[3], cells[4]
        rows.append(
            {
                "id": f"magicquant-qwen3-4b-instruct-2507-{name}".lower(),
                "curve": "magicquant/Qwen3-4B-Instruct-2507",
                "source": "magicquant",
                "model": "Qwen3-4B-Instruct-2507",
                "arch": "qwen3",
                "basename": "Qwen3",
                "size_label": "4B",
                "params": round(params),
                "quant_type": family,
                "recipe": f"{name} ({provider})",
                "bpw": round(float(size_gb) * 2**30 * 8 / params, 3),
                "bpw_note": f"Size x 2^30 x 8 / {params:.4g} params (Thireus's llama.cpp log of "
                "the same model). The column says GB, but its LM-Q8_0 (3.99) would then be 7.94 "
                "bpw, under Q8_0's 8.5 bits per weight: the sizes are GiB (8.52 bpw)",
                "mean_kld": float(kld),
                "ppl": None,
                "baseline": "bf16",
                "extrapolated": False,
                "harness": "MagicQuant pipeline (llama.cpp KLD against the BF16 model, own "
                "imatrix; corpus not named on the page)",
                "source_url": MAGICQUANT_URL,
                "meta_url": None,
                "commit": "3b068a35059114c0f6df900993dec92412d27c19",
                "source_note": "column 'KLD': the pipeline ranks by mean KLD",
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--thireus", type=Path, required=True)
    ap.add_argument("--llama-readme", type=Path, required=True)
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "benchmarks/data/quality-families.json",
    )
    args = ap.parse_args()
    th = thireus_rows(args.thireus)
    rows = th + llama3_rows(args.llama_readme) + magicquant_rows(th)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    main()
