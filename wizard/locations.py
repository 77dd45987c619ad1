"""How a location in the user's program reads in a report: ``train.py:27`` for a script, ``cell 3, line 5`` for a
notebook's cell (N its 1-based position among all the notebook's cells), ``cell In[7], line 2`` for a cell run in a
live IPython kernel (IPython's own way of naming them).

A notebook's cells run from files named ``cell N`` (``nnwizard.notebook.cells``), so the recorder's
``file:line in function`` texts come out as ``cell 3:5 in f``; :func:`render` turns every such text of a report
into ``cell 3, line 5 in f`` (and a traceback's ``File ".../cell 3", line 5`` into ``File "nb.ipynb", cell 3, line
5``). :func:`site` is the same rendering for code that holds the frame itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_CELL = re.compile(r"(?<![\w/.\-])cell (\d+):(\d+)")
_CELL_FILE = re.compile(r'File "[^"]*/cell (\d+)", line (\d+)')
_KERNEL = re.compile(r"(?<![\w/.\-])In\[(\d+)\]:(\d+)")


def site(filename: str, lineno: int, function: str | None = None) -> str:
    """``file:line in function`` of one frame, with a notebook cell's file read as ``cell N, line M``."""
    name = Path(filename).name
    where = f"{name}:{lineno}"
    if _CELL.fullmatch(where) and Path(filename).parent.name.startswith("nnwizard-notebook-"):
        where = f"{name}, line {lineno}"
    return f"{where} in {function}" if function else where


def render(text: str, notebook: str | None = None) -> str:
    """A report's text with the notebook cells' locations as ``cell N, line M``."""
    if "cell " not in text and "In[" not in text:
        return text
    text = _CELL_FILE.sub(lambda m: f'File "{notebook or "notebook"}", cell {m[1]}, line {m[2]}', text)
    text = _CELL.sub(lambda m: f"cell {m[1]}, line {m[2]}", text)
    return _KERNEL.sub(lambda m: f"cell In[{m[1]}], line {m[2]}", text)


def render_all(value: Any, notebook: str | None = None) -> Any:
    """:func:`render` over every string inside dicts and lists (a report's JSON form)."""
    if isinstance(value, str):
        return render(value, notebook)
    if isinstance(value, dict):
        return {k: render_all(v, notebook) for k, v in value.items()}
    if isinstance(value, list):
        return [render_all(v, notebook) for v in value]
    return value
