"""Run the user's training script as ``python train.py ARGS`` would, under the recorder, bounded, with
its output captured and (optionally) its writes sandboxed.

Usage::

    from nnwizard.script_run import RunOptions, load_script, run_script

    script = load_script("train.py")                  # UsageError (exit 2): missing file, syntax error
    result = run_script(script, ["--epochs", "1"], RunOptions(max_steps=40))
    result.recording      # the Recording (nnwizard.record)
    result.exit           # "finished" | "stopped" (budget) | "raised" | "exited" (sys.exit != 0) | "interrupted"
    result.output         # the script's last printed lines (stdout and stderr, interleaved)
    result.written        # files the script wrote, as [(the path it asked for, where it went)]

The script runs with ``__name__ == "__main__"``, ``sys.argv = [path, *args]``, its folder first on
``sys.path`` and the current directory unchanged (a dotted name runs like ``python -m``). The budget
(``max_steps`` optimizer steps, ``limit_batches`` per DataLoader pass, ``time_limit_s``) ends the run
by raising :class:`~nnwizard.record.StopRun` (a BaseException) inside the script. ``sandbox=True``
(diagnosis) isolates the run's writes (wizard/isolate: in a worker, the isolation in force, a fresh view of
the user's files for every run; used as a library, the Python sandbox), so existing files stay
byte-identical; watch mode runs with ``sandbox=False``. sys.argv, sys.path, sys.modules (the script's own
modules, and stubs it put in place of others), stdout/stderr, the working folder, signal handlers, torch's
global settings, the RNG states and grad mode are restored; the script's exit handlers run when its run ends;
a process the script forks never goes on as nnwizard.
"""

from __future__ import annotations

import builtins
import collections
import io
import math
import os
import runpy
import signal
import sys
import threading
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from nnwizard import isolate, watchdog
from nnwizard.isolate.python_sandbox import Sandbox  # noqa: F401 - (its home was here)
from nnwizard.record import Recorder, Recording, StopRun, plain_text
from nnwizard.script_ranges import capped_range, install as install_range
from nnwizard.script_spec import Script, load_script  # noqa: F401 - (load_script: re-exported for its callers)

DEFAULT_MAX_STEPS = 60
DEFAULT_LIMIT_BATCHES = 20
DEFAULT_TIME_LIMIT_S = 30.0
OUTPUT_LINES = 200


class BatchCap:
    """Fits the batches per pass (a DataLoader's, or a slice loop's over ``range``) to the measured step time (a model of millions of
    parameters on a CPU): after the first steps, the cap is lowered so that two training passes and
    one evaluation pass fit the time limit, i.e. the recording sees evaluation and train mode
    restored, not only the first part of epoch 1. Never below MIN_BATCHES, never above the cap given."""

    MIN_BATCHES = 4
    PASSES = 2.5   # two training passes and an evaluation pass (a forward costs about a third of a step)
    ONE_PASS = 1.4  # a script whose training is one pass: that pass and its evaluation

    def __init__(self, limit: int, seconds: float, passes: float = PASSES):
        self.limit, self.seconds, self.passes = limit, seconds, passes

    def on_step_post(self, rec, optimizer, step) -> None:
        if step.step != 3:
            return
        steps = rec.recording.steps[1:3]  # the first step pays for one-off work (copies, lazy init)
        per_step = sorted(s.duration_s for s in steps)[0] if steps else 0.0
        if per_step > 0 and rec.limit_batches:
            fit = int((getattr(rec, "time_limit_s", None) or self.seconds) / (self.passes * per_step))  # StepFit may raise it
            cap = max(self.MIN_BATCHES, min(self.limit, fit))
            if cap < rec.limit_batches:
                rec.limit_batches = cap
                if rec.recording.loaders:   # (a slice loop's cap has its own note when one applies; a full-batch script has neither)
                    rec.recording.notes.append(f"batches per pass (DataLoader or slice loop) capped at {cap} (a step took "
                                               f"{per_step:.2f} s, time limit {self.seconds:.0f} s)")


class StepFit:
    """Raises the observed run's time limit when its measured step is so slow that the limit would end
    the run before ``STEPS`` optimizer steps (two training passes and an evaluation pass of BatchCap's
    minimum): to what those steps need at the second step's time, never past ``CEILING_STEPS`` steps
    (the diagnosis target: max(20 s, 40 plain steps)). A fast script keeps the default limit.

    The first step pays for the program's start (imports, data set-up, lazy initialisation), so it is
    not the measure; but when it ends so late that a second step like it would not fit the limit, the
    limit is first raised just enough for that second step (1.5x the first step's time), so the run is
    not cut at one step (a model of millions of parameters on a loaded CPU) before it can be measured.

    ``extend=True`` (the step budget is nnwizard's default, not ``--max-steps``): a fast script's run is
    lengthened instead. At step ``EXTEND_AT`` the median step so far (the first left out) sets the budget to
    the steps that fill about ``OBSERVE_S`` seconds, at most ``OBSERVE_MAX``, never fewer than given; the
    batches per pass grow in the same ratio, so the run still spans as many passes (epochs) as before and a
    per-epoch schedule is not stepped more often for it. A curve of a few hundred steps shows what 60
    steps of a slow learner cannot (learning, or none). Not when the script builds torch.distributions
    objects from its model's outputs (a policy gradient, a likelihood): their loss is no descending curve
    (a REINFORCE loss grows with the episodes' returns), and a longer run would be read as one."""

    STEPS = int(BatchCap.PASSES * BatchCap.MIN_BATCHES)
    CEILING_STEPS = 40
    EXTEND_AT = 10
    OBSERVE_S = 3.0
    OBSERVE_MAX = 600

    def __init__(self, extend: bool = False):
        self._given: float | None = None   # the limit as given, when the first step raised it
        self.extend = extend

    def on_step_post(self, rec, optimizer, step) -> None:
        if step.step == self.EXTEND_AT and self.extend:
            self._lengthen(rec)
        if step.step not in (1, 2) or rec.time_limit_s is None:
            return
        per_step = step.duration_s
        if step.step == 1:
            need = rec.now() + 1.5 * per_step
            if need > rec.time_limit_s:
                self._given = rec.time_limit_s
                self._raise(rec, need, f"time limit raised from {rec.time_limit_s:.0f} s to {need:.0f} s to measure a "
                                       f"second step (the first took {per_step:.2f} s)")
            return
        need = min(rec.now() + (self.STEPS - 2) * per_step, self.CEILING_STEPS * per_step)
        if self._given is not None:   # the first step's allowance is replaced by what the measured step needs
            need, rec.time_limit_s = max(need, self._given, rec.now()), self._given
        if need <= rec.time_limit_s:
            return
        self._raise(rec, need, f"time limit raised from {rec.time_limit_s:.0f} s to {need:.0f} s to fit {self.STEPS} steps "
                               f"(a step took {per_step:.2f} s)")

    def _lengthen(self, rec) -> None:
        durations = sorted(s.duration_s for s in list(rec.recording.steps)[1:self.EXTEND_AT])
        if not durations or not rec.max_steps:
            return
        if rec.recording.distributions:
            rec.recording.notes.append(f"run not lengthened past {rec.max_steps} steps: the script builds "
                                       f"torch.distributions objects from its model's outputs (a policy-gradient or "
                                       f"likelihood objective, not a loss that must fall)")
            return
        per_step = durations[len(durations) // 2]
        want = min(self.OBSERVE_MAX, int(self.OBSERVE_S / max(per_step, 1e-6)))
        if want <= rec.max_steps:
            took = f"{per_step:.2f} s" if per_step >= 1 else f"{per_step * 1e3:.3g} ms"
            rec.recording.notes.append(f"run kept at {rec.max_steps} optimizer steps: a step took {took}, so {rec.max_steps} "
                                       f"already take longer than the ~{self.OBSERVE_S:.0f} s a fast script's run is "
                                       f"lengthened to fill")
            return
        if rec.limit_batches:
            rec.limit_batches = math.ceil(rec.limit_batches * want / rec.max_steps)
        rec.recording.notes.append(f"run lengthened from {rec.max_steps} to {want} optimizer steps (a step took "
                                   f"{per_step * 1e3:.3g} ms)" + (f", batches per pass to {rec.limit_batches}"
                                                                  if rec.limit_batches else ""))
        rec.max_steps = want

    @staticmethod
    def _raise(rec, need: float, note: str) -> None:
        rec.recording.notes.append(note)
        rec.time_limit_s = need
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "getitimer") \
                and signal.getitimer(signal.ITIMER_REAL)[0] > 0:  # the run's alarm (_alarm) moves with it
            signal.setitimer(signal.ITIMER_REAL, (need - rec.now()) * 1.5 + 5)
        if _MOVE[0] is not None:
            _MOVE[0]((need - rec.now()) * 1.5 + 7)


@dataclass
class RunOptions:
    max_steps: int | None = DEFAULT_MAX_STEPS
    limit_batches: int | None = DEFAULT_LIMIT_BATCHES
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S
    cap_passes: float = BatchCap.PASSES   # the passes BatchCap fits into the time limit (ONE_PASS: one epoch and its evaluation)
    mode: str = "full"
    sandbox: bool = True
    seed: int | None = 0
    replace_batch: Any = None
    lr_scale: float | None = None
    listeners: list = field(default_factory=list)
    # context managers entered once the recorder is installed and exited before it is removed: a
    # run-time replacement of one piece of the program (the simplify-ladder's rungs, wizard/script_replace.py)
    patches: list = field(default_factory=list)
    scratch: Path | None = None
    capture: bool = True


@dataclass
class RunResult:
    script: Script
    args: list[str]
    recording: Recording
    exit: str
    exit_code: int | None = None
    output: list[str] = field(default_factory=list)
    written: list[tuple[str, str]] = field(default_factory=list)
    scratch: Path | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    import_s: float = 0.0   # seconds spent importing modules that were not loaded yet
    own_files: list[Path] = field(default_factory=list)   # the script's own modules it imported (its folder's .py files)
    deleted: list[str] = field(default_factory=list)      # paths the script deleted (its view only: they are still there)
    ended_by: str | None = None   # the script ended its own process: "called os._exit(0) at train.py:40 after 12 ..."

    @property
    def crashed(self) -> bool:
        return self.exit == "raised"


# ------------------------------------------------------------------------------------ output
_LIVE: dict[str, "_Capture | None"] = {"stdout": None, "stderr": None}   # the captures of the run under way


class _Capture(io.TextIOBase):
    """A stdout/stderr stand-in keeping the last lines of one run. Once its run has ended, what is still written to
    it goes to the capture of the run under way, if any: a logging handler that a first run's ``logging.basicConfig``
    (or a library's logger, set up once a process) bound to this object keeps writing here in every later run."""

    def __init__(self, lines: collections.deque, stream_name: str):
        self.lines, self.name = lines, stream_name
        self.partial = ""
        self.ended = False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self.ended:
            live = _LIVE.get(self.name)
            return live.write(text) if live is not None and live is not self else len(str(text))
        text = str(text)
        parts = (self.partial + text).split("\n")
        self.partial = parts.pop()
        for line in parts:
            self._keep(line)
        if "\r" in self.partial:  # a progress bar redrawing its line: only its latest state is kept
            head, _, tail = self.partial.rpartition("\r")
            self.partial = tail if tail.strip() else _shown(head) + "\r"
        return len(text)

    def _keep(self, line: str) -> None:
        line = _shown(line)
        if line.strip():
            self.lines.append(line.rstrip()[:300])

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def close_partial(self) -> None:
        self._keep(self.partial)
        self.partial = ""


def _shown(line: str) -> str:
    """What a terminal shows of a line that carriage returns redrew (tqdm, progress prints): its last
    non-empty segment, without colour codes."""
    for segment in reversed(plain_text(line).split("\r")):
        if segment.strip():
            return segment
    return ""


# ------------------------------------------------------------------------------------ running
@contextmanager
def _script_environment(script: Script, args: list[str], own: list[Path] | None = None):
    """The script's argv, sys.path, stdin and plotting backend while it runs; afterwards its own modules leave
    sys.modules (their files are appended to ``own``)."""
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    before = set(sys.modules)
    sys.argv = [str(script.path) if script.module is None else str(script.path), *args]
    sys.path.insert(0, str(script.folder))
    saved_backend = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    plt_show = None
    if "matplotlib.pyplot" in sys.modules:
        plt = sys.modules["matplotlib.pyplot"]
        plt_show = plt.show
        plt.show = lambda *a, **k: None
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO("")
    state = _global_state()
    try:
        yield
    finally:
        _restore_global_state(state)
        sys.argv, sys.path[:] = saved_argv, saved_path
        sys.stdin = saved_stdin
        if saved_backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = saved_backend
        if plt_show is not None:
            sys.modules["matplotlib.pyplot"].show = plt_show
        for name in set(sys.modules) - before:  # the script's own modules are imported afresh next run
            if _own_module(sys.modules.get(name), script):
                module = sys.modules.pop(name, None)
                if own is not None and getattr(module, "__file__", None):
                    own.append(Path(module.__file__))


_SIGNALS = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGALRM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCHLD")
            if hasattr(signal, name)]


def _global_state() -> dict:
    """What a script may change for the whole process and a run must not leave behind: the working folder, the
    signal handlers, modules it replaced in sys.modules, torch's default dtype, threads, determinism and anomaly
    mode."""
    state = {"cwd": os.getcwd(), "modules": dict(sys.modules), "dtype": torch.get_default_dtype(),
             "threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
             "anomaly": torch.is_anomaly_enabled(), "cudnn": (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)}
    if threading.current_thread() is threading.main_thread():
        state["signals"] = {s: signal.getsignal(s) for s in _SIGNALS}
    return state


def _restore_global_state(state: dict) -> None:
    try:
        os.chdir(state["cwd"])
    except OSError:
        pass
    for name, module in state["modules"].items():   # a stub the script put in place of a module nnwizard uses
        if sys.modules.get(name) is not module:
            sys.modules[name] = module
    for name in [n for n, m in sys.modules.items() if n not in state["modules"]]:
        module = sys.modules[name]
        if not isinstance(module, type(sys)) or getattr(module, "__spec__", None) is None and not getattr(module, "__file__", None):
            sys.modules.pop(name, None)   # (a stub of the script's own making, not an imported module)
    torch.set_default_dtype(state["dtype"])
    if torch.get_num_threads() != state["threads"]:
        torch.set_num_threads(state["threads"])
    torch.use_deterministic_algorithms(state["deterministic"])
    torch.autograd.set_detect_anomaly(state["anomaly"])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = state["cudnn"]
    for sig, handler in state.get("signals", {}).items():
        if handler is not None and signal.getsignal(sig) is not handler:
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError, TypeError):
                pass


def _own_module(module, script: Script) -> bool:
    """Is ``module`` one of the script's own (a file in its folder, not an installed package)?"""
    origin = getattr(module, "__file__", None) or ""
    return origin.startswith(str(script.folder)) and "site-packages" not in origin


@contextmanager
def _alarm(seconds: float | None):
    """A time limit for code that never calls torch (a hang in data loading): SIGALRM on the main thread and, in a
    worker, the supervisor's deadline a little later (the script may cancel the alarm or catch what it raises:
    the supervisor then stops the run itself, and ends the process if that does not work)."""
    if not seconds:
        yield
        return
    with watchdog.armed(seconds + 2, "the script's run") as move:
        _MOVE[0] = move
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
            try:
                yield
            finally:
                _MOVE[0] = None
            return

        def fire(signum, frame):
            raise StopRun(f"the time limit of {seconds:.0f} s was reached")

        previous = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            _MOVE[0] = None
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


_MOVE: list = [None]   # moves the supervisor's deadline of the run under way (StepFit raising the time limit)


class ScriptInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run of the script; ``result`` holds what was recorded until then."""

    def __init__(self, result: RunResult):
        super().__init__("interrupted")
        self.result = result


def run_script(script: Script, args: list[str] | None = None, options: RunOptions | None = None) -> RunResult:
    """Run the script once; never raises for what the script does (KeyboardInterrupt excepted). A run
    that raised after one of its evaluation passes (a DataLoader's, or a loop over ``range``) was capped
    runs again with those uncapped: predictions gathered over a capped evaluation and compared with all the labels fail
    because of the cap, not the script. The first run stands when the rerun raises the same error
    (the script's own); otherwise the rerun does, with a note."""
    args = list(args or [])
    opts = options or RunOptions()
    result, evaluation_capped = _run_once(script, args, opts, evaluation_caps=True)
    first = result.recording.error
    if result.exit != "raised" or not evaluation_capped or first is None:
        return result
    again, _ = _run_once(script, args, opts, evaluation_caps=False)
    second = again.recording.error
    if second is not None and (second.type, second.where) == (first.type, first.where):
        return result
    again.recording.notes.append(f"a first run raised {first.type} at {first.where or '?'} after an evaluation pass was "
                                 f"capped; this run, with evaluation passes uncapped, "
                                 + ("raised elsewhere" if second is not None else
                                    "did not raise" if again.recording.total_steps > first.step else
                                    f"stopped before step {first.step}, where the first run raised"))
    return again


def _run_once(script: Script, args: list[str], opts: RunOptions, evaluation_caps: bool) -> tuple[RunResult, bool]:
    from nnwizard.isolation import preserved_state, seed_everything

    lines: collections.deque = collections.deque(maxlen=OUTPUT_LINES)
    out, err = _Capture(lines, "stdout"), _Capture(lines, "stderr")
    isolation = isolate.current()
    scratch = None
    if opts.sandbox:
        scratch = opts.scratch or isolation.scratch()
        if scratch is not None:
            scratch.mkdir(parents=True, exist_ok=True)
    listeners = list(opts.listeners)
    if opts.limit_batches and opts.time_limit_s:
        listeners.append(BatchCap(opts.limit_batches, opts.time_limit_s, opts.cap_passes))
    recorder = Recorder(opts.mode, files=script.files, max_steps=opts.max_steps, time_limit_s=opts.time_limit_s,
                        limit_batches=opts.limit_batches, replace_batch=opts.replace_batch, listeners=listeners,
                        lr_scale=opts.lr_scale)
    exit_kind, code = "finished", None
    # loops over range() in the script's own modules are capped like DataLoader passes (script_ranges)
    recorder.cap_evaluation = evaluation_caps
    ranges = capped_range(recorder, evaluation_caps) if opts.limit_batches and recorder.full else None
    own = None if ranges is None else {"range": ranges}

    def fresh(modules: list) -> None:
        for module in modules:
            if _own_module(module, script):
                install_range(module.__dict__, ranges)

    started = time.monotonic()
    saved_out, saved_err = sys.stdout, sys.stderr
    caught: list = []
    imports = [0.0]
    own_files: list[Path] = []
    with preserved_state():
        if opts.seed is not None:
            seed_everything(opts.seed)
        with _script_environment(script, args, own_files), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            if opts.capture:
                sys.stdout, sys.stderr = out, err
                live = dict(_LIVE)
                _LIVE.update(stdout=out, stderr=err)
            pid, files, ended_by = os.getpid(), isolate.RunFiles(), None
            try:
                with isolation.run(opts.sandbox, scratch) as files, _timed_imports(imports, fresh if ranges else None), \
                        _process_group(), recorder, _entered(opts.patches), (_eager(recorder) if recorder.full else _null()), \
                        _alarm((opts.time_limit_s or 0) * 1.5 + 5 if opts.time_limit_s else None), _exit_handlers(), _running():
                    try:
                        if script.notebook is not None:   # a notebook's code cells, in order, as a kernel runs them
                            script.notebook.run(init_globals=own, notes=recorder.recording.notes, shell=not opts.sandbox)
                        elif script.module is not None:
                            runpy.run_module(script.module, run_name="__main__", alter_sys=True, init_globals=own)
                        else:
                            runpy.run_path(str(script.path), run_name="__main__", init_globals=own)
                    except StopRun as stop:
                        exit_kind = "stopped"
                        recorder.recording.stopped = recorder.recording.stopped or str(stop)
                    except SystemExit as exc:
                        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                        exit_kind = "finished" if code == 0 else "exited"
                        if exc.code not in (None, 0) and not isinstance(exc.code, int):
                            lines.append(str(exc.code)[:300])
                    except ScriptExited as exc:
                        code, exit_kind = exc.code, "exited"
                        ended_by = (f"{exc.how} at {exc.where or '?'} after {recorder.recording.total_steps} optimizer "
                                    f"steps")
                        recorder.recording.notes.append(f"the script {ended_by}: its process ended there, without the "
                                                        f"rest of the program")
                    except KeyboardInterrupt as exc:
                        if watchdog.interrupts_by_message() and not watchdog.interrupt_requested():
                            exit_kind = "raised"   # the script's own KeyboardInterrupt (it raised it, or signalled
                            recorder.record_error(exc)   # itself), not the user's Ctrl-C: evidence
                        else:
                            exit_kind = "interrupted"
                    except Exception as exc:  # noqa: BLE001 - the script raising is evidence
                        exit_kind = "raised"
                        recorder.record_error(exc)
                    if os.getpid() != pid:   # a child the script forked (os.fork) ended its part: never go on as nnwizard
                        _forked_child_ends(exit_kind, code, recorder)
            except StopRun as stop:  # the alarm fired outside the script's own frames
                exit_kind = "stopped"
                recorder.recording.stopped = recorder.recording.stopped or str(stop)
            finally:
                sys.stdout, sys.stderr = saved_out, saved_err
                out.close_partial()
                err.close_partial()
                if opts.capture:
                    out.ended = err.ended = True
                    _LIVE.update(live)
    result = RunResult(script, args, recorder.recording, exit_kind, code, list(lines),
                       files.written(), scratch, round(time.monotonic() - started, 3),
                       list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))[:8],
                       round(imports[0], 3), sorted(set(own_files)), files.deleted(), ended_by)
    if exit_kind == "interrupted":
        raise ScriptInterrupted(result)
    return result, recorder.evaluation_capped or (ranges is not None and ranges._control.evaluation_capped)


@contextmanager
def _null():
    yield None


class ScriptExited(BaseException):
    """Raised where the script ended its own process without Python's exit (``os._exit``, ``os.exec*``): in a
    worker (wizard/worker.py) those calls end the run, as they would end the program, and the diagnosis goes on."""

    def __init__(self, code: int, how: str, where: str | None):
        super().__init__(how)
        self.code, self.how, self.where = code, how, where


_RUN = {"running": False}


def running() -> bool:
    """Whether the script is running now on this (the main) thread."""
    return _RUN["running"] and threading.current_thread() is threading.main_thread()


@contextmanager
def _running():
    _RUN["running"] = True
    try:
        yield
    finally:
        _RUN["running"] = False


@contextmanager
def _exit_handlers():
    """Exit handlers the script registers (``atexit``) run when its run ends, as they would when the program
    ends: inside the run's isolation, not when nnwizard's process ends, and once per run."""
    import atexit

    handlers: list = []
    real_register, real_unregister = atexit.register, atexit.unregister

    def register(func, *args, **kwargs):
        handlers.append((func, args, kwargs))
        return func

    def unregister(func):
        handlers[:] = [h for h in handlers if h[0] is not func]
        real_unregister(func)

    atexit.register, atexit.unregister = register, unregister
    try:
        yield
    finally:
        atexit.register, atexit.unregister = real_register, real_unregister
        for func, args, kwargs in reversed(handlers):
            try:
                func(*args, **kwargs)
            except BaseException:  # noqa: BLE001 - an exit handler's failure ends nothing here
                pass


def _forked_child_ends(exit_kind: str, code: int | None, recorder) -> None:
    """End a process the script forked whose code came back here (``sys.exit`` or a return in the child): with
    the code Python would have given it, at once."""
    import traceback

    if exit_kind == "raised" and recorder.recording.error is not None:
        sys.__stderr__.write(recorder.recording.error.traceback or "")
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    del traceback
    os._exit(1 if exit_kind == "raised" else int(code or 0))


@contextmanager
def _process_group():
    """A default process group the script initialised (DDP with ``init_process_group``, one process) is destroyed
    when the run ends: a run stopped at its step budget never reaches the script's own ``destroy_process_group``,
    and the next rerun's ``init_process_group`` would raise "initialize the default process group twice"."""
    try:
        import torch.distributed as dist

        ours = dist.is_available() and not dist.is_initialized()
    except Exception:  # noqa: BLE001 - a torch build without distributed
        ours = False
    try:
        yield
    finally:
        if ours and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - nothing more to undo
                pass


@contextmanager
def _eager(recorder):
    """While a diagnosis records the script, ``torch.compile`` hands back what it was given (a module, a
    function, or as a decorator) and ``Module.compile()`` does nothing: the model runs eagerly, so the recorder
    sees the ops and the loss call inside it (a compiled graph hides them: nanoGPT's loss, computed in its
    forward, was not recorded) and no step pays the compilation (28 s for nanoGPT's first step on this CPU).
    Compiled and eager code compute the same; the recording says it ran eagerly. A returned module also
    answers ``_orig_mod`` (the compiled wrapper's name for it), without registering a submodule."""
    import torch
    from torch import nn

    real_compile, real_method = torch.compile, nn.Module.compile

    def noted() -> None:
        note = "torch.compile ran eagerly while recorded (the ops inside the model are seen; no compilation time)"
        if note not in recorder.recording.notes:
            recorder.recording.notes.append(note)

    def compile(model=None, *args, **kwargs):
        noted()
        if model is None:   # @torch.compile(mode=...): a decorator
            return lambda fn: fn
        if isinstance(model, nn.Module) and "_orig_mod" not in model.__dict__:
            object.__setattr__(model, "_orig_mod", model)
        return model

    def module_compile(self, *args, **kwargs):
        noted()

    torch.compile, nn.Module.compile = compile, module_compile
    try:
        yield
    finally:
        torch.compile, nn.Module.compile = real_compile, real_method


@contextmanager
def _entered(patches: list):
    with ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


@contextmanager
def _timed_imports(spent: list[float], fresh: Callable[[list], None] | None = None):
    """Adds to ``spent[0]`` the seconds the script spends importing modules not loaded before (a rerun
    finds them in sys.modules, so its start-up is the observed one less this); ``fresh`` gets the
    modules each such import loaded."""
    real = builtins.__import__
    depth = [0]

    def timed(name, globals=None, locals=None, fromlist=(), level=0):
        if depth[0] or (name in sys.modules and not level):
            return real(name, globals, locals, fromlist, level)
        depth[0] += 1
        before = len(sys.modules)
        t0 = time.perf_counter()
        try:
            return real(name, globals, locals, fromlist, level)
        finally:
            depth[0] -= 1
            if len(sys.modules) > before:   # (sys.modules keeps insertion order: the new modules come last)
                spent[0] += time.perf_counter() - t0
                if fresh is not None:
                    fresh(list(sys.modules.values())[before:])

    builtins.__import__ = timed
    try:
        yield
    finally:
        builtins.__import__ = real
