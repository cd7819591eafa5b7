"""A small LRU of KV caches keyed by the token sequence they hold.

Agent episodes re-send their whole conversation every turn: turn k+1's prompt is turn k's prompt,
its sampled tokens and a tool result. Keeping the KV of finished requests (and of shared group
prompts) lets the next turn prefill only the new tail instead of the whole conversation.

Invariants: an entry holds, per layer, keys/values of shape (1, heads, len(tokens), dim) computed
by the *current* weights; ``clear()`` must be called whenever the weights change. Entries are
never written to (readers copy on growth).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class PrefixCache:
    def __init__(self, max_tokens: int = 16384, min_tokens: int = 16):
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        key = tuple(tokens)
        if len(key) < self.min_tokens or len(key) > self.max_tokens or key in self._entries:
            return
        self._entries[key] = kv
        self._size += len(key)
        while self._size > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._size -= len(old)

    def longest(self, prompt: list[int], limit: int) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest entry that is a prefix of ``prompt`` and at most ``limit`` long."""
        best, best_kv = 0, None
        for key, kv in self._entries.items():
            n = len(key)
            if best < n <= limit and prompt[n - 1] == key[-1] and prompt[0] == key[0] and tuple(prompt[:n]) == key:
                best, best_kv = n, kv
        if best_kv is not None:
            self._entries.move_to_end(tuple(prompt[:best]))
            self.hits += 1
            self.hit_tokens += best
        return best, best_kv

    def clear(self) -> None:
        self._entries.clear()
        self._size = 0
