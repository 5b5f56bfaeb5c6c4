"""The token sequences an evaluation scores, as one prefix tree, packed into rows that a causal LM runs once each.

Every request of a log-likelihood run is a token sequence whose last tokens are scored. Many share their first
tokens: the choices of one document share its context, choices share their first words, documents built from one
template share its opening. :class:`PrefixTree` holds each distinct prefix once, as a node (its last token). The
nodes, numbered in depth-first pre-order, are cut into rows of at most ``row_len`` tokens: a row is a run of
consecutive nodes, after the ancestors of its first node that precede it (each node's ancestors are then in its row,
before it). In a row, a token sees the tokens that are its ancestors or itself, and sits at its depth as position,
so its hidden state is the one it has at the end of its own sequence run alone (:meth:`LanguageModel.hidden
<mohge.model.transformer.LanguageModel.hidden>` with ``positions_BS`` and ``mask_BSS``).

With pre-order numbers, node ``j`` is an ancestor of node ``i`` or ``i`` itself exactly when
``pre[j] <= pre[i] < pre[j] + size[j]`` (``size``: the nodes of ``j``'s subtree): the mask of a row is one
comparison of its nodes' numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

Tensor = torch.Tensor


@dataclass
class Row:
    """One packed row: its nodes (pre-order numbers, ancestors of the first owned node first) and how many of them,
    from the end, it owns (the nodes whose hidden states are read from this row)."""

    nodes: list[int]
    owned: int


class PrefixTree:
    """The distinct prefixes of the sequences added, each a node numbered in pre-order once :meth:`freeze` runs."""

    def __init__(self) -> None:
        self._children: list[dict[int, int]] = [{}]  # insertion ids; 0 is the root (the empty prefix, no token)
        self._token: list[int] = [-1]
        self.frozen = False

    def add(self, seq: Sequence[int]) -> list[int]:
        """Add ``seq``; return the insertion id of each of its prefixes (``seq[: k + 1]`` for k = 0, 1, ...)."""
        if self.frozen:
            raise RuntimeError("PrefixTree.add after freeze")
        node, path = 0, []
        for tok in seq:
            child = self._children[node].get(tok)
            if child is None:
                child = len(self._token)
                self._children[node][tok] = child
                self._children.append({})
                self._token.append(int(tok))
            node = child
            path.append(node)
        return path

    def __len__(self) -> int:
        """Distinct non-empty prefixes: the tokens a scheme computing each prefix once runs."""
        return len(self._token) - 1

    def freeze(self) -> list[int]:
        """Number the nodes in pre-order (0, 1, ... without the root); return the map insertion id -> number."""
        n = len(self)
        number = [-1] * (n + 1)
        self.token, self.depth, self.parent, self.size = [0] * n, [0] * n, [-1] * n, [1] * n
        seen = 0
        stack = [(child, -1, 0) for child in reversed(self._children[0].values())]
        while stack:
            node, parent, depth = stack.pop()
            pre, seen = seen, seen + 1
            number[node] = pre
            self.token[pre], self.depth[pre], self.parent[pre] = self._token[node], depth, parent
            stack.extend((child, pre, depth + 1) for child in reversed(self._children[node].values()))
        for pre in range(n - 1, -1, -1):  # children come after their parent: sizes add up from the end
            if self.parent[pre] >= 0:
                self.size[self.parent[pre]] += self.size[pre]
        self.frozen = True
        return number

    def ancestors(self, pre: int) -> list[int]:
        """The ancestors of node ``pre``, root-most first (not the node itself)."""
        out = []
        while self.parent[pre] >= 0:
            pre = self.parent[pre]
            out.append(pre)
        return out[::-1]

    def rows(self, row_len: int) -> list[Row]:
        """Consecutive runs of nodes, each after its first node's ancestors, at most ``row_len`` tokens a row."""
        if not self.frozen:
            raise RuntimeError("PrefixTree.rows before freeze")
        if row_len <= max(self.depth, default=0):
            raise ValueError(f"row_len={row_len} must exceed the deepest node's depth {max(self.depth)}")
        rows, start, n = [], 0, len(self)
        while start < n:
            before = self.ancestors(start)
            end = min(n, start + row_len - len(before))
            rows.append(Row(before + list(range(start, end)), end - start))
            start = end
        return rows

    def batch(self, rows: Sequence[Row]) -> tuple[Tensor, Tensor, Tensor]:
        """Token ids [B, P], positions [B, P] and masks [B, P, P] of ``rows``, right-padded with the first node's
        token at position 0; a padding token sees only itself, and no real token sees it."""
        B, P = len(rows), max(len(r.nodes) for r in rows)
        pre_BP = torch.full((B, P), -1, dtype=torch.long)
        for b, r in enumerate(rows):
            pre_BP[b, : len(r.nodes)] = torch.tensor(r.nodes, dtype=torch.long)
        real_BP = pre_BP >= 0
        pre = pre_BP.clamp(min=0)
        token = torch.tensor(self.token, dtype=torch.long)[pre]
        depth = torch.tensor(self.depth, dtype=torch.long)[pre].masked_fill(~real_BP, 0)
        end = pre + torch.tensor(self.size, dtype=torch.long)[pre]
        # query i sees key j: j is i's ancestor or i (pre-order intervals), both real; padding sees itself
        sees = (pre[:, None, :] <= pre[:, :, None]) & (pre[:, :, None] < end[:, None, :])
        sees &= real_BP[:, :, None] & real_BP[:, None, :]
        sees |= torch.eye(P, dtype=torch.bool)[None] & ~real_BP[:, :, None]
        return token, depth, sees
