"""Model-fit probes: does what the model outputs fit what the loss expects, and do the layers' shapes
fit one another?

- ``loss-output-audit``: the model's last module and its real outputs against the loss: a Softmax
  before CrossEntropyLoss (softmax applied twice), probabilities or raw logits into NLLLoss, logits
  into BCELoss, a Sigmoid before BCEWithLogitsLoss.
- ``shape-audit``: each layer's input and output shapes on one batch (a table, with the convolution
  and pooling arithmetic); on a shape crash the first layer whose input does not fit, what it
  expected and why; without a crash, an output and target that broadcast silently inside the loss.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from nnwizard.record.losscalls import LossCalls
from nnwizard.probes._crash import error_kind, expected_input
from nnwizard.record.frames import first_line, user_frame
from nnwizard.record.tracers import trace_modules
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import user_source_files

ELEMENTWISE = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss, nn.BCELoss, nn.BCEWithLogitsLoss)


def _last_leaf(trace):
    """The last leaf module that ran in the forward pass (the model's output layer)."""
    for call in reversed(trace.calls):
        module = trace.modules.get(call.path)
        if module is not None and not any(True for _ in module.children()):
            return call, module
    return None, None


# ----------------------------------------------------------------------------- loss-output-audit
_NAMES = {"cross_entropy": "CrossEntropyLoss", "nll_loss": "NLLLoss", "binary_cross_entropy": "BCELoss",
          "binary_cross_entropy_with_logits": "BCEWithLogitsLoss", "mse_loss": "MSELoss", "l1_loss": "L1Loss",
          "smooth_l1_loss": "SmoothL1Loss", "huber_loss": "HuberLoss", "kl_div": "KLDivLoss"}


def _capture(target, model, inputs, targets, files):
    """Run one real step (the user's train_step when given, else loss_fn(model(x), y)) and return
    (the first loss call, the model's output, the leaf-module trace, the exception or None)."""
    box: dict = {}
    hook = model.register_forward_hook(lambda m, a, o: box.setdefault("out", o))
    error = None
    with trace_modules(model, leaves_only=True) as trace, LossCalls(files, model) as calls:
        try:
            if target.user_train_step:
                model.train()
                target.train_step(model, (inputs, targets), target.make_optimizer(model))
            else:
                model.eval()
                with torch.no_grad():
                    target.loss_fn(model(inputs), targets)
        except Exception as exc:  # noqa: BLE001 - what reached the loss before it raised still counts
            error = exc
    hook.remove()
    return calls.first, box.get("out"), trace, error


@probe(
    "loss-output-audit",
    title="What really reaches the loss (logits, probabilities, log-probabilities, constants)",
    outcomes={
        "ok": "the loss gets what it expects",
        "double-softmax": "probabilities (rows summing to 1) go into a loss that applies softmax itself",
        "probs-to-nll": "NLLLoss gets probabilities instead of log-probabilities",
        "logits-to-nll": "NLLLoss gets raw logits instead of log-probabilities",
        "logits-to-bce": "BCELoss gets values outside [0, 1] (logits)",
        "double-sigmoid": "BCEWithLogitsLoss gets probabilities (a sigmoid already applied)",
        "logprobs-to-logits": "BCEWithLogitsLoss gets log-probabilities (logsigmoid / log_softmax output)",
        "squashed-logits": "a Sigmoid/Tanh bounds the logits of CrossEntropyLoss",
        "clamped-logits": "a ReLU (or clamp) after the last layer: no logit below 0 and many exactly 0",
        "other-dim": "outputs are normalised (softmax / log_softmax) over a dimension other than the classes",
        "softmax-size1": "a softmax / log_softmax over a dimension of size 1: every value is 1 (or 0)",
        "single-class": "a class loss gets one score per sample: its value is 0 whatever the model does",
        "constant": "every value a normalising op passes to the loss is the same, across samples and outputs",
    },
    timeout_s=30,
)
def loss_output_audit(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed)
    inputs, targets = target.batch()
    files = user_source_files(target)
    call, out, trace, error = _capture(target, model, inputs, targets, files)
    if call is None:
        if error is not None:
            return cannot_run(f"the step raised before any loss was called: {first_line(error)}", reason="raised",
                              error=first_line(error))
        if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.numel() == 0:
            return skipped("the model's output is not one floating-point tensor")
        return passed(f"no built-in loss function was called ({type(target.loss_fn).__name__}): no output convention "
                      f"to check", "ok", loss=type(target.loss_fn).__name__, output_shape=list(out.shape))
    o = call.input.detach().float()
    if o.numel() == 0:
        return skipped("the loss got an empty tensor")
    name = _NAMES.get(call.name, call.name)
    last, module = _last_leaf(trace)
    last_type = type(module).__name__ if module is not None else None
    producer = call.producer
    data = dict(loss=name, loss_function=call.name, loss_where=call.where, last_module=last.path if last else None,
                last_type=last_type, output_shape=list(o.shape), out_min=float(o.min()), out_max=float(o.max()),
                producer=producer.describe() if producer else None, via="train_step" if target.user_train_step else "loss_fn",
                loss_raised=first_line(error) if error is not None else None)
    if producer is not None:
        where = f"the loss input comes from {producer.describe()}"
    elif last is not None:
        where = f"the model's last module call is {last_type} '{last.path}'"
    else:
        where = "the model's output"
    normalised = producer.op if producer else ("softmax" if isinstance(module, nn.Softmax) else
                                               "log_softmax" if isinstance(module, nn.LogSoftmax) else
                                               "sigmoid" if isinstance(module, nn.Sigmoid) else None)
    in01 = bool(((o >= 0) & (o <= 1)).all())
    rows_sum_one = o.dim() >= 2 and o.shape[1] > 1 and in01 and bool(((o.sum(1) - 1).abs() < 1e-3).all())
    data["rows_sum_to_one"] = rows_sum_one
    data["zero_share"] = round(float((o == 0).float().mean()), 4)
    spread = float(o.max() - o.min())
    # constants: a normalisation over a dimension of size 1, one class score, or one value everywhere
    if producer is not None and producer.op in ("softmax", "log_softmax") and producer.size == 1:
        value = 1.0 if producer.op == "softmax" else 0.0
        return failed("softmax-size1", f"{where}: dimension {producer.dim} has size 1 (input shape "
                      f"{list(o.shape)} at the loss), so every value is exactly {value:g} and {name} gets a constant "
                      f"that carries no gradient back to the model", **data)
    if call.kind == "class" and o.dim() >= 2 and o.shape[1] == 1:
        return failed("single-class", f"{name} gets outputs {list(o.shape)}: one score per sample in the class "
                      f"dimension (1), so log_softmax over it is 0 and the loss is 0 whatever the model predicts; "
                      f"{where}", **data)
    data["constant"] = o.numel() > 1 and spread == 0.0
    # constant after a normalising op: the op made it so (a constant straight out of the layers, e.g.
    # dead ReLUs before a bias, is the activation audits' finding, not a mismatch with the loss)
    if data["constant"] and producer is not None:
        return failed("constant", f"every one of the {o.numel()} values reaching {name} is {float(o.flatten()[0]):.4g} "
                      f"(shape {list(o.shape)}): the loss input does not depend on the sample or the output; {where}", **data)
    if o.dim() >= 2 and o.shape[1] > 1 and not rows_sum_one and call.kind == "class":
        # normalised over another dimension (softmax(dim=0) written for a single sample): the columns,
        # not the rows, sum to one (or their logsumexp is zero)
        for dim in [d for d in range(o.dim()) if d != 1 and o.shape[d] > 1]:
            sums = o.sum(dim) if in01 else torch.logsumexp(o, dim)
            goal = 1.0 if in01 else 0.0
            if bool(((sums - goal).abs() < 1e-3).all()):
                data["normalised_dim"] = dim
                what = "softmax" if in01 else "log_softmax"
                return failed("other-dim", f"the outputs {list(o.shape)} are a {what} over dimension {dim}, not over the "
                              f"classes (dimension 1): each class score is normalised across the samples of the batch", **data)
    if call.name == "cross_entropy":
        if rows_sum_one or normalised == "softmax":
            c = o.shape[1]
            floor = math.log(1 + (c - 1) / math.e)  # CE of softmax(p) when p is one-hot: the best it can do
            data.update(classes=c, loss_floor=round(floor, 4))
            ratio = _softmax_grad_ratio(o, call.target)
            if ratio is not None:
                data["grad_ratio"] = round(ratio, 4)
            grad = f"; the gradient reaching the logits is {ratio:.2f}x what it would be" if ratio is not None else ""
            return failed("double-softmax", f"{where} and its outputs are probabilities (rows sum to 1, range "
                          f"[{data['out_min']:.3g}, {data['out_max']:.3g}]); {name} applies log_softmax again, so the loss "
                          f"cannot fall below ln(1 + {c - 1}/e) = {floor:.3f} even when every prediction is right{grad}", **data)
        if _clamped(o, module, data["zero_share"]):
            return failed("clamped-logits", f"{where}: none of the {o.numel()} logits is below 0 and "
                          f"{data['zero_share']:.0%} are exactly 0 (a ReLU or clamp after the last layer); {name} needs "
                          f"unbounded logits: a class score can never go negative, so the model can only raise the right "
                          f"class, and the scores held at 0 pass no gradient", **data)
        if normalised in ("sigmoid", "tanh") or isinstance(module, (nn.Sigmoid, nn.Tanh)):
            return failed("squashed-logits", f"{where}: the logits are squashed into [{data['out_min']:.3g}, "
                          f"{data['out_max']:.3g}] before {name}, which needs unbounded logits", **data)
        note = "; a log_softmax before it is harmless (log_softmax is idempotent)" if normalised == "log_softmax" else ""
        return passed(f"{where}; outputs in [{data['out_min']:.3g}, {data['out_max']:.3g}]: logits for {name}{note}", **data)
    if call.name == "nll_loss":
        lse = torch.logsumexp(o, 1) if o.dim() >= 2 else o
        data["max_logsumexp"] = float(lse.abs().max())
        if rows_sum_one or normalised == "softmax":
            return failed("probs-to-nll", f"{where}: NLLLoss gets probabilities (rows sum to 1) but needs "
                          f"log-probabilities; it minimises -p[y], bounded at -1, with tiny gradients", **data)
        if float(lse.abs().max()) > 1e-3:
            return failed("logits-to-nll", f"{where}: outputs in [{data['out_min']:.3g}, {data['out_max']:.3g}] with "
                          f"logsumexp per row up to {data['max_logsumexp']:.3g} (log-probabilities give 0): NLLLoss on raw "
                          f"logits just pushes one logit up without bound (the loss goes negative)", **data)
        return passed(f"{where}: log-probabilities (logsumexp per row 0) for NLLLoss", **data)
    if call.name == "binary_cross_entropy":
        if not in01:
            outside = int(((o < 0) | (o > 1)).sum())
            data["outside"] = outside
            kind = "log-probabilities" if float(o.max()) <= 0 else "logits"
            return failed("logits-to-bce", f"{where}: {outside} of {o.numel()} values outside [0, 1] (range "
                          f"[{data['out_min']:.3g}, {data['out_max']:.3g}]: {kind}): BCELoss needs probabilities and raises "
                          f"(or, on CUDA, hits a device-side assert); give logits to BCEWithLogitsLoss", **data)
        return passed(f"{where}: probabilities in [{data['out_min']:.3g}, {data['out_max']:.3g}] for BCELoss", **data)
    if call.name == "binary_cross_entropy_with_logits":
        if normalised in ("logsigmoid", "log_softmax") or (float(o.max()) <= 0 and normalised is not None):
            return failed("logprobs-to-logits", f"{where}: log-probabilities in [{data['out_min']:.3g}, "
                          f"{data['out_max']:.3g}] go into BCEWithLogitsLoss, which reads them as logits: every "
                          f"prediction is below 0.5", **data)
        if _clamped(o, module, data["zero_share"]):
            return failed("clamped-logits", f"{where}: none of the {o.numel()} logits is below 0 and "
                          f"{data['zero_share']:.0%} are exactly 0 (a ReLU or clamp after the last layer): no prediction "
                          f"of {name} can fall below probability 0.5, and the logits held at 0 pass no gradient", **data)
        if normalised in ("sigmoid", "softmax") or (in01 and o.numel() >= 16 and float(o.min()) > 0):
            return failed("double-sigmoid", f"{where}: outputs already in [{data['out_min']:.3g}, {data['out_max']:.3g}] "
                          f"go into BCEWithLogitsLoss, which applies sigmoid again (predictions stuck between 0.5 and 0.73)", **data)
        return passed(f"{where}; logits in [{data['out_min']:.3g}, {data['out_max']:.3g}] for BCEWithLogitsLoss", **data)
    return passed(f"{where}; {name}: no output convention to check", **data)


CLAMPED_ZEROS = 0.1    # share of exact zeros, none below, that marks logits clamped by a ReLU


def clamped(x: torch.Tensor, zeros: float) -> bool:
    """Logits clamped at 0 from below (a ReLU or clamp after the last layer): none negative, and at least
    CLAMPED_ZEROS of them (``zeros``: their share of exact zeros) held at 0. Script mode's trace-loss-input too."""
    return float(x.min()) >= 0 and zeros >= CLAMPED_ZEROS


def _clamped(o: torch.Tensor, module, zeros: float) -> bool:
    """Module mode: clamped logits, or none negative straight out of a final ReLU (16 values or more to judge by share)."""
    if float(o.min()) < 0:
        return False
    return isinstance(module, (nn.ReLU, nn.ReLU6)) or (o.numel() >= 16 and clamped(o, zeros))


def _softmax_grad_ratio(probs: torch.Tensor, targets: torch.Tensor | None) -> float | None:
    """Gradient norm at the logits through softmax + cross-entropy, over the norm through
    cross-entropy alone, for the logits these probabilities imply (softmax(log p) = p)."""
    if targets is None:
        return None
    try:
        z = probs.float().clamp_min(1e-12).log().detach().requires_grad_(True)
        g_double = torch.autograd.grad(F.cross_entropy(torch.softmax(z, 1), targets), z)[0]
        z2 = z.detach().clone().requires_grad_(True)
        g_single = torch.autograd.grad(F.cross_entropy(z2, targets), z2)[0]
        return float(g_double.norm() / g_single.norm().clamp_min(1e-12))
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------------------------- shape-audit
def _pair(v):
    return v if isinstance(v, (tuple, list)) else (v, v)


def _arithmetic(module: nn.Module, shape: list | None) -> str:
    """The output-size formula of a convolution or pooling layer, filled in with the real sizes."""
    if shape is None or len(shape) < 3:
        return ""
    spatial = shape[2:]
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
                           nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)):
        n = len(spatial)
        k = _pair(module.kernel_size) if n == 2 else (module.kernel_size if isinstance(module.kernel_size, tuple) else (module.kernel_size,) * n)
        s = module.stride if isinstance(module.stride, tuple) else (module.stride or module.kernel_size,) * n
        s = s if isinstance(s, tuple) else (s,) * n
        p = module.padding if isinstance(module.padding, tuple) else (module.padding,) * n
        d = getattr(module, "dilation", 1)
        d = d if isinstance(d, tuple) else (d,) * n
        if isinstance(p[0], str):
            return f"padding={p[0]!r}"
        parts = []
        for size, kk, ss, pp, dd in zip(spatial, k, s, p, d):
            kk = kk[0] if isinstance(kk, tuple) else kk
            out = (size + 2 * pp - dd * (kk - 1) - 1) // ss + 1
            parts.append(f"({size}+2*{pp}-{dd}*({kk}-1)-1)//{ss}+1={out}")
        return "; ".join(parts)
    return ""


def _explain_linear(module: nn.Linear, got: int, calls, index: int, modules) -> str:
    """Why a Linear after a Flatten sees the wrong number of features: the map that was flattened."""
    for call in reversed(calls[:index]):
        if call.output and len(call.output) >= 3 and not isinstance(modules.get(call.path), (nn.Flatten,)):
            c, rest = call.output[1], call.output[2:]
            made = " x ".join(str(v) for v in [c, *rest])
            text = f"the flattened {call.type} '{call.path}' output {call.output[1:]} gives {made} = {got} features"
            need = module.in_features
            if need % c == 0:
                per = need // c
                side = math.isqrt(per)
                if len(rest) == 2 and side * side == per:
                    text += (f", but in_features = {need} = {c} x {side} x {side} expects a {side}x{side} map "
                             f"where the layers before produce {rest[0]}x{rest[1]}")
                else:
                    text += f", but in_features = {need} = {c} x {per}"
            else:
                text += f", but in_features = {need}"
            unpadded = [p for p, m in modules.items() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
                        and not isinstance(m.padding, str) and all(v == 0 for v in _pair(m.padding))
                        and any(v > 1 for v in _pair(m.kernel_size))]
            if unpadded:
                text += f" (convolution{'s' if len(unpadded) > 1 else ''} {', '.join(repr(u) for u in unpadded)} have no padding and shrink the map)"
            return text
    return f"it receives {got} features but in_features = {module.in_features}"


@probe(
    "shape-audit",
    title="Per-layer shape table; the first layer whose input does not fit; silent broadcasting in the loss",
    outcomes={
        "ok": "every layer's input fits and outputs pair one-to-one with targets",
        "layer-mismatch": "a layer raised on an input of the wrong shape",
        "forward-error": "the forward pass raised for another reason",
        "broadcast": "outputs and targets of different shapes broadcast silently in the loss",
        "loss-shape": "the loss raised on the shapes of outputs and targets",
    },
    timeout_s=60,
)
def shape_audit(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed).train()
    inputs, targets = target.batch()
    files = user_source_files(target)
    data = {"input_shape": list(inputs.shape) if hasattr(inputs, "shape") else None, "target_shape": list(targets.shape)}
    error = None
    with trace_modules(model) as trace:
        try:
            with torch.no_grad():
                out = model(inputs)
        except Exception as exc:
            error = exc
    calls = trace.calls
    leaf = lambda c: not any(True for _ in trace.modules[c.path].children()) if c.path in trace.modules else True  # noqa: E731
    shown = [i for i, c in enumerate(calls) if leaf(c) or c.raised]
    bad_index = next((i for i, c in enumerate(calls) if c.raised), None)
    rows, marked = [], []
    for r, i in enumerate(shown):
        c = calls[i]
        module = trace.modules.get(c.path)
        expects = expected_input(module) if module is not None else None
        rows.append([c.path, c.type, c.input, "raised" if c.raised else c.output, _arithmetic(module, c.input) if module is not None else "",
                     expects or ""])
        if c.raised:
            marked.append(r)
    table = Table("layer-shapes", "Layer input and output shapes (one real batch)",
                  ["module", "type", "input", "output", "size arithmetic", "expects"], rows, marked)
    data["layers"] = len(rows)
    if error is not None:
        data.update(error=first_line(error), kind=error_kind(error), where=user_frame(error, files))
        if bad_index is None:
            return failed("forward-error", f"forward raised outside any module: {data['error']}", [table], **data)
        bad = calls[bad_index]
        module = trace.modules.get(bad.path)
        expects = expected_input(module) if module is not None else None
        data.update(layer=bad.path, layer_type=bad.type, layer_input=bad.input, expects=expects)
        if data["kind"] == "shape" and bad.input:
            if isinstance(module, nn.Linear):
                got = bad.input[-1]
                data.update(got=got, expected=module.in_features)
                why = _explain_linear(module, got, calls, bad_index, trace.modules)
            elif isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and len(bad.input) >= 2:
                data.update(got=bad.input[1], expected=module.in_channels)
                why = f"its input has {bad.input[1]} channels in dimension 1 but in_channels = {module.in_channels}"
            elif isinstance(module, (nn.RNNBase,)):
                data.update(got=bad.input[-1], expected=module.input_size)
                why = f"its input has {bad.input[-1]} features in the last dimension but input_size = {module.input_size}"
            else:
                why = f"it expects {expects}" if expects else data["error"]
            data["why"] = why
            return failed("layer-mismatch", f"first layer whose input does not fit: {bad.type} '{bad.path}' got "
                          f"{bad.input}: {why}", [table], **data)
        return failed("forward-error", f"{bad.type} '{bad.path}' raised on input {bad.input}: {data['error']}", [table], **data)
    if not isinstance(out, torch.Tensor):
        return passed(f"{len(rows)} layers ran; the output is not a single tensor", artifacts=[table], **data)
    out_shape, tgt_shape = list(out.shape), list(targets.shape)
    data["output_shape"] = out_shape
    elementwise = isinstance(target.loss_fn, ELEMENTWISE) or target.task in ("regression", "binary")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.no_grad():
                loss = target.loss_fn(out, targets)
        except Exception as exc:
            data.update(error=first_line(exc), kind=error_kind(exc))
            if data["kind"] == "shape":
                return failed("loss-shape", f"the loss raised on outputs {out_shape} and targets {tgt_shape}: {data['error']}",
                              [table], **data)
            return cannot_run(f"{len(rows)} layers fit; the loss raised ({data['error']}), so broadcasting in it could not be checked",
                              reason="raised", **data)
    if caught:
        data["loss_warning"] = str(caught[0].message)[:200]
    if elementwise and out_shape != tgt_shape:
        try:
            broadcast = list(torch.broadcast_shapes(tuple(out_shape), tuple(tgt_shape)))
        except RuntimeError:
            broadcast = None
        if broadcast is not None and math.prod(broadcast) > max(math.prod(out_shape), math.prod(tgt_shape)):
            data["broadcast_shape"] = broadcast
            data["loss_broadcast"] = float(loss.detach().float().mean())
            if out.numel() == targets.numel():
                with torch.no_grad():
                    data["loss_paired"] = float(target.loss_fn(out.reshape(targets.shape), targets).float().mean())
            paired = (f"; paired one-to-one the same outputs give {data['loss_paired']:.4g} instead of "
                      f"{data['loss_broadcast']:.4g}") if "loss_paired" in data else ""
            return failed("broadcast", f"output {out_shape} and target {tgt_shape} broadcast to {broadcast} inside "
                          f"{type(target.loss_fn).__name__}: each prediction is compared with all {tgt_shape[0]} targets, "
                          f"so the best the model can learn is their mean{paired}", [table], **data)
    return passed(f"{len(rows)} layers fit; output {out_shape} against target {tgt_shape}", artifacts=[table], **data)
