"""``kubectl koord-queue list``: units with their place and reason; ``-l`` as ``kubectl get -l``,
and ``--watch``, which prints again whenever a unit changes (a watch through ``shared.kube``,
relisting when the server says the version is too old, until Ctrl-C)."""

from __future__ import annotations

import time
from typing import Any, TextIO

from koord_queue.cli import commands, render
from koord_queue.cli.client import QUEUE_UNITS, Gathered, Reader, denied
from koord_queue.cli.formats import write_objects
from koord_queue.shared import kube
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.predicates import TERMINAL_PHASES
from koord_queue.shared.core.charges import remaining_request, reserved_resources
from koord_queue.shared.core.policies import is_waiting

Obj = dict[str, Any]


def wait_of(unit: Unit, now: float) -> tuple[bool, float | None]:
    """Whether the unit still waits, and for how long it has (or had, until admitted) waited:
    ``list``'s WAIT column, and the dashboard's (docs/dashboard.md)."""
    waiting = is_waiting(unit) and unit.phase not in TERMINAL_PHASES
    if waiting:
        return True, now - unit.created if unit.created else None
    if unit.last_allocate_time and unit.created:
        return False, unit.last_allocate_time - unit.created
    return False, None


async def cmd_list(reader: Reader, args: Any, out: TextIO, style: render.Style) -> int:
    """``list``; with ``--watch``, print again whenever a unit changes, until interrupted."""
    namespace = None if args.all_namespaces else args.namespace
    got = Gathered()
    await reader.units(namespace, got, want_all=False, selector=args.selector)
    await _print_list(reader, args, got, namespace, out, style)
    if not args.watch:
        return 0
    version = got.resource_version
    while True:
        try:
            async for kind, obj in reader.client.watch(
                QUEUE_UNITS, resource_version=version, namespace=namespace, label_selector=args.selector
            ):
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                key = f"{obj['metadata'].get('namespace', '')}/{obj['metadata'].get('name', '')}"
                if kind == "DELETED":
                    got.units.pop(key, None)
                else:
                    got.units[key] = obj
                out.write("\n")
                await _print_list(reader, args, got, namespace, out, style)
        except kube.Gone:
            await reader.units(namespace, got, want_all=False, selector=args.selector)
            version = got.resource_version
        except kube.KubeError as err:
            raise denied(err, "watch", QUEUE_UNITS, namespace) from None


async def _print_list(
    reader: Reader, args: Any, got: Gathered, namespace: str | None, out: TextIO, style: render.Style
) -> None:
    got.positions = {}
    parsed = got.parsed_units()
    queues = {u.quota for u in parsed.values() if u.quota}
    await reader.positions(namespace, sorted(q for q in queues if q), got)
    now = time.time()
    rows: list[dict[str, Any]] = []
    shown: list[Obj] = []
    for key in sorted(parsed, key=lambda k: (parsed[k].namespace, parsed[k].quota or "", k)):
        unit, raw = parsed[key], got.units[key]
        if args.queue and unit.quota != args.queue:
            continue
        phase = unit.phase or "Pending"
        if args.phase and phase.lower() != args.phase.lower():
            continue
        waiting, waited = wait_of(unit, now)
        shown.append(raw)
        rows.append(
            {
                "namespace": unit.namespace,
                "name": unit.name,
                "job": commands.job_ref(unit, raw),
                "queue": unit.quota or "",
                "phase": phase,
                "priority": unit.priority,
                "position": got.positions.get(key),
                "waitSeconds": None if waited is None else round(waited, 1),
                "waiting": waiting,
                "reason": commands.short_reason(unit),
                "message": unit.message,
                "request": render.resources(remaining_request(unit)),
                "holds": render.resources(reserved_resources(unit)),
            }
        )
    if args.output and write_objects(args.output, shown, QUEUE_UNITS, out):
        out.flush()
        return
    if args.output in ("json", "yaml"):
        commands.dump({"items": rows, "positionsKnown": got.visibility_ok}, args.output, out)
        out.flush()
        return
    if not rows:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        out.write(f"No QueueUnits found in {where}.\n")
        out.flush()
        return
    wide = args.output == "wide"
    headers = ["NAMESPACE"] if namespace is None else []
    headers += ["NAME", "QUEUE", "PHASE", "PRIORITY", "POSITION", "WAITED", "REASON"]
    if wide:
        headers += ["JOB", "REQUEST", "HOLDS", "MESSAGE"]
    table_rows = []
    for r in rows:
        colour = ("yellow",) if r["waiting"] else ("green",) if r["phase"] in ("Running", "Dequeued") else ()
        cells = [r["namespace"]] if namespace is None else []
        cells += [
            r["name"],
            r["queue"] or "-",
            style(r["phase"], *colour),
            str(r["priority"]),
            "-" if r["position"] is None else str(r["position"]),
            render.age(r["waitSeconds"]),
            r["reason"] if wide else render.truncate(r["reason"], 60),
        ]
        if wide:
            cells += [r["job"], r["request"], r["holds"], r["message"] or "-"]
        table_rows.append(cells)
    out.write(render.table(headers, table_rows) + "\n")
    out.flush()
