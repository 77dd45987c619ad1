"""Where does the learning signal die? One backward followed op by op, from the loss to every trained
parameter.

While a :class:`GradWalk` is entered (a ``TorchFunctionMode``, thread-local like every mode), it notes for
every op the user's code runs with gradients on:

- the autograd node each output was given, with the op, the module that was running and the user's
  ``file:line`` (the forward call site of that node);
- every *exit* from the graph: an op that took a tensor requiring grad and gave back a Python number, a
  NumPy array, a list, or a tensor that no longer requires grad (``.item()``, ``.tolist()``, ``.numpy()``,
  ``float(t)``, ``.detach()``, ``.data``, ``argmax``, comparisons, integer casts, ``torch.tensor(...)`` of
  tensors, any op under ``torch.no_grad()``), with the node its input hung from;
- every new leaf that requires grad (``torch.tensor(values, requires_grad=True)``, ``.requires_grad_()`` on
  a detached copy): where a graph may begin again after an exit.

``watch(loss)`` is called with the tensor a backward is about to run on (before it runs): it walks the
loss's graph (``grad_fn.next_functions``), notes which parameters its ``AccumulateGrad`` nodes reach, and
hooks every node. After the backward, ``report(trained)`` reads what each node received and passed on:

- a trained parameter the graph never reaches is *cut*: the first exit (in the order the code ran it)
  whose input hung from that parameter names the op and line, and a leaf the loss's graph starts from
  instead names where the graph began again;
- a trained parameter the graph reaches whose gradient is exactly zero (or non-finite) is *killed*: the
  node nearest the loss that received a nonzero (finite) gradient and passed on only zeros (non-finite
  values) towards that parameter names the op and line, read from its saved tensors (a softmax over a
  dimension of size 1, a ReLU dead for every sample, a saturated sigmoid / tanh / clamp, a step function
  such as round or sign).

Nothing here changes a value; the cost is one Python call per op while entered and one hook per node of
one backward.

    walk = GradWalk(files=[Path("train.py")])
    with walk:
        walk.attach(model)                  # module names for the ops (optional)
        loss = loss_fn(model(x), y)
        walk.watch(loss)
        loss.backward()
    found = walk.report({id(p): name for name, p in model.named_parameters()})
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

MAX_NODES = 200_000   # a graph larger than this is walked no further (the report says so)
MAX_EXITS = 4096      # graph exits kept (in order); later ones are counted only
# an exit op -> what it turns the tensor into (for the sentence)
EXIT_KINDS = {
    "item": "a Python number (.item())", "__float__": "a Python number (float())", "__int__": "a Python number (int())",
    "tolist": "Python numbers (.tolist())", "numpy": "a NumPy array (.numpy())", "__array__": "a NumPy array",
    "detach": "a detached copy (.detach())", "detach_": "a detached tensor (.detach_())", "__get__": "its .data",
    "tensor": "a new tensor (torch.tensor(...) copies values)", "as_tensor": "a new tensor (torch.as_tensor(...))",
    "new_tensor": "a new tensor (.new_tensor(...))", "argmax": "class indices (argmax)", "argmin": "indices (argmin)",
    "argsort": "indices (argsort)", "topk": "indices (topk)", "max": "indices (max)", "min": "indices (min)",
}
INTEGER_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
STEP_NODES = ("Round", "Floor", "Ceil", "Sign", "Trunc", "Frac", "Heaviside", "Sgn")
RELU_NODES = ("Relu", "Threshold", "Relu6", "Hardswish")
CLAMP_NODES = ("Clamp", "Hardtanh", "Hardsigmoid")
SQUASH_NODES = ("Sigmoid", "Tanh", "Softsign")
SOFTMAX_NODES = ("Softmax", "LogSoftmax", "_Softmax", "_LogSoftmax")
SAVED_NODES = frozenset(SOFTMAX_NODES + RELU_NODES + CLAMP_NODES + SQUASH_NODES)
_SKIP = {"dim", "size", "numel", "is_floating_point", "__len__", "__repr__", "__format__", "data_ptr", "stride",
         "storage_offset", "is_contiguous", "__hash__", "_is_view", "untyped_storage", "__reduce_ex__", "register_hook",
         "backward", "element_size", "__deepcopy__", "__setstate__", "__iter__", "__contains__", "requires_grad",
         "grad_fn", "is_leaf", "device", "dtype", "shape", "__index__", "__bool__", "grad", "__set__"}


@dataclass
class Site:
    op: str                  # the torch function: "softmax", "linear", "round"
    module: str              # the innermost module running ("" outside the model), e.g. "net.3"
    module_type: str
    where: str | None        # the user's file:line in function
    order: int               # position among the ops seen
    in_model: bool = False   # made while a model's forward ran (else in the loop's code, e.g. between model and loss)

    def describe(self) -> str:
        layer = f" in {self.module_type} '{self.module}'" if self.module else ""
        return f"{self.op}{layer}" + (f" at {self.where}" if self.where else "")


@dataclass
class Exit:
    """A tensor requiring grad that an op turned into something autograd cannot follow."""
    op: str
    kind: str                # what the op turned it into (EXIT_KINDS), or "no_grad"
    where: str | None
    order: int
    nodes: list = field(default_factory=list, repr=False)   # grad_fn / AccumulateGrad-able leaves of its inputs
    shape: list | None = None
    count: int = 1           # the same op at the same line, repeated (a list comprehension of .item())


@dataclass
class Leaf:
    """A tensor requiring grad made by the user's code with no graph behind it."""
    op: str
    where: str | None
    order: int
    tensor: Any = field(default=None, repr=False)


def _tensors(obj: Any, depth: int = 0):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for o in obj[:4096]:
            yield from _tensors(o, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o, depth + 1)


OURS = "<nnwizard>"
_PACKAGE = str(Path(__file__).resolve().parents[1])   # the folder holding wizard/ and probes/ (or nnwizard/ once installed)
# nnwizard's own files whose ops stand for the user's: the reference step and loss, the target that calls the
# user's functions, and the probe that runs a module-mode step
_CALLERS = ("reference.py", "target.py", "gradpath.py")
_MACHINERY: dict[str, bool] = {}


def _machinery(filename: str) -> bool:
    hit = _MACHINERY.get(filename)
    if hit is None:
        resolved = str(Path(filename).resolve()) if not filename.startswith("<") else filename
        hit = _MACHINERY[filename] = resolved.startswith(_PACKAGE) and not resolved.endswith(_CALLERS) \
            and "/examples/" not in resolved and "/tests/" not in resolved
    return hit


class _Mode(TorchFunctionMode):
    def __init__(self, walk: "GradWalk"):
        super().__init__()
        self.walk = walk

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        walk = self.walk
        name = getattr(func, "__name__", None) or "" if walk.enabled else ""
        if not walk.enabled or name in _SKIP or (name == "__get__" and _property(func) != "data") \
                or (name.startswith("_") and not name.startswith("__")):   # torch's private helpers (Module.to's checks)
            return func(*args, **kwargs)
        # which inputs hang from the graph, read before the op runs (requires_grad_() changes its own input)
        attached = [t for t in _tensors(args) if t.requires_grad] + [t for t in _tensors(kwargs) if t.requires_grad]
        out = func(*args, **kwargs)
        try:
            if walk._from_input:
                walk._follow(args, kwargs, out)
            walk._observe(name, attached, out)
        except Exception:  # noqa: BLE001 - the walk must never break the user's computation
            walk.errors += 1
        return out


def _property(func) -> str | None:
    """The name of the Tensor property a ``__get__`` reads (``data``, ``shape``, ``T``...)."""
    return getattr(getattr(func, "__self__", None), "__name__", None)


class GradWalk:
    """See the module docstring. ``files``: the user's source files (``where`` names their frames; without
    them, any frame outside torch and nnwizard)."""

    def __init__(self, files: list[Path] | None = None):
        self.files = {str(Path(f).resolve()) for f in files or []}
        self.enabled = True
        # exits and new leaves are noted once armed: a script's own set-up before its first forward (building the
        # model, moving it to a device, an optimizer) handles parameters without being part of any step
        self.armed = True
        self.errors = 0
        self.ops = 0
        self.sites: dict[int, tuple[Any, Site]] = {}     # id(node) -> (node, where it was made)
        self.exits: list[Exit] = []
        self.exits_dropped = 0
        self.leaves: list[Leaf] = []
        self.roots: list[Any] = []                       # the loss tensors watched
        self.root_leaves: list[Any] = []                 # of them, those that are leaves (no graph at all)
        self.nodes: dict[int, dict] = {}                 # id(node) -> what its hook saw (filled by the backward)
        self.saved: dict[int, tuple[str, dict]] = {}     # id(node) -> (cause, saved numbers), read before the backward
        self._graph: dict[int, Any] = {}                 # id(node) -> node, every node of the watched graphs
        self._depth: dict[int, int] = {}
        self._via: dict[int, int | None] = {}   # id(node) -> the nearest node toward the loss whose call was seen
        self._stack: list[tuple[str, str]] = []
        self._handles: list = []
        self._attached: list[nn.Module] = []
        self._user: dict[str, bool] = {}
        self.truncated = False
        self.unread: list[str] = []   # nodes whose saved values could not be read (named in the report)
        self._from_input: dict[int, Any] = {}            # id -> tensor computed from the tracked input (kept alive)
        self._mode = _Mode(self)

    # -- context ------------------------------------------------------------------------------------
    def __enter__(self) -> "GradWalk":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._mode.__exit__(*exc)
        except Exception:  # noqa: BLE001 - the mode stack was changed under it (the recorder restores its own)
            pass
        self.detach_modules()

    def attach(self, model: nn.Module) -> None:
        """Name the ops that ``model`` runs by its modules; ``detach_modules`` takes the hooks off again
        (a model pickled later must not carry them)."""
        if any(m is model for m in self._attached):
            return
        self._attached.append(model)
        for path, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(
                lambda m, a, _n=path: self._stack.append((_n, type(m).__name__))))
            self._handles.append(module.register_forward_hook(self._pop(path)))

    def _pop(self, name: str):
        def post(module, args, output):
            if self._stack and self._stack[-1][0] == name:
                self._stack.pop()
        return post

    def detach_modules(self) -> None:
        while self._handles:
            self._handles.pop().remove()
        self._stack.clear()

    # -- where ----------------------------------------------------------------------------------------
    def _is_user(self, filename: str) -> bool:
        hit = self._user.get(filename)
        if hit is None:
            if self.files:
                hit = str(Path(filename).resolve()) in self.files
            else:
                hit = not any(part in filename for part in ("/torch/", "/nnwizard/", "/probes/", "/wizard/", "<"))
            self._user[filename] = hit
        return hit

    def where(self, through: bool = False) -> str | None:
        """``file:line in function`` of the innermost user frame; ``OURS`` when nnwizard's own machinery (the
        recorder reading a tensor, a listener) made the op, not the user's code or what it called. ``through``: the
        user's frame beyond nnwizard's (where a node was made: the recorder's loss wrapper calls the user's loss
        function for them)."""
        frame = sys._getframe(1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.endswith("_gradwalk.py") or "/torch/" in filename:
                frame = frame.f_back
                continue
            if _machinery(filename) and not through:
                return OURS
            if self._is_user(filename):
                return f"{Path(filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"
            frame = frame.f_back
        return None

    # -- what the model's input reaches --------------------------------------------------------------
    def track(self, inputs) -> None:
        """Follow ``inputs`` (the model's input) through the ops: ``depends(output)`` then says whether the output
        was computed from it at all (a structural question: a layer whose weights are zero right now still
        passes its input on)."""
        for t in _tensors(inputs):
            self._from_input[id(t)] = t

    def _follow(self, args, kwargs, out) -> None:
        seen = self._from_input
        if any(id(t) in seen and seen[id(t)] is t for t in _tensors(args)) or \
                any(id(t) in seen and seen[id(t)] is t for t in _tensors(kwargs)):
            for t in _tensors(out):
                if len(seen) < MAX_NODES:
                    seen[id(t)] = t

    def depends(self, output) -> bool | None:
        """Whether ``output`` was computed from the tracked input (None: no input was tracked)."""
        if not self._from_input:
            return None
        seen = self._from_input
        return any(id(t) in seen and seen[id(t)] is t for t in _tensors(output))

    # -- observing ------------------------------------------------------------------------------------
    def _observe(self, name: str, attached: list[torch.Tensor], out) -> None:
        self.ops += 1
        outs = list(_tensors(out))
        grad_on = torch.is_grad_enabled()
        if attached:
            if any(t is a for t in outs for a in attached):   # in place (an update under no_grad): no exit
                return
            # a new leaf made from tensors with a graph (torch.tensor(loss, requires_grad=True)) keeps nothing of it
            kept = [t for t in outs if t.requires_grad and t.grad_fn is not None]
            fresh = [t for t in outs if t.requires_grad and t.grad_fn is None and not isinstance(t, nn.Parameter)]
            if fresh and self.armed and len(self.leaves) < MAX_EXITS:
                self.leaves.append(Leaf(name, self.where(), self.ops, fresh[0]))
            if not kept and (outs or out is not None) and self.armed:
                # the inputs hung from the graph, nothing that comes out does (unless nnwizard's machinery read them)
                kind = EXIT_KINDS.get(name)
                if not grad_on:
                    kind = "no_grad"
                elif kind is None and outs and all(t.dtype in INTEGER_DTYPES for t in outs):
                    kind = f"{str(outs[0].dtype).replace('torch.', '')} values ({name})"
                elif kind is None:
                    kind = f"a tensor that does not require grad ({name})"
                self._exit(name, kind, attached, outs)
            for t in kept:
                node = t.grad_fn
                if node is not None and id(node) not in self.sites:
                    module, mtype = self._stack[-1] if self._stack else ("", "")
                    self.sites[id(node)] = (node, Site(name, module, mtype, self.where(through=True), self.ops, bool(self._stack)))
        elif grad_on and self.armed:
            for t in outs:
                if t.requires_grad and t.grad_fn is None and not isinstance(t, nn.Parameter):
                    where = self.where()
                    if len(self.leaves) < MAX_EXITS and where != OURS:
                        self.leaves.append(Leaf(name, where, self.ops, t))

    def _exit(self, name: str, kind: str, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        where = self.where()
        if where == OURS:
            return
        last = self.exits[-1] if self.exits else None
        nodes = [t.grad_fn if t.grad_fn is not None else t for t in inputs[:8]]
        if last is not None and last.op == name and last.where == where and last.kind == kind:
            last.count += 1
            if len(last.nodes) < 64:
                last.nodes += nodes
            return
        if len(self.exits) >= MAX_EXITS:
            self.exits_dropped += 1
            return
        self.exits.append(Exit(name, kind, where, self.ops, nodes, list(outs[0].shape) if outs else None))

    # -- the backward ---------------------------------------------------------------------------------
    def watch(self, loss: torch.Tensor) -> None:
        """Walk the graph ``loss`` hangs from and hook each node; call before its backward runs."""
        if not isinstance(loss, torch.Tensor):
            return
        self.roots.append(loss)
        if loss.grad_fn is None:   # the loss is itself a new leaf (torch.tensor(value, requires_grad=True))
            self.root_leaves.append(loss)
            return
        frontier = [(loss.grad_fn, 0, None)]
        while frontier:
            node, depth, via = frontier.pop(0)
            if node is None or id(node) in self._graph:
                continue
            if len(self._graph) >= MAX_NODES:
                self.truncated = True
                break
            self._graph[id(node)] = node
            self._depth[id(node)] = depth
            self._via[id(node)] = via
            self._hook(node)
            try:
                self._read_saved(node)
            except Exception as exc:  # noqa: BLE001 - a node type whose saved values read oddly: its cause stays unknown
                self.unread.append(f"{node.name()}: {type(exc).__name__}: {exc}")
            own = id(node) if id(node) in self.sites else via
            frontier += [(child, depth + 1, own) for child, _ in node.next_functions]

    def _read_saved(self, node) -> None:
        """The cause a node of this type would be, and its saved numbers, read now: the backward frees them."""
        base = node.name().rstrip("0123456789").removesuffix("Backward")
        if base in SAVED_NODES:
            self.saved[id(node)] = (_cause(node), _saved(node))

    def _hook(self, node) -> None:
        seen = self.nodes.setdefault(id(node), {"in": None, "out": None})

        def hook(grad_inputs, grad_outputs, _seen=seen):
            _seen["in"] = _state(grad_outputs)            # what reached the node (from the loss side)
            _seen["out"] = [_state([g]) for g in grad_inputs]   # what it passed on, per input
        try:
            node.register_hook(hook)
        except Exception:  # noqa: BLE001 - a node type that takes no hooks
            pass

    # -- the reading ----------------------------------------------------------------------------------
    def report(self, trained: dict[int, str]) -> dict[str, Any]:
        """What happened to the gradient of each trained parameter (``trained``: id(parameter) -> name)."""
        index = {pid: i for i, pid in enumerate(trained)}
        names = list(trained.values())
        memo: dict[int, int] = {}
        reached = 0
        leaves_in_graph = list(self.root_leaves)
        for node in self._graph.values():
            if type(node).__name__ == "AccumulateGrad" or _is_accumulate(node):
                var = getattr(node, "variable", None)
                if var is not None and id(var) in index:
                    reached |= 1 << index[id(var)]
                elif var is not None:
                    leaves_in_graph.append(var)
        found: dict[str, Any] = dict(ops=self.ops, nodes=len(self._graph), truncated=self.truncated, backwards=len(self.roots),
                                     trained=len(trained), reached=bin(reached).count("1"))
        if self.unread:
            found["unread"] = self.unread[:5]
        unreached = [i for i in range(len(trained)) if not reached >> i & 1]
        # parameters reached whose whole gradient is zero / non-finite
        zero, nonfinite = [], []
        for node in self._graph.values():
            if not _is_accumulate(node):
                continue
            var = getattr(node, "variable", None)
            if var is None or id(var) not in index:
                continue
            state = self.nodes.get(id(node), {}).get("in")
            if state is None or state == "zero":
                zero.append(index[id(var)])
            elif state == "nonfinite":
                nonfinite.append(index[id(var)])
        found["unreached"] = [names[i] for i in unreached]
        found["zero"] = [names[i] for i in zero]
        found["nonfinite"] = [names[i] for i in nonfinite]
        if unreached:
            mask = sum(1 << i for i in unreached)
            cut = self._first_exit(mask, index, memo)
            if cut is not None:
                found["exit"] = cut
            starts = [leaf for leaf in self.leaves if any(leaf.tensor is v for v in leaves_in_graph)]
            if starts:
                found["restart"] = starts[0]
        for kind, group in (("zero", zero), ("nonfinite", nonfinite)):
            if group:
                mask = sum(1 << i for i in group)
                node = self._killer(mask, index, memo, kind)
                if node is not None:
                    found[f"{kind}_node"] = node
        return found

    def _reach(self, node, index: dict[int, int], memo: dict[int, int]) -> int:
        """Bit mask of the trained parameters ``node`` (a grad_fn, or a leaf tensor) leads to."""
        if isinstance(node, torch.Tensor):
            return 1 << index[id(node)] if id(node) in index else 0
        if node is None:
            return 0
        key = id(node)
        if key in memo:
            return memo[key]
        # iterative post-order: deep graphs (an RNN unrolled over many steps) must not hit the recursion limit
        stack, order, seen = [node], [], set()
        while stack:
            n = stack.pop()
            if n is None or id(n) in memo or id(n) in seen:
                continue
            seen.add(id(n))
            order.append(n)
            stack += [c for c, _ in n.next_functions if c is not None]
            if len(seen) > MAX_NODES:
                break
        for n in reversed(order):
            if _is_accumulate(n):
                var = getattr(n, "variable", None)
                memo[id(n)] = 1 << index[id(var)] if var is not None and id(var) in index else 0
                continue
            mask = 0
            for c, _ in n.next_functions:
                if c is not None:
                    mask |= memo.get(id(c), 0)
            memo[id(n)] = mask
        return memo.get(key, 0)

    def _first_exit(self, mask: int, index, memo) -> dict | None:
        hits = []
        for e in self.exits:
            reach = 0
            for n in e.nodes:
                reach |= self._reach(n, index, memo)
            if reach & mask:
                hits.append((e, reach & mask))
        if not hits:
            return None
        e, reach = hits[0]
        return dict(op=e.op, kind=e.kind, where=e.where, count=e.count, shape=e.shape,
                    params=bin(reach).count("1"), exits=len(hits))

    def _killer(self, mask: int, index, memo, kind: str) -> dict | None:
        """The node nearest the loss that received a nonzero (``kind`` "zero") or finite ("nonfinite") gradient
        and passed on only zeros (non-finite values) along every input that leads to these parameters."""
        best = None
        for key, node in self._graph.items():
            if _is_accumulate(node):
                continue
            seen = self.nodes.get(key, {})
            came, went = seen.get("in"), seen.get("out")
            if came is None or went is None:
                continue
            if kind == "zero" and came != "ok":
                continue
            if kind == "nonfinite" and came not in ("ok", "zero"):
                continue
            toward = [(c, state) for (c, _), state in zip(node.next_functions, went)
                      if c is not None and self._reach(c, index, memo) & mask]
            if not toward:
                continue
            if kind == "zero" and all(state in ("zero", None) for _, state in toward):
                pass
            elif kind == "nonfinite" and any(state == "nonfinite" for _, state in toward):
                pass
            else:
                continue
            depth = self._depth.get(key, 0)
            if best is None or depth < best[0]:
                best = (depth, node)
        if best is None:
            return None
        node = best[1]
        site = self.sites.get(id(node))
        cause, numbers = self.saved.get(id(node), (None, {}))
        op = site[1].op if site else node.name().rstrip("0123456789").removesuffix("Backward")
        if site is None and self._via.get(id(node)) in self.sites:
            # a node made inside a call the mode saw as one op (log_softmax inside cross_entropy): that call's line
            site = self.sites[self._via[id(node)]]
            op = f"{op} inside {site[1].op}"
        info = dict(node=node.name(), depth=best[0], cause=cause or _cause_by_name(node),
                    op=op,
                    where=site[1].where if site else None, module=site[1].module if site else "",
                    module_type=site[1].module_type if site else "", in_model=site[1].in_model if site else False)
        info.update(numbers)
        return info


def _is_accumulate(node) -> bool:
    return hasattr(node, "variable") and not node.next_functions


def _state(grads) -> str | None:
    """"ok" (some nonzero value, all finite), "zero" (every value exactly 0), "nonfinite", or None (nothing came)."""
    found = None
    for g in grads:
        if g is None or not isinstance(g, torch.Tensor) or not g.numel():
            continue
        g = g.detach()
        if not g.is_floating_point() and not g.is_complex():
            continue
        if not bool(torch.isfinite(g).all()):
            return "nonfinite"
        found = "ok" if bool((g != 0).any()) else (found or "zero")
    return found


def _dim(node, result) -> int | None:
    """A softmax node's saved dimension as an index into ``result``: autograd saves it as an unsigned 64-bit
    number, so ``dim=-1`` reads 2**64 - 1."""
    dim = getattr(node, "_saved_dim", None)
    if not isinstance(dim, int) or not isinstance(result, torch.Tensor) or not result.dim():
        return None
    if dim >= 2 ** 63:
        dim -= 2 ** 64
    return dim if -result.dim() <= dim < result.dim() else None


def _cause(node) -> str:
    """What kind of op stops the gradient: read from the node's type and saved tensors (before the backward)."""
    base = node.name().rstrip("0123456789").removesuffix("Backward")
    if base in SOFTMAX_NODES:
        result = getattr(node, "_saved_result", None)
        dim = _dim(node, result)
        if dim is not None and result.shape[dim] == 1:
            return "softmax-size1"
        return "softmax-saturated"
    return _cause_by_name(node)


def _cause_by_name(node) -> str:
    base = node.name().rstrip("0123456789").removesuffix("Backward")
    if base in RELU_NODES:
        return "relu-dead"
    if base in CLAMP_NODES:
        return "clamp-saturated"
    if base in SQUASH_NODES:
        return "squash-saturated"
    if base in STEP_NODES:
        return "step-function"
    if base in ("Mul", "Div"):
        return "scaled-by-zero"
    return "zero-op"


def _saved(node) -> dict[str, Any]:
    """Numbers that show why (the softmax's dimension and size, the share of a ReLU's outputs that are 0, a
    sigmoid's range)."""
    out: dict[str, Any] = {}
    try:
        result = getattr(node, "_saved_result", None)
        dim = _dim(node, result)
        if isinstance(result, torch.Tensor) and result.numel():
            r = result.detach().float()
            out.update(saved_shape=list(r.shape), saved_min=float(r.min()), saved_max=float(r.max()),
                       saved_zero=float((r == 0).float().mean()))
            if dim is not None:
                out.update(dim=dim, dim_size=int(r.shape[dim]))
        x = getattr(node, "_saved_self", None)
        if isinstance(x, torch.Tensor) and x.numel() and x.is_floating_point():
            v = x.detach().float()
            out.update(input_min=float(v.min()), input_max=float(v.max()))
            for attr in ("_saved_min", "_saved_max"):
                bound = getattr(node, attr, None)
                if isinstance(bound, (int, float)) and math.isfinite(bound):
                    out[attr.removeprefix("_saved_")] = float(bound)
    except Exception:  # noqa: BLE001 - saved tensors already freed, or of an odd type
        pass
    return out


def constant_rows(output: Any, inputs: Any) -> dict[str, Any] | None:
    """When every row (sample) of the model's output is identical while the rows of its input differ: the
    output does not depend on the input (for these samples). None when not so or not measurable."""
    out = next(_tensors(output), None)
    x = next(_tensors(inputs), None)
    if out is None or x is None or out.dim() < 1 or x.dim() < 1 or len(out) < 4 or len(x) != len(out):
        return None
    if not out.is_floating_point():
        return None
    o = out.detach().reshape(len(out), -1).float()
    xi = x.detach().reshape(len(x), -1)
    xi = xi.float() if xi.is_floating_point() or not xi.is_complex() else xi.abs()
    if not bool(torch.isfinite(o).all()):
        return None
    distinct_inputs = len({hash(row.numpy().tobytes()) for row in xi.cpu()[:64]})
    spread = float((o - o[:1]).abs().max())
    if spread == 0 and distinct_inputs > 1:
        return dict(rows=len(out), distinct_inputs=distinct_inputs, value=float(o[0, 0]), output_shape=list(out.shape))
    return None
