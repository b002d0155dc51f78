"""Claiming and writing the folders probe writes: run folders, comparison folders, pruned models,
the model cache. Every writer goes through this module, so that:

- **A folder is claimed before the work starts.** A lock file beside it (``.NAME.probe-lock``)
  is held with ``fcntl.flock``, which the system releases when the process ends however it ends;
  a second run aimed at the same folder stops at once with one error instead of both writing.
- **A folder is complete or absent.** Files are written into a temporary sibling
  (``.NAME.probe-XXXXXXXX``) and moved into place at the end; on an error or an interrupt the
  temporary folder is removed (one left by a killed process is removed by the next claim).
- **probe replaces only its own files.** Each folder probe writes records the names of its files
  (:data:`MANIFEST`). With ``force``, a folder probe wrote gets the new files and loses the
  previous run's files that are not written again; a file probe did not write is never deleted
  or overwritten, and a non-empty folder without that record is refused even with ``force``.

Usage::

    with claim(out, kind="run", force=force) as folder:   # raises InputError if taken
        ...                                               # the long work
        with folder.staging() as tmp:                     # moved into place on success
            (tmp / "index.html").write_text(html)

Claims are re-entrant within a process: a command claims its folder early and the library
function that writes it claims it again.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: an exclusively created lock file instead
    fcntl = None

#: The record of the files probe wrote into a folder (relative paths), and the folder's kind.
MANIFEST = ".probe-files.json"
#: Suffix of the lock file beside a claimed folder; tag of its temporary siblings.
LOCK_SUFFIX = ".probe-lock"
TMP_TAG = ".probe-"
#: Records of folders written before the manifest existed: their ``output`` names probe's files.
LEGACY_RECORDS = ("run.json", "compare.json")

_HELD: dict[str, Claim] = {}


class FolderBusy(InputError):
    """Another probe process holds the folder's claim."""


def probe_files(folder: Path, kind: str | None = None) -> set[str] | None:
    """The files probe wrote into ``folder`` (relative paths), or None if probe did not write it.

    Raises:
        InputError: ``folder`` was written by probe as another kind of folder than ``kind``.
    """
    try:
        record = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        names, found = set(record["files"]), record.get("kind")
    except (OSError, ValueError, KeyError, TypeError):
        names, found = None, None
        for legacy in LEGACY_RECORDS:
            try:
                names = set(json.loads((folder / legacy).read_text(encoding="utf-8"))["output"]) | {legacy}
                found = {"run.json": "run", "compare.json": "compare"}[legacy]
                break
            except (OSError, ValueError, KeyError, TypeError):
                continue
    if names is not None and kind is not None and found is not None and found != kind:
        raise InputError(f"{folder} holds a probe {found} folder, not a {kind} folder: choose another folder")
    return names


def _inside(folder: Path, name: str) -> Path | None:
    """``folder / name`` if ``name`` is a plain relative path that stays inside ``folder``."""
    if not name or os.path.isabs(name) or ".." in Path(name).parts:
        return None
    return folder / name


class Claim:
    """A claimed folder (see the module docstring); release it with :meth:`release` or ``with``.

    Attributes:
        path: the folder, as given; kind: ``run``, ``compare``, ``pruned model``, ``cache`` ...;
        force: whether probe's files of an earlier run may be replaced; owned: the whole folder
        is probe's (a cache), every file in it may be replaced.
    """

    def __init__(self, path: Path, kind: str, force: bool, owned: bool, fd, created: list[Path]) -> None:
        self.path, self.kind, self.force, self.owned = path, kind, force, owned
        self._fd, self._created, self._depth = fd, created, 1

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Give the claim back (the outermost release removes the lock and the empty parents it made)."""
        self._depth -= 1
        if self._depth > 0:
            return
        _HELD.pop(_key(self.path), None)
        _unlock(self._fd, _lock_path(self.path))
        for folder in reversed(self._created):  # parents created for the lock, if nothing else went there
            try:
                folder.rmdir()
            except OSError:
                break

    @contextmanager
    def staging(self):
        """A temporary sibling folder to write the files into; moved into place when the block
        ends without error, removed on an error or an interrupt.

        Raises:
            InputError: the folder cannot be written, or holds a file probe did not write under
                the name of a new file.
        """
        tmp = _new_sibling(self.path)
        try:
            yield tmp
            try:
                self._commit(tmp)
            except OSError as exc:
                raise InputError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _commit(self, tmp: Path) -> None:
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        record = {"written_by": "probe", "kind": self.kind, "files": files,
                  "created": _dt.datetime.now().isoformat(timespec="seconds")}
        (tmp / MANIFEST).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        empty = self.path.is_dir() and not any(self.path.iterdir())
        if not self.path.exists() or (empty and not _holds_cwd(self.path)):
            try:
                os.rename(tmp, self.path)  # atomic; replaces an empty folder
                return
            except OSError:
                pass  # something appeared there meanwhile: place the files one by one
        old = set() if empty else self._replaceable()
        clash = next((f for f in files if (self.path / f).exists() and f not in old), None)
        if clash is not None:
            raise InputError(f"{self.path} holds {clash}, which probe did not write: move it or choose another "
                             "folder")
        for name in files:
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / name, self.path / name)
        for name in old - set(files) - {MANIFEST}:  # the earlier run's files this run does not write again
            target = _inside(self.path, name)
            if target is not None and (target.is_file() or target.is_symlink()):
                target.unlink()
        os.replace(tmp / MANIFEST, self.path / MANIFEST)

    def _replaceable(self) -> set[str]:
        """Files of the existing folder that probe may replace or remove."""
        if self.owned:
            return {p.relative_to(self.path).as_posix() for p in self.path.rglob("*") if p.is_file()}
        names = probe_files(self.path, self.kind)
        if names is None:
            raise InputError(f"{self.path} holds files probe did not write; --force replaces only probe's own "
                             "files: choose another folder")
        return names


def _holds_cwd(path: Path) -> bool:
    """Whether the process's working folder is ``path`` or inside it (a folder renamed over would leave
    the shell that ran ``--out .`` in a removed folder: the files are moved in instead)."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return False
    target = path.resolve()
    return cwd == target or target in cwd.parents


def _new_sibling(path: Path) -> Path:
    """A new empty folder ``.NAME.probe-XXXXXXXX`` beside ``path``, with the usual permissions
    (the umask's, as a folder made by hand; tempfile's are owner-only)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}{TMP_TAG}{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    raise InputError(f"cannot write {path}: no free temporary name beside it")


def _key(path: Path) -> str:
    return os.path.abspath(path)


def _lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}{LOCK_SUFFIX}"


def _check(path: Path, kind: str, force: bool, owned: bool, what: str) -> None:
    """Raise InputError unless ``path`` may be written (see :func:`claim`)."""
    for parent in path.absolute().parents:  # the nearest existing ancestor must be a writable folder
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"cannot create {what} {path}: {parent} is a file")
            if not os.access(parent, os.W_OK):
                raise InputError(f"cannot create {what} {path}: {parent} is not writable")
            break
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} {path} exists and is not a folder")
    if not path.exists() or not any(path.iterdir()) or owned:
        return
    written = probe_files(path, kind)
    if written is None:  # --force would not help: say so at once
        raise InputError(f"{what} {path} holds files probe did not write; --force replaces only probe's own "
                         "files: choose another folder")
    if not force:
        raise InputError(f"{what} {path} already exists and is not empty; use --force to replace probe's files "
                         "in it")


def claim(path: str | Path, *, kind: str, force: bool = False, owned: bool = False,
          what: str = "output folder") -> Claim:
    """Claim ``path`` for writing (re-entrant within a process).

    Args:
        kind: what the folder holds (``run``, ``compare``, ``pruned model``, ``cache``); ``force``
            replaces only a folder probe wrote as the same kind.
        force: an existing non-empty folder that probe wrote may be written again (its other files are kept).
        owned: the folder is probe's own (a cache): it is replaced whatever it holds.
        what: how messages name the folder (``output folder``, ``--save-pruned folder`` ...).

    Raises:
        FolderBusy: another probe process is writing ``path``.
        InputError: ``path`` is a file, sits under a file or an unwritable folder, is a non-empty
            folder without ``force``, or a non-empty folder probe did not write.
    """
    path = Path(path)
    if path.name in ("", ".", ".."):  # "." or "..": the lock and the temporary sibling go beside the folder itself
        path = Path(os.path.abspath(path))
    held = _HELD.get(_key(path))
    if held is not None:
        held._depth += 1
        return held
    _check(path, kind, force, owned, what)
    created = [p for p in reversed(path.absolute().parents) if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _lock(_lock_path(path), path, what)
    except OSError as exc:
        _remove_empty(created)
        raise InputError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    except InputError:
        _remove_empty(created)
        raise
    try:
        _check(path, kind, force, owned, what)  # again, now that no other probe run can change it
    except InputError:
        _unlock(fd, _lock_path(path))
        raise
    _sweep(path)
    _HELD[_key(path)] = held = Claim(path, kind, force, owned, fd, created)
    return held


def _remove_empty(created: list[Path]) -> None:
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break


def _lock(lock: Path, path: Path, what: str):
    """Take the lock file ``lock``: a file descriptor (flock) or the path (exclusive creation)."""
    busy = f"another probe run is writing {what} {path}; wait for it to finish or choose another folder"
    if fcntl is None:  # pragma: no cover
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            raise FolderBusy(f"{busy} (or delete {lock} if no run is going)") from None
        return None
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip()
            os.close(fd)
            raise FolderBusy(f"{busy} (process {holder or '?'})") from None
        try:  # the previous holder may have removed the file after this process opened it
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
            return fd
        os.close(fd)


def _unlock(fd, lock: Path) -> None:
    try:
        lock.unlink()  # while still holding it: a waiting process re-checks the inode
    except OSError:
        pass
    if fd is not None:
        os.close(fd)


def _sweep(path: Path) -> None:
    """Remove temporary siblings of ``path`` left by a killed run (safe: the caller holds the lock)."""
    pattern = re.compile(re.escape(f".{path.name}{TMP_TAG}") + r"[A-Za-z0-9_]{8}$")
    for sibling in path.parent.iterdir():
        if pattern.match(sibling.name) and sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)


def claim_new(base: Path, *, kind: str, what: str = "output folder") -> Claim:
    """Claim a new folder: ``base`` or, if taken, ``base-2``, ``base-3`` ... (default run folders)."""
    n, path = 1, base
    while True:
        if not path.exists():
            try:
                return claim(path, kind=kind, what=what)
            except FolderBusy:
                pass
            except InputError:
                if not path.exists():
                    raise  # not a race with another run: the parent cannot be written
        n += 1
        path = base.with_name(f"{base.name}-{n}")


def write_folder(path: str | Path, files: dict[str, str | bytes], *, kind: str, force: bool = False,
                 what: str = "output folder") -> Path:
    """Write ``files`` (relative name -> text or bytes) to ``path`` as one claimed, staged folder.

    Raises:
        InputError: as :func:`claim`, or the folder cannot be written.
    """
    with claim(path, kind=kind, force=force, what=what) as folder, folder.staging() as tmp:
        try:
            for name, content in files.items():
                target = tmp / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    target.write_bytes(content)
                else:
                    target.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    return Path(path)


def replace_file(path: str | Path, content: str | bytes) -> Path:
    """Write one file the caller named (``HeadView.save``) whole or not at all: into a temporary
    sibling, renamed over ``path`` at the end; on an error or an interrupt the sibling is removed
    and ``path`` is as it was.

    Raises:
        InputError: ``path`` is a folder or cannot be written.
    """
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path} is a folder; give a file name")
    tmp = path.parent / f".{path.name}{TMP_TAG}{secrets.token_hex(4)}"
    try:
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path
