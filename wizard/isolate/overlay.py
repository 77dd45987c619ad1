"""Copy-on-write views of the file systems a worker can write, made of the kernel's overlayfs (Linux).

Every writable place is covered by an overlay whose lower layer is the real folder and whose upper layer is
ours, so every write, deletion, rename or chmod, by any code, lands in the upper layer and the program reads
its own writes. One overlay cannot sit on ``/`` (the kernel refuses the root as a lower layer), so there is one
per top-level folder of each writable file system and one per other writable mount; mounts nested below a
covered folder are put back on top of its overlay (their own overlay, or a read-only bind of what was there).

In a user namespace only our own user and group exist, and overlayfs copies a folder up with its owner, so a
write below a folder owned by someone else would fail (EOVERFLOW): the folders on the way to the places a
script writes (its working folder, its own folder, the home and temp folders) get an overlay of their own
below such a folder. Deletions are whiteouts in the upper layer (character devices 0/0): ``changes`` reads the
upper layers into the files written and deleted. Stdlib only: this runs in the namespace launcher, before
the worker's Python starts (wizard/isolate/namespaces.py).
"""

from __future__ import annotations

import ctypes
import os
import stat

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PSEUDO = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "mqueue", "securityfs", "debugfs", "tracefs",
          "pstore", "bpf", "configfs", "fusectl", "hugetlbfs", "autofs", "binfmt_misc", "efivarfs", "nsfs",
          "selinuxfs", "rpc_pipefs", "ramfs", "overlay-internal"}
SKIPPED_ROOTS = ("/proc", "/sys", "/dev")   # top-level folders that hold pseudo file systems: never covered
FRESH_TMPFS = ("/dev/shm",)                 # shared memory: an empty tmpfs of its own (nothing there is the user's)

_libc = ctypes.CDLL(None, use_errno=True)
if hasattr(_libc, "umount2"):   # (Linux: elsewhere only remove_tree is used)
    _libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    _libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _b(value):
    return None if value is None else os.fsencode(value)


def mount(source, target, fstype, flags=0, data=None) -> None:
    if _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'bind'} on {target}: {os.strerror(err)}")


def umount(target, flags=MNT_DETACH) -> None:
    _libc.umount2(_b(target), flags)


class Mount:
    def __init__(self, line: str):
        left, right = line.split(" - ", 1)
        fields, rest = left.split(), right.split()
        self.point = _unescape(fields[4])
        self.options = set(fields[5].split(","))
        self.fstype = rest[0]

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape") if "\\" in path else path


def mounts(text: str | None = None) -> list[Mount]:
    """The visible mounts (the last one mounted on a point hides the ones before it), parents first."""
    if text is None:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    visible: dict[str, Mount] = {}
    for line in text.splitlines():
        if " - " in line:
            m = Mount(line)
            visible[m.point] = m
    return sorted(visible.values(), key=lambda m: _depth(m.point))


def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


def _under(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")


class Unit:
    """One place put in the namespace: ``overlay`` (copy-on-write over the real folder), ``tmpfs`` (empty),
    ``keep`` (a read-only bind of what was there, put back on top of a covering overlay)."""

    def __init__(self, path: str, kind: str):
        self.path, self.kind = path, kind
        self.source: int | None = None   # an O_PATH descriptor of the real place, opened before anything is covered
        self.upper: str | None = None    # (overlay) the current upper layer

    def __repr__(self) -> str:
        return f"{self.kind}:{self.path}"


def plan(all_mounts: list[Mount], roots: list[str], uid: int, gid: int, user_namespace: bool) -> list[Unit]:
    """What to cover, parents first. ``roots``: places the script will likely write (their way down gets an overlay
    of its own below a folder of another owner, in a user namespace)."""
    units: dict[str, Unit] = {}
    pseudo_points = [m.point for m in all_mounts if m.fstype in PSEUDO]
    points = {m.point for m in all_mounts}

    def covered(path: str) -> bool:
        return any(_under(path, u) and u != path for u in units if units[u].kind in ("overlay", "tmpfs"))

    for m in all_mounts:
        if m.fstype in PSEUDO:
            continue
        if m.point in FRESH_TMPFS:
            units[m.point] = Unit(m.point, "tmpfs")
            continue
        if any(_under(m.point, p) for p in SKIPPED_ROOTS) or any(_under(m.point, p) and p != "/" for p in pseudo_points):
            continue
        if m.point == "/":
            for name in sorted(os.listdir("/")):
                path = "/" + name
                if path in points or path in SKIPPED_ROOTS or os.path.islink(path) or not os.path.isdir(path):
                    continue
                units[path] = Unit(path, "overlay")
            continue
        if m.readonly or not os.path.isdir(m.point):
            if covered(m.point):
                units[m.point] = Unit(m.point, "keep")
            continue
        units[m.point] = Unit(m.point, "overlay")
    if user_namespace:
        for root in roots:
            for path in _own_overlays(root, units, uid, gid):
                units.setdefault(path, Unit(path, "overlay"))
    return sorted(units.values(), key=lambda u: (_depth(u.path), u.path))


def _own_overlays(root: str, units: dict[str, Unit], uid: int, gid: int) -> list[str]:
    """Folders on the way down to ``root`` that need an overlay of their own: below a folder whose owner or group is
    not ours (copying it up would fail), and ``root`` itself when it is another's but we may write there."""
    root = os.path.abspath(root)
    holder = max((u for u in units if _under(root, u) and units[u].kind == "overlay"), key=len, default=None)
    if holder is None or not os.path.isdir(root):
        return []
    chain, path = [], root
    while path != holder and path != "/":
        chain.append(path)
        path = os.path.dirname(path)
    chain.reverse()   # holder's child ... root
    out = []
    for i, folder in enumerate(chain):
        try:
            st = os.lstat(folder)
        except OSError:
            return out
        foreign = (st.st_uid, st.st_gid) != (uid, gid)
        if foreign and i + 1 < len(chain):
            out.append(chain[i + 1])
        if foreign and folder == root and os.access(folder, os.W_OK):
            out.append(folder)
    return out


class Layers:
    """The units' upper layers, generation after generation (``fresh()``: a new, empty one for every overlay), on
    disk in ``scratch`` or, for the overlays whose lower layer holds the scratch folder, on a tmpfs."""

    def __init__(self, units: list[Unit], scratch: str, user_namespace: bool):
        self.units, self.user_namespace = units, user_namespace
        os.makedirs(os.path.join(scratch, "upper"), exist_ok=True)
        os.makedirs(os.path.join(scratch, "memory"), exist_ok=True)
        mount("tmpfs", os.path.join(scratch, "memory"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700")
        self._disk = os.open(os.path.join(scratch, "upper"), os.O_PATH | os.O_DIRECTORY)
        self._memory = os.open(os.path.join(scratch, "memory"), os.O_PATH | os.O_DIRECTORY)
        real = os.path.realpath(scratch)
        self._in_memory = {u.path for u in units if u.kind == "overlay" and _under(real, os.path.realpath(u.path))}
        for unit in units:
            if unit.kind in ("overlay", "keep"):
                unit.source = os.open(unit.path, os.O_PATH | (os.O_DIRECTORY if os.path.isdir(unit.path) else 0))
        self.generation = 0
        self.keep_all = False   # --keep-scratch: every generation's upper layers stay (g<N>-<unit>-u)

    def base(self, unit: Unit) -> str:
        return f"/proc/self/fd/{self._memory if unit.path in self._in_memory else self._disk}"

    def mount_all(self) -> list[str]:
        """Cover every unit (parents first); what could not be covered, in words (it is then made read-only)."""
        problems = []
        for i, unit in enumerate(self.units):
            try:
                if unit.kind == "tmpfs":
                    mount("tmpfs", unit.path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
                elif unit.kind == "keep":
                    mount(f"/proc/self/fd/{unit.source}", unit.path, None, MS_BIND | MS_REC)
                    _readonly(unit.path)
                else:
                    try:
                        unit.upper = self._overlay(unit, i, self.base(unit))
                    except OSError:
                        if unit.path in self._in_memory:
                            raise
                        self._in_memory.add(unit.path)   # (an upper layer on this disk refused: e.g. itself an overlay)
                        unit.upper = self._overlay(unit, i, self.base(unit))
            except OSError as exc:
                if unit.kind != "overlay":
                    problems.append(f"{unit.path}: {exc.strerror}")
                    continue
                try:   # not coverable (a file system overlayfs cannot use as a lower layer): read-only instead
                    mount(f"/proc/self/fd/{unit.source}", unit.path, None, MS_BIND | MS_REC)
                    _readonly(unit.path)
                    problems.append(f"{unit.path} is read-only for the script ({exc.strerror})")
                    unit.upper = None
                except OSError as again:
                    raise OSError(again.errno, f"{unit.path}: {exc.strerror}, and read-only: {again.strerror}") from None
        return problems

    def _overlay(self, unit: Unit, i: int, base: str) -> str:
        upper, work = f"{base}/g{self.generation}-{i}-u", f"{base}/g{self.generation}-{i}-w"
        os.makedirs(upper, 0o755, exist_ok=True)
        os.makedirs(work, 0o700, exist_ok=True)
        try:   # the root of an overlay shows its upper layer's mode
            os.chmod(upper, stat.S_IMODE(os.stat(f"/proc/self/fd/{unit.source}").st_mode))
        except OSError:
            pass
        options = f"lowerdir=/proc/self/fd/{unit.source},upperdir={upper},workdir={work}"
        mount("overlay", unit.path, "overlay", 0, options + (",userxattr" if self.user_namespace else ""))
        return upper

    def fresh(self) -> list[str]:
        """A new generation: the overlays are taken away (what has them open keeps its view) and made again, empty."""
        old = [u.upper for u in self.units if u.upper]
        for unit in reversed(self.units):
            umount(unit.path)
        self.generation += 1
        problems = self.mount_all()
        for upper in old if not self.keep_all else []:   # the old upper layers' files (a checkpoint in memory) are let go
            remove_tree(upper)
            remove_tree(upper[:-1] + "w")
        return problems

    def changes(self) -> dict[str, list[str]]:
        """What the program did in this generation: files written (or changed) and paths deleted."""
        written, deleted = [], []
        for unit in self.units:
            if not unit.upper:
                continue
            for folder, dirs, files in os.walk(unit.upper):
                rel = os.path.relpath(folder, unit.upper)
                shown = unit.path if rel == "." else os.path.join(unit.path, rel)
                for name in dirs + files:
                    full = os.path.join(folder, name)
                    try:
                        st = os.lstat(full)
                    except OSError:
                        continue
                    where = os.path.join(shown, name)
                    lower = os.path.join(f"/proc/self/fd/{unit.source}", rel, name)
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                        deleted.append(where)
                    elif not stat.S_ISDIR(st.st_mode):
                        written.append(where)
                    elif not os.path.lexists(lower):
                        written.append(where + "/")   # a folder the program made (its files are listed too)
                    elif self._opaque(full) and os.path.isdir(lower):   # deleted and made again: what was in it is gone
                        deleted += [os.path.join(where, n) for n in os.listdir(lower) if not os.path.lexists(os.path.join(full, n))]
        return {"written": sorted(written), "deleted": sorted(deleted)}

    def _opaque(self, path: str) -> bool:
        name = ("user." if self.user_namespace else "trusted.") + "overlay.opaque"
        try:
            return os.getxattr(path, name, follow_symlinks=False) == b"y"
        except OSError:
            return False

    def keep(self, folder: str) -> None:
        """``--keep-scratch``: copy the upper layers that live in memory into ``folder`` (whiteouts left out)."""
        import shutil

        for i, unit in enumerate(self.units):
            if unit.upper and unit.path in self._in_memory:
                target = os.path.join(folder, unit.path.strip("/").replace("/", "_") or "root")
                shutil.copytree(unit.upper, target, symlinks=True, dirs_exist_ok=True,
                                ignore=lambda d, names: [n for n in names if _whiteout(os.path.join(d, n))])


def _readonly(path: str) -> None:
    try:
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    except OSError:
        pass   # (a locked mount keeps its flags: it was not writable for us anyway)


def _whiteout(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def remove_tree(path: str) -> None:
    """Remove a folder of ours, overlayfs's work folders (mode 000) included; what cannot go is left."""
    import shutil

    for folder, dirs, _ in os.walk(path):
        for name in dirs:   # (top-down: a folder is opened to us before os.walk lists it)
            try:
                os.chmod(os.path.join(folder, name), 0o700, follow_symlinks=False)
            except (OSError, NotImplementedError):
                pass
    shutil.rmtree(path, ignore_errors=True)
