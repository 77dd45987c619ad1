"""The hypothesis catalog (trees/catalog.yaml): every id a tree may conclude, with its fix."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nnwizard.errors import TreeError
from nnwizard.yamlsource import line_of, load_with_lines

Category = Literal["data", "model", "loop", "generalization"]


class Hypothesis(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str
    category: Category
    prior: float = Field(0.05, ge=0.0, le=0.5)
    meaning: str
    detection: str
    fix: str
    snippet: str


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hypotheses: dict[str, Hypothesis]


def builtin_trees_dir() -> Path:
    return Path(str(resources.files("nnwizard.trees")))


def load_catalog_file(path: Path) -> Catalog:
    try:
        data, lines = load_with_lines(path)
    except yaml.YAMLError as exc:
        raise TreeError(f"{path}: malformed YAML: {exc}") from None
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise TreeError(f"{path}:{line_of(lines, err['loc'])}: {loc}: {err['msg']}") from None


@lru_cache(maxsize=None)
def load_catalog(extra_dir: str | None = None) -> Catalog:
    """The built-in catalog, extended by a ``catalog.yaml`` in the user's ``--trees`` folder."""
    catalog = load_catalog_file(builtin_trees_dir() / "catalog.yaml")
    if extra_dir and (Path(extra_dir) / "catalog.yaml").exists():
        extra = load_catalog_file(Path(extra_dir) / "catalog.yaml")
        catalog = Catalog(hypotheses={**catalog.hypotheses, **extra.hypotheses})
    return catalog
