"""Import the user's training module from a dotted path, a file path, or either with ``:attr``.

Like uvicorn's importer, this tells "there is no such module" apart from "the module exists but
raised while importing", and names the line in the user's file where it raised.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from nnwizard.errors import TargetError


def split_spec(spec: str) -> tuple[str, str | None]:
    """``pkg.mod:attr`` -> (``pkg.mod``, ``attr``); a drive letter or path colon is left alone."""
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail.isidentifier():
        return head, tail
    return spec, None


def _looks_like_file(path: str) -> bool:
    return path.endswith(".py") or os.sep in path or (os.altsep is not None and os.altsep in path)


def _package_root(file: Path) -> tuple[Path, str]:
    """Walk up while folders are packages: the folder to put on sys.path and the dotted name."""
    parts = [file.stem]
    folder = file.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return folder, ".".join(parts)


def raised_at(exc: BaseException) -> str:
    """The innermost frame outside site-packages: where the user's code raised (for a syntax error: the
    line that does not parse, not the import machinery that read it)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if "site-packages" not in f.filename and "importlib" not in f.filename]
    frame = (user or frames)[-1] if frames else None
    return f" at {frame.filename}:{frame.lineno}" if frame else ""


def import_module(spec: str) -> ModuleType:
    """Import ``spec`` (dotted or file path) with the current directory on ``sys.path``."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    if _looks_like_file(spec):
        file = Path(spec).resolve()
        if not file.is_file():
            raise TargetError(
                f"Cannot load module {spec!r}: there is no file {file}. Pass a dotted module path "
                "importable from the current directory (mypkg.train) or an existing .py file."
            )
        root, name = _package_root(file)
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    else:
        name = spec
    try:
        if _looks_like_file(spec) and _shadowed(name, file):
            return _load_file(name, file)
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (name == missing or name.startswith(missing + ".")):
            raise TargetError(
                f"Cannot load module {spec!r}: no module named {missing!r} is importable from "
                f"{cwd}. Run nnwizard from the folder that contains your package, or pass a file "
                "path (path/to/train.py)."
            ) from None
        raise TargetError(
            f"Module {spec!r} was found but importing it failed{raised_at(exc)}: "
            f"{type(exc).__name__}: {exc}. Install what it imports, or fix the import."
        ) from exc
    except Exception as exc:  # anything the user's module raises at import time
        raise TargetError(
            f"Module {spec!r} was found but raised while being imported{raised_at(exc)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _shadowed(name: str, file: Path) -> bool:
    """Another module of that name is loaded already (the user's ``attr.py`` or ``model.py`` beside an installed
    ``attr`` package that something imported first): importing the name would return that one."""
    loaded = sys.modules.get(name)
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    return loaded is not None and (origin is None or Path(origin).resolve() != file)


def _load_file(name: str, file: Path) -> ModuleType:
    """The user's file as a module of its own, leaving the module already registered under that name in place."""
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_namespace(spec: str) -> tuple[Any, ModuleType]:
    """The object holding the contract's names, and the module it came from."""
    path, attr = split_spec(spec)
    module = import_module(path)
    if attr is None:
        return module, module
    if not hasattr(module, attr):
        raise TargetError(f"Module {path!r} has no attribute {attr!r} (named after ':' in {spec!r}).")
    factory = getattr(module, attr)
    if not callable(factory):
        return factory, module
    try:
        return factory(), module
    except Exception as exc:
        raise TargetError(
            f"{spec}: calling {attr}() raised{raised_at(exc)}: {type(exc).__name__}: {exc}. It must "
            "return an object with build_model, build_data and loss_fn/build_loss."
        ) from exc
