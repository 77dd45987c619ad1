"""record/frames.py: the one helper that tells the user's code from torch's and nnwizard's, on the live stack and
in a traceback."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nnwizard.record.frames import LIBRARY, LOCAL, PACKAGE, USER, UserCode, first_line, plain_text, user_frame


def _user_module(tmp_path: Path, source: str, name: str = "train_user"):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return path, namespace


def test_kinds_of_files(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    code = UserCode([script])
    assert code.kind(str(script)) == USER
    assert code.kind(torch.__file__) == LIBRARY
    assert code.kind(str(Path(sys.modules["nnwizard.record.frames"].__file__))) == LIBRARY
    assert code.kind("<string>") == LIBRARY
    assert code.kind("/usr/lib/python3/site-packages/somepkg/mod.py") == PACKAGE
    assert code.kind(str(tmp_path / "helper.py")) == LOCAL
    assert code.near(str(tmp_path / "helper.py")) and not code.near("/elsewhere/helper.py")
    # without files, the caller's own code is the user's
    assert UserCode().kind(str(tmp_path / "helper.py")) == USER


def test_where_finds_the_innermost_user_frame_through_library_frames(tmp_path):
    path, ns = _user_module(tmp_path, """
        def outer(probe):
            return inner(probe)

        def inner(probe):
            return probe()
    """)
    code = UserCode([path])
    where = ns["outer"](lambda: code.where(sys._getframe(0)))
    assert where == f"{path.name}:6 in inner"
    # a frame of no user file, without fallback: nothing
    assert UserCode([tmp_path / "other.py"]).where(sys._getframe(0), fallback=False) is None


def test_in_traceback_names_the_users_line_and_falls_back_near_it(tmp_path):
    path, ns = _user_module(tmp_path, """
        import torch

        def train():
            return torch.ones(2, 3) @ torch.ones(2, 3)
    """)
    with pytest.raises(RuntimeError) as info:
        ns["train"]()
    assert UserCode([path]).in_traceback(info.value) == f"{path.name}:5 in train"
    assert user_frame(info.value, [path]) == f"{path.name}:5 in train"
    # another script given: the frame beside it (same folder) is the fallback, none without one
    other = tmp_path / "main.py"
    assert UserCode([other]).in_traceback(info.value, fallback="near") == f"{path.name}:5 in train"
    assert UserCode([other]).in_traceback(info.value, fallback=None) is None


def test_locate_says_whether_the_op_was_called_straight_from_the_user(tmp_path):
    path, ns = _user_module(tmp_path, """
        def direct(probe):
            return probe()
    """)
    code = UserCode([path])
    where, direct = ns["direct"](lambda: code.locate(sys._getframe(1)))
    assert where == f"{path.name}:3 in direct" and direct
    where, direct = ns["direct"](lambda: code.locate(sys._getframe(0)))   # (a frame of this test file between)
    assert where == f"{path.name}:3 in direct" and not direct


def test_first_line_and_plain_text():
    assert first_line(ValueError("bad shape\nmore detail")) == "ValueError: bad shape"
    assert first_line(KeyError("x" * 500), limit=10).startswith("KeyError: 'xxxxxxxxx")
    assert plain_text("\x1b[1mbold\x1b[0m plain") == "bold plain"
