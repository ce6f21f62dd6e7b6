"""The plugin's administrator and inspection commands: ``stop``/``resume`` a whole queue,
``describe`` one QueueUnit the way ``kubectl describe`` prints objects, and ``version``.

``stop`` writes ``koord-queue/stopped: "true"`` on the Queue (in the component namespace, which a
namespace user cannot write: manifests/rbac/user-roles.yaml); the scheduler then admits nothing
from it and tells its waiting units why (docs/compatibility.md#stopping-a-queue).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any, TextIO

from koord_queue.cli import render
from koord_queue.cli.client import Gathered, Reader, find_unit
from koord_queue.shared.api import names
from koord_queue.shared.api.durations import parse_time
from koord_queue.shared.api.parsing import parse_unit

Obj = dict[str, Any]
#: The distribution the plugin is installed from (pyproject.toml).
DISTRIBUTION = "koord-queue-py"


# --- stop, resume ----------------------------------------------------------------------------------


async def cmd_stop(reader: Reader, args: Any, out: TextIO, *, stop: bool) -> int:
    value = "true" if stop else None  # a merge patch with null removes the annotation
    await reader.patch_queue(args.queue, {"metadata": {"annotations": {names.STOPPED_ANNOTATION: value}}})
    if stop:
        out.write(
            f"queue {args.queue} stopped: nothing new is admitted from it; its waiting units keep their "
            f"places and admitted units keep running (kubectl koord-queue resume {args.queue} undoes it)\n"
        )
    else:
        out.write(f"queue {args.queue} resumed: its waiting units compete for admission again, in order\n")
    return 0


# --- describe --------------------------------------------------------------------------------------


def _time(value: float | None, now: float) -> str:
    if value is None or value <= 0:
        return "-"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))
    return f"{stamp} ({render.age(now - value)} ago)"


def _event_time(event: Mapping[str, Any]) -> float | None:
    text = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
    )
    return parse_time(text)


def describe_text(raw: Obj, events: Sequence[Obj], events_error: str | None, now: float) -> str:
    """A QueueUnit as ``kubectl describe`` lays an object out: fields, then tables, then events."""
    unit = parse_unit(raw)
    meta = raw.get("metadata") or {}
    ref = (raw.get("spec") or {}).get("consumerRef") or {}
    fields: list[tuple[str, str]] = [
        ("Name", unit.name),
        ("Namespace", unit.namespace),
        ("Job", f"{ref.get('kind', '-')}/{ref.get('name', '-')}" if ref else "-"),
        ("Queue", unit.quota or "- (no quota label)"),
        ("Phase", unit.phase or "Pending"),
        ("Priority", str(unit.priority)),
        ("Active", "true" if unit.active else "false (held)"),
        ("Created", _time(unit.created, now)),
        ("Last Admitted", _time(unit.last_allocate_time, now)),
        ("Message", unit.message or "-"),
        ("Labels", ",".join(f"{k}={v}" for k, v in sorted((meta.get("labels") or {}).items())) or "<none>"),
    ]
    if unit.pool:
        fields.append(("Pool", unit.pool + (f" (through {unit.pool_quota})" if unit.pool_quota else "")))
    if unit.requeue_at is not None:
        fields.append(("Requeued At", _time(unit.requeue_at, now)))
    width = max(len(k) for k, _ in fields) + 2
    lines = [f"{(k + ':').ljust(width)}{v}" for k, v in fields]

    def section(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        lines.append(f"{title}:")
        if not rows:
            lines.append("  <none>")
            return
        lines.extend("  " + line for line in render.table(headers, rows).splitlines())

    section(
        "Pod Sets",
        ["NAME", "COUNT", "PER POD"],
        [[p.name, str(p.count), render.resources(p.per_pod, empty="nothing")] for p in unit.pod_sets],
    )
    section(
        "Admissions",
        ["POD SET", "REPLICAS", "RUNNING", "RECLAIMING", "RESOURCES"],
        [
            [
                a.name,
                str(a.replicas),
                str(a.running),
                str(a.reclaim_replicas or 0),
                render.resources(a.resources),
            ]
            for a in unit.admissions
        ],
    )
    section(
        "Admission Checks",
        ["NAME", "STATE", "MESSAGE"],
        [[c.name, str(c.state or "Pending"), c.message or "-"] for c in unit.admission_checks],
    )
    section(
        "Conditions",
        ["TYPE", "STATUS", "REASON", "MESSAGE"],
        [
            [
                str(c.get("type", "")),
                str(c.get("status", "")),
                str(c.get("reason") or "-"),
                str(c.get("message") or "-"),
            ]
            for c in unit.conditions
        ],
    )
    if events_error is not None:
        lines.append(f"Events:  cannot be read: {events_error}")
    elif not events:
        lines.append("Events:  <none>")
    else:
        rows = []
        for e in events[-20:]:
            at = _event_time(e)
            count = int(e.get("count") or 1)
            seen = render.age(now - at) if at is not None else "-"
            source = (e.get("source") or {}).get("component") or e.get("reportingComponent") or "-"
            rows.append(
                [
                    str(e.get("type", "")),
                    str(e.get("reason", "")),
                    seen + (f" (x{count})" if count > 1 else ""),
                    str(source),
                    " ".join(str(e.get("message", "")).split()),
                ]
            )
        section("Events", ["TYPE", "REASON", "AGE", "FROM", "MESSAGE"], rows)
    return "\n".join(lines) + "\n"


async def cmd_describe(reader: Reader, args: Any, out: TextIO) -> int:
    got = Gathered()
    await reader.units(args.namespace, got, want_all=False)
    raw = find_unit(got.units, args.namespace, args.job)
    meta = raw.get("metadata") or {}
    events, error = await reader.events(
        args.namespace, "QueueUnit", str(meta.get("name", "")), str(meta.get("uid", ""))
    )
    out.write(describe_text(raw, events, error, time.time()))
    return 0


# --- version ---------------------------------------------------------------------------------------


def plugin_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


async def cmd_version(reader: Reader | None, out: TextIO) -> int:
    """The plugin's version, and the server's when the reconciler's Deployment can be read."""
    server = await reader.server_version() if reader is not None else "unknown"
    out.write(f"Plugin version: {plugin_version()}\nServer version: {server}\n")
    return 0
