"""One rank of a distributed run: the user's script run as ``python train.py ARGS`` would run in that rank,
under the recorder with the rank's digest, the step agreement and a heartbeat; the digest goes to the shared
store at the end (or, after an abort, from the heartbeat thread).

Run by nnwizard's launcher as ``python -m nnwizard.distributed.rank`` (the configuration in the
``NNWIZARD_DIST`` environment variable, JSON: see ``launch.rank_config``), or in-process by every rank of the
user's own torchrun job (``run_rank``). The diagnosis runs nothing else in a rank: the audits and the reports
are the parent's (or rank 0's) work.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from nnwizard.distributed.agree import StepAgreement
from nnwizard.distributed.channel import Channel, connect
from nnwizard.distributed.digest import RankDigest
from nnwizard.distributed.env import CONFIG_VAR, rank_and_world
from nnwizard.distributed.heartbeat import ABORTED, Heartbeat


@contextmanager
def shared_scratch():
    """The ranks of one run share one scratch folder: a file one rank wrote (rank 0's checkpoint, loaded by every
    rank after a barrier) is read from there by the others too, as it would be read from the real folder."""
    from nnwizard.script_run import Sandbox

    original = Sandbox.redirect_read

    @functools.wraps(original)
    def redirect_read(self, file):
        found = original(self, file)
        if found is not file:
            return found
        path = self._abs(file)
        if path is None or self._exempted(path):
            return file
        there = self._scratch_for(path)
        return str(there) if there.is_file() else file

    Sandbox.redirect_read = redirect_read
    try:
        yield
    finally:
        Sandbox.redirect_read = original


def run_rank(cfg: dict, channel, rank: int, world: int, *, heartbeat_kw: dict | None = None):
    """Run the script in this rank; returns (RunResult or None, the digest sent). Never raises for what the
    script does; KeyboardInterrupt (Ctrl-C, or SIGINT from the launcher) ends the run with the partial digest."""
    from nnwizard.script_run import RunOptions, ScriptInterrupted, load_script, run_script

    script = load_script(cfg["script"])
    digest = RankDigest(rank, world, script.folder)
    agreement = StepAgreement(channel, rank, cfg.get("max_steps"), cfg.get("time_limit_s"))
    beat = Heartbeat(channel, digest, rank, **(heartbeat_kw or {}))
    beat.start()
    opts = RunOptions(max_steps=cfg.get("max_steps"), limit_batches=cfg.get("limit_batches"), time_limit_s=None,
                      seed=cfg.get("seed", 0), listeners=[digest, agreement], patches=[digest.patches()],
                      scratch=Path(cfg["scratch"]) if cfg.get("scratch") else None)
    result, interrupted = None, False
    try:
        with shared_scratch():
            result = run_script(script, list(cfg.get("args", [])), opts)
    except ScriptInterrupted as stop:
        result, interrupted = stop.result, True
    except KeyboardInterrupt:
        interrupted = True
    finally:
        with _uninterrupted():   # (a second Ctrl-C, or the launcher's SIGTERM, must not lose the digest)
            payload = digest.finish(result)
            if interrupted:
                payload["exit"] = "interrupted"
            if beat.state == "running":
                channel.put(f"digest/{rank}", payload)
                beat.finish()
    return result, payload


@contextmanager
def _uninterrupted():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame):
    raise KeyboardInterrupt   # SIGTERM from the launcher ends the run as Ctrl-C does: a partial digest


def _die_with_parent() -> None:
    """End this rank when the process that started it ends (Linux: PR_SET_PDEATHSIG): never left blocked in a
    collective."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - not Linux
        pass


def main() -> int:
    """``python -m nnwizard.distributed.rank``: one rank started by nnwizard's launcher."""
    cfg = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8") if len(sys.argv) > 1 else os.environ[CONFIG_VAR])
    rank, _, world = rank_and_world()
    _die_with_parent()
    if cfg.get("crash_dir"):   # a rank killed by its backend (gloo's abort) or a segfault leaves its Python stacks
        crash = open(Path(cfg["crash_dir"]) / f"crash.rank{rank}.txt", "w", encoding="utf-8")  # noqa: SIM115
        faulthandler.enable(file=crash, all_threads=True)
        if hasattr(signal, "SIGUSR1"):   # the launcher's last word to a rank whose heartbeat thread no longer runs
            faulthandler.register(signal.SIGUSR1, file=crash, all_threads=True)
    channel = Channel(connect(cfg["store"]), cfg.get("run", ""))
    signal.signal(signal.SIGTERM, _interrupt)
    if cfg.get("mode") == "watch":
        from nnwizard.distributed.watch import watch_rank

        return watch_rank(cfg, channel, rank, world)
    _, payload = run_rank(cfg, channel, rank, world, heartbeat_kw={"exit_code": ABORTED})
    return 130 if payload.get("exit") == "interrupted" else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # (a process group the script left behind, or a thread it started, never holds the rank up)
