"""Per-proposal credit for teachers: each proposal is paid its own reward from the env's resolution info.

The AEC reward a teacher receives when its round resolves is the *sum* over its proposals of that round
(``teacher_group_size`` of them), delivered at one step. Learners that credit each decision separately
(GRPO groups of proposals, REINFORCE per action) need the reward of each proposal instead. The env lists
them in the teacher's info at resolution (``info["resolved"]``: one dict per proposal with its
``attempt`` index and ``reward``, next to the round in ``info["round"]``), and a proposal's own step info
holds its round and attempt: together they identify ``(teacher, round, attempt)``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["ProposalKey", "ProposalLedger"]

T = TypeVar("T")

ProposalKey = tuple[str, int, int]
"""``(teacher, round, attempt)``: one proposal of an episode."""


class ProposalLedger(Generic[T]):
    """Teacher proposals of one episode awaiting their round's resolution.

    Usage, around every ``env.step``: after stepping a teacher's proposal, ``record(env, agent, item)``
    (``item`` is whatever the caller wants back: an index, an observation/action pair); after every step,
    ``settle(env)`` returns the recorded items whose round has just resolved, each with its own reward.

    A resolution stays in a teacher's info until the teacher acts again, so ``settle`` pays each recorded
    proposal once and ignores resolutions it has already paid.
    """

    def __init__(self) -> None:
        self._pending: dict[ProposalKey, T] = {}

    def record(self, env: Any, agent: str, item: T) -> None:
        """Records the proposal ``agent`` has just stepped, keyed by the round and attempt in its step info.

        Raises:
            ValueError: ``agent``'s info lacks ``round``/``attempt`` (call it right after a teacher's step).
        """
        info = env.infos.get(agent, {})
        if "round" not in info or "attempt" not in info:
            raise ValueError(f"{agent}'s info has no round/attempt: record a proposal right after its step")
        self._pending[(agent, int(info["round"]), int(info["attempt"]))] = item

    def settle(self, env: Any) -> list[tuple[T, float]]:
        """The recorded proposals paid by resolutions now in the env's infos, with each one's reward."""
        paid: list[tuple[T, float]] = []
        for teacher in [a for a in env.possible_agents if a.startswith("teacher")]:
            info = env.infos.get(teacher, {})
            for entry in info.get("resolved", ()):
                key = (teacher, int(info["round"]), int(entry["attempt"]))
                if key in self._pending:
                    paid.append((self._pending.pop(key), float(entry["reward"])))
        return paid

    def unsettled(self) -> list[ProposalKey]:
        """Keys of recorded proposals not paid yet (empty once an episode has ended)."""
        return sorted(self._pending)
