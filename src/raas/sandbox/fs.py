"""Host-side file access to a sandbox's shared directories that the sandbox cannot redirect.

The sandboxed code owns the workspace and may fill it with symlinks (``ln -s /etc/shadow x``).
Following such a link from the host would read or overwrite the host's own files, so every path
is resolved by the kernel with ``openat2(RESOLVE_IN_ROOT)``: lookups, ``..`` and absolute
symlinks are all clamped to a root directory that mirrors the sandbox's ``/``. Only regular
files are read or written (a FIFO planted in the workspace would otherwise block the host).

Invariant: nothing in this module opens a path under ``root`` without ``RESOLVE_IN_ROOT``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

from raas.sandbox.base import SandboxError

_SYS_OPENAT2 = 437  # the same number on every Linux architecture (unified syscall table, 5.6+)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """``openat2(root_fd, path, {flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS})``."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(root_fd), ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise SandboxError("the kernel lacks openat2 (Linux 5.6+ is required for sandbox file access)")
        if err == errno.ENXIO:  # a FIFO without reader or a socket: refused instead of blocking
            raise SandboxError(f"/{path} is not a regular file")
        raise OSError(err, os.strerror(err), path)
    return int(fd)


class ConfinedFS:
    """Reads and writes regular files below ``root`` (a host directory standing for ``/``).

    ``owner`` (uid, gid), when set, is given to every file and directory created, so that a
    sandbox running as another host user can still modify what the host wrote.
    """

    def __init__(self, root: str, owner: tuple[int, int] | None = None):
        self._root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._owner = owner

    def close(self) -> None:
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    def read(self, rel: str, max_bytes: int) -> bytes:
        fd = openat2(self._root_fd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        try:
            size = _regular_size(fd, rel)
            if size > max_bytes:
                raise SandboxError(f"/{rel} is {size} bytes, more than the {max_bytes} allowed")
            chunks, left = [], max_bytes + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
            if left <= 0:  # grew while we read
                raise SandboxError(f"/{rel} is larger than the {max_bytes} bytes allowed")
            return b"".join(chunks)
        finally:
            os.close(fd)

    def write(self, rel: str, data: bytes, mode: int) -> None:
        # No O_TRUNC here: a non-regular file must be rejected before anything is changed.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = openat2(self._root_fd, rel, flags, mode)
        except FileNotFoundError:
            self._make_parents(rel)
            fd = openat2(self._root_fd, rel, flags, mode)
        try:
            _regular_size(fd, rel)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self._owner:
                os.fchown(fd, *self._owner)
        finally:
            os.close(fd)

    def _make_parents(self, rel: str) -> None:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            try:
                os.close(openat2(self._root_fd, "/".join(parts[:i]), os.O_PATH | os.O_DIRECTORY))
                continue
            except FileNotFoundError:
                pass
            parent = openat2(self._root_fd, "/".join(parts[: i - 1]) or ".", os.O_PATH | os.O_DIRECTORY)
            try:
                os.mkdir(parts[i - 1], 0o755, dir_fd=parent)
                if self._owner:
                    os.chown(parts[i - 1], *self._owner, dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                pass  # created concurrently; the next openat2 decides whether it is usable
            finally:
                os.close(parent)


def _regular_size(fd: int, rel: str) -> int:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", "/" + rel)
    if not stat.S_ISREG(st.st_mode):
        raise SandboxError(f"/{rel} is not a regular file")
    return st.st_size
