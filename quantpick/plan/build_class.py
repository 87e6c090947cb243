"""Which llama.cpp build the compute estimate assumes: the rule follows the installed build. Pure.

Two facts about llama-server's compute buffers changed at the turn of May/June 2026, and both are
big for this model family (vocabulary 248320):

- PR #23861 "llama: limit max outputs of `llama_context`" (commit de6f727aa, merged 2026-06-01):
  llama-server sets `n_outputs_max = n_parallel x outputs per sequence`
  (tools/server/server-context.cpp: load_model), so the logits reserve a few rows instead of a whole
  ubatch (485 MiB at -ub 512, 1940 MiB at -ub 2048). Earlier builds reserve the whole ubatch.
- PR #23764 "llama: use f16 mask for FA to save VRAM" (commit 031ddb2e0, merged 2026-05-29): with
  flash attention the KQ mask is reserved in f16 only. Earlier builds kept the f32 mask beside its
  f16 cast (6 bytes per element instead of 2).

Cut-over build, and how sure it is: b9442 (tested 2026-05-31) predates the cap; a third-party
pinned tree at b9464 (commit 5dcb71166) lists #23861 as included; a benchmark log labels
de6f727aa as `b9453-7` (git describe: 7 commits after tag b9453, i.e. build 9460). So the cap
starts at b9460 (likely) and certainly by b9464. The rule uses b9464: a build in b9460-b9463 is
treated as uncapped, which over-estimates (safe), never under-estimates. The f16 mask landed two
days earlier, so every build >= b9464 has both; builds before get both old behaviours, which
over-estimates the mask for the few builds between the two PRs (again the safe side).

Semver-era builds (`version: 0.5.0-dev (build N, ...)`; semver tags started near b10621, Aug
2026) are capped whatever N says (shallow clones report build 1). With no llama.cpp found, or one
whose build cannot be read (build 1 without a version: a shallow clone), the plan uses the rule of
the pinned build (b11312, scripts/llamacpp.pin): what a user installs today. Only a build that
reports itself older than b9464 gets the older (uncapped) rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quantpick.plan.memory import RunConfig

# First build known to contain PR #23861 (and #23764); see the module docstring.
CAPPED_FROM_BUILD = 9464
# The pinned build (scripts/llamacpp.pin LLAMACPP_BUILD_NUMBER): the rule when none is found.
PINNED_BUILD = 11312
CAPPED = "capped"
UNCAPPED = "uncapped"


@dataclass(frozen=True)
class ComputeRule:
    """The llama.cpp build class a compute estimate assumes."""

    name: str  # CAPPED | UNCAPPED
    build: str | None  # the build as read ("b11312 (0c1e57098)"), None when unknown
    reason: str  # one line: why this rule

    @property
    def capped(self) -> bool:
        return self.name == CAPPED

    def describe(self) -> str:
        what = (
            "llama-server reserves logits for a few rows (n_outputs_max cap, PR #23861)"
            if self.capped
            else "logits for a whole ubatch and the f32 FA mask (builds before PR #23861)"
        )
        return f"compute buffers for {self.reason}: {what}"


PINNED = ComputeRule(
    CAPPED,
    None,
    f"llama.cpp b{PINNED_BUILD}, the pinned build (none found here: what an install gets today)",
)


def compute_rule(version: str | None, build: int | None, commit: str | None) -> ComputeRule:
    """The rule for a build read from `llama-server --version` (machine/llamacpp.py)."""
    label = None
    if build is not None:
        label = f"b{build}" + (f" ({commit})" if commit else "")
    if version:
        return ComputeRule(CAPPED, label, f"llama.cpp {version}, {label}")
    if build is None or build <= 1:
        # build 1 without a semver version: a shallow clone of unknown age, not known to be older
        return ComputeRule(
            CAPPED,
            label,
            f"llama.cpp {label or 'of unknown build'} (age unknown: b{PINNED_BUILD}'s rule)",
        )
    if build >= CAPPED_FROM_BUILD:
        return ComputeRule(CAPPED, label, f"llama.cpp {label}")
    return ComputeRule(UNCAPPED, label, f"llama.cpp {label} (before b{CAPPED_FROM_BUILD})")


def apply_rule(config: RunConfig, rule: ComputeRule) -> RunConfig:
    """`config` with the compute terms of that build class."""
    if rule.capped:
        return replace(config, logits_rows="server", fa_mask_f32=False)
    return replace(config, logits_rows="batch", fa_mask_f32=True)
