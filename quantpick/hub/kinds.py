"""The hub kinds quantpick reads a manifest's files from, as data (pure: no I/O, cheap to import,
read by manifest validation and shell completion as well as by the download stage).

Each kind names the module that implements it: one `RepoSource` subclass per module
(hub/huggingface.py, hub/modelscope.py, hub/mirror.py). Adding a hub is that module and one entry
in `KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HubKind:
    name: str  # the manifest's `kind` (and --source value)
    label: str  # for people: "Hugging Face"
    module: str  # quantpick.hub.<module> defines `source_class`
    source_class: str
    manifest_keys: tuple[str, ...]  # the keys a manifest source of this kind may carry
    repository: bool  # a hub of repositories (listing, revisions, hashes), not a URL template
    default_revision: str | None = None  # the branch a revision-less source reads
    prefixes: tuple[str, ...] = ()  # MODEL prefixes that name this hub (`ms:owner/name`)

    tags_pinned: bool = False  # a tag names fixed bytes (ModelScope); only "master"/"main" move

    def pinned(self, revision: str | None) -> bool:
        """Whether `revision` names immutable content: a commit (40 lower-case hex), or on a hub
        whose tags are fixed, any revision but its moving branches. HF revisions in manifests are
        commits; ModelScope manifests pin tags or commits, but "master" moves."""
        revision = revision or ""
        if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision):
            return True
        return self.tags_pinned and revision not in ("", "master", "main")


HF = HubKind(
    "hf", "Hugging Face", "huggingface", "HFSource", ("kind", "repo", "revision", "name"),
    repository=True, default_revision="main", prefixes=("hf:",),
)  # fmt: skip
MODELSCOPE = HubKind(
    "modelscope", "ModelScope", "modelscope", "ModelScopeSource",
    ("kind", "repo", "revision", "name"), repository=True, default_revision="master",
    prefixes=("ms:", "modelscope:"), tags_pinned=True,
)  # fmt: skip
MIRROR = HubKind(
    "mirror", "mirror", "mirror", "MirrorSource", ("kind", "url_template", "revision", "name"),
    repository=False,
)  # fmt: skip

KINDS: dict[str, HubKind] = {k.name: k for k in (HF, MODELSCOPE, MIRROR)}
SOURCE_KINDS = tuple(KINDS)  # "hf", "modelscope", "mirror"
REPOSITORY_KINDS = tuple(k.name for k in KINDS.values() if k.repository)  # "hf", "modelscope"


def is_repository(kind: str) -> bool:
    """A hub of repositories (listing, revisions, hashes): not a mirror, not unknown."""
    found = KINDS.get(kind)
    return found is not None and found.repository


def kind(name: str) -> HubKind | None:
    return KINDS.get(name)
