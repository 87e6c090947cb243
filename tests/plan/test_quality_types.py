"""Quant names to the ggml type that holds most of their weights."""

from __future__ import annotations

import pytest

from quantpick.plan.quality_types import base_type


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("Q4_K_M", "Q4_K"), ("UD-Q4_K_XL", "Q4_K"), ("q4_K", "Q4_K"), ("Q3_K_L", "Q3_K"),
        ("Q2_K_S", "Q2_K"), ("Q6_K-family hybrid", "Q6_K"), ("Q8_0", "Q8_0"),
        ("UD-Q8_K_XL", "Q8_0"), ("IQ4_XS", "IQ4_XS"), ("iq4_nl", "IQ4_NL"),
        ("UD-IQ4_NL_XL", "IQ4_NL"), ("IQ3_M", "IQ3_S"), ("IQ3_XS", "IQ3_XXS"),
        ("IQ3_XXS", "IQ3_XXS"), ("UD-IQ3_S (reconstructed)", "IQ3_S"), ("IQ2_M", "IQ2_S"),
        ("IQ2_XXS", "IQ2_XXS"), ("UD-IQ1_M", "IQ1_M"), ("Q4_0", "Q4_0"), ("Q5_1", "Q5_1"),
        ("MXFP4_MOE", None), ("BF16", None), ("F16", None), ("custom", None),
    ],
)  # fmt: skip
def test_base_type(name: str, base: str | None) -> None:
    assert base_type(name) == base
