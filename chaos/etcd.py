"""A tiny etcd v3 client over etcd's HTTP/JSON gRPC gateway (no etcdctl is built).

Used by the observer to watch the cluster's storage directly, in revision order, and by the fault
injectors to compact the history (forcing ``410 Gone`` on the apiserver's watchers after a
restart). Keys and values travel base64-encoded, as the gateway's JSON mapping of ``bytes`` wants.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    mod_revision: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change: ``type`` is ``PUT`` or ``DELETE``; ``value`` is empty on delete."""

    type: str
    key: bytes
    value: bytes
    revision: int


class Compacted(Exception):
    """The watch start revision was compacted away; ``revision`` is the compaction point."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"required revision has been compacted (compacted at {revision})")
        self.revision = revision


class Etcd:
    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url.rstrip("/")
        self.session = session

    async def _post(self, path: str, body: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
        async with self.session.post(
            self.url + path, json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise RuntimeError(f"etcd {path}: HTTP {resp.status}: {text[:300]}")
            result: dict[str, Any] = json.loads(text)
            return result

    async def revision(self, *, timeout: float = 10.0) -> int:
        """The store's current revision (from the header of an empty range read)."""
        found = await self._post("/v3/kv/range", {"key": b64(b"\x00"), "limit": 1}, timeout=timeout)
        return int(found["header"]["revision"])

    async def range(self, start: bytes, end: bytes, *, revision: int = 0) -> tuple[list[KeyValue], int]:
        body: dict[str, Any] = {"key": b64(start), "range_end": b64(end)}
        if revision:
            body["revision"] = str(revision)
        found = await self._post("/v3/kv/range", body, timeout=60.0)
        kvs = [
            KeyValue(
                key=base64.b64decode(kv["key"]),
                value=base64.b64decode(kv.get("value", "") or ""),
                mod_revision=int(kv["mod_revision"]),
            )
            for kv in found.get("kvs") or []
        ]
        return kvs, int(found["header"]["revision"])

    async def put(self, key: bytes, value: bytes, *, timeout: float = 5.0) -> int:
        """Write one key; returns the revision of the write."""
        found = await self._post("/v3/kv/put", {"key": b64(key), "value": b64(value)}, timeout=timeout)
        return int(found["header"]["revision"])

    async def compact(self, revision: int) -> None:
        await self._post("/v3/kv/compaction", {"revision": str(revision), "physical": True}, timeout=60.0)

    async def watch(self, start: bytes, end: bytes, *, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Stream every change in ``[start, end)`` from ``start_revision`` on, in revision order.

        Ends when the connection ends; raises :class:`Compacted` when the history needed is gone.
        """
        body = {
            "create_request": {
                "key": b64(start),
                "range_end": b64(end),
                "start_revision": str(start_revision),
            }
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=None)
        async with self.session.post(self.url + "/v3/watch", json=body, timeout=timeout) as resp:
            if resp.status >= 300:
                raise RuntimeError(f"etcd watch: HTTP {resp.status}: {(await resp.text())[:300]}")
            async for line in _lines(resp.content):
                message = json.loads(line)
                if "error" in message:
                    raise RuntimeError(f"etcd watch: {message['error']}")
                result = message.get("result") or {}
                compacted = int(result.get("compact_revision") or 0)
                if compacted:
                    raise Compacted(compacted)
                if result.get("canceled"):
                    raise RuntimeError(f"etcd watch canceled: {result.get('cancel_reason', '')}")
                for event in result.get("events") or []:
                    kv = event.get("kv") or {}
                    yield WatchEvent(
                        type=str(event.get("type") or "PUT"),
                        key=base64.b64decode(kv.get("key", "")),
                        value=base64.b64decode(kv.get("value", "") or ""),
                        revision=int(kv.get("mod_revision") or 0),
                    )


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-delimited messages of any size (``StreamReader.readline`` stops at 512 KiB, and one
    watch message carries whole objects: a QueueUnit may be over a megabyte)."""
    buffer = b""
    async for chunk in stream.iter_any():
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line, buffer = buffer[:end], buffer[end + 1 :]
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer
