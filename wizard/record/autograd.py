"""Walks over autograd graphs: which of some nodes a loss's graph reaches, the nodes of one step's graph,
every node below some roots. A grad_fn's Python object may live only while referenced (torch 2.11 frees it
and makes a new one on the next access), so the id of a dropped node can come back as another node's:
each walk holds every node it visited, and callers hold the nodes whose ids they search for."""

from __future__ import annotations

import collections

import torch


def reached(root, targets: set[int], limit: int = 4000) -> set[int]:
    """Which of the autograd nodes (by id) in ``targets`` the graph below ``root`` reaches, visiting at most
    ``limit`` nodes (breadth first). The targets' nodes must be held by the caller."""
    found: set[int] = set()
    if root is None or not targets:
        return found
    queue, seen = collections.deque([root]), {}
    while queue and len(seen) < limit and len(found) < len(targets):
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        if id(node) in targets:
            found.add(id(node))
        queue.extend(fn for fn, _ in node.next_functions)
    return found


def step_nodes(root, limit: int) -> list:
    """The autograd nodes of one step's graph below ``root`` (at most ``limit`` visited), its parameters'
    AccumulateGrad nodes left out (every step's graph shares those): a later step's graph that reaches one of
    them runs through this step's graph (a hidden state or cached output carried over without detach())."""
    nodes, queue, seen = [], collections.deque([root]), {}
    while queue and len(seen) < limit:
        node = queue.popleft()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node   # (held: see reached)
        if type(node).__name__ != "AccumulateGrad":
            nodes.append(node)
        queue.extend(fn for fn, _ in node.next_functions)
    return nodes


def one_op_from(loss: torch.Tensor, node) -> bool:
    """``loss`` is one op away from the graph node ``node`` (``loss_fn(...) / accumulation_steps``, ``loss * w``,
    ``loss + penalty``): its own node takes ``node``'s output as an input."""
    fn = loss.grad_fn
    return fn is not None and node is not None and any(n is node for n, _ in fn.next_functions)


def graph_nodes(roots, limit: int = 200_000) -> list:
    """Every distinct autograd node reachable from ``roots`` (tensors or grad_fn nodes), depth first,
    at most ``limit``. The list keeps the nodes alive, so their ids stay unique while it is held."""
    seen: dict[int, object] = {}
    stack = [r.grad_fn if isinstance(r, torch.Tensor) else r for r in roots]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(fn for fn, _ in node.next_functions)
    return list(seen.values())
