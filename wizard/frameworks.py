"""Which training framework owns the optimizer, its rate and the loop of a recorded script, and where the user's code
sets that framework's knob, so that a fix names the knob the user edits (``TrainingArguments(learning_rate=...)`` at
the line that builds it, ``configure_optimizers``) instead of the line that merely called ``trainer.train()``.

Detection reads the run (the models' classes, the line each optimizer was built at) and the user's own source files
(their ``ast``), never the example's name:

- ``lightning``: a recorded model is a ``LightningModule`` (Lightning or the older pytorch_lightning).
- ``transformers``: the script builds ``TrainingArguments(...)`` and a ``Trainer`` whose optimizer the script did not
  build itself (no optimizer built on a line of the user's files, no ``optimizers=`` argument given to the Trainer).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

LIGHTNING_EVAL_HOOKS = ("validation_step", "test_step", "predict_step", "on_validation_start",
                        "on_validation_epoch_start", "on_validation_batch_start", "on_validation_model_eval",
                        "on_test_start", "on_test_batch_start")


@dataclass
class Site:
    where: str                 # "file.py:42"
    function: str | None = None
    text: str = ""             # the source of the call or expression


@dataclass
class Framework:
    name: str                                        # "lightning" | "transformers"
    rate: Site | None = None                         # where the learning rate is set (the knob and its value)
    rate_expr: str | None = None                     # the expression passed (`args.lr`, `3e-4`, `self.lr`)
    optimizers_hook: Site | None = None              # lightning: configure_optimizers
    train_in_eval: list[Site] = field(default_factory=list)   # lightning: `.train()` calls inside evaluation hooks


def _trees(files: list[Path]) -> list[tuple[Path, ast.Module]]:
    out = []
    for path in dict.fromkeys(Path(f) for f in files):
        try:
            out.append((path, ast.parse(path.read_text(encoding="utf-8", errors="replace"))))
        except (OSError, SyntaxError, ValueError):
            continue
    return out


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _loc(path: Path, node: ast.AST) -> str:
    return f"{path.name}:{node.lineno}"


def _lightning_module(rec) -> bool:
    for m in getattr(rec, "models", []) or []:
        module = m.owner or m.module
        if any(c.__name__ == "LightningModule" and c.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
               for c in type(module).__mro__):
            return True
    return False


def detect(rec, files: list[Path]) -> Framework | None:
    trees = _trees(files)
    if _lightning_module(rec):
        fw = Framework("lightning")
        for path, tree in trees:
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if node.name == "configure_optimizers" and fw.optimizers_hook is None:
                    fw.optimizers_hook = Site(_loc(path, node), "configure_optimizers")
                    for call in ast.walk(node):
                        lr = next((k for k in getattr(call, "keywords", []) if k.arg == "lr"), None) \
                            if isinstance(call, ast.Call) else None
                        if lr is not None:
                            fw.rate = Site(_loc(path, call), "configure_optimizers", ast.unparse(call))
                            fw.rate_expr = ast.unparse(lr.value)
                            break
                if node.name in LIGHTNING_EVAL_HOOKS:
                    for call in ast.walk(node):
                        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "train" \
                                and not (call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value is False) \
                                and not any(k.arg == "mode" for k in call.keywords):
                            fw.train_in_eval.append(Site(_loc(path, call), node.name, ast.unparse(call)))
        return fw
    args_call = trainer_optimizers = None
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "TrainingArguments" and args_call is None:
                args_call = (path, node)
            if isinstance(node, ast.Call) and _name(node.func) in ("Trainer", "Seq2SeqTrainer", "SFTTrainer") \
                    and any(k.arg in ("optimizers", "optimizer_cls_and_kwargs") for k in node.keywords):
                trainer_optimizers = True
    built_by_user = any(o.where for o in getattr(rec, "optimizers", []) or [] if not _is_train_call(o.where, trees))
    if args_call is None or trainer_optimizers or built_by_user:
        return None
    path, node = args_call
    fw = Framework("transformers")
    lr = next((k for k in node.keywords if k.arg == "learning_rate"), None)
    fw.rate = Site(_loc(path, node), None, "TrainingArguments(...)")
    fw.rate_expr = ast.unparse(lr.value) if lr is not None else None
    return fw


def _is_train_call(where: str | None, trees) -> bool:
    """Is the optimizer's recorded line (``file.py:N in f``) a call of ``.train(...)`` / ``.fit(...)``: the framework
    built it inside, and the recorder could only name the user's line that entered the framework."""
    if not where:
        return True
    name, _, rest = where.partition(":")
    line = rest.split(" ", 1)[0]
    if not line.isdigit():
        return False
    for path, tree in trees:
        if path.name != name:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node, "lineno", None) == int(line) \
                    and _name(node.func) in ("train", "fit", "train_model"):
                return True
    return False


def rate_fix(fw: Framework, lr: float, best: float, measured: str | None) -> str:
    """The learning-rate fix in the framework's terms."""
    now = f"{lr:.3g}"
    want = f"{best:.3g}"
    given = f" (now `{fw.rate_expr}` = {now})" if fw.rate_expr and fw.rate_expr != now else f" (now {now})"
    then = "." if measured else ", then diagnose again to measure it."
    if fw.name == "transformers":
        where = fw.rate.where if fw.rate else "the line that builds it"
        head = (f"the Trainer builds its optimizer from `TrainingArguments(learning_rate=...)` at {where}{given}"
                if fw.rate_expr else f"`TrainingArguments(...)` at {where} leaves `learning_rate` at its default ({now})")
        return f"{head}{measured or ''}: set `learning_rate={want}` there{then}"
    site = fw.rate.where if fw.rate else fw.optimizers_hook.where if fw.optimizers_hook else "configure_optimizers"
    head = f"Lightning steps the optimizer that `configure_optimizers` returns, built at {site}{given}{measured or ''}"
    return f"{head}: build it with `lr={want}` there (or pass that rate to the module){then}"


def eval_mode_fix(fw: Framework, site: str) -> str:
    """eval-mode-missing in a Lightning run: Lightning calls eval() before validation_step, so say what switched the
    model back to training mode."""
    if fw.train_in_eval:
        s = fw.train_in_eval[0]
        return (f"Lightning already puts the model in eval mode before `validation_step`; `{s.text}` at {s.where} in "
                f"`{s.function}` switches it back to training mode, so the evaluation whose loss is computed at {site} "
                f"runs with dropout and batch statistics on: remove that call (Lightning restores training mode itself).")
    return (f"Lightning already puts the model in eval mode before `validation_step`, yet the evaluation whose loss is "
            f"computed at {site} ran in training mode: look for a `.train()` call reached from `validation_step` or "
            f"an `on_validation_*` hook of the module or a callback, and remove it.")
