"""What one rank sends the others during the doctor's world checks, validated before anything reads it.

A peer's bytes are untrusted: a rank of another distinit version, a buggy script or a hostile process on
the job's port can send any JSON. Every document is parsed and validated here against a bounded model
(types, ranges, sizes, nesting), so that a bad peer becomes one failed verdict naming its rank and the
real cause, never an ``AttributeError`` deep inside a check or "another rank ran out of time".
"""

# No `from __future__ import annotations`: pydantic must see the real types.

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from distinit._identity import RankClaim
from distinit.doctor._model import LOCAL_IDS, Check

#: Longest string a peer may put in a name-like field (a hostname, a version, an interface).
NAME_CHARS = 255
#: Longest text (a check's summary or fix, a variable's value, a failure's reason).
TEXT_CHARS = 4096
#: Most entries in a peer's maps and lists (variables, failures).
ENTRIES = 512
#: Characters of a validation error quoted in a verdict.
QUOTED_CHARS = 160

Name = Annotated[str, Field(max_length=NAME_CHARS)]
Text = Annotated[str, Field(max_length=TEXT_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_locals(local: tuple[Check, ...]) -> None:
    """Raise ValueError for a local check with an unknown id or an oversized text."""
    for check in local:
        if check.id not in LOCAL_IDS or len(check.summary) > TEXT_CHARS or len(check.fix or "") > TEXT_CHARS:
            raise ValueError(f"local check {check.id[:40]!r}: not a local check id, or its text is too long")


class PeerFacts(_Strict):
    """A rank's versions, backends and NCCL_*/GLOO_*/TORCH_* variables (``consensus``)."""

    versions: dict[Name, Name | None] = Field(max_length=32)
    backends: dict[Name, bool] = Field(max_length=32)
    variables: dict[Name, Text] = Field(max_length=ENTRIES)
    digest: str = Field(max_length=64)


class PeerDocument(_Strict):
    """A rank's first message: who it claims to be, its facts, its local checks, its listener."""

    claim: RankClaim
    facts: PeerFacts
    local: tuple[Check, ...] = Field(max_length=len(LOCAL_IDS))
    cuda_device: int | None = Field(default=None, ge=0, le=4096)
    endpoint: tuple[Name, Annotated[int, Field(ge=1, le=65535)]]

    @model_validator(mode="after")
    def _bounded(self) -> "PeerDocument":
        identity = self.claim.identity
        fields = ("hostname", "boot_id", "shm_device", "launcher_node")
        long = [f for f in fields if len(getattr(identity, f) or "") > NAME_CHARS]
        if long:
            raise ValueError(f"claim.identity.{long[0]} is longer than {NAME_CHARS} characters")
        _check_locals(self.local)
        return self


class PeerResults(_Strict):
    """A rank's second message: what it found probing other hosts (empty unless it leads its host)."""

    reach_tested: int = Field(default=0, ge=0, le=1 << 20)
    reach_failures: tuple[tuple[Name, Text], ...] = Field(default=(), max_length=ENTRIES)
    clock: tuple[float, Annotated[float, Field(ge=0)]] | Text | None = None
    bandwidth: tuple[Name, Annotated[float, Field(ge=0)] | Text] | None = None


def _why(exc: ValidationError) -> str:
    """The first validation error in a few words: where in the document, and what."""
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "the document"
    text = f"{where}: {first.get('msg', 'invalid')}"
    more = exc.error_count() - 1
    return (text[:QUOTED_CHARS] + (f" (and {more} more error(s))" if more else "")).strip()


def parse_document(raw: bytes | None, *, rank: int, world_size: int) -> PeerDocument | str:
    """Rank ``rank``'s first message as a :class:`PeerDocument`, or why it is not one (in words).

    ``raw`` is None when the rank announced a size out of bounds. The claim's rank must be a rank of the
    world (a duplicate is left for ``nodes`` to name).
    """
    if raw is None:
        return "announced a document size out of bounds"
    try:
        document = PeerDocument.model_validate_json(raw)
    except ValidationError as exc:
        return f"sent a document that does not validate: {_why(exc)}"
    if document.claim.rank >= world_size:
        return f"claims rank {document.claim.rank} in a world of {world_size}"
    return document


def parse_results(raw: bytes | None) -> PeerResults | str:
    """A rank's second message as :class:`PeerResults`, or why it is not one."""
    if raw is None:
        return "announced a result size out of bounds"
    try:
        return PeerResults.model_validate_json(raw)
    except ValidationError as exc:
        return f"sent results that do not validate: {_why(exc)}"


def peer_failure(bad: dict[int, str], *, host_of: dict[int, str]) -> Check:
    """``consensus`` failing on the ranks whose documents did not validate, naming each and why."""
    named = "; ".join(f"rank {r} ({host_of.get(r, '?')}) {why}" for r, why in sorted(bad.items())[:4])
    more = f"; and {len(bad) - 4} more rank(s)" if len(bad) > 4 else ""
    evidence: dict[str, Any] = {"invalid_documents": {str(r): why for r, why in sorted(bad.items())[:64]}}
    return Check(
        id="consensus",
        status="fail",
        summary=f"{named}{more}",
        fix="run the same distinit version on every rank (`pip show distinit`), and make sure nothing else "
        "joins the job's MASTER_ADDR:MASTER_PORT",
        ranks=tuple(sorted(bad)),
        hosts=tuple(dict.fromkeys(host_of.get(r, "?") for r in sorted(bad))),
        evidence=evidence,
    )


class PeerLocal(_Strict):
    """A rank's local checks, sent to rank 0 when the world did not form (see ``_postmortem``)."""

    rank: int = Field(ge=0)
    host: Name
    local: tuple[Check, ...] = Field(max_length=len(LOCAL_IDS))

    @model_validator(mode="after")
    def _bounded(self) -> "PeerLocal":
        _check_locals(self.local)
        return self


def parse_local(raw: bytes, *, rank: int) -> PeerLocal | str:
    """Rank ``rank``'s local checks as :class:`PeerLocal`, or why they are not (size, shape, another rank)."""
    if len(raw) > 1 << 20:
        return f"sent {len(raw)} bytes of local checks (limit {1 << 20})"
    try:
        found = PeerLocal.model_validate_json(raw)
    except ValidationError as exc:
        return f"sent local checks that do not validate: {_why(exc)}"
    return found if found.rank == rank else f"sent the local checks of rank {found.rank}"
