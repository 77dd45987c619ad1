"""A wheel of nnwizard, installed on its own and run from another directory, finds its trees,
catalog and probes (the folders are mapped to nnwizard.* packages by the build backend)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import EXAMPLES, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    [whl] = list(out.glob("nnwizard-*.whl"))
    return whl


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "nnwizard/trees/catalog.yaml" in names and "nnwizard/trees/sanity.yaml" in names
    assert "nnwizard/probes/sanity.py" in names and "nnwizard/cli.py" in names
    assert "nnwizard/record/recorder.py" in names and "nnwizard/record/patches/losses.py" in names
    assert not any(n.startswith(("wizard/", "probes/", "trees/")) for n in names), "no top-level wizard/probes/trees"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "nnwizard = nnwizard.launch:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_wheel_runs_from_another_directory(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}

    def run(*args):
        return subprocess.run([sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    where = run("-c", "import nnwizard, nnwizard.catalog as c; print(nnwizard.__file__); print(c.builtin_trees_dir())")
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    validated = run("-m", "nnwizard", "trees", "validate")
    assert validated.returncode == 0 and "sanity" in validated.stdout, validated.stdout + validated.stderr
    diagnosed = run("-m", "nnwizard", "diagnose", "--module", str(EXAMPLES / "broken_frozen.py"), "--non-interactive",
                    "-s", "flat", "-q", "--fail-on", "0.5")
    assert diagnosed.returncode == 1 and "frozen-parameters" in diagnosed.stderr, diagnosed.stderr
