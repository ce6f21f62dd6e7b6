"""A kubeconfig's inline certificates and keys, held in memory rather than in temporary files.

The processes need no writable directory: their image has a read-only root filesystem and no home
or temporary directory (docs/development.md#runtime-constraints). Python's TLS reads a client
certificate and key only from a path, so ``shared.kubeconfig`` hands it an in-memory file that is
closed once read (:func:`loadable`); kubernetes-asyncio (leader election, and the loader of an
auth-provider user) writes inline certificates to temporary files, so it gets in-memory files that
stay open instead (:func:`memory_file`, :func:`inline_in_memory`). Apart from the client because
it is about files, not the API.
"""

from __future__ import annotations

import base64
import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any, Final

#: kubeconfig entries whose inline form (``<key>-data``, base64) kubernetes-asyncio would write to a
#: temporary file, as (list, entry, key)
_INLINE_FILES: Final = (
    ("clusters", "cluster", "certificate-authority"),
    ("users", "user", "client-certificate"),
    ("users", "user", "client-key"),
)
#: content -> its in-memory file, open for the process's life (a client may build TLS again later)
_memory_files: dict[bytes, str] = {}


def memory_file(name: str, data: bytes) -> str:
    """A path to ``data`` held in memory only: an anonymous file (memfd, Linux), named through
    ``/proc/self/fd``, for APIs that read certificates only from a path. The processes need no
    writable directory: their image has a read-only root filesystem and no home or temporary
    directory (docs/development.md#runtime-constraints). Only this process can open the path."""
    if (path := _memory_files.get(data)) is None:
        fd = os.memfd_create(f"koord-queue-{name}", os.MFD_CLOEXEC)
        _write_all(fd, data)
        path = _memory_files[data] = f"/proc/self/fd/{fd}"
    return path


@contextlib.contextmanager
def loadable(name: str, data: bytes) -> Iterator[str]:
    """A path to ``data`` while the block runs, for a TLS library to read, and nothing afterwards.

    On Linux an anonymous in-memory file (memfd), closed at the end; elsewhere (the kubectl plugin
    on macOS) a private temporary file, removed at the end, as no memfd exists there."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(f"koord-queue-{name}", os.MFD_CLOEXEC)
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    fd, path = tempfile.mkstemp(prefix="koord-queue-")  # 0600
    try:
        _write_all(fd, data)
        os.close(fd)
        fd = -1
        yield path
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def inline_in_memory(config: Mapping[str, Any]) -> None:
    """Replace a kubeconfig's inline certificates and keys by in-memory files, in place.

    kubernetes-asyncio hands them to TLS through temporary files (``tempfile.mkstemp``), which needs
    a writable temporary directory and leaves a private key on disk while the process runs."""
    for section, kind, key in _INLINE_FILES:
        for node in config.get(section) or []:
            entry = getattr(node, "value", node).get(kind)  # the merger wraps entries in ConfigNodes
            if isinstance(entry, dict) and entry.get(f"{key}-data"):
                data = base64.standard_b64decode(entry.pop(f"{key}-data"))
                entry[key] = memory_file(key, data)
