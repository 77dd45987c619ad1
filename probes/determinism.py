"""Reproducibility: two short runs from the same seed, compared bitwise, and where they part.

Each run replays what a user's script does in a fresh process: seed, ``build_data()``, ``build_model()``,
the optimizer, then a few steps of the user's own loop. Python's and NumPy's global generators are
seeded only when the user's code seeds them (a fresh process otherwise starts them from OS entropy),
so "I set torch.manual_seed and still get different results" is reproduced, not hidden.

On a mismatch the probe narrows the source: rerun with every global generator seeded (mismatch gone:
the global Python/NumPy RNG is the source); compare the batches of both runs (the data pipeline: a
private generator in the Dataset or its transforms, or unseeded workers); compare the initial
weights and one forward pass (the model code); otherwise the loop or nondeterministic kernels. On
CUDA it also reports ``cudnn.benchmark`` and the ops ``torch.use_deterministic_algorithms`` warns
about.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import math
import os
import random
import re
import warnings

import numpy as np
import torch

from nnwizard import reference
from nnwizard.record.frames import first_line
from nnwizard.probes.api import Table, cannot_run, failed, passed, probe
from nnwizard.target import DeviceLoader, as_loader, user_source_files

SEEDS_GLOBALS = re.compile(r"\b(random\.seed|np\.random\.seed|numpy\.random\.seed|seed_everything|set_seed|set_random_seed)\s*\(\s*[^)\s]")
UNSEEDED = [
    (re.compile(r"default_rng\(\s*(None)?\s*\)"), "a NumPy Generator created without a seed"),
    (re.compile(r"RandomState\(\s*(None)?\s*\)"), "a NumPy RandomState created without a seed"),
    (re.compile(r"\brandom\.Random\(\s*\)"), "a Python random.Random created without a seed"),
    (re.compile(r"torch\.Generator\([^)]*\)(?!\s*\.manual_seed)"), "a torch.Generator that is never seeded on this line"),
    (re.compile(r"seed\([^)]*time\.time"), "a seed taken from the clock"),
]
GLOBAL_DRAWS = re.compile(r"\b(np\.random|numpy\.random|random)\.(rand|randn|randint|random|uniform|normal|choice|shuffle|"
                          r"permutation|gauss|sample|binomial|integers|beta)\s*\(")
COST = ("full determinism costs speed: deterministic kernels and cudnn.benchmark=False typically slow GPU "
        "training by 10-30% (more for scatter/index-add heavy models), and some ops then raise instead of "
        "running; on CPU it is essentially free")


def _digest(obj) -> str:
    h = hashlib.sha1()

    def feed(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu()
            if t.dtype in (torch.bfloat16, torch.float16):
                t = t.float()
            h.update(str(t.dtype).encode())
            h.update(t.contiguous().numpy().tobytes())
        elif isinstance(x, (list, tuple)):
            for y in x:
                feed(y)
        elif isinstance(x, dict):
            for k in sorted(x):
                feed(x[k])
        else:
            h.update(repr(x).encode())

    feed(obj)
    return h.hexdigest()[:16]


def _params(model) -> torch.Tensor:
    """Every parameter, flat, where the model is (a GPU compares its own copies without a transfer)."""
    params = [p.detach().float().reshape(-1) for p in model.parameters()]
    return torch.cat(params) if params else torch.zeros(0)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _fingerprint(tensors) -> list[int]:
    """Integer sums of each tensor's bit patterns (all of them, and every 7th), on its device: equal for
    bitwise-equal tensors, and integer sums do not depend on the order a parallel reduction adds in. For the
    initial weights, where a SHA-1 of an 85M-parameter model's bytes took a second on the CPU."""
    sums = []
    for t in tensors:
        flat = t.detach().reshape(-1)
        bits = flat.view(_BITS[flat.element_size()]) if flat.is_floating_point() or flat.is_complex() else flat
        sums += [bits.sum(dtype=torch.int64), bits[::7].sum(dtype=torch.int64)]
    return torch.stack([x.cpu() for x in sums]).tolist() if sums else []


class _Tap:
    """Iterates a loader and records a digest of each batch it hands out."""

    def __init__(self, loader, log):
        self.loader, self.log = loader, log

    def __iter__(self):
        for batch in self.loader:
            self.log.append(_digest(batch))
            yield batch

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def _seed(seed: int, globals_too: bool) -> None:
    torch.manual_seed(seed)
    if globals_too:
        random.seed(seed)
        np.random.seed(seed % 2**32)
    else:  # a fresh process: Python and NumPy start from OS entropy
        random.seed(os.urandom(16))
        np.random.seed(int.from_bytes(os.urandom(4), "little"))


def one_run(target, seed: int, steps: int, globals_too: bool, start: torch.nn.Module | None = None,
            keep: bool = False) -> dict:
    """seed -> build_data -> build_model -> optimizer -> ``steps`` steps of the user's loop. With ``start``,
    a copy of that model instead of a build (a pair of runs compared with each other once the builds agree);
    with ``keep``, the built model's initial state is kept as ``start`` for such a pair."""
    _seed(seed, globals_too)
    train, _ = target.namespace.build_data()
    loader = as_loader(train, True)
    model = copy.deepcopy(start) if start is not None else target.namespace.build_model().to(target.device)
    init = _fingerprint(model.parameters())  # not a copy: two runs' copies would cost two models
    kept = copy.deepcopy(model) if keep else None
    optimizer = target.make_optimizer(model)
    scheduler = target.make_scheduler(optimizer)
    batches: list[str] = []
    tapped = DeviceLoader(_Tap(loader, batches), target.device, steps, target.sample_limit)
    losses: list[float] = []
    if target.user_train_epoch:
        losses.append(reference.as_float(target.user_train_epoch(model, tapped, target.loss_fn, optimizer, scheduler)))
    else:
        step = target.user_train_step or reference.train_step
        for batch in tapped:
            losses.append(reference.as_float(step(model, batch, target.loss_fn, optimizer)))
    return {"losses": losses, "batches": batches, "init": init, "final": _params(model), "loader": loader, "start": kept}


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bitwise-equal values, a NaN matching a NaN in the same place (a diverged run can be reproducible)."""
    return x.shape == y.shape and bool(((x == y) | (torch.isnan(x) & torch.isnan(y))).all())


def _same(a: dict, b: dict) -> bool:
    return len(a["losses"]) == len(b["losses"]) and all(
        x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a["losses"], b["losses"])) and _equal(a["final"], b["final"])


def _random_attrs(obj, path: str, depth: int = 0, seen=None) -> list[tuple[str, str]]:
    """Generators held by the dataset, its wrapped datasets and its transforms."""
    seen = seen if seen is not None else set()
    if obj is None or id(obj) in seen or depth > 3:
        return []
    seen.add(id(obj))
    kinds = {np.random.Generator: "numpy Generator", np.random.RandomState: "numpy RandomState",
             random.Random: "random.Random", torch.Generator: "torch.Generator"}
    for cls, name in kinds.items():
        if isinstance(obj, cls):
            return [(path, name)]
    found = []
    children = []
    if isinstance(obj, (list, tuple)):
        children = [(f"{path}[{i}]", x) for i, x in enumerate(obj[:16])]
    elif hasattr(obj, "__dict__") and not inspect.ismodule(obj) and not isinstance(obj, torch.Tensor):
        children = [(f"{path}.{k}", v) for k, v in vars(obj).items() if not k.startswith("__")]
    for name, child in children:
        if isinstance(child, (torch.Tensor, np.ndarray, str, bytes, int, float)) or callable(child) and not hasattr(child, "__dict__"):
            continue
        found += _random_attrs(child, name, depth + 1, seen)
    return found


def seeding_notes(files) -> tuple[list[str], list[str], bool]:
    """(unseeded constructors, global draws, seeds globals) in the user's files, as file:line notes."""
    unseeded, draws, seeds = [], [], False
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for no, line in enumerate(lines, 1):
            code = line.split("#", 1)[0]
            if SEEDS_GLOBALS.search(code):
                seeds = True
            for pattern, what in UNSEEDED:
                if pattern.search(code):
                    unseeded.append(f"{path.name}:{no} {what}: `{code.strip()}`")
            if GLOBAL_DRAWS.search(code):
                draws.append(f"{path.name}:{no} `{code.strip()}`")
    return unseeded, draws, seeds


def _cuda_report(target, seed: int) -> dict:
    info = {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic)}
    if target.device.type != "cuda":
        return info
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    ops: list[str] = []
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = target.fresh_model(seed)
            optimizer = target.make_optimizer(model)
            target.train_step(model, target.batch(), optimizer)
        ops = _warned_ops(caught)
    except Exception as exc:  # noqa: BLE001
        info["deterministic_error"] = first_line(exc)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    info["nondeterministic_ops"] = ops
    return info


def _warned_ops(caught) -> list[str]:
    """The ops ``torch.use_deterministic_algorithms(True, warn_only=True)`` warned about: those with no
    deterministic implementation (their name), cuBLAS without ``CUBLAS_WORKSPACE_CONFIG``, attention kernels."""
    ops = []
    for w in caught:
        text = str(w.message)
        if "CUBLAS_WORKSPACE_CONFIG" in text:
            ops.append("cuBLAS matmuls (CUBLAS_WORKSPACE_CONFIG unset)")
        elif "deterministic" in text:
            ops.append(text.split(" does not have a deterministic implementation")[0].split(". ")[0].strip()[:120])
    return sorted(set(ops))


def _math_attention():
    """scaled_dot_product_attention on its math kernel (matmuls and a softmax), whose backward adds in a
    fixed order; the flash and memory-efficient kernels' backward does not."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # an older torch
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


def _deterministic_pair(target, seed: int, steps: int, start: torch.nn.Module | None) -> tuple[bool, list[str]]:
    """(whether two runs with deterministic CUDA algorithms agree bitwise, the ops that ran without a
    deterministic implementation there). cuDNN deterministic and not autotuned, attention on its math
    kernel, ops without a deterministic kernel only warn; every generator is seeded, as in the pair that
    differed (the code seeds the globals, or the probe did)."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        with warnings.catch_warnings(record=True) as caught, _math_attention():
            warnings.simplefilter("always")
            same = _same(one_run(target, seed, steps, True, start), one_run(target, seed, steps, True, start))
        return same, _warned_ops(caught)
    except Exception:  # noqa: BLE001 - then the kernels are not shown to be the source
        return False, []
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


@probe(
    "determinism",
    title="Two short runs from the same seed, compared bitwise",
    outcomes={
        "ok": "identical losses and parameters",
        "global-rng": "runs differ because Python/NumPy global generators are not seeded (only torch is)",
        "data": "the data pipeline hands out different batches from the same seed",
        "model": "the model's initialisation or forward pass differs from the same seed",
        "loop": "same batches and model, yet training differs (loop or nondeterministic kernels)",
        "kernels": "on CUDA: runs differ only through nondeterministic kernels (identical with deterministic algorithms)",
        "crashed": "the user's code raised during the runs",
    },
    timeout_s=60,
    cost=12,
)
def determinism(ctx):
    target = ctx.target
    steps = int(ctx.param("steps", 2 if target.sample_limit else 5))  # 2 when the session slices dear batches
    seed = ctx.seed
    files = user_source_files(target)
    unseeded, draws, seeds_globals = seeding_notes(files)
    data = {"steps": steps, "seeds_globals": seeds_globals, "unseeded": unseeded[:6], "global_draws": draws[:6], "cost": COST}
    data.update(_cuda_report(target, seed))
    try:
        cuda = target.device.type == "cuda"  # there a pair with deterministic kernels may follow: from a's initial state
        a = one_run(target, seed, steps, seeds_globals, keep=cuda)
        b = one_run(target, seed, steps, seeds_globals)
    except Exception as exc:  # noqa: BLE001
        return cannot_run(f"a short run of the user's loop raised: {first_line(exc)}", "crashed", reason="raised",
                          error=first_line(exc), training_raised=True)
    loader = a["loader"]
    workers = int(getattr(loader, "num_workers", 0) or 0)
    data.update(workers=workers, worker_init_fn=getattr(loader, "worker_init_fn", None) is not None,
                loader_generator=getattr(loader, "generator", None) is not None)
    if _same(a, b):
        data.update(losses=a["losses"])
        return passed(f"two runs of {steps} steps from seed {seed} agree bitwise (losses and {a['final'].numel():,} "
                      f"parameters)" + ("" if seeds_globals else "; the code seeds only torch, and that is enough here"), **data)
    diff = next((i for i, (x, y) in enumerate(zip(a["losses"], b["losses"])) if x != y), None)
    delta = float((a["final"] - b["final"]).abs().nan_to_num(0.0).max()) if a["final"].shape == b["final"].shape and a["final"].numel() else math.inf
    data.update(first_loss_diff=diff, max_param_diff=delta, losses_a=a["losses"], losses_b=b["losses"])
    at = f"losses differ from step {diff}" if diff is not None else "losses agree but parameters differ"
    head = f"two runs from seed {seed}: {at}; parameters differ by up to {delta:.3g}"
    rows = [["torch only" + (" + globals (the code seeds them)" if seeds_globals else ""), "no", head]]
    if not seeds_globals:
        c = one_run(target, seed, steps, True, keep=cuda)
        d = one_run(target, seed, steps, True)
        if _same(c, d):
            rows.append(["torch + Python + NumPy", "yes", "identical once the global generators are seeded"])
            data.update(source="global-rng", where="; ".join(draws[:3]) or "the global random / numpy.random generators")
            where = f" ({'; '.join(draws[:3])})" if draws else ""
            return failed("global-rng", f"{head}. Seeding Python's and NumPy's global generators as well makes the runs "
                          f"identical: the code draws from them{where} but seeds only torch",
                          [Table("stages", "Determinism stages", ["seeded", "identical", "result"], rows)], **data)
        a, b = c, d
        rows.append(["torch + Python + NumPy", "no", "still different"])
    table = Table("stages", "Determinism stages", ["seeded", "identical", "result"], rows)
    bdiff = next((i for i, (x, y) in enumerate(zip(a["batches"], b["batches"])) if x != y), None)
    if bdiff is not None:
        holders = _random_attrs(getattr(a["loader"], "dataset", None), "dataset")
        notes = [f"{p} is a {kind}" for p, kind in holders]
        if workers and not data["worker_init_fn"] and not data["loader_generator"]:
            notes.append(f"DataLoader(num_workers={workers}) without worker_init_fn or generator")
        notes += unseeded[:3]
        data.update(source="data", batch_step=bdiff, holders=[f"{p}: {k}" for p, k in holders], where="; ".join(notes) or "the data pipeline")
        return failed("data", f"{head}; with every generator seeded the batches still differ from batch {bdiff}: the data "
                      f"pipeline draws from an unseeded source ({data['where']})", [table], **data)
    if a["init"] != b["init"]:
        data.update(source="model-init", where="; ".join(unseeded[:3]) or "build_model()")
        return failed("model", f"{head}; the batches agree but build_model() returns different initial weights from the "
                      f"same seed ({data['where']})", [table], **data)
    batch = target.batch()
    outs = []
    for _ in range(2):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        m = target.fresh_model(seed).train()
        with torch.no_grad():
            outs.append(_digest(m(batch[0])))
    if outs[0] != outs[1]:
        data.update(source="model-forward", where="; ".join(unseeded[:3]) or "the model's forward")
        return failed("model", f"{head}; the batches and initial weights agree but the same forward pass gives different "
                      f"outputs: the model code draws from an unseeded generator ({data['where']})", [table], **data)
    ops = data.get("nondeterministic_ops") or []
    if target.device.type == "cuda":
        same, left = _deterministic_pair(target, seed, steps, a["start"])
        data.update(deterministic_identical=same, deterministic_left=left)
        if same or left:
            # identical: the kernels were the source. Still different, but only after ops that have no deterministic
            # kernel ran: nothing in the code is shown to vary (batches, weights and forward agree), those ops are
            rows.append(["the same, deterministic CUDA algorithms", "yes" if same else "no",
                         "identical: the kernels were the source" if same else
                         f"still different; no deterministic kernel exists for: {', '.join(left[:4])}"])
            data.update(source="kernels", where=", ".join((ops or left)[:4]) or "cuDNN / atomic-add kernels")
            shown = ("the two runs are identical: the difference is" if same else
                     f"the runs still differ, and {', '.join(left[:4])} ran without a deterministic kernel: the "
                     f"difference is most likely")
            return failed("kernels", f"{head}; batches, initial weights and forward agree, and with "
                          f"torch.use_deterministic_algorithms(True), cudnn.deterministic and attention on its math kernel "
                          f"{shown} nondeterministic CUDA kernels ({data['where']}), normal on a GPU (float-rounding "
                          f"order of parallel sums), not a defect of the code",
                          [Table("stages", "Determinism stages", ["seeded", "identical", "result"], rows)], **data)
    bench = " with cudnn.benchmark=True" if data["cudnn_benchmark"] else ""
    data.update(source="loop", where=(", ".join(ops[:4]) or "the loop") + bench)
    return failed("loop", f"{head}; batches, initial weights and forward agree, so the difference arises in the "
                  f"backward/update ({data['where']})", [table], **data)
