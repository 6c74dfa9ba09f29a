"""Lineage records: where every member came from (parents, operators, generation)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

Origin = Literal["initial", "offspring"]
MemberRole = Literal["teacher", "student", "both"]


@dataclass(frozen=True)
class LineageRecord:
    """The birth of one member.

    Attributes:
        member: the new member's id (unique within a run, never reused).
        role: ``teacher``, ``student`` or ``both`` (self-play members).
        generation: generation at whose end it was born (``-1`` for the initial population).
        origin: ``initial`` or ``offspring``.
        parents: parent member ids (best first), empty for the initial population.
        crossover: crossover operator name ("" for the initial population).
        mutation: mutation operator name ("").
        replaced: id of the member whose slot it took (``-1`` for the initial population).
    """

    member: int
    role: MemberRole
    generation: int
    origin: Origin
    parents: tuple[int, ...] = ()
    crossover: str = ""
    mutation: str = ""
    replaced: int = -1

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        record = asdict(self)
        record["parents"] = list(self.parents)
        return record

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> LineageRecord:
        """Inverse of ``to_json``."""
        return cls(**{**record, "parents": tuple(int(p) for p in record["parents"])})


def ancestors(member: int, records: Iterable[LineageRecord]) -> set[int]:
    """All ancestors of ``member`` (parents, their parents, ...) according to ``records``."""
    by_id = {r.member: r for r in records}
    seen: set[int] = set()
    stack = list(by_id[member].parents) if member in by_id else []
    while stack:
        parent = stack.pop()
        if parent in seen:
            continue
        seen.add(parent)
        if parent in by_id:
            stack.extend(by_id[parent].parents)
    return seen


def operator_use(records: Iterable[LineageRecord]) -> dict[str, int]:
    """How many children each operator made (keys ``crossover:<name>`` and ``mutation:<name>``)."""
    counts: dict[str, int] = {}
    for r in records:
        if r.origin != "offspring":
            continue
        for key in (f"crossover:{r.crossover}", f"mutation:{r.mutation}"):
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
