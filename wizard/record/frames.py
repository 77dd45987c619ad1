"""Which code is the user's, and where in it something happened (and what an exception says, in one line): ``file:line in function`` of the innermost
frame of the user's program, on the live stack (a loss call, an optimizer built, an op traced) or in an
exception's traceback (a crash). The one place that tells the user's code from torch's, an installed
package's and nnwizard's own.

A file is one of four kinds (``UserCode.kind``):

- ``USER``: one of the user's files given (the script, the training module); with no files given, any
  code that is neither a library nor an installed package (the caller's own code);
- ``LOCAL``: other code outside torch, nnwizard and the installed packages (a module next to the script,
  the standard library);
- ``PACKAGE``: an installed package (``site-packages``) other than torch;
- ``LIBRARY``: torch, nnwizard itself, ``runpy`` and code without a file (``<string>``, ``<frozen ...>``).

The user's frame is the innermost ``USER`` frame; where none is found, ``fallback`` takes the innermost
frame in the folder of the user's files, else the innermost one outside torch and nnwizard.
"""

from __future__ import annotations

import re
from pathlib import Path

USER, LOCAL, PACKAGE, LIBRARY = 3, 2, 1, 0

_OURS = (str(Path(__file__).resolve().parent.parent), )      # nnwizard (its probes and trees are found by name below)
_OUR_NAMES = ("/nnwizard/", "/wizard/", "/probes/")
# frames of torch's function-mode plumbing between an op and its caller (not the op's own code)
_PLUMBING = ("/torch/overrides.py", "/torch/utils/_device")


def site(filename: str, lineno: int | None, function: str) -> str:
    """``train.py:12 in main``."""
    return f"{Path(filename).name}:{lineno} in {function}"


def tb_frames(exc: BaseException) -> list[tuple]:
    """The (frame, line number) pairs of ``exc``'s traceback, outermost first."""
    tb, out = exc.__traceback__, []
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _library(name: str) -> bool:
    return "/torch/" in name or name.startswith("<") or "runpy" in name or any(p in name for p in _OUR_NAMES) \
        or name.startswith(_OURS)


class UserCode:
    """The user's files (``files``: the script or training module; none: the caller's own code) and the
    frames in them; see the module docstring. Kinds are cached per file name and call sites per code
    position: the recorder asks at every loss call."""

    def __init__(self, files=None):
        self.files = {str(Path(f).resolve()) for f in files or []}
        self.folders = {str(Path(f).resolve().parent) for f in files or []}
        self._kinds: dict[str, int] = {}
        self._codes: dict = {}   # code object -> (kind, file base name)
        self._sites: dict = {}   # (code object, f_lasti) -> "file:line in function"

    # -- kinds --------------------------------------------------------------------------------------
    def kind(self, filename: str) -> int:
        known = self._kinds.get(filename)
        if known is None:
            if self.files and not filename.startswith("<") and str(Path(filename).resolve()) in self.files:
                known = USER
            elif _library(filename):
                known = LIBRARY
            elif "site-packages" in filename or "dist-packages" in filename:
                known = PACKAGE
            else:
                known = LOCAL if self.files else USER
            self._kinds[filename] = known
        return known

    def is_user(self, filename: str) -> bool:
        return self.kind(filename) == USER

    def near(self, filename: str) -> bool:
        """In the folder of one of the user's files (a helper module beside the script)."""
        return not filename.startswith("<") and any(str(Path(filename).resolve()).startswith(f) for f in self.folders)

    def _code(self, code) -> tuple[int, str]:
        known = self._codes.get(code)
        if known is None:
            known = self._codes[code] = (self.kind(code.co_filename), Path(code.co_filename).name)
        return known

    # -- the live stack -----------------------------------------------------------------------------
    def where(self, frame, fallback: bool = True) -> str | None:
        """``file:line in function`` of the innermost user frame from ``frame`` outwards; ``fallback``: else
        the innermost frame outside torch and nnwizard."""
        other = None
        sites = self._sites
        while frame is not None:
            code = frame.f_code
            kind, name = self._code(code)
            if kind == USER or (fallback and other is None and kind != LIBRARY):
                key = (code, frame.f_lasti)   # a call site: its text is made once (f_lineno decodes the line table)
                text = sites.get(key)
                if text is None:
                    text = sites[key] = f"{name}:{frame.f_lineno} in {code.co_name}"
                if kind == USER:
                    return text
                other = text
            frame = frame.f_back
        return other

    def locate(self, frame, skip: tuple[str, ...] = ()) -> tuple[str | None, bool]:
        """For an op traced by a torch-function mode: the user frame's ``file:line in function``, and whether
        the op was called straight from it (no other frame between), the frames of the files ``skip`` (the
        tracer's own) and of torch's function-mode plumbing skipped."""
        first = True
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename in skip or any(p in filename for p in _PLUMBING):
                frame = frame.f_back
                continue
            if self.is_user(filename):
                return site(filename, frame.f_lineno, frame.f_code.co_name), first
            first = False
            frame = frame.f_back
        return None, False

    # -- tracebacks ---------------------------------------------------------------------------------
    def user_index(self, frames: list[tuple], fallback: str | None = None) -> int | None:
        """The index in ``frames`` (``tb_frames``) of the innermost user frame; ``fallback="near"``: else of the
        innermost one in the user's folders; ``"any"``: else that, else the innermost one outside torch and
        nnwizard."""
        tests = [self.is_user] + ([self.near] if fallback else []) + \
            ([lambda name: self.kind(name) != LIBRARY] if fallback == "any" else [])
        for test in tests:
            for i in range(len(frames) - 1, -1, -1):
                if test(frames[i][0].f_code.co_filename):
                    return i
        return None

    def in_traceback(self, exc: BaseException, fallback: str | None = "any") -> str | None:
        """``file:line in function`` of the innermost user frame of ``exc``'s traceback (see ``user_index``)."""
        frames = tb_frames(exc)
        i = self.user_index(frames, fallback)
        if i is None:
            return None
        frame, lineno = frames[i]
        return site(frame.f_code.co_filename, lineno, frame.f_code.co_name)


def user_frame(exc: BaseException, files=None) -> str | None:
    """``file:line in function`` of the innermost frame of ``exc`` in the user's ``files`` (else near them, else
    outside torch and nnwizard)."""
    return UserCode(files).in_traceback(exc)


def first_line(exc: BaseException, limit: int = 240) -> str:
    """``TypeName: the first line of its message`` (at most ``limit`` characters of it)."""
    text = str(exc).strip().splitlines()
    message = text[0] if text else ""
    return f"{type(exc).__name__}: {message[:limit]}"


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain_text(text: str) -> str:
    """``text`` without terminal escape sequences (bold, colours): torch's own messages carry some."""
    return _ANSI.sub("", text)

