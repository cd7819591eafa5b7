"""Bounded staleness and group assembly.

Invariants:
* ``StalenessGate``: rollouts for step ``s`` are submitted only while ``s <= version + eta``, so
  at most ``eta + 1`` steps of rollouts are ever in flight; a finished group is admitted to a
  batch trained at ``version`` only if every token in it was sampled by a policy version
  ``>= version - eta``. With ``eta = 0`` training is synchronous and on-policy.
* ``GroupBuffer``: a group is released only when all its samples have finished, exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raas.contracts import Trajectory


@dataclass
class StalenessGate:
    max_staleness: int

    def may_submit(self, step: int, version: int) -> bool:
        return step <= version + self.max_staleness

    def admits(self, group: list[Trajectory], version: int) -> bool:
        sampled = [t.min_version for t in group if t.num_sampled]
        return not sampled or min(sampled) >= version - self.max_staleness

    @staticmethod
    def staleness(group: list[Trajectory], version: int) -> int:
        sampled = [t.min_version for t in group if t.num_sampled]
        return version - min(sampled) if sampled else 0


@dataclass
class GroupBuffer:
    sizes: dict[str, int] = field(default_factory=dict)  # group id -> expected samples
    parts: dict[str, list[Trajectory]] = field(default_factory=dict)

    def expect(self, group_id: str, n: int) -> None:
        self.sizes[group_id] = n

    def add(self, t: Trajectory) -> list[Trajectory] | None:
        """Add one finished sample; returns the whole group when it is complete."""
        if t.group_id not in self.sizes:
            return None  # not ours (another client's job, or an evaluation)
        part = self.parts.setdefault(t.group_id, [])
        if any(x.id == t.id for x in part):
            return None
        part.append(t)
        if len(part) == self.sizes[t.group_id]:
            del self.sizes[t.group_id]
            return sorted(self.parts.pop(t.group_id), key=lambda x: x.metrics.get("sample_index", 0))
        return None
