"""The probe registry: built-in modules load themselves; third-party probes arrive through the
``nnwizard.probes`` entry-point group, exactly as built-ins register."""

from __future__ import annotations

import sys
import types

import pytest

import nnwizard.probes.api as api


def test_builtin_probes_are_registered():
    registry = api.load_all()
    assert {"model-summary", "forward-shape", "initial-loss", "overfit-one-batch"} <= set(registry)
    for spec in registry.values():
        assert "errored" in spec.outcomes and "skipped" in spec.outcomes
        if not spec.module.split(".")[-1].startswith("test_"):  # probes the test modules register
            assert spec.module.startswith("nnwizard.probes."), spec.module


def test_entry_point_probe_is_loaded(monkeypatch):
    plugin = types.ModuleType("nnwizard_plugin_demo")

    def load():
        @api.probe("plugin-demo", title="a third-party probe", outcomes={"ok": "quiet"})
        def demo(ctx):
            return api.passed("hello")

        return plugin

    class FakeEntryPoint:
        name = "demo"

        def load(self):
            return load()

    monkeypatch.setitem(sys.modules, "nnwizard_plugin_demo", plugin)
    monkeypatch.setattr(api, "_LOADED", False)
    monkeypatch.setattr(api, "entry_points", lambda group: [FakeEntryPoint()] if group == "nnwizard.probes" else [])
    assert "plugin-demo" in api.load_all()
    assert api.get("plugin-demo").title == "a third-party probe"
    api._REGISTRY.pop("plugin-demo")


def test_unknown_probe_is_a_usage_error():
    from nnwizard.errors import ExitCode, ProbeNotFound

    with pytest.raises(ProbeNotFound, match="unknown probe 'nope'") as info:
        api.get("nope")
    assert info.value.exit_code == ExitCode.USAGE


def test_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="registered twice"):
        api.probe("model-summary", title="again", outcomes={"ok": "x"})(lambda ctx: None)
