"""The script a ``--script`` names: found and syntax-checked (exit 2 when it cannot run at all). Importable
without torch: the supervisor checks the script before any worker starts."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from nnwizard.errors import UsageError


@dataclass
class Script:
    spec: str            # as given
    path: Path | None    # the file that runs
    module: str | None   # a dotted name run like `python -m`
    folder: Path

    @property
    def files(self) -> list[Path]:
        return [self.path] if self.path else []


def load_script(spec: str, import_names: bool = True) -> Script | None:
    """Find and syntax-check the script; UsageError (exit 2, one line) when it cannot run at all. A dotted name is
    looked up as Python would find it (``import_names``: which imports its parent packages, running their code),
    else only as a file below the working folder (None when it is not one: the worker looks it up)."""
    path = Path(spec)
    if path.suffix == ".py" or os.sep in spec or path.exists():
        if not path.is_file():
            raise UsageError(f"--script {spec}: no such file")
        _syntax_check(path, spec)
        return Script(spec, path.resolve(), None, path.resolve().parent)
    if not import_names:
        base = Path.cwd().joinpath(*spec.split("."))
        for candidate in (base.with_suffix(".py"), base / "__main__.py"):
            if candidate.is_file():
                _syntax_check(candidate, spec)
        return None
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):
        found = None
    finally:
        if added:
            sys.path.remove(cwd)
    if found is None or not found.origin or not found.origin.endswith(".py"):
        raise UsageError(f"--script {spec}: no such file, and no module of that name importable from {cwd}")
    origin = Path(found.origin)
    if origin.name == "__init__.py":
        main = origin.parent / "__main__.py"
        if not main.is_file():
            raise UsageError(f"--script {spec}: a package without __main__.py cannot be run")
        origin = main
    _syntax_check(origin, spec)
    return Script(spec, origin.resolve(), spec, Path.cwd())


def _syntax_check(path: Path, spec: str) -> None:
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--script {spec}: cannot read: {exc.strerror}") from None
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise UsageError(f"--script {spec}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except ValueError as exc:
        raise UsageError(f"--script {spec}: cannot be compiled: {exc}") from None
