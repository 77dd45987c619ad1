"""What a notebook's cells call on ``get_ipython()`` while nnwizard runs them outside a kernel: a small stand-in
for IPython's ``InteractiveShell`` that runs the magics whose effect the program depends on and skips, with a
note in the report, those that only touch the kernel or the machine.

- run: ``%time``/``%timeit``/``%prun``/``%capture`` and their cell forms (the statement once, at its own cell
  and line), ``%cd``, ``%env``/``%set_env``, ``%run script.py`` (into the notebook's namespace), ``%%writefile``
  (through ``open``, so the diagnosis sandbox catches it), ``%reset -f``.
- no-ops: ``%matplotlib`` (plots go to the non-interactive Agg backend anyway), ``%config``, ``%load_ext``,
  ``%autoreload``, ``%who``, ``%%html`` and the other display magics, ``?`` help.
- shell commands ``!cmd``, ``x = !cmd``, ``%pip``, ``%conda``, ``%%bash``/``%%sh``: run as a kernel runs them
  in ``watch`` (the user's real run); skipped with a note in a diagnosis (it installs nothing and starts no shell
  command; ``x = !ls`` gives an empty list). Any magic not listed here is skipped with a note.
"""

from __future__ import annotations

import os
import runpy
import shlex
import subprocess
import sys
from typing import Any

QUIET = {"matplotlib", "config", "load_ext", "reload_ext", "unload_ext", "autoreload", "aimport", "who", "whos",
         "who_ls", "xmode", "precision", "colors", "pinfo", "pinfo2", "psearch", "pdoc", "pdef", "psource", "pfile",
         "history", "hist", "store", "notebook", "page", "pprint", "autocall", "automagic", "doctest_mode", "lsmagic",
         "magic", "quickref", "alias_magic", "rehashx", "tb", "pdb", "html", "markdown", "latex", "javascript", "js",
         "svg", "nnwizard_diagnose", "clear", "ls", "pwd", "dhist", "bookmark", "logstart", "logstop", "load"}
TIMED = {"time", "timeit", "prun", "capture", "nnwizard_watch", "memit", "debug"}
SHELL = {"pip", "conda", "mamba", "system", "sx", "bash", "sh", "script", "bg", "sql", "writefile_remote", "perl",
         "ruby", "python2", "python3", "pypy", "cmd", "powershell"}


def display(*objs: Any, **kwargs: Any) -> None:
    """IPython's ``display()`` outside a kernel: each object's text form, as a console shows it."""
    for obj in objs:
        print(obj if isinstance(obj, str) else repr(obj))


class _Events:
    """``get_ipython().events``: callbacks are accepted and never fired (no cell runs through a kernel)."""

    def register(self, *args: Any, **kwargs: Any) -> None:
        pass

    def unregister(self, *args: Any, **kwargs: Any) -> None:
        pass


class _SList(list):
    """What ``x = !cmd`` gives when the command is not run: an empty list with IPython's SList accessors."""

    @property
    def s(self) -> str:
        return " ".join(self)

    @property
    def n(self) -> str:
        return "\n".join(self)

    @property
    def l(self) -> list:  # noqa: E743 - IPython's name
        return list(self)


class _Captured:
    """What ``%%capture out`` binds ``out`` to: the output went to nnwizard's own capture, so it reads empty."""

    stdout = stderr = ""
    outputs: list = []

    def show(self) -> None:
        pass

    def __call__(self) -> None:
        pass


class NotebookShell:
    """``get_ipython()`` for a notebook run by nnwizard: see the module docstring."""

    def __init__(self, notebook, user_ns: dict, notes: list, run_shell: bool = False):
        self.notebook, self.user_ns, self.notes, self.run_shell = notebook, user_ns, notes, run_shell
        self.current = None      # the cell running
        self.events = _Events()
        self.config: dict = {}
        self.kernel = None

    def get_ipython(self) -> "NotebookShell":
        return self

    # -- where -------------------------------------------------------------------------------------
    def _line(self) -> int:
        """The line of the current cell that called the shell (the magic's own line)."""
        cell = self.current
        frame = sys._getframe(1)
        while frame is not None and cell is not None:
            if frame.f_code.co_filename == str(cell.file):
                return frame.f_lineno
            frame = frame.f_back
        return 1

    def _where(self, line: int | None = None) -> str:
        cell = self.current
        return f"cell {cell.index}, line {line or self._line()}" if cell is not None else "a notebook cell"

    def _note(self, text: str) -> None:
        note = f"notebook: {text}"
        if note not in self.notes:
            self.notes.append(note)

    def _exec(self, code: str, line: int) -> None:
        """``code`` run in the notebook's namespace as lines of the current cell from ``line`` on."""
        cell = self.current
        filename = str(cell.file) if cell is not None else "<notebook>"
        exec(compile("\n" * (line - 1) + code, filename, "exec"), self.user_ns)  # noqa: S102 - the user's cell

    # -- IPython's entry points ------------------------------------------------------------------
    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> Any:
        at = self._line()
        if name in TIMED:
            if line.strip():
                self._exec(_strip_options(name, line), at)
            return None
        if name == "cd":
            target = os.path.expanduser(line.strip().strip("'\"") or "~")
            os.chdir(target)
            return None
        if name in ("env", "set_env"):
            return self._env(name, line)
        if name == "run":
            return self._run(line, at)
        if name == "reset" and "-f" in line.split():
            keep = {"__builtins__", "__name__", "get_ipython", "display", "In", "Out"}
            for key in [k for k in self.user_ns if k not in keep and not k.startswith("_")]:
                del self.user_ns[key]
            return None
        if name in QUIET or name == "reset":
            return None
        if name in SHELL and self.run_shell and name in ("pip", "conda", "mamba", "system", "sx"):
            prefix = {"pip": f"{sys.executable} -m pip", "system": "", "sx": ""}.get(name, name)
            return self.system(f"{prefix} {line}".strip()) if name != "sx" else self.getoutput(line)
        if name in SHELL:
            self._note(f"`%{name} {line}` at {self._where(at)} was not run (a diagnosis installs nothing and runs no "
                       f"shell command)")
            return None
        self._note(f"`%{name}` at {self._where(at)} is a magic nnwizard does not run outside a kernel; it was skipped")
        return None

    def run_cell_magic(self, name: str, line: str, cell: str) -> Any:
        at = self._line()
        if name in TIMED:
            self._exec(cell, at + 1)
            return None
        if name in ("writefile", "file"):
            args = shlex.split(line)
            append = any(a in ("-a", "--append") for a in args)
            target = next((a for a in args if not a.startswith("-")), None)
            if target is None:
                raise ValueError("%%writefile: no file name given")
            with open(os.path.expanduser(target), "a" if append else "w", encoding="utf-8") as fh:
                fh.write(cell)
            return None
        if name in QUIET:
            return None
        if name in ("bash", "sh") and self.run_shell:
            subprocess.run([name, "-c", cell], check=False)
            return None
        if name in SHELL:
            self._note(f"the `%%{name}` cell at {self._where(at)} was not run (a diagnosis runs no shell command)")
            return None
        self._note(f"the `%%{name}` cell at {self._where(at)} is a magic nnwizard does not run outside a kernel; "
                   f"it was skipped")
        return None

    def captured(self) -> "_Captured":
        return _Captured()

    def system(self, cmd: str) -> None:
        if self.run_shell:
            subprocess.run(os.path.expandvars(cmd), shell=True, check=False)  # noqa: S602 - the user's own `!cmd`
            return
        self._note(f"`!{cmd}` at {self._where()} was not run (a diagnosis installs nothing and runs no shell command)")

    def getoutput(self, cmd: str, split: bool = True, depth: int = 0) -> _SList:
        if self.run_shell:
            done = subprocess.run(os.path.expandvars(cmd), shell=True, check=False, capture_output=True, text=True)  # noqa: S602
            return _SList(done.stdout.splitlines())
        self._note(f"`!{cmd}` at {self._where()} was not run (a diagnosis runs no shell command): its output is an "
                   f"empty list")
        return _SList()

    def magic(self, arg_s: str) -> Any:
        name, _, line = arg_s.lstrip("%").partition(" ")
        return self.run_line_magic(name, line)

    def run_cell(self, raw_cell: str, *args: Any, **kwargs: Any) -> None:
        from nnwizard.notebook.cells import python_source

        self._exec(python_source(raw_cell), 1)

    def ev(self, expr: str) -> Any:
        return eval(expr, self.user_ns)  # noqa: S307 - the user's own expression

    def ex(self, cmd: str) -> None:
        exec(cmd, self.user_ns)  # noqa: S102

    def push(self, variables: dict | str, interactive: bool = True) -> None:
        if isinstance(variables, dict):
            self.user_ns.update(variables)

    def set_next_input(self, *args: Any, **kwargs: Any) -> None:
        pass

    def register_magics(self, *args: Any, **kwargs: Any) -> None:
        pass

    def register_magic_function(self, *args: Any, **kwargs: Any) -> None:
        pass

    def showtraceback(self, *args: Any, **kwargs: Any) -> None:
        pass

    # -- the magics that change state -----------------------------------------------------------
    def _env(self, name: str, line: str) -> Any:
        text = line.strip()
        if not text:
            return dict(os.environ)
        if "=" in text:
            key, _, value = text.partition("=")
        else:
            key, _, value = text.partition(" ")
        key, value = key.strip(), value.strip()
        if not value and "=" not in text:
            return os.environ.get(key)
        os.environ[key] = os.path.expandvars(value)
        return None

    def _run(self, line: str, at: int) -> None:
        args = shlex.split(line)
        module = None
        while args and args[0].startswith("-"):
            flag = args.pop(0)
            if flag == "-m" and args:
                module = args.pop(0)
                break
        saved = list(sys.argv)
        try:
            if module is not None:
                sys.argv = [module, *args]
                result = runpy.run_module(module, init_globals=self.user_ns, run_name="__main__")
            elif args:
                path = os.path.expanduser(args[0])
                if path.endswith(".ipynb"):
                    self._note(f"`%run {line}` at {self._where(at)}: running another notebook is not supported; skipped")
                    return None
                sys.argv = [path, *args[1:]]
                result = runpy.run_path(path, init_globals=self.user_ns, run_name="__main__")
            else:
                return None
        finally:
            sys.argv = saved
        self.user_ns.update({k: v for k, v in result.items() if not k.startswith("__")})
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._note(f"get_ipython().{name} is not available outside a kernel; the call did nothing")
        return _nothing


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _strip_options(name: str, line: str) -> str:
    """The statement of ``%timeit -n 10 -r 3 f(x)`` / ``%prun -s cumulative f(x)`` without the magic's options."""
    if name not in ("timeit", "prun"):
        return line
    words = line.strip().split(" ")
    takes_value = {"-n", "-r", "-s", "-T", "-D", "-l", "-p"}
    i = 0
    while i < len(words) and words[i].startswith("-"):
        i += 2 if words[i] in takes_value else 1
    return " ".join(words[i:])
