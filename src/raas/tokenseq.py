"""Helpers on token-id sequences shared by the engine (prefix-shared prefill) and the trainer
(prefix-shared forward/backward)."""

from __future__ import annotations


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest prefix that every sequence in ``seqs`` starts with."""
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in seqs):
            return i
    return n
