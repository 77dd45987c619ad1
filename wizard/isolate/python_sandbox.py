"""``--isolation python``: the script's writes redirected by patching the Python functions that reach the file
system, for where the operating system offers no isolation (macOS, locked-down containers).

What the script writes goes to a scratch folder that mirrors the paths it used (``scratch/<path relative to the
working directory>``, ``scratch/_abs/<absolute path>`` elsewhere); reads, listings (``os.listdir``,
``os.scandir``, ``glob``, ``Path.glob``, ``os.walk``) and ``stat`` see those writes, and see files the script
deleted as gone while the originals stay. Intercepted: ``open``/``io.open``/``io.FileIO``, ``os.open``,
``os.mkdir``/``makedirs``, ``os.remove``/``unlink``/``rmdir`` (with ``dir_fd`` too), ``shutil.rmtree``,
``os.rename``/``replace`` (``shutil.move``), ``os.truncate``, ``os.chmod``/``chown``/``utime``,
``os.link``/``symlink``, ``tempfile`` (through ``os.open``/``os.mkdir``), ``torch.save``/``load``,
``numpy.load`` and its text loaders, ``sqlite3.connect``, ``h5py.File``, ``safetensors.torch`` files. Child processes cannot be followed:
``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn`` are refused with ``PermissionError`` (and
listed); ``multiprocessing`` children (spawn, forkserver) start through a wrapper that installs the same
sandbox in them. What it cannot see: writes by C code that opens files itself (other than the libraries
named), by memory maps of existing files, and by processes started outside Python. docs/isolation.md says so.

New entries the script makes in the system temp folder (``tempfile.mkdtemp()``) are made for real, so that C
code and children given their path find them, and are removed when the run ends.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

ENV = "NNWIZARD_PY_SANDBOX"   # a multiprocessing child's sandbox: {"scratch", "cwd", "removed"}

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _fd_path(fd: int) -> str | None:
    """The path of an open directory descriptor (``dir_fd`` arguments)."""
    try:
        if sys.platform.startswith("linux"):
            return os.readlink(f"/proc/self/fd/{fd}")
        import fcntl

        return fcntl.fcntl(fd, 50, b"\0" * 1024).split(b"\0", 1)[0].decode()  # F_GETPATH (macOS)
    except (OSError, ValueError):
        return None


class _Entry:
    """A ``scandir`` entry for a file that exists only in the scratch folder, named by the path the script used."""

    def __init__(self, name: str, path: str, inner: os.DirEntry):
        self.name, self.path, self._inner = name, path, inner

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self._inner.is_dir(follow_symlinks=follow_symlinks)

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return self._inner.is_file(follow_symlinks=follow_symlinks)

    def is_symlink(self) -> bool:
        return self._inner.is_symlink()

    def stat(self, *, follow_symlinks: bool = True):
        return self._inner.stat(follow_symlinks=follow_symlinks)

    def inode(self) -> int:
        return self._inner.inode()

    def is_junction(self) -> bool:
        return False

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<DirEntry {self.name!r}>"


class _Listing:
    """What ``os.scandir`` returns: an iterator that is also a context manager."""

    def __init__(self, entries: list):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._it)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._it = iter(())


class Sandbox:
    """Redirects the script's writes to ``scratch``; reads and listings follow them there.

    ``with Sandbox(scratch):`` installs it for one run. A worker process installs it once for its whole life
    (``install()``; ``begin(scratch)`` before each run, ``end()`` after), so that the script's background threads,
    ``__del__`` methods and exit handlers stay inside it after a run."""

    def __init__(self, scratch: Path | None = None):
        self._undo: list = []
        self._child_undo: list = []
        self._local = threading.local()
        self.refused: list[str] = []   # child processes refused, as the script gave them
        self.begin(scratch)

    # -- the run ------------------------------------------------------------------------------------
    def begin(self, scratch: Path | None, cwd: str | None = None, removed: list[str] | None = None) -> None:
        self.scratch = Path(scratch).resolve() if scratch is not None else None
        if self.scratch is not None:
            _real["makedirs"](str(self.scratch), exist_ok=True)
        self.map: dict[str, Path] = {}   # real absolute path -> scratch path
        self.removed: set[str] = set(removed or [])   # deleted by the script (the originals stay)
        self.opaque: set[str] = set()                  # folders deleted and made again: originals below them are gone
        self._log_size = -1                            # (deletions are shared with child processes through a file)
        self._shared = False                           # (True once a child process was started, and in a child)
        self.cwd = Path(cwd or os.getcwd()).resolve()
        self._exempt = [os.devnull, "/proc", "/sys", "/dev"] + ([str(self.scratch)] if self.scratch else [])
        home = Path.home()
        for p in (home / ".cache", home / ".config" / "matplotlib", Path(sys.prefix)):
            self._exempt.append(str(p))
        # the system temp folder: what the script creates there (tempfile.TemporaryDirectory, mkstemp) is
        # its own and transient, so it is made for real (and removed at the end); what was there before is redirected
        self._tmp = {os.path.abspath(tempfile.gettempdir()), os.path.realpath(tempfile.gettempdir())}
        self._tmp_new: set[str] = set()
        self._touched: set[str] = set()
        self._exempt_set = set(self._exempt)
        self._exempt_prefixes = tuple(e.rstrip(os.sep) + os.sep for e in self._exempt)
        self._tmp_prefixes = tuple(t.rstrip(os.sep) + os.sep for t in self._tmp)
        self._cwd_prefix = str(self.cwd).rstrip(os.sep) + os.sep
        if self._undo:
            self._children()

    def end(self) -> list[tuple[str, str]]:
        """The files written, and the temp entries the run made for real removed."""
        written = self.written()
        for path in sorted(self._tmp_new, key=len):
            if _real["isdir"](path) and not _real["islink"](path):
                _real["rmtree"](path, ignore_errors=True)
            elif os.path.lexists(path):
                try:
                    _real["unlink"](path)
                except OSError:
                    pass
        self._tmp_new = set()
        return written

    @property
    def active(self) -> bool:
        return self.scratch is not None

    # -- mapping ------------------------------------------------------------------------------------
    def _abs(self, file, dir_fd: int | None = None) -> str | None:
        if isinstance(file, int) or self.scratch is None:
            return None
        try:
            raw = os.fspath(file)
        except TypeError:
            return None
        if isinstance(raw, bytes):
            raw = raw.decode(errors="replace")
        if dir_fd is not None and not os.path.isabs(raw):
            base = _fd_path(dir_fd)
            if base is None:
                return None
            raw = os.path.join(base, raw)
        return os.path.abspath(raw)

    def _exempted(self, path: str) -> bool:
        if path in self._exempt_set or path.startswith(self._exempt_prefixes):
            return True
        if not path.startswith(self._tmp_prefixes) or path.startswith(self._cwd_prefix):
            return False  # the user's own folder is sandboxed even when it lies under the temp folder
        if any(path == n or path.startswith(n + os.sep) for n in self._tmp_new):
            return True
        if path in self.map or _real["lexists"](path):
            return False
        self._tmp_new.add(path)  # new under the temp folder: the script's own
        return True

    def mirror(self, path: str) -> Path:
        if path.startswith(self._cwd_prefix):
            return self.scratch / path[len(self._cwd_prefix):]
        return self.scratch / "_abs" / path.lstrip(os.sep)

    def _touch(self, path: str) -> None:
        """``path`` has a scratch copy now: its folder's listing and its own lookups consult the scratch folder."""
        self._touched.add(path)
        self._touched.add(os.path.dirname(path))

    def _log(self) -> str | None:
        return str(self.scratch / ".nnwizard-removed") if self.scratch is not None else None

    def _read_log(self) -> None:
        """Deletions made by the script's multiprocessing children (and theirs, by the parent)."""
        log = self._log()
        try:
            size = _real["stat"](log).st_size if log else -1
        except OSError:
            return
        if size != self._log_size:
            self._log_size = size
            with _real["open"](log, encoding="utf-8") as f:
                self.removed |= {line.rstrip("\n") for line in f if line.strip()}

    def gone(self, path: str) -> bool:
        """Deleted by the script (itself or a folder above it), and not written again since."""
        if self._shared:
            self._read_log()
        if not self.removed or path in self.map or _real["lexists"](str(self.mirror(path))):
            return False
        probe = path
        while True:
            if probe in self.removed and (probe not in self.opaque or probe != path):
                return True
            parent = os.path.dirname(probe)
            if parent == probe:
                return False
            probe = parent

    def _seen(self, path: str) -> str | None:
        """Where the script's view of ``path`` lies: its scratch copy, the original, or None (deleted)."""
        if self.gone(path):
            return None
        target = self.map.get(path)
        if target is None:
            if not self._shared and path not in self._touched and os.path.dirname(path) not in self._touched:
                return path   # (nothing was written there: no scratch copy to look for)
            mirrored = self.mirror(path)
            if _real["lexists"](str(mirrored)):   # (a folder with written files in it, or a child process's write)
                return str(mirrored)
            return path
        return str(target)

    def redirect_write(self, file, copy_existing: bool = False, dir_fd: int | None = None):
        path = self._abs(file, dir_fd)
        if path is None or self._exempted(path):
            return file
        target = self.map.get(path)
        if target is None:
            target = self.mirror(path)
            _real["makedirs"](str(target.parent), exist_ok=True)
            if copy_existing and not self.gone(path) and _real["isfile"](path) and not _real["lexists"](str(target)):
                shutil.copy2(path, target)
            self.map[path] = target
            self._touch(path)
        self.removed.discard(path)
        return str(target)

    def redirect_read(self, file, dir_fd: int | None = None):
        path = self._abs(file, dir_fd)
        if path is None or self._exempted(path):
            return file
        seen = self._seen(path)
        if seen is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(file))
        return seen if seen != path else file

    def remove(self, path: str) -> None:
        """The script's view loses ``path`` (a file, or a folder and all below it); originals stay."""
        for known in [k for k in self.map if k == path or k.startswith(path.rstrip(os.sep) + os.sep)]:
            self.map.pop(known)
        mirrored = self.mirror(path)
        if _real["isdir"](str(mirrored)) and not _real["islink"](str(mirrored)):
            _real["rmtree"](str(mirrored), ignore_errors=True)
        elif _real["lexists"](str(mirrored)):
            _real["unlink"](str(mirrored))
        self.opaque -= {o for o in self.opaque if o == path or o.startswith(path.rstrip(os.sep) + os.sep)}
        if _real["lexists"](path):
            self.removed.add(path)
            if self._shared:
                with _real["open"](self._log(), "a", encoding="utf-8") as f:
                    f.write(path + "\n")

    def written(self) -> list[tuple[str, str]]:
        out = []
        for real, target in sorted(self.map.items()):
            if target.is_file():
                try:
                    shown = str(Path(real).relative_to(self.cwd))
                except ValueError:
                    shown = real
                out.append((shown, str(target)))
        return out

    def deleted(self) -> list[str]:
        return sorted(self.removed)

    # -- patches ------------------------------------------------------------------------------------
    def _set(self, owner, name, value) -> None:
        original = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, original))

    def __enter__(self) -> "Sandbox":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.uninstall()

    def uninstall(self) -> None:
        while self._child_undo:
            self._child_undo.pop()()
        while self._undo:
            self._undo.pop()()

    def install(self) -> "Sandbox":
        sb = self
        real_open = _real["open"]

        def sandboxed_open(file, mode="r", *args, **kwargs):
            if isinstance(file, int) or not sb.active or getattr(sb._local, "busy", False):
                return real_open(file, mode, *args, **kwargs)
            if any(c in mode for c in "wax+"):
                if "x" in mode and sb._seen(sb._abs(file) or "") not in (None, sb._abs(file)):
                    raise FileExistsError(errno.EEXIST, "File exists", os.fspath(file))
                file = sb.redirect_write(file, copy_existing=("a" in mode or "+" in mode) and "w" not in mode)
            else:
                file = sb.redirect_read(file)
            return real_open(file, mode, *args, **kwargs)

        self._set(builtins, "open", sandboxed_open)
        self._set(io, "open", sandboxed_open)
        # stdlib modules that bound the builtin open at import (`from builtins import open as bltn_open`): tarfile
        # extracting an archive would make its folders in the scratch folder (os.makedirs) but write its files for real
        import bz2
        import tarfile
        for owner, name in ((tarfile, "bltn_open"), (bz2, "_builtin_open")):
            if getattr(owner, name, None) is real_open:
                self._set(owner, name, sandboxed_open)

        class FileIO(_real["FileIO"]):
            def __init__(self, file, mode="r", closefd=True, opener=None):
                if not isinstance(file, int) and sb.active:
                    file = (sb.redirect_write(file, copy_existing="a" in mode or "+" in mode)
                            if any(c in mode for c in "wax+") else sb.redirect_read(file))
                super().__init__(file, mode, closefd, opener)

        self._set(io, "FileIO", FileIO)

        def os_open(path, flags, mode=0o777, *, dir_fd=None):
            if sb.active and not isinstance(path, int):
                if flags & _WRITE_FLAGS:
                    p = sb._abs(path, dir_fd)
                    if p is not None and flags & os.O_EXCL and flags & os.O_CREAT and sb._seen(p) not in (None, p):
                        raise FileExistsError(errno.EEXIST, "File exists", os.fspath(path))
                    existed = p is not None and not sb._exempted(p) and _real["exists"](sb._seen(p) or "")
                    target = sb.redirect_write(path, copy_existing=not flags & os.O_TRUNC, dir_fd=dir_fd)
                    if existed and target is not path and not _real["exists"](target):   # (truncated: an empty copy)
                        os.close(_real["os_open"](target, os.O_WRONLY | os.O_CREAT, 0o666))
                else:
                    target = sb.redirect_read(path, dir_fd=dir_fd)
                if target is not path:
                    return _real["os_open"](target, flags, mode)
            return _real["os_open"](path, flags, mode, dir_fd=dir_fd)

        self._set(os, "open", os_open)

        def mkdir(path, mode=0o777, *, dir_fd=None):
            p = sb._abs(path, dir_fd)
            if p is None or sb._exempted(p):
                return _real["mkdir"](path, mode, dir_fd=dir_fd)
            if sb._seen(p) is not None and (_real["exists"](sb._seen(p))):
                raise FileExistsError(errno.EEXIST, "File exists", os.fspath(path))
            parent = os.path.dirname(p)
            if sb._seen(parent) is None or not _real["isdir"](sb._seen(parent)):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
            target = sb.mirror(p)
            sb.map[p] = target
            sb._touch(p)
            if p in sb.removed:
                sb.opaque.add(p)
            _real["makedirs"](str(target), exist_ok=True)

        self._set(os, "mkdir", mkdir)

        def follow(real):
            def check(path):
                p = sb._abs(path)
                if p is None or sb._exempted(p):
                    return real(path)
                seen = sb._seen(p)
                return False if seen is None else real(seen)
            return check

        for name in ("exists", "lexists", "isdir", "isfile", "islink"):
            self._set(os.path, name, follow(getattr(os.path, name)))

        def follow_stat(real):
            def call(path, *args, dir_fd=None, **kwargs):
                p = sb._abs(path, dir_fd)
                if p is None or sb._exempted(p):
                    return real(path, *args, dir_fd=dir_fd, **kwargs) if dir_fd is not None else real(path, *args, **kwargs)
                seen = sb._seen(p)
                if seen is None:
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
                return real(seen, *args, **kwargs)
            return call

        for name in ("stat", "lstat", "access"):
            self._set(os, name, follow_stat(getattr(os, name)))
        for name in ("getsize", "getmtime", "getatime", "getctime"):
            self._set(os.path, name, lambda path, _n=name: getattr(os.stat(path), {"getsize": "st_size", "getmtime": "st_mtime",
                                                                                     "getatime": "st_atime", "getctime": "st_ctime"}[_n]))

        def copy_on_write(real):
            """chmod, chown, utime, truncate: applied to a copy of the file in the scratch folder."""
            def call(path, *args, dir_fd=None, **kwargs):
                if isinstance(path, int):
                    return real(path, *args, **kwargs)
                p = sb._abs(path, dir_fd)
                if p is None or sb._exempted(p):
                    return real(path, *args, dir_fd=dir_fd, **kwargs) if dir_fd is not None else real(path, *args, **kwargs)
                seen = sb._seen(p)
                if seen is None:
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
                if seen == p:   # the original: copied first (a folder: made in the scratch folder with its mode)
                    target = sb.mirror(p)
                    if _real["isdir"](p):
                        _real["makedirs"](str(target), exist_ok=True)
                        shutil.copystat(p, target)
                        sb.map[p] = target
                        sb._touch(p)
                    else:
                        sb.redirect_write(p, copy_existing=True)
                    seen = str(sb.map[p])
                return real(seen, *args, **kwargs)
            return call

        for name in ("chmod", "chown", "utime", "truncate"):
            if hasattr(os, name):
                self._set(os, name, copy_on_write(getattr(os, name)))

        def guarded_remove(kind):
            def remove(path, *, dir_fd=None):
                p = sb._abs(path, dir_fd)
                if p is None or sb._exempted(p):
                    return _real[kind](path, dir_fd=dir_fd)
                seen = sb._seen(p)
                if seen is None or not _real["lexists"](seen):
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
                if kind == "rmdir":
                    if not _real["isdir"](seen):
                        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", os.fspath(path))
                    if _listing(sb, p):
                        raise OSError(errno.ENOTEMPTY, "Directory not empty", os.fspath(path))
                elif _real["isdir"](seen) and not _real["islink"](seen):
                    raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
                sb.remove(p)
            return remove

        self._set(os, "remove", guarded_remove("unlink"))
        self._set(os, "unlink", guarded_remove("unlink"))
        self._set(os, "rmdir", guarded_remove("rmdir"))

        def rmtree(path, ignore_errors=False, onerror=None, *args, **kwargs):
            p = sb._abs(path, kwargs.get("dir_fd"))
            if p is None or sb._exempted(p):
                return _real["rmtree"](path, ignore_errors, onerror, *args, **kwargs)
            seen = sb._seen(p)
            if seen is None or not _real["isdir"](seen) or _real["islink"](seen):
                if ignore_errors:
                    return None
                error = (FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path)) if seen is None
                         or not _real["lexists"](seen) else NotADirectoryError(errno.ENOTDIR, "Not a directory", os.fspath(path)))
                raise error
            sb.remove(p)
            return None

        self._set(shutil, "rmtree", rmtree)
        rmtree.avoids_symlink_attacks = getattr(_real["rmtree"], "avoids_symlink_attacks", False)

        def moved(kind):
            def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
                s, d = sb._abs(src, src_dir_fd), sb._abs(dst, dst_dir_fd)
                if s is None or d is None or (sb._exempted(s) and sb._exempted(d)):
                    return _real[kind](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
                source = s if sb._exempted(s) else sb._seen(s)
                if source is None or not _real["lexists"](source):
                    raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(src))
                target = d if sb._exempted(d) else str(sb.mirror(d))
                if _real["isdir"](target) and not _real["isdir"](source):
                    raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(dst))
                if _real["isdir"](target) and kind == "replace":
                    _real["rmtree"](target, ignore_errors=True)
                _real["makedirs"](os.path.dirname(target), exist_ok=True)
                below = {known: os.path.relpath(str(where), source) for known, where in sb.map.items()
                         if known.startswith(s.rstrip(os.sep) + os.sep)}   # what lay below a moved folder
                if source == s and not sb._exempted(s):   # an original: copied, and gone from the script's view
                    if _real["isdir"](s):
                        shutil.copytree(s, target, symlinks=True, dirs_exist_ok=True)
                    else:
                        shutil.copy2(s, target, follow_symlinks=False)
                else:
                    _real[kind](source, target)
                if not sb._exempted(s):
                    sb.remove(s)
                if not sb._exempted(d):
                    sb.map[d] = Path(target)
                    sb._touch(d)
                    sb.removed.discard(d)
                    for known, rel in below.items():   # ... now lies below the new name
                        sb.map[d + known[len(s):]] = Path(target) / rel
                        sb._touch(d + known[len(s):])
                return None
            return rename

        self._set(os, "rename", moved("rename"))
        self._set(os, "replace", moved("replace"))

        def linked(kind):
            def link(src, dst, *args, **kwargs):
                d = sb._abs(dst, kwargs.get("dst_dir_fd") or kwargs.get("dir_fd"))
                if d is None or sb._exempted(d):
                    return _real[kind](src, dst, *args, **kwargs)
                target = sb.redirect_write(dst)
                if kind == "link":
                    s = sb._abs(src)
                    src = sb._seen(s) if s is not None and sb._seen(s) else src
                return _real[kind](src, target)
            return link

        self._set(os, "link", linked("link"))
        self._set(os, "symlink", linked("symlink"))

        def listed(path):
            """``(absolute path, names)`` the script sees in ``path`` (its own writes and deletions applied), or None
            where the real call answers (a descriptor, bytes, an exempted folder, the sandbox off)."""
            if isinstance(path, (int, bytes)) or not sb.active:
                return None
            p = sb._abs(path)
            if p is None or sb._exempted(p):
                return None
            names = _listing(sb, p)
            if names is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", os.fspath(path))
            return p, names

        def listdir(path="."):
            seen = listed(path)
            return _real["listdir"](path) if seen is None else list(seen[1])

        def scandir(path="."):
            seen = listed(path)
            if seen is None:
                return _real["scandir"](path)
            p, names = seen
            shown = os.fspath(path)
            entries = []
            for place in (p, str(sb.mirror(p))):
                if not _real["isdir"](place):
                    continue
                with _real["scandir"](place) as found:
                    for entry in found:
                        if names.pop(entry.name, None) is None:
                            continue   # deleted, or taken from the scratch copy below
                        full = os.path.join(shown, entry.name)
                        if place == p and sb._seen(os.path.join(p, entry.name)) != os.path.join(p, entry.name):
                            names[entry.name] = True   # a changed copy: the scratch folder's entry
                            continue
                        entries.append(entry if place == p else _Entry(entry.name, full, entry))
            return _Listing(entries)

        self._set(os, "listdir", listdir)
        self._set(os, "scandir", scandir)
        self._patch_torch_numpy()
        self._patch_databases()
        self._patch_processes()
        return self

    def _patch_torch_numpy(self) -> None:
        sb = self
        torch = sys.modules.get("torch")
        if torch is not None:
            real_save, real_load = torch.save, torch.load

            def save(obj, f, *args, **kwargs):
                if isinstance(f, (str, os.PathLike)):
                    f = sb.redirect_write(f)
                return real_save(obj, f, *args, **kwargs)

            def load(f, *args, **kwargs):
                if isinstance(f, (str, os.PathLike)):
                    f = sb.redirect_read(f)
                return real_load(f, *args, **kwargs)

            self._set(torch, "save", save)
            self._set(torch, "load", load)
        try:
            import numpy as np
            real_np_load = np.load
            self._set(np, "load", lambda file, *a, **k: real_np_load(sb.redirect_read(file), *a, **k))
            from numpy.lib import _datasource  # genfromtxt / loadtxt open files with the io.open numpy kept at import
            openers = _datasource._file_openers
            openers._load()
            table = openers._file_openers
            real_np_open = table.get(None)
            if real_np_open is not None:
                table[None] = builtins.open
                self._undo.append(lambda: table.__setitem__(None, real_np_open))
        except (ImportError, AttributeError):  # pragma: no cover - another numpy layout: its text loaders are not followed
            pass

    def _patch_databases(self) -> None:
        """sqlite3, h5py and safetensors open their files in native code: the path they get is redirected (for
        writing, a copy of the original, changed in place)."""
        sb = self
        import importlib.util
        import sqlite3

        if importlib.util.find_spec("safetensors") is not None:
            try:
                import safetensors.torch as st   # (its module globals, which save_file and load_file look up at each call)

                real_serialize, real_safe_open = st.serialize_file, st.safe_open
                self._set(st, "serialize_file", lambda tensors, filename, *a, **k: real_serialize(
                    tensors, sb.redirect_write(filename), *a, **k))
                self._set(st, "safe_open", lambda filename, *a, **k: real_safe_open(sb.redirect_read(filename), *a, **k))
            except (ImportError, AttributeError):
                pass

        real_connect = sqlite3.connect

        def connect(database, *args, **kwargs):
            if isinstance(database, (str, bytes, os.PathLike)) and os.fspath(database) not in (":memory:", b":memory:", "") \
                    and not kwargs.get("uri"):
                database = sb.redirect_write(database, copy_existing=True)
            return real_connect(database, *args, **kwargs)

        self._set(sqlite3, "connect", connect)
        real_import = builtins.__import__

        def watched_import(name, *args, **kwargs):
            module = real_import(name, *args, **kwargs)
            if "h5py" in sys.modules and not getattr(sys.modules["h5py"], "_nnwizard_sandboxed", False):
                sb._patch_h5py(sys.modules["h5py"])
            return module

        self._set(builtins, "__import__", watched_import)
        if "h5py" in sys.modules:
            self._patch_h5py(sys.modules["h5py"])

    def _patch_h5py(self, h5py) -> None:
        sb = self
        File = getattr(h5py, "File", None)
        if File is None:
            return

        class SandboxedFile(File):
            def __init__(self, name, mode="r", *args, **kwargs):
                if isinstance(name, (str, os.PathLike)):
                    name = (sb.redirect_read(name) if mode == "r" else
                            sb.redirect_write(name, copy_existing=mode in ("r+", "a")))
                super().__init__(name, mode, *args, **kwargs)

        h5py._nnwizard_sandboxed = True
        self._set(h5py, "File", SandboxedFile)
        self._undo.append(lambda: setattr(h5py, "_nnwizard_sandboxed", False))

    def _patch_processes(self) -> None:
        """Refuse child processes (their writes cannot be followed); multiprocessing children get this sandbox."""
        sb = self
        import subprocess

        def refuse(what) -> None:
            sb.refused.append(what)
            raise PermissionError(errno.EPERM, f"nnwizard --isolation python cannot follow the writes of a child process, so "
                                               f"it does not start one ({what}); use --isolation os (Linux) or, if the "
                                               f"script's side effects are wanted, --isolation none")

        def execute_child(self, args, *rest, **kwargs):
            refuse(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args))

        if hasattr(subprocess.Popen, "_execute_child"):
            self._set(subprocess.Popen, "_execute_child", execute_child)
        self._set(os, "system", lambda command: refuse(str(command)))
        for name in ("posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle", "execlp", "execlpe",
                     "execvp", "execvpe"):
            if hasattr(os, name):
                self._set(os, name, lambda path, *args, _n=name, **kwargs: refuse(f"os.{_n}({os.fspath(path)!r})"))
        self._children()

    def _children(self) -> None:
        """multiprocessing's spawn and forkserver children start through a launcher that installs this sandbox."""
        import multiprocessing.spawn as mp_spawn

        while self._child_undo:
            self._child_undo.pop()()
        import multiprocessing.process as mp_process

        wrapper = self.scratch and _child_launcher(self.scratch)
        if wrapper:
            sb, previous, start = self, mp_spawn.get_executable(), mp_process.BaseProcess.start

            def started(process, *args, **kwargs):
                if not sb._shared:   # from now on, deletions go through the shared log
                    sb._shared = True
                    with _real["open"](sb._log(), "a", encoding="utf-8") as f:
                        f.writelines(p + "\n" for p in sorted(sb.removed))
                return start(process, *args, **kwargs)

            mp_spawn.set_executable(wrapper)
            mp_process.BaseProcess.start = started
            os.environ[ENV] = json.dumps({"scratch": str(self.scratch), "cwd": str(self.cwd)})
            self._child_undo += [lambda: mp_spawn.set_executable(previous), lambda: os.environ.pop(ENV, None),
                                 lambda: setattr(mp_process.BaseProcess, "start", start)]


def _listing(sb: Sandbox, path: str) -> dict[str, bool] | None:
    """The names the script sees in folder ``path`` (originals not deleted, and its own), None: no such folder."""
    seen = sb._seen(path)
    if seen is None:
        return None
    names: dict[str, bool] = {}
    found = False
    if _real["isdir"](path):
        found = True
        for name in _real["listdir"](path):
            if not sb.gone(os.path.join(path, name)):
                names[name] = True
    mirrored = str(sb.mirror(path))
    if _real["isdir"](mirrored):
        found = True
        for name in _real["listdir"](mirrored):
            names[name] = True
    return names if found else None


def _child_launcher(scratch: Path) -> str | None:
    """An executable that multiprocessing starts its children with: Python with this sandbox installed first."""
    path = str(Path(scratch).parent / "nnwizard-python-child")
    if not _real["exists"](path):
        try:
            _real["makedirs"](str(Path(scratch).parent), exist_ok=True)
            fd = _real["os_open"](path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755)
            with _real["open"](fd, "w", encoding="utf-8") as out:
                out.write(f"#!{sys.executable}\nfrom nnwizard.isolate.python_sandbox import child_main\nchild_main()\n")
        except OSError:
            return None
    return path


def child_main() -> None:
    """A multiprocessing child: install the parent's sandbox, then run ``-c CODE`` as the interpreter would."""
    config = json.loads(os.environ.get(ENV) or "{}")
    if config.get("scratch"):
        sandbox = Sandbox(None)
        sandbox.begin(Path(config["scratch"]), config.get("cwd"))
        sandbox._shared = True   # (what the parent and its other children delete, this one sees gone, and the reverse)
        sandbox._read_log()
        sandbox.install()
    args = sys.argv[1:]
    code = args[args.index("-c") + 1] if "-c" in args else ""
    sys.argv = ["-c", *args[args.index("-c") + 2:]] if "-c" in args else ["-c"]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})


def _real_test(test, follow: bool = True):
    """A path test made on the original ``os.stat``/``os.lstat`` (the patched ones would come back here)."""
    stat_of = os.stat if follow else os.lstat

    def check(path) -> bool:
        try:
            return test(stat_of(path).st_mode)
        except (OSError, ValueError):
            return False
    return check


def _real_makedirs(path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
    head = os.path.dirname(path)
    if head and head != path and not _real["exists"](head):
        _real_makedirs(head, mode, True)
    try:
        _real["mkdir"](path, mode)
    except FileExistsError:
        if not exist_ok or not _real["isdir"](path):
            raise


import stat as _stat  # noqa: E402

_real = {
    "open": builtins.open, "FileIO": io.FileIO, "os_open": os.open, "mkdir": os.mkdir, "makedirs": _real_makedirs,
    "rmtree": shutil.rmtree, "unlink": os.unlink, "rmdir": os.rmdir, "rename": os.rename, "replace": os.replace,
    "listdir": os.listdir, "scandir": os.scandir, "link": os.link, "symlink": os.symlink,
    "stat": os.stat, "exists": _real_test(lambda mode: True), "lexists": _real_test(lambda mode: True, follow=False),
    "isdir": _real_test(_stat.S_ISDIR), "isfile": _real_test(_stat.S_ISREG),
    "islink": _real_test(_stat.S_ISLNK, follow=False),
}
