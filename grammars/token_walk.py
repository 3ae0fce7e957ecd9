"""Walk the vocabulary trie through one byte DFA, level by level in numpy.

This is the only place that touches every token: a walk from a DFA state visits each trie node
whose bytes keep the DFA alive, in a few vectorised operations per depth. Results are per node;
``TokenTrie.token_node`` turns node flags into token flags with one gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grammars.trie import TokenTrie

__all__ = ["WalkResult", "walk"]


@dataclass(frozen=True, eq=False)
class WalkResult:
    """Nodes reached alive (with the DFA state there) and the subset where the DFA accepts."""

    nodes: np.ndarray  # int64, every node reached with a live DFA state
    states: np.ndarray  # int32, DFA state at each of ``nodes``
    accept_nodes: np.ndarray  # int64, nodes where the state is accepting
    accept_states: np.ndarray  # int32, DFA state at each accept node


_EMPTY_I64 = np.empty(0, dtype=np.int64)
_EMPTY_I32 = np.empty(0, dtype=np.int32)


def walk(trie: TokenTrie, table: np.ndarray, accepting: np.ndarray, state: int, parents: np.ndarray | None) -> WalkResult:
    """Run the DFA from ``state`` over every path below ``parents`` (None: below the root).

    The nodes in ``parents`` themselves are not visited: their bytes were consumed before.
    """
    flat = table.reshape(-1)
    if parents is None:
        parents = np.zeros(1, dtype=np.int64)
    frontier, pos = trie.children_of(parents)
    states = np.full(frontier.shape[0], state, dtype=np.int64)
    node_parts: list[np.ndarray] = []
    state_parts: list[np.ndarray] = []
    node_byte = trie.node_byte
    while frontier.shape[0]:
        nxt = flat[states * 256 + node_byte[frontier]]
        live = nxt >= 0
        if not live.all():
            frontier = frontier[live]
            nxt = nxt[live]
        if not frontier.shape[0]:
            break
        node_parts.append(frontier)
        state_parts.append(nxt)
        frontier, pos = trie.children_of(frontier)
        states = nxt[pos].astype(np.int64, copy=False)
    if not node_parts:
        return WalkResult(_EMPTY_I64, _EMPTY_I32, _EMPTY_I64, _EMPTY_I32)
    nodes = np.concatenate(node_parts)
    node_states = np.concatenate(state_parts).astype(np.int32, copy=False)
    acc = accepting[node_states]
    return WalkResult(nodes, node_states, nodes[acc], node_states[acc])
