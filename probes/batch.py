"""Batch independence: in eval mode, the output of one sample must depend on that sample's input
alone. Backpropagating sample i's output and finding gradient on sample j's input means the batch
axis is being used as another axis (a sequence layer without ``batch_first``, a softmax or a
normalisation over dim 0, a reshape that interleaves samples). The probe says which samples mix,
along which dimension, and the first module and op whose output already mixes them."""

from __future__ import annotations

import contextlib

from dataclasses import dataclass

import torch
from torch import nn

from nnwizard.record.autograd import graph_nodes
from nnwizard.record.frames import first_line
from nnwizard.record.tensors import shape_of
from nnwizard.record.optrace import OpTracer
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import user_source_files

# In eval mode a per-sample model routes exactly zero gradient to other samples (a zero row of the
# upstream gradient times any weight is exactly zero), so any cross-sample gradient above float
# round-off is real. 1e-5 of the largest own-sample gradient sits far above round-off (~1e-7
# relative in float32) and far below any genuine mixing (a recurrence or softmax over the batch
# gives ratios of 1e-2 to 1).
MIX_TOLERANCE = 1e-5
# A softmax over the batch leaves every column summing to one along dim 0.
SUM_TOLERANCE = 1e-3
SOFTMAX_OPS = {"softmax", "log_softmax", "softmin", "_softmax", "_log_softmax"}
SEQUENCE_TYPES = (nn.RNNBase, nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoder,
                  nn.TransformerDecoder, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def first_tensor(out, n: int):
    """The model's main output: the tensor itself, or the first tensor with ``n`` rows inside a
    tuple, list or dict (models returning (logits, hidden) or {"logits": ...})."""
    if isinstance(out, torch.Tensor):
        return out
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else []
    for item in items:
        if isinstance(item, torch.Tensor) and item.dim() > 0 and item.shape[0] == n:
            return item
    return None


def _sample_count(inputs: torch.Tensor, limit: int, avoid: set[int]) -> int:
    """How many samples to test: at most ``limit``, and a count that no other input dimension (or
    the class count) shares, so that a transposed tensor cannot pass for the batch axis."""
    for n in range(min(limit, inputs.shape[0]), 1, -1):
        if n not in avoid:
            return n
    return min(limit, inputs.shape[0])


@dataclass
class _Op:
    name: str
    dim: object
    out: torch.Tensor
    module: str
    where: str | None


def _leaves(model: nn.Module, inputs: torch.Tensor):
    """Input tensors that gradients are measured on: the inputs themselves when they are floating
    point, else the outputs of every Embedding (integer token ids cannot require grad)."""
    if inputs.is_floating_point():
        x = inputs.detach().clone().requires_grad_(True)
        return x, [x], []
    entries: list[torch.Tensor] = []

    def hook(module, args, output):
        leaf = output.detach().requires_grad_(True)
        entries.append(leaf)
        return leaf

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Embedding)]
    return inputs, entries, handles


def _row_mix(tensor: torch.Tensor, row: int, entries: list[torch.Tensor], weights: torch.Tensor | None = None):
    """Gradient reaching each sample of ``entries`` from row ``row`` of ``tensor``: (own, per-sample)."""
    if weights is None:
        g = torch.Generator(device="cpu").manual_seed(row)
        weights = torch.randn(tensor[row].shape, generator=g).to(tensor.device, tensor.dtype)
    grads = torch.autograd.grad((tensor[row] * weights).sum(), entries, retain_graph=True, allow_unused=True)
    per_sample = torch.zeros(tensor.shape[0], dtype=torch.float64)
    for entry, grad in zip(entries, grads):
        if grad is not None and grad.dim() > 0 and grad.shape[0] == tensor.shape[0]:
            per_sample += grad.detach().abs().double().reshape(grad.shape[0], -1).sum(1).cpu()
    return per_sample


def _batch_first(module: nn.Module) -> bool | None:
    if isinstance(module, nn.Transformer):
        return module.batch_first
    if hasattr(module, "batch_first"):
        return bool(module.batch_first)
    return None


def _softmax_signature(out: torch.Tensor) -> dict | None:
    """Outputs that are probabilities (or log-probabilities) summing to one along dim 0."""
    if out.dim() < 2 or out.shape[0] < 2 or not out.is_floating_point():
        return None
    o = out.detach().double()
    if bool(((o >= 0) & (o <= 1)).all()):
        probs, kind = o, "probabilities"
    elif bool((o <= 0).all()):
        probs, kind = o.exp(), "log-probabilities"
    else:
        return None
    along_batch = float((probs.sum(0) - 1).abs().max())
    along_last = float((probs.sum(-1) - 1).abs().max())
    if along_batch < SUM_TOLERANCE and along_last >= SUM_TOLERANCE:
        return {"kind": kind, "batch_sum_error": along_batch, "class_sum_error": along_last}
    return None


def _takes_rows(model: torch.nn.Module, inputs: torch.Tensor) -> bool:
    """Whether a 1-D input is a batch of scalars (the forward also takes its first value alone) rather than one
    sample's feature vector (a policy called on a single observation: a slice of it does not fit the first layer)."""
    try:
        with torch.no_grad():
            model(inputs[:1])
        return True
    except Exception:  # noqa: BLE001 - a forward that cannot take one value of it: the dim holds features
        return False


@probe(
    "batch-independence",
    title="Does each sample's output depend on its own input only? (eval mode, backprop per sample)",
    outcomes={
        "ok": "every sample's output depends on its own input alone",
        "batch-softmax": "a softmax / log-softmax normalises over the batch dimension (dim 0)",
        "sequence-axis": "a recurrent or attention layer without batch_first runs across the samples of the batch",
        "mixes": "outputs depend on other samples' inputs (the batch axis is mixed by another op)",
        "time-first": "script mode: a time-first model fed (T, B, ...) by the script itself; dim 0 is not the batch",
    },
    timeout_s=60,
    cost=4,
)
def batch_independence(ctx: ProbeContext):
    target = ctx.target
    batch = target.batch()
    inputs = batch[0] if batch else None
    if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0 or inputs.shape[0] < 2:
        return skipped("needs a batch of at least two samples in a single input tensor")
    avoid = set(inputs.shape[1:]) | ({target.num_classes} if target.num_classes else set())
    n = _sample_count(inputs, int(ctx.param("samples", 8)), avoid)
    model = target.fresh_model(ctx.seed).eval()  # BatchNorm in train mode mixes legitimately
    if inputs.dim() == 1 and inputs.is_floating_point() and not _takes_rows(model, inputs):
        return skipped(f"the model is called on one unbatched sample of {inputs.shape[0]} features (a slice of it "
                       f"does not go through the forward): there is no batch whose samples could mix")
    files = user_source_files(target)
    x, entries, handles = _leaves(model, inputs[:n])
    if not x.is_floating_point() and not handles:
        return skipped(f"integer inputs {list(inputs.shape)} and no nn.Embedding to measure gradients at")
    try:
        with torch.enable_grad(), _eval_backward(x):
            raw = model(x)
    except Exception as exc:  # the forward pass raising is forward-shape's finding, not ours
        return cannot_run(f"the forward pass raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    finally:
        for h in handles:
            h.remove()
    out = first_tensor(raw, n)
    if out is None or out.dim() == 0 or out.shape[0] != n or not out.requires_grad or not entries:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(raw).__name__
        return skipped(f"the output ({shape}) has no batch dimension of {n} rows carrying gradient from the input")

    matrix = torch.stack([_row_mix(out, i, entries) for i in range(n)])  # [output row, input sample]
    own = matrix.diagonal()
    scale = float(own.max())
    signature = _softmax_signature(out)
    data = {"samples": n, "input_shape": list(inputs[:n].shape), "output_shape": list(out.shape), "dim": 0}
    if scale == 0.0 and signature is None:
        return skipped("no output row receives any gradient from its own input", **data)
    off = matrix.clone()
    off.fill_diagonal_(0.0)
    ratio = off / max(scale, 1e-30)
    worst = float(ratio.max())
    data["mixing_ratio"] = worst
    mixed_rows = [i for i in range(n) if float(ratio[i].max()) > MIX_TOLERANCE]
    rows = [[i, float(own[i]), float(off[i].max()), ", ".join(str(j) for j in range(n) if float(ratio[i, j]) > MIX_TOLERANCE) or "-"]
            for i in range(n)]
    table = Table("batch-mixing", "Gradient from each output row to the input samples",
                  ["output row", "grad on own input", "largest grad on another sample", "samples it depends on"],
                  rows, marked=mixed_rows)
    if not mixed_rows and signature is None:
        return passed(f"{n} samples in eval mode: no output row receives gradient from another sample's input "
                      f"(largest cross-sample ratio {worst:.1e})", artifacts=[table], **data)

    i = int(ratio.max(1).values.argmax())
    sources = [j for j in range(n) if j != i and float(ratio[i, j]) > MIX_TOLERANCE]
    data.update(row=i, depends_on=sources, mixed_rows=len(mixed_rows))
    data.update(_locate(model, inputs[:n], i, n, files, ctx))
    if signature is not None:
        data.update(sums_to_one=signature["kind"], batch_sum_error=signature["batch_sum_error"])
    who = (f"output row {i} (dim 0 of the output {list(out.shape)}) receives gradient from the inputs of samples "
           f"{_list(sources)}" if sources else f"the output {list(out.shape)} mixes samples along dim 0")
    where = _where_text(data)
    op_is_softmax = data.get("op") in SOFTMAX_OPS and _is_batch_dim(data.get("op_dim"), data.get("op_ndim"))
    if signature is not None or op_is_softmax:
        sums = (f"; the {signature['kind']} sum to 1 along dim 0 (the batch of {n}) within "
                f"{signature['batch_sum_error']:.1e}") if signature else ""
        return failed("batch-softmax", f"{who}{where}{sums}", [table], **data)
    if data.get("seq_batch_first") is False:
        if getattr(target, "inputs_batch_first", True) is False and _time_first(model, inputs, n):
            # a script that feeds its model (T, B, ...) itself (no DataLoader batch as yielded): the
            # default time-first layout, and every sample along dim 1 depends on its own input only
            return skipped(f"{who}{where}; but the model keeps samples apart along dim 1 and the script does not feed "
                           f"it a DataLoader batch as yielded, so dim 0 is taken for time, not the batch (the default "
                           f"layout of a recurrent layer without batch_first)", "time-first", **data)
        lengths = getattr(target, "sequence_lengths", None)
        shape = data.get("module_input")
        ids = inputs.dim() == 1 and not inputs.is_floating_point() and not getattr(target, "inputs_batch_first", True)
        if (lengths or ids) and isinstance(shape, list) and len(shape) == 3 and shape[1] == 1:
            # one sequence per forward, laid out (time, 1, features) by the model itself: nothing to mix
            seen = (f"dim 0 of its input is {_list(lengths)} long across the recorded forwards" if lengths else
                    f"its input is one row of {len(inputs)} token ids")
            data["input_lengths"] = (lengths or [len(inputs)])[:8]
            return skipped(f"{who}{where}; but the script feeds its model one sequence per forward ({seen}) and the "
                           f"layer sees a batch of 1, so dim 0 is time, not a batch of samples", "time-first", **data)
        return failed("sequence-axis", f"{who}{where}", [table], **data)
    return failed("mixes", f"{who}{where}", [table], **data)


def _eval_backward(x: torch.Tensor):
    """The gradients here run through a model in eval mode, and cuDNN's RNN kernels have no backward in
    eval mode ("cudnn RNN backward can only be called in training mode"): on CUDA the forward runs with
    cuDNN off, so an LSTM/GRU takes torch's own kernels, which have one. (Same values; slower, on 8 samples.)"""
    return torch.backends.cudnn.flags(enabled=False) if x.is_cuda else contextlib.nullcontext()


def _time_first(model: nn.Module, inputs: torch.Tensor, limit: int) -> bool:
    """Whether each sample along dim 1 of ``inputs`` reaches only its own slice along dim 1 of the
    output: a consistent time-first (T, B, ...) model."""
    if inputs.dim() < 2 or inputs.shape[1] < 2:
        return False
    m = min(limit, inputs.shape[1])
    x, entries, handles = _leaves(model, inputs[:, :m].contiguous())
    try:
        with torch.enable_grad(), _eval_backward(x):
            raw = model(x)
    except Exception:  # noqa: BLE001 - a model that cannot take the slice: not shown to be time-first
        return False
    finally:
        for h in handles:
            h.remove()
    out = raw if isinstance(raw, torch.Tensor) else next(
        (t for t in (raw.values() if isinstance(raw, dict) else raw if isinstance(raw, (tuple, list)) else [])
         if isinstance(t, torch.Tensor) and t.dim() > 1 and t.shape[1] == m), None)
    if out is None or out.dim() < 2 or out.shape[1] != m or not out.requires_grad or not entries:
        return False
    flipped = out.transpose(0, 1)
    for j in range(m):
        g = torch.Generator(device="cpu").manual_seed(j)
        w = torch.randn(flipped[j].shape, generator=g).to(out.device, out.dtype)
        grads = torch.autograd.grad((flipped[j] * w).sum(), entries, retain_graph=True, allow_unused=True)
        per = torch.zeros(m, dtype=torch.float64)
        for grad in grads:
            if grad is not None and grad.dim() > 1 and grad.shape[1] == m:
                per += grad.detach().abs().double().transpose(0, 1).reshape(m, -1).sum(1).cpu()
        own = float(per[j])
        per[j] = 0.0
        if own <= 0.0 or float(per.max()) > MIX_TOLERANCE * own:
            return False
    return True


def _list(items: list[int], limit: int = 6) -> str:
    text = ", ".join(str(i) for i in items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _is_batch_dim(dim, ndim) -> bool:
    if not isinstance(dim, int):
        return False
    return dim == 0 or (isinstance(ndim, int) and dim == -ndim)


def _mixes(tensor, row: int, entries, ctx: ProbeContext) -> bool:
    per_sample = _row_mix(tensor, row, entries)
    own = float(per_sample[row])
    per_sample[row] = 0.0
    other = float(per_sample.max())
    return other > MIX_TOLERANCE * max(own, 1e-30) and other > 0.0


def _locate(model: nn.Module, inputs: torch.Tensor, row: int, n: int, files, ctx: ProbeContext) -> dict:
    """The first module (innermost, earliest to finish) and the first op whose output already mixes
    samples. A second, traced forward pass (eval mode: the same function) keeps every module output
    and every op output with ``n`` rows; each candidate's row ``row`` is backpropagated to the
    inputs, in execution order, until one reaches another sample."""
    done: list[tuple] = []  # (path, module, input shape, output, input), in completion order
    paths = {m: (p or "(model)") for p, m in model.named_modules()}
    ops: list[_Op] = []
    reducers: list[_Op] = []  # ops that take a tensor with n rows and return one without (mean(0), view...)

    def post(module, args, output):
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        done.append((paths[module], module, shape_of(args[0]) if args else None, output, first))

    def on_op(rec, func, args, out, kwargs):
        first = out[0] if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor) else out
        if (isinstance(first, torch.Tensor) and first.requires_grad and first.dim() > 0 and first.shape[0] == n
                and rec.phase == "forward" and len(ops) < 2000):
            # the normalised axis, read from the autograd node (SoftmaxBackward0._saved_dim), which
            # holds whether the user wrote F.softmax(x, 0), x.softmax(dim=0) or torch.log_softmax(x, 0)
            dim = getattr(first.grad_fn, "_saved_dim", None) if rec.op in SOFTMAX_OPS else None
            ops.append(_Op(rec.op, dim, first, rec.module or "(model)", rec.where))
        elif (isinstance(first, torch.Tensor) and first.grad_fn is not None and rec.phase == "forward" and len(reducers) < 2000
              and any(isinstance(a, torch.Tensor) and a.dim() > 0 and a.shape[0] == n for a in args)):
            reducers.append(_Op(rec.op, None, first, rec.module or "(model)", rec.where))

    x, entries, handles = _leaves(model, inputs)
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        with torch.enable_grad(), _eval_backward(x), OpTracer(model, files, record="all", on_op=on_op):
            model(x)
    except Exception:  # noqa: BLE001 - the untraced pass ran; a tracing failure only loses the location
        return {}
    finally:
        for h in handles:
            h.remove()
    found: dict = {}
    for path, module, in_shape, output, given in done:
        tensor = first_tensor(output, n)
        if tensor is None or not tensor.requires_grad or tensor.dim() == 0 or tensor.shape[0] != n:
            continue
        if ctx.time_left() < 2:
            break
        # the culprit's output mixes samples while its input does not; a layer that merely receives
        # an already mixed input (the Linear after a hand-rolled batch normalisation) is not it
        fed_mixed = (given is not None and given.requires_grad and given.dim() > 0 and given.shape[0] == n
                     and _mixes(given, row, entries, ctx))
        if not fed_mixed and _mixes(tensor, row, entries, ctx):
            found.update(module=path, module_type=type(module).__name__, module_input=in_shape)
            seq = module if isinstance(module, SEQUENCE_TYPES) else None
            if seq is None:  # MultiheadAttention inside a Transformer layer: the layer owns batch_first
                for other_path, other, *_ in done:
                    if isinstance(other, SEQUENCE_TYPES) and path.startswith(other_path + ".") and _batch_first(other) is not None:
                        seq = other
                        break
            if seq is not None and _batch_first(seq) is not None:
                found.update(seq_batch_first=_batch_first(seq), seq_type=type(seq).__name__)
            break
    for op in ops:
        if ctx.time_left() < 2:
            break
        if _mixes(op.out, row, entries, ctx):
            found.update(op=op.name, op_dim=op.dim if isinstance(op.dim, int) else None, op_ndim=op.out.dim(),
                         op_where=op.where, op_module=op.module)
            # an op that collapsed the batch axis just before (h.mean(0), a view merging samples) and
            # feeds this one is where the samples met: name it, and this op as where they recombine
            # (the list held while the ids are compared: a grad_fn's Python object can be freed once unreferenced)
            nodes = graph_nodes([op.out], limit=5000)
            feeding = {id(n) for n in nodes}
            inside = [r for r in reducers if r.out.grad_fn is not None and id(r.out.grad_fn) in feeding]
            if inside:
                last = inside[-1]
                found.update(op=last.name, op_dim=None, op_where=last.where, op_module=last.module, op_into=op.name)
            break
    return found


def _where_text(data: dict) -> str:
    parts = []
    if "module" in data:
        text = f"{data['module_type']} '{data['module']}'"
        if data.get("seq_batch_first") is False and isinstance(data.get("module_input"), list) and len(data["module_input"]) == 3:
            a, b, c = data["module_input"]
            text += (f" (batch_first=False) reads its input {data['module_input']} as (time={a}, batch={b}, "
                     f"features={c}): the batch axis is its time axis")
        parts.append(text)
    if "op" in data:
        dim = f"(dim={data['op_dim']})" if data.get("op_dim") is not None else "()"
        at = f" at {data['op_where']}" if data.get("op_where") else ""
        into = f" (feeding {data['op_into']}(), which spreads it back over the samples)" if data.get("op_into") else ""
        parts.append(f"op {data['op']}{dim}{at}{into}")
    return ("; first mixing at " + ", ".join(parts)) if parts else ""
