"""``%load_ext nnwizard`` in IPython or Jupyter:

``%%nnwizard_watch [--out DIR] [--on-anomaly stop|continue] [--every N] [--no-tensorboard]``
    runs the cell as usual, watched as ``nnwizard watch`` watches a script: ``DIR/watch.jsonl``, TensorBoard scalars,
    and a replay bundle at each anomaly (the bundle keeps the kernel's cells, so ``nnwizard replay`` rebuilds the
    classes they define). Locations read ``cell In[k], line M``.

``%nnwizard_diagnose [diagnose flags]``
    diagnoses the code cells run so far in this kernel (``In[1]`` ... up to the previous cell), in a fresh process and
    the kernel's working folder, as ``nnwizard diagnose --script`` diagnoses a notebook, and shows the report here.
    The kernel's own state is not touched. The report (the JSON form) is kept in ``nnwizard_report``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def load(ipython) -> None:
    ipython.register_magic_function(_watch_magic(ipython), magic_kind="cell", magic_name="nnwizard_watch")
    ipython.register_magic_function(_diagnose_magic(ipython), magic_kind="line", magic_name="nnwizard_diagnose")


# ------------------------------------------------------------------------------------ %%nnwizard_watch
def _watch_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%%nnwizard_watch", add_help=False)
    parser.add_argument("--out", default="nnwizard-watch")
    parser.add_argument("--on-anomaly", default="continue", choices=["continue", "stop"])
    parser.add_argument("--every", type=int, default=None)
    parser.add_argument("--no-tensorboard", action="store_true")
    return parser


def _cell_file(count: int, python: str) -> Path:
    """The cell ``In[count]`` as a file of its own, so that every location in it reads ``cell In[k], line M``."""
    folder = Path(tempfile.gettempdir()) / f"nnwizard-notebook-kernel-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    path = folder / f"In[{count}]"
    path.write_text(python, encoding="utf-8")
    return path


def _running_count(ipython) -> int:
    """The execution count of the cell running now, as its traceback would name it (``In[k]``): from the frame of
    the cell's code (IPython's compiler maps its file name to the count); the shell's counter otherwise."""
    names = getattr(getattr(ipython, "compile", None), "_filename_map", None) or {}
    frame = sys._getframe(1)
    while frame is not None:
        count = names.get(frame.f_code.co_filename)
        if isinstance(count, int):
            return count
        frame = frame.f_back
    return ipython.execution_count


def _watch_magic(ipython):
    def nnwizard_watch(line: str, cell: str) -> None:
        from nnwizard.notebook.sources import WATCHED
        from nnwizard.record import StopRun
        from nnwizard.watcher import Watch

        try:
            args = _watch_parser().parse_args(shlex.split(line))
        except SystemExit:
            print(f"%%nnwizard_watch {line}: expected [--out DIR] [--on-anomaly stop|continue] [--every N] "
                  f"[--no-tensorboard]", file=sys.stderr)
            return
        if args.every is not None and args.every < 1:
            print(f"%%nnwizard_watch: --every {args.every}: must be 1 or more", file=sys.stderr)
            return
        count = _running_count(ipython)
        python = ipython.transform_cell(cell)
        WATCHED[count] = python
        path = _cell_file(count, python)
        code = compile(python, str(path), "exec")
        watch = Watch(out=args.out, on_anomaly=args.on_anomaly, every=args.every, files=[path], script=None,
                      tensorboard=False if args.no_tensorboard else None)
        watch.start()
        try:
            exec(code, ipython.user_ns)  # noqa: S102 - the user's own cell, run as the kernel would
        except StopRun:
            pass   # --on-anomaly stop: the cell ends at the anomaly (said once, by the watch)
        finally:
            watch.close()
        log = Path(args.out) / "watch.jsonl"
        summary = f"nnwizard watch: {watch.steps} optimizer steps watched; log {log}"
        summary += ("; bundles: " + ", ".join(str(b) for b in watch.bundles)) if watch.bundles else (
            "; no anomaly" if watch.steps else "")
        print(summary, file=sys.stderr)

    nnwizard_watch.__doc__ = __doc__
    return nnwizard_watch


# ------------------------------------------------------------------------------------ %nnwizard_diagnose
def kernel_notebook(ipython, folder: Path) -> Path:
    """The cells run so far in this kernel (raw, as typed), as a notebook whose cell k is In[k], run in the kernel's
    working folder."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    raw = list(getattr(ipython.history_manager, "input_hist_raw", None) or ipython.user_ns.get("_ih") or [""])
    current = ipython.execution_count
    cells = [new_code_cell(source if k < current else "") for k, source in enumerate(raw[1:current], start=1)]
    nb = new_notebook(cells=cells, metadata={"nnwizard": {"cells": "In", "cwd": os.getcwd()}})
    path = folder / "kernel.ipynb"
    nbformat.write(nb, str(path))
    return path


def _own_reports(flags: list[str]) -> tuple[list[str], dict[str, str]]:
    """The user's flags without ``--json F`` / ``--report F`` (the magic writes its own report files and copies them
    there afterwards), and those paths."""
    kept, wanted = [], {}
    i = 0
    while i < len(flags):
        flag = flags[i]
        name, eq, value = flag.partition("=")
        if name in ("--json", "--report"):
            if eq:
                wanted[name] = value
            elif i + 1 < len(flags):
                wanted[name] = flags[i + 1]
                i += 1
        else:
            kept.append(flag)
        i += 1
    return kept, wanted


def _diagnose_magic(ipython):
    def nnwizard_diagnose(line: str) -> None:
        folder = Path(tempfile.mkdtemp(prefix="nnwizard-kernel-diagnose-"))
        notebook = kernel_notebook(ipython, folder)
        if not any(c.strip() for c in (getattr(ipython.history_manager, "input_hist_raw", None) or [])[1:ipython.execution_count]):
            print("%nnwizard_diagnose: no cell has run yet in this kernel: run the training cells first", file=sys.stderr)
            return
        flags, wanted = _own_reports(shlex.split(line))
        js, md = folder / "report.json", folder / "report.md"
        command = [sys.executable, "-m", "nnwizard", "diagnose", "--script", str(notebook), "--non-interactive",
                   "--json", str(js), "--report", str(md), *flags]
        env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}   # plain text in the cell's output
        try:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for text in proc.stdout:   # the diagnosis's progress, as it comes
                print(text, end="")
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            print("%nnwizard_diagnose: interrupted", file=sys.stderr)
            return
        if not js.is_file():
            print(f"%nnwizard_diagnose: the diagnosis ended with exit code {code} and no report", file=sys.stderr)
            return
        ipython.user_ns["nnwizard_report"] = json.loads(js.read_text(encoding="utf-8"))
        if type(ipython).__name__ == "ZMQInteractiveShell":   # Jupyter: the markdown report, rendered
            from IPython.display import Markdown, display

            display(Markdown(md.read_text(encoding="utf-8")))
        for flag, source in (("--json", js), ("--report", md)):
            if flag in wanted:
                shutil.copyfile(source, wanted[flag])
                print(f"wrote {wanted[flag]}", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)   # (the terminal view above already showed it; --json/--report keep copies)

    nnwizard_diagnose.__doc__ = __doc__
    return nnwizard_diagnose
