"""The ranks' digests side by side (:class:`DistributedRun`): what the cross-rank probes
(``probes/distributed.py``) read, and the ``distributed`` section of the reports.

A :class:`DistributedTarget` carries a run alone (no one-process diagnosis to attach it to: a run interrupted
by Ctrl-C, or the report rank 0's watchdog writes under the user's torchrun while its own script hangs); the
engine then walks only the trees made for distributed runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# communication failures: what a rank raises when a peer is gone or the ranks disagree (gloo, nccl, the store)
# a backend that noticed the ranks in different collectives (gloo's enforce, nccl's / TORCH_DISTRIBUTED_DEBUG's checks)
MISMATCH = re.compile(r"collective mismatch|doesn't match expected size|Detected mismatch between collectives|"
                      r"mismatch between collectives|Mismatch between collectives", re.IGNORECASE)
COMM_ERROR = re.compile(r"Connection (closed|reset)|closed by peer|Broken pipe|pair\.cc|Timed out|timed out waiting|"
                        r"communicator was aborted|NCCL (error|communicator)|Watchdog caught collective|"
                        r"socket (closed|timeout)", re.IGNORECASE)   # a peer gone or a collective that never completed


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def user_frames(stack: str | None, limit: int = 4) -> list[str]:
    """The script's own frames in a faulthandler dump of the main thread, innermost first ('train.py:33 in f')."""
    if not stack:
        return []
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", stack.strip())
    out = []
    for block in blocks:
        frames = [(path, line, fn) for path, line, fn in _FRAME.findall(block)]
        if any("/nnwizard/" in p and "heartbeat" in p for p, _, _ in frames) or any("threading.py" in p for p, _, _ in frames[-1:]):
            continue   # nnwizard's heartbeat thread, a helper thread
        own = [f"{p.rsplit('/', 1)[-1]}:{line} in {fn}" for p, line, fn in frames
               if not any(x in p for x in ("site-packages", "/torch/", "/nnwizard/", "/wizard/", "<frozen", "runpy", "/lib/python"))]
        if own:
            out = own[:limit]
            break
    return out


def collective_in(stack: str | None) -> str | None:
    """The torch.distributed function the main thread was inside in a faulthandler dump (None: none)."""
    for block in re.split(r"\n(?=Thread 0x|Current thread 0x)", (stack or "").strip()):
        frames = _FRAME.findall(block)
        if any("heartbeat" in p for p, _, _ in frames):
            continue
        for path, _, fn in frames:
            if "/torch/distributed/" in path and fn not in ("wrapper", "_get_default_group"):
                return fn
    return None


def is_comm_error(error: dict | None) -> bool:
    if not error:
        return False
    text = f"{error.get('type', '')} {error.get('message', '')}"
    return bool(COMM_ERROR.search(text)) or error.get("type") == "DistBackendError"


@dataclass
class DistributedRun:
    world: int
    launcher: str                      # "nnwizard --nproc" or "torchrun"
    digests: dict[int, dict]           # rank -> its digest (a rank that sent none is missing)
    kind: str = "cpu"                  # the ranks' device kind (cpu: gloo, cuda: nccl)
    stacks: dict[int, str] = field(default_factory=dict)
    abort: dict | None = None          # why the watchdog ended the run
    interrupted: bool = False
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    logs: dict[int, list[str]] = field(default_factory=dict)   # the last lines a rank's process wrote (stderr)
    seconds: float = 0.0
    start_error: str | None = None     # the launcher could not start the ranks
    beats: dict[int, dict | None] = field(default_factory=dict)   # the last heartbeats

    # -- what the run was ----------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        return sorted(self.digests)

    def missing(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.digests]

    def initialised(self) -> bool:
        """Some rank called init_process_group (or wrapped a model in DDP/FSDP): the script is distributed."""
        return any(d.get("init", {}).get("calls") or d.get("ddp") or d.get("fsdp") for d in self.digests.values())

    @property
    def backend(self) -> str | None:
        return next((d["init"].get("backend") for d in self.digests.values() if d.get("init", {}).get("backend")), None)

    def data_parallel(self) -> bool:
        """A DDP or FSDP wrapper was built on some rank."""
        return any(d.get("ddp") or d.get("fsdp") for d in self.digests.values())

    def error(self, rank: int) -> dict | None:
        return self.digests.get(rank, {}).get("error")

    def ended(self, rank: int) -> str:
        """How the rank's script ended, in a few words."""
        d = self.digests.get(rank)
        if d is None:
            code = self.exit_codes.get(rank)
            if self.interrupted:
                return "interrupted before it began to run the script"
            return "sent no digest" + (f" (its process exited with code {code})" if code is not None else "")
        err = d.get("error")
        if d.get("exit") == "died":
            code = self.exit_codes.get(rank)
            how = (f"killed by signal {-code}" if isinstance(code, int) and code < 0 else
                   f"exited with code {code}" if code is not None else "ended")
            name, frames = self.position(rank)
            return (f"its process {how}" + (f" in {name}" if name else "") + (f" called from {frames[0]}" if frames else "")
                    + f" (its last step recorded: {d.get('total_steps', 0)})")
        if d.get("exit") == "aborted":
            busy = (d.get("busy") or {})
            return "stopped by the watchdog" + (f" while in {busy.get('name')}" if busy else "")
        if err:
            return f"raised {err['type']} at {err.get('where') or '?'} (step {err.get('step')}): {err['message'][:160]}"
        if d.get("exit") == "interrupted":
            return "interrupted"
        if d.get("stopped"):
            return f"stopped at step {d.get('total_steps')}: {d['stopped']}"
        return f"ran to its end after {d.get('total_steps', 0)} optimizer steps"

    def busy(self, rank: int) -> dict | None:
        """What the rank waited in when its digest (or, for a rank that died, its last heartbeat) was taken."""
        d = self.digests.get(rank) or {}
        beat = (self.beats.get(rank) or {}).get("busy")
        if d.get("exit") in (None, "died"):   # (a partial digest is older than the last heartbeat)
            return beat or d.get("busy")
        return d.get("busy")

    def position(self, rank: int) -> tuple[str | None, list[str]]:
        """(the collective a rank was in, the script's frames that called it, innermost first) from its stacks (a rank
        stopped or killed), else from its heartbeat."""
        stack = self.stacks.get(rank)
        frames = user_frames(stack)
        busy = self.busy(rank)
        name = collective_in(stack) or (busy or {}).get("name")
        if frames:
            return name, frames
        if busy and busy.get("where"):
            return name, [busy["where"]]
        return name, []

    def backend_mismatch(self) -> str | None:
        """A backend's own words that the ranks were in different collectives (a rank's error or its last lines)."""
        texts = [(d.get("error") or {}).get("message", "") + "\n" + (d.get("error") or {}).get("traceback", "")
                 for d in self.digests.values()] + ["\n".join(lines) for lines in self.logs.values()]
        for text in texts:
            for line in text.splitlines():
                if MISMATCH.search(line):
                    return line.strip()[:300]
        return None

    def first_failure(self) -> tuple[int, dict] | None:
        """The rank whose own error came first (an error of its program, not a lost peer), and the error."""
        own = [(d["error"].get("step", 0), r, d["error"]) for r, d in self.digests.items()
               if d.get("error") and not is_comm_error(d["error"])]
        if not own:
            return None
        _, rank, err = min(own, key=lambda t: (t[0], t[1]))
        return rank, err

    # -- the report --------------------------------------------------------------------------------
    def summary(self, single_process: bool = True) -> dict[str, Any]:
        """The ``distributed`` section of the JSON report."""
        ranks = []
        for r in range(self.world):
            d = self.digests.get(r) or {}
            ranks.append({"rank": r, "ended": self.ended(r), "steps": d.get("total_steps"), "seconds": d.get("seconds"),
                          "collectives": d.get("collective_count"), "files_written": sorted({w["path"] for w in d.get("writes", [])}),
                          "stack": self.stacks.get(r), "log_tail": self.logs.get(r, [])[-12:]})
        from nnwizard.probes.distributed import CROSS_RANK_PROBES

        return {
            "world_size": self.world, "launcher": self.launcher, "backend": self.backend,
            "device": self.kind, "distributed": self.initialised(), "seconds": round(self.seconds, 2),
            "aborted": self.abort, "interrupted": self.interrupted, "start_error": self.start_error, "ranks": ranks,
            "probes_on_all_ranks": list(CROSS_RANK_PROBES),
            "probes_on_one_rank": ("every other probe: the loop audits and the reruns (overfit one batch, lr sweep, "
                                   "...) ran the script as one process (RANK=0, WORLD_SIZE=1)") if single_process else None,
        }


class DistributedTarget:
    """A target made of a distributed run alone (see the module docstring)."""

    mode = "distributed"
    capturable = False
    task = ""
    task_source = ""
    crashed = False
    untrained = False

    def __init__(self, run: DistributedRun, spec: str):
        self.distributed = run
        self.spec = spec
        import torch

        self.device = torch.device("cuda" if run.kind == "cuda" else "cpu")

    def observed(self) -> dict:
        return {}
