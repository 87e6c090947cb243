"""model.repo_ref: a repository as people paste it (owner/name or a hub URL)."""

from __future__ import annotations

import pytest

from quantpick.errors import UsageError
from quantpick.model.repo_ref import RepoRef, parse_repo_ref

R = "unsloth/Qwen3.6-35B-A3B-GGUF"


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        (R, RepoRef(R)),
        (f"https://huggingface.co/{R}", RepoRef(R, "hf")),
        (f"https://huggingface.co/{R}/", RepoRef(R, "hf")),
        (f"huggingface.co/{R}", RepoRef(R, "hf")),
        (f"https://hf.co/{R}/tree/main", RepoRef(R, "hf", "main")),
        (f"https://huggingface.co/{R}/tree/main/BF16", RepoRef(R, "hf", "main")),
        (f"https://huggingface.co/{R}/blob/main/Qwen3.6-Q4_K_M.gguf",
         RepoRef(R, "hf", "main", "Qwen3.6-Q4_K_M.gguf")),
        (f"https://huggingface.co/{R}/resolve/abc123/BF16/x-00001-of-00002.gguf?download=true",
         RepoRef(R, "hf", "abc123", "BF16/x-00001-of-00002.gguf")),
        (f"https://huggingface.co/{R}/commit/abc123", RepoRef(R, "hf", "abc123")),
        (f"https://www.modelscope.cn/models/{R}", RepoRef(R, "modelscope")),
        (f"https://modelscope.cn/models/{R}/files", RepoRef(R, "modelscope")),
        (f"https://www.modelscope.cn/models/{R}/file/view/master/x-Q4_K_M.gguf",
         RepoRef(R, "modelscope", "master", "x-Q4_K_M.gguf")),
        (f"https://modelscope.cn/models/{R}/resolve/master/x-Q4_K_M.gguf",
         RepoRef(R, "modelscope", "master", "x-Q4_K_M.gguf")),
        (f"https://www.modelscope.cn/api/v1/models/{R}/repo?Revision=master&FilePath=x.gguf",
         RepoRef(R, "modelscope", "master", "x.gguf")),
    ],
)  # fmt: skip
def test_pasted_urls_name_the_repository(text: str, ref: RepoRef) -> None:
    got = parse_repo_ref(text)
    assert (got.repo, got.kind, got.revision, got.path) == (ref.repo, ref.kind, ref.revision,
                                                            ref.path)  # fmt: skip
    assert got.url == (text.strip() if ref.kind else None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("https://huggingface.co/datasets/o/r", "a Hugging Face dataset"),
        ("https://huggingface.co/spaces/o/r", "a Hugging Face space"),
        ("https://github.com/o/r", "not a Hugging Face or ModelScope address"),
        ("ftp://huggingface.co/o/r", "not a Hugging Face or ModelScope address"),
        ("https://huggingface.co/o", "cannot read"),
        ("https://huggingface.co/o/r/discussions/3", "cannot read"),
        ("https://huggingface.co/o/r/blob/main", "cannot read"),
        ("https://huggingface.co/o/r/blob/main/../x", "names no file"),
        ("https://modelscope.cn/o/r", "not a ModelScope model page"),
        ("o/r/x", "cannot read 'o/r/x' as a repository"),
        ("a b/c", "as a repository"),
        ("-o/r", "as a repository"),
    ],
)
def test_anything_else_is_one_usage_error(text: str, problem: str) -> None:
    """Never a repo id handed to huggingface_hub (HFValidationError, exit 5)."""
    with pytest.raises(UsageError) as info:
        parse_repo_ref(text)
    assert problem in info.value.message and info.value.exit_code == 2
