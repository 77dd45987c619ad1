"""The cells a watch bundle keeps, so that ``nnwizard replay`` rebuilds the classes a notebook defined in its cells
(a model pickled as ``__main__.Net`` needs ``Net`` again, and no file holds it).

- A notebook run by ``nnwizard watch --script nb.ipynb``: its code cells (``cell N``).
- A live IPython kernel (``nnwizard.watch`` or ``%%nnwizard_watch`` in Jupyter): the cells run so far, ``In[k]``, as
  IPython transformed them (a ``%%nnwizard_watch`` cell: the body that ran).
"""

from __future__ import annotations

import ast
import sys
import types

# In[k] -> the Python a %%nnwizard_watch cell ran (IPython's history holds the magic call, not its body)
WATCHED: dict[int, str] = {}


def current_cells() -> list[dict] | None:
    """``[{"cell": "cell 3" | "In[3]", "python": ...}]`` of the notebook running in this process, or None."""
    from nnwizard.notebook import cells

    if cells.ACTIVE is not None:
        return [{"cell": f"cell {c.index}", "python": c.python} for c in cells.ACTIVE.cells]
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    history = getattr(shell, "user_ns", {}).get("In") if shell is not None else None
    if not history:
        return None
    return [{"cell": f"In[{k}]", "python": WATCHED.get(k, source)} for k, source in enumerate(history)
            if k and isinstance(source, str) and source.strip()]


def load_cells_defs(cells: list[dict], name: str) -> types.ModuleType:
    """The imports, classes, functions and call-free assignments of the cells, in order, executed into a module
    without running anything else (as ``bundle.load_script_defs`` does for a script)."""
    from nnwizard.bundle import definitions

    module = types.ModuleType(name)
    for cell in cells:
        try:
            tree = ast.parse(cell.get("python", ""))
        except SyntaxError:
            continue
        definitions(tree, f"<{cell.get('cell', 'cell')}>", module)
    return module
