"""Read an exception raised by the user's training code into a diagnosis: which hypothesis it is
evidence for, the operation that raised, the shapes / dtypes / devices of the tensors it got, and the
user's own file:line. Shared by the probes (``training-crash``) and by script mode, which calls it on
the exception a crashed script raised. Also the coarser kinds the probes name in their outcomes
(:func:`error_kind`) and what a layer expects of its input (:func:`expected_input`).

    from nnwizard.probes._crash import classify_exception, shadowed_methods

    try:
        train(...)
    except Exception as exc:
        c = classify_exception(exc, model=model, loss_fn=loss_fn, files=[Path("train.py")], targets=y)
        c.hypothesis   # "op-shape-mismatch" (a catalog id) or None when it fits none
        c.sentence     # one evidence sentence with the op, operands, file:line and message
        c.as_dict()    # JSON-safe

The reading uses the traceback only (message, frames and the locals of the frame that raised), so it
works after the fact; it never re-runs the user's code.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nnwizard.record import LOSS_FUNCTIONS
from nnwizard.record.frames import UserCode, first_line, site, tb_frames

CLASS_LOSSES = {"cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss"}

# nn.Module methods a subclass may override only with a compatible signature (``forward`` and the
# hooks meant to be overridden are not listed). A user ``train(self, x, y)`` breaks ``model.train()``.
MODULE_METHODS = sorted(
    name for name, value in vars(nn.Module).items()
    if callable(value) and not name.startswith("_") and name not in {"forward", "extra_repr", "reset_parameters"}
)

_PATTERNS: list[tuple[str, str]] = [
    # torch.tensor(...) given tensors of several elements: it converts each to a Python number
    ("tensor-list", r"only one element tensors can be converted to Python scalars"),
    ("rnn-hidden", r"Expected hidden(\[\d\])? size \(\d+, \d+, \d+\), got \[\d+, \d+, \d+\]"),
    ("inplace", r"modified by an inplace operation"),
    ("second-backward", r"backward through the graph a second time|saved tensors after they have already been freed"),
    ("no-grad", r"does not require grad|does not have a grad_fn"),
    ("empty-params", r"optimizer got an empty parameter list"),
    ("device", r"same device|Expected all tensors to be on the same|is not on the expected device|"
               r"Input type \(.*\) and weight type \(.*\) should be the same|expected device|device type .* but got|"
               r"must be on the same device|found at least two devices|cuda.*and.*cpu|cpu.*and.*cuda"),
    ("loss-input", r"elements of input should be between 0 and 1|input should be between 0 and 1"),
    ("label-range", r"out of bounds|index .* is out of range|device-side assert|Assertion .t >= 0|"
                    r"index out of range in self"),
    ("dtype", r"expected scalar type|Expected .*Long|not implemented for '(Float|Int|Long|Half|Bool|Byte|Double)'|"
              r"expected .*dtype|Found dtype|must have the same dtype|expected both .* same dtype|"
              r"could not infer output dtype|Input dtype must be|result type .* can't be cast|"
              r"only Tensors of floating point|must be a floating point|Expected .* (Float|Double|floating)|"
              r"dtype .* but got"),
    ("shape", r"shapes cannot be multiplied|size mismatch|must match the size|Expected input batch_size|"
              r"expected input\[|Given groups=|doesn't match the broadcast shape|invalid for input of size|"
              r"Expected .* dimensions|expected .*D .* input|input.size\(-1\) must be equal|"
              r"Target size .* must be the same as input size|Using a target size|shape .* is invalid|"
              r"number of dims|Expected target size|dimension out of range|mismatch in shape|same number of dim|"
              r"Sizes of tensors must match|stack expects each tensor|tensors expected, but got|"
              r"inconsistent tensor size|view size is not compatible|multi-target not supported|"
              r"target tensor expected|cannot be broadcast|must match except in dimension|size of tensor a|"
              r"mat1 and mat2|Expected size|expected .* to have .* elements|is not broadcastable|"
              r"the number of sizes provided|Dimension out of range|match the existing size|"
              r"1D tensors expected|both arguments to|unflatten|incompatible"),
]


def crash_kind(exc: BaseException) -> str:
    """The kind of failure ``exc`` is, read from its type and message (the finer reading of a crash)."""
    text = f"{type(exc).__name__}: {exc}"
    for kind, pattern in _PATTERNS:
        if re.search(pattern, text, re.IGNORECASE):
            return kind
    if isinstance(exc, AttributeError):
        return "attribute"
    if isinstance(exc, TypeError) and re.search(r"\w+\(\) (missing|takes|got an unexpected)", str(exc)):
        return "call"
    return "other"


# ------------------------------------------------------------------------------------ static check
@dataclass
class Shadow:
    cls: str
    name: str
    where: str | None
    signature: str
    why: str


def _compatible(override, base) -> str | None:
    """None when ``override`` can be called every way nn.Module's ``base`` can; else why not."""
    if not callable(override):
        return f"it is a {type(override).__name__}, not a method"
    try:
        sig, base_sig = inspect.signature(override), inspect.signature(base)
    except (TypeError, ValueError):
        return None
    base_params = [p for p in list(base_sig.parameters.values())[1:] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in base_params if p.default is p.empty]
    trials = [[object()] * len(required), [object()] * len(base_params)]
    for args in trials:
        try:
            sig.bind(object(), *args)
        except TypeError as exc:
            return f"nn.Module.{base.__name__}{base_sig} cannot call it: {exc}"
    return None


def shadowed_methods(model: nn.Module) -> list[Shadow]:
    """Attributes of the user's Module subclasses (class or instance) that override an nn.Module
    method with something that cannot be called the way nn.Module and training loops call it."""
    found: list[Shadow] = []
    seen: set[tuple[type, str]] = set()
    for module in model.modules():
        cls = type(module)
        if cls.__module__.startswith("torch."):
            continue
        owners = [c for c in cls.__mro__ if c is not nn.Module and issubclass(c, nn.Module) and not c.__module__.startswith("torch.")]
        for name in MODULE_METHODS:
            base = getattr(nn.Module, name)
            holder = next((c for c in owners if name in vars(c)), None)
            value = vars(holder)[name] if holder is not None else module.__dict__.get(name)
            if value is None or (holder or cls, name) in seen:
                continue
            seen.add((holder or cls, name))
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            why = _compatible(value, base)
            if why is None:
                continue
            where = None
            try:
                src = inspect.getsourcefile(value)
                line = inspect.getsourcelines(value)[1]
                where = f"{Path(src).name}:{line}"
            except (TypeError, OSError):
                pass
            try:
                signature = f"{name}{inspect.signature(value)}"
            except (TypeError, ValueError):
                signature = f"{name} = {type(value).__name__}"
            found.append(Shadow((holder or cls).__name__, name, where, signature, why))
    return found


# ------------------------------------------------------------------------------------- reading it
@dataclass
class Operand:
    name: str
    shape: list[int] | None
    dtype: str | None
    device: str | None

    def describe(self) -> str:
        if self.shape is None:
            return self.name
        return f"{self.name} {self.dtype}{self.shape} on {self.device}"


@dataclass
class Classification:
    hypothesis: str | None          # a catalog id, None when the exception fits none
    kind: str                       # shape | dtype | device | label-range | inplace | no-grad | ... | other
    op: str | None                  # the operation that raised: "torch.cat", "Linear 'fc2'", "CrossEntropyLoss"
    phase: str                      # forward | loss | backward | step | evaluate | other
    where: str | None               # the user's file:line in function
    code: str | None                # that line's source
    exception: str                  # "RuntimeError: first line of the message"
    operands: list[Operand] = field(default_factory=list)
    sentence: str = ""
    subject: str | None = None      # the variable the fix names (a list of tensors handed to torch.tensor)

    @property
    def shapes(self) -> list:
        return [o.shape for o in self.operands if o.shape is not None]

    @property
    def dtypes(self) -> list:
        return [o.dtype for o in self.operands if o.dtype is not None]

    @property
    def devices(self) -> list:
        return sorted({o.device for o in self.operands if o.device is not None})

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(shapes=self.shapes, dtypes=self.dtypes, devices=self.devices)
        return out


def _statement(filename: str, lineno: int) -> str | None:
    line = linecache.getline(filename, lineno).strip()
    return _code_only(line) if line else None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value) if isinstance(node.value, (ast.Name, ast.Attribute)) else "(...)"
        return f"{head}.{node.attr}" if head else None
    return None


def _parse(code: str) -> ast.AST | None:
    text = code.rstrip(":").strip()
    for candidate in (text, text + ")", text + "))", text + "]"):
        try:
            return ast.parse(candidate)
        except SyntaxError:
            continue
    return None


def _resolve(path: str, frame) -> Any:
    head, *rest = path.split(".")
    if head in frame.f_locals:
        value = frame.f_locals[head]
    elif head in frame.f_globals:
        value = frame.f_globals[head]
    else:
        return None
    for part in rest:
        try:
            value = inspect.getattr_static(value, part) if not isinstance(value, nn.Module) else getattr(value, part)
        except AttributeError:
            return None
        if isinstance(value, property):
            return None
    return value


def _describe_tensor(name: str, value: Any) -> Operand | None:
    if isinstance(value, torch.Tensor):
        return Operand(name, list(value.shape), str(value.dtype).replace("torch.", ""), str(value.device))
    return None


# what a message says about the op that raised it, for picking the call on the line
_OP_HINTS = [
    (r"Sizes of tensors must match except|must match except in dimension", ("cat", "concat", "concatenate", "hstack", "vstack")),
    (r"stack expects", ("stack",)),
    (r"1D tensors expected", ("dot", "vdot", "inner")),
    (r"invalid for input of size|view size is not compatible", ("view", "reshape", "flatten", "unflatten")),
    (r"shapes cannot be multiplied|mat1 and mat2", ("matmul", "mm", "bmm", "linear", "addmm", "einsum")),
    (r"^(\w+)\(\)", ()),
]


_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.MatMult: "@", ast.Pow: "**", ast.FloorDiv: "//",
           ast.Mod: "%"}


def _code_only(line: str) -> str:
    """The line without a trailing comment (when what is left still parses)."""
    if "#" in line:
        head = line[:line.index("#")].rstrip()
        if head and _parse(head) is not None:
            return head
    return line


def _pick_call(calls: list[str], message: str) -> str | None:
    if not calls:
        return None
    for pattern, names in _OP_HINTS:
        m = re.search(pattern, message)
        if not m:
            continue
        names = names or (m.group(1),)
        for call in calls:
            if call.split(".")[-1] in names:
                return call
    return calls[-1]  # ast.walk is breadth first: the last call is the innermost one


def _shown(call: str | None) -> str | None:
    """A method called on an expression reads as Tensor.<method>."""
    return f"Tensor.{call[len('(...).'):]}" if call and call.startswith("(...).") else call


def _operands(code: str | None, frame, message: str = "") -> tuple[list[Operand], str | None]:
    """The tensors named on the line that raised (locals, attributes of locals), and the call on it."""
    if not code or frame is None:
        return [], None
    tree = _parse(code)
    if tree is None:
        return [], None
    names, calls, binops = [], [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = _dotted(node.func)
            # a module call that had started would have left its own frames below this one
            if func and not isinstance(_resolve(func, frame), nn.Module):
                calls.append(func)
        if isinstance(node, ast.BinOp):
            binops.append(_BINOPS.get(type(node.op), "arithmetic"))
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(getattr(node, "ctx", None), ast.Load):
            dotted = _dotted(node)
            if dotted and dotted not in names and not dotted.startswith("(...)"):
                names.append(dotted)
    operands = []
    for name in names:
        value = _resolve(name, frame)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value[:8]):
            operands += [op for i, v in enumerate(value[:4]) if (op := _describe_tensor(f"{name}[{i}]", v))]
            continue
        op = _describe_tensor(name, value)
        if op is not None and not any(o.name.startswith(name + ".") for o in operands):
            operands.append(op)
        if len(operands) >= 6:
            break
    # a bare "h" is an attribute chain's head: keep the longest names that are tensors
    operands = [o for o in operands if not any(p.name != o.name and p.name.startswith(o.name + ".") for p in operands)]
    call = _shown(_pick_call(calls, message))
    if binops and (call is None or re.search(r"size of tensor a|device|broadcast", message, re.IGNORECASE)):
        call = f"`{binops[-1]}`"
    return operands, call


def _module_paths(model: nn.Module | None) -> dict[int, str]:
    if model is None:
        return {}
    try:
        return {id(m): (p or "(model)") for p, m in model.named_modules()}
    except Exception:  # noqa: BLE001 - a model whose named_modules is shadowed
        return {}


def _phase(frames, given: str | None) -> str:
    if given:
        return given
    names = [(f.f_code.co_filename, f.f_code.co_name) for f, _ in frames]
    if any(n == "backward" and ("/torch/_tensor.py" in p or "/torch/autograd/" in p) for p, n in names):
        return "backward"
    if any("/torch/optim/" in p and n == "step" for p, n in names):
        return "step"
    if any("/torch/optim/" in p for p, _ in names):
        return "optimizer"
    if any(n in LOSS_FUNCTIONS for _, n in names) or any("/torch/nn/modules/loss.py" in p for p, _ in names):
        return "loss"
    if any(n == "_call_impl" for _, n in names):
        return "forward"
    return "other"


DDP_UNUSED = "Expected to have finished reduction in the prior iteration"


def ddp_unused_names(message: str, names: list[str] | None) -> list[str]:
    """The parameters DistributedDataParallel's reducer says got no gradient: named in the message
    (TORCH_DISTRIBUTED_DEBUG=INFO), else its indices mapped through ``names`` (the wrapped module's trainable
    parameters in DDP's order)."""
    m = re.search(r"Parameters which did not receive grad for rank \d+: ([^\n]+)", message)
    if m:
        return [n.strip() for n in m.group(1).split(",") if n.strip()]
    m = re.search(r"Parameter indices which did not receive grad for rank \d+: ([\d ]+)", message)
    if not m:
        return []
    indices = [int(i) for i in m.group(1).split()]
    return [names[i] if names and i < len(names) else f"parameter #{i}" for i in indices]


def ddp_unused_detail(message: str, frames=()) -> str:
    """DistributedDataParallel's unused-parameter error read in the program's terms."""
    ddp = next((f.f_locals.get("self") for f, _ in frames if "/torch/nn/parallel/distributed.py" in f.f_code.co_filename
                and type(f.f_locals.get("self")).__name__ == "DistributedDataParallel"), None)
    names = None
    if ddp is not None:
        ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
        names = [n for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignored]
    unused = ddp_unused_names(message, names)
    which = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "") if unused else "some parameters"
    return (f"DistributedDataParallel waits for a gradient of every parameter it wraps, and {which} received none in the "
            f"previous backward, so its next forward raised; pass find_unused_parameters=True to "
            f"DistributedDataParallel(...), or remove (or use) the branch those parameters belong to")


def classify_exception(exc: BaseException, *, model: nn.Module | None = None, loss_fn: Any = None,
                       files: list[Path] | None = None, inputs: Any = None, targets: Any = None,
                       phase: str | None = None) -> Classification:
    """Classify ``exc`` (raised by the user's training code) into a hypothesis; see the module
    docstring. ``model``, ``loss_fn``, ``targets`` sharpen the reading (parameter counts, which loss,
    the targets' dtype and shape); ``files`` are the user's source files (else: anything outside
    torch, site-packages and nnwizard counts as the user's); ``phase`` overrides the phase read from
    the traceback."""
    user = UserCode(files)
    frames = tb_frames(exc)
    kind = crash_kind(exc)
    message = first_line(exc)
    # the user's innermost frame, and the torch layer / loss running below it
    user_index = user.user_index(frames)
    if user_index is None:  # nnwizard's own reference loop called torch: the innermost non-torch frame
        for i in range(len(frames) - 1, -1, -1):
            if "site-packages" not in frames[i][0].f_code.co_filename and "/torch/" not in frames[i][0].f_code.co_filename:
                user_index = i
                break
    frame, lineno = frames[user_index] if user_index is not None else (None, None)
    mine = frame is not None and user.is_user(frame.f_code.co_filename)
    where = site(frame.f_code.co_filename, lineno, frame.f_code.co_name) if mine else None
    code = _statement(frame.f_code.co_filename, lineno) if frame is not None else None
    operands, call = _operands(code, frame, str(exc).strip())
    paths = _module_paths(model)
    layer = loss_module = None
    loss_function = None
    for f, _ in frames[(user_index or 0):]:
        name = f.f_code.co_name
        filename = f.f_code.co_filename
        this = f.f_locals.get("self")
        if "/torch/nn/modules/" in filename and name == "forward" and isinstance(this, nn.Module):
            if isinstance(this, nn.modules.loss._Loss):
                loss_module = loss_module or this
            elif layer is None or not any(True for _ in this.children()):
                layer = this  # the innermost built-in layer that was running
        if "/torch/nn/functional.py" in filename and name in LOSS_FUNCTIONS:
            loss_function = loss_function or name
    phase_name = _phase(frames, phase)
    if loss_module is not None or loss_function is not None:
        op = type(loss_module).__name__ if loss_module is not None else f"F.{loss_function}"
    elif layer is not None:
        op = f"{type(layer).__name__} '{paths.get(id(layer), type(layer).__name__)}'"
    else:
        op = call
    is_loss = loss_module is not None or loss_function is not None
    loss_name = type(loss_module).__name__ if loss_module is not None else (loss_function or type(loss_fn).__name__ if loss_fn is not None else "")
    t = targets if isinstance(targets, torch.Tensor) else None

    n_params = n_trainable = None
    if model is not None:
        try:
            params = list(model.parameters())
            n_params, n_trainable = sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)
        except Exception:  # noqa: BLE001
            pass
    shadows = []
    if model is not None and kind in ("call", "attribute", "other"):
        try:
            shadows = shadowed_methods(model)
        except Exception:  # noqa: BLE001
            shadows = []

    hypothesis, detail, subject = None, "", None
    if kind == "tensor-list":
        hypothesis, detail, subject = _tensor_list(code, frame)
    elif kind == "inplace":
        hypothesis = "inplace-modification"
    elif kind == "second-backward":
        hypothesis = "graph-retained"
    elif kind == "no-grad":
        if n_params == 0:
            hypothesis, detail = "no-parameters", "the model has no parameters at all"
        elif n_trainable == 0:
            hypothesis, detail = "frozen-parameters", f"none of its {n_params:,} parameters requires grad"
        else:
            hypothesis, detail = "disconnected-parameters", "the loss has no path back to any trainable parameter"
    elif kind == "empty-params" or (n_params == 0 and kind in ("attribute", "other", "call")):
        hypothesis, detail = "no-parameters", (f"{type(model).__name__} has no parameters" if model is not None else "")
    elif kind == "device":
        hypothesis = "device-mismatch"
    elif kind == "loss-input":
        hypothesis, detail = "loss-output-mismatch", "the loss needs probabilities in [0, 1] and got values outside (logits?)"
    elif kind == "label-range":
        hypothesis = "labels-out-of-range" if (is_loss or "Target" in str(exc) or phase_name == "loss") else None
        if hypothesis is None and isinstance(layer, nn.Embedding):
            hypothesis, detail = "labels-out-of-range", f"an index reached Embedding with {layer.num_embeddings} rows"
        elif hypothesis is None:
            hypothesis = "op-shape-mismatch"
    elif kind == "dtype":
        target_dtype = t is not None and (any(o.dtype == str(t.dtype).replace("torch.", "") and o.shape == list(t.shape)
                                               for o in operands) or is_loss)
        text = str(exc)
        if is_loss and t is not None and (("Long" in text and t.is_floating_point()) or
                                          ("Float" in text or "Double" in text) and not t.is_floating_point()
                                          or "target" in text.lower()):
            hypothesis = "labels-wrong-dtype"
        elif phase_name == "backward" and t is not None and not t.is_floating_point() and "Found dtype" in text:
            hypothesis, detail = "labels-wrong-dtype", f"the targets are {str(t.dtype).replace('torch.', '')}"
        elif is_loss and target_dtype:
            hypothesis = "labels-wrong-dtype"
        else:
            hypothesis = "dtype-mismatch"
    elif kind == "rnn-hidden":
        m = re.search(r"Expected hidden(?:\[\d\])? size \((\d+), (\d+), (\d+)\), got \[(\d+), (\d+), (\d+)\]", str(exc))
        wanted, given = int(m.group(2)), int(m.group(5))
        hypothesis = "layer-shape-mismatch"
        if isinstance(layer, nn.RNNBase) and not layer.batch_first and wanted != given:
            # the script built the hidden state for a batch of `given` (its input's dim 0); the layer, built
            # without batch_first, reads dim 1 of that input as the batch: (batch, time, features) data
            hypothesis, detail = "axes-swapped", (f"{type(layer).__name__} without batch_first=True reads dim 1 of its "
                                                  f"input as the batch ({wanted}), but the hidden state was made for a "
                                                  f"batch of {given}: the input is laid out (batch, time, features); build "
                                                  f"the layer with batch_first=True")
    elif kind == "shape":
        if is_loss:
            hypothesis = "target-shape-mismatch"
            if t is not None:
                detail = f"targets {str(t.dtype).replace('torch.', '')}{list(t.shape)}"
                if loss_name in CLASS_LOSSES and t.dim() >= 2 and t.shape[-1] == 1 and not t.is_floating_point():
                    detail += f": class ids shaped {list(t.shape)}; {loss_name} wants shape {list(t.shape[:-1])}"
            if inputs is not None and isinstance(inputs, torch.Tensor) and t is not None and inputs.dim() and t.dim() and inputs.shape[0] == t.shape[0]:
                # the targets pair with the inputs; an output whose batch differs was reshaped wrongly
                m = re.search(r"input batch_size \((\d+)\) to match target batch_size \((\d+)\)", str(exc))
                if m and int(m.group(2)) == t.shape[0] and int(m.group(1)) != t.shape[0]:
                    hypothesis, detail = "op-shape-mismatch", (f"the outputs hold {m.group(1)} rows for {t.shape[0]} targets: "
                                                               f"a view/reshape in the forward mixed the batch dimension")
        elif layer is not None and not isinstance(layer, (nn.Flatten, nn.Unflatten)):
            hypothesis = "layer-shape-mismatch"
        else:
            hypothesis = "op-shape-mismatch"
    elif kind == "call":
        m = re.search(r"(\w+)\.(\w+)\(\) (?:missing|takes|got an unexpected)", str(exc))
        names = {s.name for s in shadows}
        if m and m.group(2) in names or (not m and shadows):
            hypothesis = "module-method-shadowed"
    elif kind == "attribute" and shadows:
        hypothesis = "module-method-shadowed"
    elif kind == "attribute" and "'NoneType' object" in str(exc) and code and re.search(r"\.grad\b", code):
        # p.grad.data / p.grad.norm() after backward(): that parameter got no gradient (a hand-written update)
        hypothesis, detail = "disconnected-parameters", ("a parameter's .grad is still None after backward(): the loss "
                                                         "does not depend on it")
    if hypothesis is None and DDP_UNUSED in str(exc):
        hypothesis, detail = "disconnected-parameters", ddp_unused_detail(str(exc), frames)
    if hypothesis is None and shadows and kind in ("call", "attribute", "other"):
        hypothesis = "module-method-shadowed"
    if hypothesis == "module-method-shadowed" and shadows:
        s = shadows[0]
        detail = f"{s.cls}.{s.signature}" + (f" ({s.where})" if s.where else "") + f" overrides nn.Module.{s.name}: {s.why}"

    parts = []
    if op:
        parts.append(f"{op}")
    if phase_name != "other":
        parts.append(f"({phase_name})")
    head = " ".join(parts) or "the training code"
    at = f" at {where}" if where else (" in nnwizard's reference code" if frame is not None else "")
    line = f" `{code}`" if code else ""
    ops = f"; operands: {', '.join(o.describe() for o in operands[:4])}" if operands else ""
    sentence = f"{head} raised{at}{line}: {message}{ops}" + (f"; {detail}" if detail else "")
    return Classification(hypothesis, kind, op, phase_name, where, code, message, operands, sentence, subject)


# ------------------------------------------------------------------------------- coarse kinds
_KINDS = [
    ("no-grad", r"does not require grad|does not have a grad_fn"),
    ("inplace", r"modified by an inplace operation"),
    ("label-range", r"out of bounds|index .* is out of range|device-side assert|Assertion .t >= 0"),
    ("dtype", r"expected scalar type|Expected .*Long|not implemented for '(Float|Int|Long|Half|Bool)'|"
              r"expected .*dtype|Found dtype|must have the same dtype|expected both .* same dtype"),
    ("shape", r"shapes cannot be multiplied|size mismatch|must match the size|Expected input batch_size|"
              r"expected input\[|Given groups=|doesn't match the broadcast shape|invalid for input of size|"
              r"Expected .* dimensions|expected .*D .* input|input.size\(-1\) must be equal|"
              r"Target size .* must be the same as input size|Using a target size|shape .* is invalid|"
              r"number of dims|Expected target size|dimension out of range|mismatch in shape|same number of dim"),
    ("memory", r"out of memory|CUDA error: out of memory"),
]


def error_kind(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    for kind, pattern in _KINDS:
        if re.search(pattern, text, re.IGNORECASE):
            return kind
    return "other"


def expected_input(module: nn.Module) -> str | None:
    """What a layer expects of its input, in words, for the layer shape mismatch evidence."""
    if isinstance(module, nn.Linear):
        return f"{module.in_features} input features in the last dimension"
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return f"{module.in_channels} input channels in dimension 1"
    if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
        return f"{module.num_features} features/channels in dimension 1"
    if isinstance(module, nn.LayerNorm):
        return f"trailing dimensions {list(module.normalized_shape)}"
    if isinstance(module, (nn.RNNBase,)):
        return f"{module.input_size} features in the last dimension"
    if isinstance(module, nn.Embedding):
        return f"integer indices in [0, {module.num_embeddings})"
    return None


def _tensor_list(code: str | None, frame) -> tuple[str, str, str | None]:
    """``torch.tensor(xs)`` where ``xs`` holds tensors of several elements: the values are copied one number
    at a time, which fails for them and, for one-element tensors, silently leaves the graph. On the path of
    the loss (the tensors carry a graph) the parameters behind them would get no gradient: disconnected;
    elsewhere (data preparation) it is a tensor built the wrong way: op-shape-mismatch. Both: torch.stack."""
    found = None
    tree = _parse(code) if code else None
    for node in ast.walk(tree) if tree is not None else []:
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(getattr(node, "ctx", None), ast.Load):
            name = _dotted(node)
            value = _resolve(name, frame) if name and frame is not None else None
            if isinstance(value, (list, tuple)) and value and any(isinstance(v, torch.Tensor) for v in value[:64]):
                found = (name, value)
                break
    if found is None:
        return ("op-shape-mismatch", "torch.tensor() converts every element to a Python number: it was given "
                "tensors of several elements; build the tensor with torch.stack (or torch.cat)", None)
    name, value = found
    tensors = [v for v in value[:64] if isinstance(v, torch.Tensor)]
    shapes = sorted({tuple(t.shape) for t in tensors})
    shown = ", ".join(str(list(s)) for s in shapes[:3])
    graph = any(t.requires_grad for t in tensors)
    what = f"{name}, a list of {len(value)} tensors of shape {shown}"
    if graph:
        return ("disconnected-parameters", f"torch.tensor() copies values out of the graph one number at a time; it was "
                f"given {what} that carry the model's graph: it cannot convert them, and with one-element tensors it "
                f"would run and cut the graph (no gradient would reach the model); use torch.stack({name})", name)
    return ("op-shape-mismatch", f"torch.tensor() converts every element to a Python number; it was given {what}: use "
            f"torch.stack({name}) (or torch.cat) to build one tensor from them", name)
