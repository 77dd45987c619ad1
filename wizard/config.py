"""Settings from ``pyproject.toml`` (``[tool.nnwizard]``) and ``NNWIZARD_*`` environment variables.

Precedence: a flag on the command line, then the environment variable, then the config file, then the built-in
default. The config file is the first ``pyproject.toml`` found from the current directory upwards. Keys are the
long flag names without the dashes (``fail-on`` or ``fail_on``); a key in the top table applies to every command
that has that flag, a key in ``[tool.nnwizard.<command>]`` to that command only::

    [tool.nnwizard]
    fail-on = "high"
    device = "cpu"
    max-steps = 40

    [tool.nnwizard.watch]
    out = "runs/nnwizard"

An unknown key is a usage error (exit 2) that names it. The environment variables are ``NNWIZARD_`` and the key in
capitals with underscores (``NNWIZARD_FAIL_ON=high``); they are wired to the flags in the CLI (``ENV``).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any

from nnwizard.errors import UsageError

# the settings each command takes from the config file and the environment (its long flag names)
SETTINGS: dict[str, tuple[str, ...]] = {
    "diagnose": ("symptom", "device", "seed", "fail-on", "strict", "max-steps", "non-interactive", "budget",
                 "probe-timeout", "trees", "quiet", "json", "report", "isolation"),
    "watch": ("out", "on-anomaly", "every"),
    "replay": ("device", "seed", "quiet", "json", "report"),
}
LIST_SETTINGS = {"symptom"}


def env_name(key: str) -> str:
    """``fail-on`` -> ``NNWIZARD_FAIL_ON``."""
    return "NNWIZARD_" + key.upper().replace("-", "_")


def find_pyproject(start: Path | None = None) -> Path | None:
    """The first ``pyproject.toml`` from ``start`` (the current directory) upwards."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def _toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the [tool.nnwizard] settings: {exc}") from None


def _key(raw: str) -> str:
    return raw.replace("_", "-")


def _unknown(path: Path, where: str, key: str, known: list[str]) -> UsageError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(sorted(known))}"
    return UsageError(f"{path}: unknown key {key!r} in [{where}]{hint}")


def default_map(start: Path | None = None) -> tuple[dict[str, dict[str, Any]], Path | None]:
    """click's ``default_map`` from ``[tool.nnwizard]``: ``{command: {parameter name: value}}``, and the file read."""
    path = find_pyproject(start)
    if path is None:
        return {}, None
    table = _toml(path).get("tool", {}).get("nnwizard")
    if table is None:
        return {}, path
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.nnwizard] must be a table")
    every = sorted({k for keys in SETTINGS.values() for k in keys})
    out: dict[str, dict[str, Any]] = {command: {} for command in SETTINGS}
    for raw, value in table.items():
        key = _key(raw)
        if isinstance(value, dict) and raw in SETTINGS:
            for sub_raw, sub_value in value.items():
                sub = _key(sub_raw)
                if sub not in SETTINGS[raw]:
                    raise _unknown(path, f"tool.nnwizard.{raw}", sub_raw, list(SETTINGS[raw]))
                out[raw][_param(sub)] = _value(sub, sub_value)
            continue
        if key not in every:
            raise _unknown(path, "tool.nnwizard", raw, every + list(SETTINGS))
        for command, keys in SETTINGS.items():
            if key in keys:
                out[command].setdefault(_param(key), _value(key, value))
    return {k: v for k, v in out.items() if v}, path


def _param(key: str) -> str:
    """The CLI function's parameter name of a flag (``fail-on`` -> ``fail_on``; the two whose names differ)."""
    return {"json": "json_path", "report": "report_path", "non-interactive": "non_interactive"}.get(key, key.replace("-", "_"))


def _value(key: str, value: Any) -> Any:
    if key in LIST_SETTINGS:
        return value if isinstance(value, list) else [value]
    return value
