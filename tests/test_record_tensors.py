"""record/tensors.py and record/autograd.py: walking nested values and graphs."""

from __future__ import annotations

import collections
import math

import torch

from nnwizard.record.autograd import graph_nodes, one_op_from, reached, step_nodes
from nnwizard.record.tensors import (cpu_copy, fingerprint, nonfinite_inputs, same_storage, shape_of, tensors_in,
                                     total_norm, values_in)


def test_tensors_in_walks_nesting_to_a_depth():
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    nested = {"x": [a, (b, {"deep": [c]})], "n": 3}
    assert [t.numel() for t in tensors_in(nested)] == [1, 2, 3]
    assert [t.numel() for t in tensors_in(nested, depth=2)] == [1, 2]   # c sits four levels down
    assert list(tensors_in(5)) == []


def test_cpu_copy_detaches_copies_and_keeps_container_types():
    Pair = collections.namedtuple("Pair", "x y")
    x = torch.ones(2, requires_grad=True)
    out = cpu_copy({"pair": Pair(x * 2, [x]), "od": collections.OrderedDict(a=x), "k": "v"})
    assert isinstance(out["pair"], Pair) and isinstance(out["od"], collections.OrderedDict) and out["k"] == "v"
    assert not out["pair"].x.requires_grad and out["pair"].y[0] is not x
    assert torch.equal(out["od"]["a"], torch.ones(2))


def test_fingerprint_tells_batches_apart_and_same_storage_finds_views():
    a, b = torch.arange(10.0), torch.arange(10.0) + 1
    assert fingerprint((a, a)) == fingerprint((a.clone(), a.clone())) != fingerprint((a, b))
    assert fingerprint("no tensor") is None
    assert same_storage(a[2:5], (b, a)) == 1 and same_storage(torch.zeros(1), (a, b)) is None


def test_norms_shapes_and_values():
    norms = [torch.tensor(3.0), torch.tensor(4.0)]
    assert total_norm(norms) == 5.0
    assert math.isclose(total_norm([torch.tensor(1.0)] * 40), math.sqrt(40), rel_tol=1e-6)
    assert shape_of(torch.zeros(2, 3)) == [2, 3] and shape_of((torch.zeros(4),)) == [4] and shape_of(1) is None
    assert values_in([torch.nn.Parameter(torch.zeros(3, 2)), torch.nn.parameter.UninitializedParameter()]) == 6


def test_nonfinite_inputs_reads_data_not_masks_or_graph_outputs():
    mask = torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)
    assert not nonfinite_inputs([(torch.randn(2, 4), mask)])
    assert nonfinite_inputs([(torch.tensor([1.0, float("nan")]),)])
    hidden = torch.tensor([float("inf")], requires_grad=True) * 1.0   # computed by a graph: not the data
    assert not nonfinite_inputs([(hidden,)])


def test_graph_walks():
    w = torch.ones(3, requires_grad=True)
    out = (w * 2).sum()
    loss = out / 4
    held = out.grad_fn
    assert reached(loss.grad_fn, {id(held)}) == {id(held)}
    assert reached(loss.grad_fn, set()) == set()
    assert one_op_from(loss, held) and not one_op_from(out, held)
    nodes = step_nodes(loss.grad_fn, limit=100)
    assert all(type(n).__name__ != "AccumulateGrad" for n in nodes) and held in nodes
    assert len(graph_nodes([loss])) == len(nodes) + 1   # (its AccumulateGrad node too)
