"""Writing a person's files: atomically, and never over a file of theirs by surprise.

Every file toast-lab writes for a person (plan files from `plan.save`, `lab.export` and
`toast-lab partition --out`; the notebook `toast-lab lab` writes) goes through `write_file`:

- the bytes go to a temporary file in the target's directory (hidden: `.<name>.<random>.tmp`),
  are flushed to the disk (fsync), and the temporary file is renamed over the target
  (`os.replace`, atomic on POSIX and Windows). A write that fails midway — a full disk, a
  killed process, a serializer that raises — leaves the previous file exactly as it was, and
  no half-written one beside it;
- an existing file is replaced only when it is empty, or is one of the kind being written
  (`replaceable(path)`, e.g. a toast-lab plan file, which a person re-exports as they go), or
  the caller passes overwrite=True. Anything else (a user's `train.py`) raises
  ExistingFileError naming the file and the override. A directory is never replaced.

A symbolic link is written through: its target is replaced and the link kept.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Callable


OVERWRITE_FIX = "pass overwrite=True to replace it, or choose another name"


class ExistingFileError(FileExistsError):
    """A write refused because it would replace a file that is not one of ours; the message
    names the file and how to replace it anyway."""


def replace_refusal(path, replaceable: Callable[[Path], bool] | None = None,
                    kind: str = "file toast-lab wrote",
                    fix: str = OVERWRITE_FIX) -> str | None:
    """Why `path` may not be replaced without overwrite=True, or None where it may: it does
    not exist, is empty, or `replaceable(path)` says it is of the kind being written. kind:
    what that kind is called; fix: how the caller's user asks to replace it anyway."""
    target = Path(os.path.realpath(path))
    try:
        st = target.stat()
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"{path} cannot be inspected ({err.strerror or err}); not overwritten"
    if stat.S_ISDIR(st.st_mode):
        return f"{path} is a directory; give a file name"
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:
        return None  # nothing to lose (e.g. a name made by tempfile or `touch`)
    if stat.S_ISREG(st.st_mode) and replaceable is not None and replaceable(target):
        return None
    return f"{path} exists and is not a {kind}: not overwritten; {fix}"


def write_file(path, data: bytes | str, *, overwrite: bool = False,
               replaceable: Callable[[Path], bool] | None = None,
               kind: str = "file toast-lab wrote",
               fix: str = OVERWRITE_FIX) -> Path:
    """Writes `data` (str: as UTF-8) to `path` atomically (see the module docstring) and
    returns `path`. Raises ExistingFileError where `path` holds a file `replace_refusal` will
    not replace and overwrite is False; IsADirectoryError for a directory; OSError where the
    disk refuses (the previous file, if any, is then untouched)."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give a file name")
    if not overwrite:
        why = replace_refusal(path, replaceable, kind, fix)
        if why is not None:
            raise ExistingFileError(why)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, temp = _temporary(target)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)  # the bytes are on the disk before the name points at them
        finally:
            os.close(fd)
        _keep_mode(target, temp)
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    _sync_directory(target.parent)
    return path


def _temporary(target: Path) -> tuple[int, Path]:
    """(descriptor, path) of a new hidden file beside `target`, created with the permissions a
    new file gets (0o666 less the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(temp, flags, 0o666), temp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file beside {target}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _keep_mode(target: Path, temp: Path) -> None:
    """A file replaced keeps its permissions (the person may have set them)."""
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        return
    os.chmod(temp, mode)


def _sync_directory(directory: Path) -> None:
    """The rename itself on the disk (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = ["ExistingFileError", "replace_refusal", "write_file"]
