"""The commands of ``kubectl koord-queue``: each reads through :class:`~koord_queue.cli.client.Reader`,
decides with the core (``shared.core.explain`` replays the scheduler's own code), and prints."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from typing import Any, TextIO

import yaml

from koord_queue.cli import render
from koord_queue.cli.client import QUOTAS, CliError, Gathered, Reader, find_unit
from koord_queue.cli.formats import write_objects
from koord_queue.shared.api import goparse, names
from koord_queue.shared.api.model import Unit
from koord_queue.shared.api.names import Phase
from koord_queue.shared.api.parsing import parse_quota, parse_unit
from koord_queue.shared.api.predicates import TERMINAL_PHASES, all_running, has_reclaim
from koord_queue.shared.core import explain, pools, reasons, replay
from koord_queue.shared.core.explanation import Explanation, Level
from koord_queue.shared.core.policies import is_waiting
from koord_queue.shared.core.quota import priority_cap
from koord_queue.shared.core.reasons import Reason
from koord_queue.shared.jobs import registry
from koord_queue.shared.jobs.running_timeout import RunningTimeout

Obj = dict[str, Any]


def job_ref(unit: Unit, raw: Obj) -> str:
    ref = (raw.get("spec") or {}).get("consumerRef") or {}
    kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
    return f"{kind.lower()}/{name}" if kind and name else "-"


def short_reason(unit: Unit) -> str:
    """One line, plain words: where the unit stands (the scheduler's recorded reason, mapped)."""
    if unit.phase in TERMINAL_PHASES:
        return "finished"
    if not unit.quota:
        return "no quota label: belongs to no queue"
    if has_reclaim(unit):
        return "being preempted: pods being reclaimed"
    if unit.phase == Phase.RESERVED:
        pending = [c.name for c in unit.admission_checks if c.state != names.AdmissionCheckState.READY]
        return f"waiting for admission check(s): {', '.join(pending) or '-'}"
    if unit.phase == Phase.TIMEOUT_BACKOFF:
        return f"backing off: {unit.message or 'requeued later'}"
    if not is_waiting(unit):
        return "running" if all_running(unit) else "admitted: pods not all running yet"
    if not unit.active:
        return "inactive: held (scheduling.x-k8s.io/active=false)"
    found = reasons.classify(unit.message, unit.quota)
    if found is None:
        return unit.message or "waiting: not examined yet"
    q = found.quota or unit.quota
    words = {
        Reason.QUOTA: f"no room in quota {q} for {found.resource}",
        Reason.PARENT_QUOTA: f"no room in parent quota {q} for {found.resource}",
        Reason.QUOTA_STRUCTURE: f"quota tree broken at {q}",
        Reason.BLOCKED: "blocked by a unit ahead (Block policy)",
        Reason.HELD: "queue held: admitted pods not running yet",
        Reason.PREEMPTING: "queue is preempting for another unit",
        Reason.PREEMPTOR: "preempting: waiting for victims to give back quota",
        Reason.INACTIVE: "inactive: held",
        Reason.QUEUE_NOT_FOUND: f"queue {q} does not exist",
        Reason.STOPPED: f"queue {q} is stopped by an administrator",
        Reason.NOT_BOUND: f"quota {unit.quota} is not bound to this namespace",
        Reason.PARENT_ONLY: f"quota {unit.quota} is a parent quota: it takes no jobs",
        Reason.SHARE: f"the rest of {q}'s parent is held for sibling quotas ({found.resource})",
        Reason.GUARANTEE: f"within its min: waiting for borrowed {found.resource} to come back",
        Reason.BEYOND_DEPTH: "beyond the queue's max-depth",
        Reason.INVALID: "spec cannot be read",
        Reason.NO_QUOTA_LABEL: "no quota label",
    }
    return words.get(found.reason, unit.message)


def dump(data: Any, output: str, out: TextIO) -> None:
    if output == "json":
        out.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    else:
        out.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


# --- explain ---------------------------------------------------------------------------------------


def _timeout_for(raw: Obj, got: Gathered) -> RunningTimeout | None:
    if got.settings is None:
        return None
    ref = (raw.get("spec") or {}).get("consumerRef") or {}
    adapter = registry.by_kind(str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""))
    timeouts = got.settings.running_timeouts
    return timeouts.for_extension(adapter.extension) if adapter is not None else timeouts.default


async def gather_for_unit(reader: Reader, namespace: str, wanted: str) -> tuple[Gathered, Obj]:
    got = Gathered()
    await reader.units(namespace, got, want_all=True)
    raw = find_unit(got.units, namespace, wanted)
    await reader.quotas(namespace, got)
    await reader.queues(got)
    await reader.settings(got)
    await reader.positions(namespace, [], got)
    if not got.quotas_complete:
        await reader.standings(namespace, got)
    unit = parse_unit(raw)
    readable = {str((q.get("metadata") or {}).get("name", "")) for q in got.quotas}
    if unit.quota and unit.quota not in readable:
        exists = await reader.queue_exists(namespace, unit.quota, got) if not got.complete else False
        if exists is None:
            got.unreadable_quotas.add(unit.quota)
            got.unknowns.append(
                f"whether queue {unit.quota} exists cannot be told (visibility API unavailable)"
            )
        elif exists:
            got.unreadable_quotas.add(unit.quota)
            got.unknowns.append(f"ElasticQuota {unit.quota} exists but cannot be read (another namespace)")
    return got, raw


def build_view(got: Gathered, raw: Obj) -> replay.View:
    return view_from(got, got.parsed_units(), _timeout_for(raw, got))


def view_from(got: Gathered, units: dict[str, Unit], running_timeout: RunningTimeout | None) -> replay.View:
    """The replay's input from what was gathered: ``explain``'s, and the dashboard's for many
    units at once (docs/dashboard.md)."""
    settings = got.settings
    return replay.View(
        units=units,
        quotas=got.parsed_quotas(),
        queues=got.queue_configs(),
        reclaim_protect_seconds=settings.reclaim_protect_seconds if settings else 0.0,
        namespace_binding=settings.quota_namespace_binding if settings else True,
        guarantees=settings.quota_guarantees if settings else True,
        complete=got.complete,
        unreadable_quotas=frozenset(got.unreadable_quotas),
        queues_known=got.queues is not None,
        positions=dict(got.positions),
        queue_missing=frozenset(got.queue_missing),
        running_timeout=running_timeout,
        unknowns=tuple(got.unknowns),
        usage_half_life=settings.usage_half_life_seconds if settings else None,
        quotas_complete=got.quotas_complete,
        standings=dict(got.standings),
    )


async def cmd_explain(reader: Reader, args: Any, out: TextIO, style: render.Style) -> int:
    got, raw = await gather_for_unit(reader, args.namespace, args.job)
    unit = parse_unit(raw)
    now = time.time()
    result = explain.explain(build_view(got, raw), unit.key, now)
    if args.output in ("json", "yaml"):
        data = dataclasses.asdict(result)
        data["reason"] = result.reason.value
        data["job"] = job_ref(unit, raw)
        data["waiting"] = result.waiting_now
        for level in data["fairness"]:
            for sibling in level["siblings"]:  # a zero share stands last of all: no JSON number
                sibling["score"] = sibling["score"] if math.isfinite(sibling["score"]) else None
        dump(data, args.output, out)
        return 0
    out.write(render_explanation(result, unit, raw, style, now) + "\n")
    return 0


def _refusal_mark(level: Level, style: render.Style) -> str:
    if level.refuses is None:
        return style("unknown", "dim")
    return style("no: refuses", "red", "bold") if level.refuses else style("yes", "green")


def render_explanation(e: Explanation, unit: Unit, raw: Obj, style: render.Style, now: float) -> str:
    """The answer of ``explain`` as text, top to bottom: the unit, why, what it is charged, the
    quota chain, who stands ahead and who holds the quota, the queue, and what would let it run."""
    lines: list[str] = []
    ref = (raw.get("spec") or {}).get("consumerRef") or {}
    job = f"{ref.get('kind')} {ref.get('name')}" if ref.get("kind") and ref.get("name") else ""
    head = f"QueueUnit {unit.namespace}/{unit.name}" + (f" ({job})" if job else "")
    lines.append(style(head, "bold"))
    facts = [f"phase {e.phase}", f"priority {unit.priority}", f"queue {e.quota or '-'}"]
    if e.position is not None:
        total = f" of {e.waiting}" if e.waiting is not None and e.unseen_ahead == 0 else ""
        facts.append(f"position {e.position}{total}")
    if e.waiting_now and e.waited_since:
        facts.append(f"waiting {render.age(now - e.waited_since)}")
    if unit.pool:
        facts.append(f"pool {unit.pool}" + (f" (through quota {unit.pool_quota})" if unit.pool_quota else ""))
    lines.append("  " + ", ".join(facts))
    lines.append("")
    colour = ("yellow", "bold") if e.waiting_now else ("green", "bold")
    lines.append(f"{style('Why:', *colour)} {e.summary}")
    if e.message:
        lines.append(f"  the scheduler's words: {e.message!r}")
    if e.recorded and e.recorded != e.message:
        lines.append(f"  last recorded on the unit: {e.recorded!r}")
    routes = pools.tried(e.recorded or e.message or "")
    if routes and e.waiting_now:
        lines.append("  pools tried, in order (docs/pools.md#fallback-between-pools):")
        lines.extend(f"    {i}. {text}" for i, text in enumerate(routes, start=1))
    if e.replay_agrees is False:
        lines.append(
            "  (replaying the scheduler on what you can read gives a different answer than it last "
            "recorded: something changed since, or holders you cannot see make the difference)"
        )
    if unit.pod_sets:
        lines.append("")
        lines.append(style("Charged per pod:", "bold"))
        for ps in unit.pod_sets:
            lines.append(f"  {ps.name}: {ps.count} x {render.resources(ps.per_pod, empty='nothing')}")
        lines.append(
            "  what the kube-scheduler reserves for each pod: its containers and init containers, its "
            "pod-level requests, RuntimeClass overhead and the namespace's LimitRange default requests "
            "(docs/compatibility.md#requests-the-apiserver-fills-in)."
        )
    lines.extend(_quota_chain(e, style))
    lines.extend(_fair_share(e, style))
    if e.ahead or e.unseen_ahead:
        lines.append("")
        count = len(e.ahead) + e.unseen_ahead
        lines.append(style(f"Ahead of it in queue {e.quota} ({count}):", "bold"))
        for a in e.ahead[:10]:
            lines.append(
                f"  {a.position}. {a.key}  priority {a.priority}  asks {render.resources(a.request)}"
            )
        if len(e.ahead) > 10:
            lines.append(f"  ... and {len(e.ahead) - 10} more")
        if e.unseen_ahead:
            lines.append(f"  {e.unseen_ahead} more in namespaces you cannot read")
    if e.holders:
        lines.append("")
        lines.append(style(f"Holding quota {e.refusing_quota or e.quota}:", "bold"))
        for h in e.holders[:10]:
            extra = ", being reclaimed" if h.reclaiming else ""
            lines.append(
                f"  {h.key}  holds {render.resources(h.holds)}  ({h.running}/{h.admitted} pods running, "
                f"{h.phase or 'Pending'}{extra})"
            )
        if len(e.holders) > 10:
            lines.append(f"  ... and {len(e.holders) - 10} more")
    lines.append("")
    lines.extend(_queue_facts(e, style, now))
    if e.next_steps:
        lines.append("")
        lines.append(style("What would let it run:" if e.waiting_now else "Next:", "bold"))
        lines.extend(f"  - {step}" for step in e.next_steps)
    if e.unknowns:
        lines.append("")
        lines.append(style("Not known, or assumed:", "bold"))
        lines.extend(f"  - {u}" for u in e.unknowns)
    return "\n".join(lines)


def _quota_chain(e: Explanation, style: render.Style) -> list[str]:
    """The quota chain from the unit's quota up, with each level's figures and whether it fits."""
    lines: list[str] = []
    if not e.levels:
        return lines
    lines.append("")
    lines.append(style(f"Quota chain (request {render.resources(e.request)}):", "bold"))
    rows = []
    for lv in e.levels:
        bound = "" if lv.used_complete else "≥"
        rows.append(
            [
                lv.name + ("" if lv.readable else " (not readable)"),
                lv.namespace or "-",
                render.resources(lv.min) if lv.readable else "?",
                render.resources(lv.max, empty="unlimited") if lv.readable else "?",
                bound + render.resources(lv.used, empty="0"),
                render.resources(lv.free) if lv.readable else "?",
                render.resources(lv.over_min, empty="0"),
                _refusal_mark(lv, style),
            ]
        )
    headers = ["QUOTA", "NAMESPACE", "MIN", "MAX", "USED", "FREE", "BORROWED", "FITS"]
    lines.extend("  " + line for line in render.table(headers, rows).splitlines())
    lines.append(
        "  BORROWED is usage above min: below a parent quota, siblings within their min may reclaim it "
        "(docs/compatibility.md#reclaim-across-quotas)."
    )
    return lines


def _share_text(share: Mapping[str, float]) -> str:
    return ",".join(f"{r}={v:.0%}" for r, v in sorted(share.items())) or "-"


def _fair_share(e: Explanation, style: render.Style) -> list[str]:
    """Each level of the chain that divides spare capacity: the siblings in the order they get it,
    with their decayed usage, share and standing (docs/compatibility.md#fair-over-time)."""
    lines: list[str] = []
    for level in e.fairness:
        lines.append("")
        lines.append(style(f"Spare capacity below {level.parent} (usage history):", "bold"))
        rows = []
        for place, s in enumerate(level.siblings, start=1):
            mark = "yours" if s.own else "ahead" if s.ahead else ""
            figures = not level.served or s.own  # a served level has figures for the quota only
            rows.append(
                [
                    str(place + level.unseen_ahead if s.own else place) if figures else "-",
                    s.name,
                    render.resources(s.usage, empty="0") if figures else "?",
                    _share_text(s.share) if figures else "?",
                    (f"{s.score:.2f}" if math.isfinite(s.score) else "-") if figures else "?",
                    style(mark, "yellow") if s.ahead else mark,
                ]
            )
        headers = ["ORDER", "QUOTA", "USAGE(DECAYED)", "SHARE", "STANDING", ""]
        lines.extend("  " + line for line in render.table(headers, rows).splitlines())
        if level.unseen_ahead:
            lines.append(
                f"  and {level.unseen_ahead} sibling quota(s) you cannot read, ahead of {level.quota}"
            )
        lines.append(f"  {level.text}")
    if e.fairness:
        lines.append(
            "  STANDING = the largest decayed usage as a fraction of the parent, divided by the share; "
            "lower gets spare capacity first (docs/compatibility.md#fair-over-time)."
        )
    return lines


def _queue_facts(e: Explanation, style: render.Style, now: float) -> list[str]:
    """The queue's policy, its preemption round, admission checks, requeue and running timeout."""
    lines: list[str] = []
    lines.append(style("Queue:", "bold"))
    if e.policy:
        lines.append(
            f"  policy {e.policy}{', blocked' if e.blocked else ''}; wait-for-pods-running "
            f"{'on' if e.wait_for_pods_running else 'off'}; preemption: {e.preemption}"
        )
    if e.round is not None:
        victims = (
            ", ".join(f"{v} ({n} replica(s) being reclaimed)" for v, n in e.round.victims) or "none left"
        )
        lines.append(f"  preemption round in progress for {e.round.preemptor}: waiting for {victims}")
    else:
        lines.append("  no preemption round in progress")
    if e.preempt_error and e.preempt_error != e.preemption:
        lines.append(f"  preemption for this unit: {e.preempt_error}")
    if e.checks:
        lines.append(
            "  admission checks: "
            + "; ".join(f"{n} {s or 'Pending'}{' (' + m + ')' if m else ''}" for n, s, m in e.checks)
        )
    if e.requeue_at is not None:
        lines.append(f"  requeued in {render.age(e.requeue_at - now)}")
    if e.running_timeout:
        when = f": due in {render.age(e.timeout_at - now)}" if e.timeout_at is not None else ""
        lines.append(
            f"  running timeout {render.age(e.running_timeout)} after admission (pods not all running by "
            f"then: suspended and requeued){when}"
        )
    elif not any("running timeout" in u for u in e.unknowns):
        lines.append("  running timeout off")
    return lines


# --- quotas ----------------------------------------------------------------------------------------


async def cmd_quotas(reader: Reader, args: Any, out: TextIO, style: render.Style) -> int:
    namespace = None if args.all_namespaces else args.namespace
    got = Gathered()
    if namespace is None:
        await reader.units(None, got, want_all=False)
    else:
        await reader.units(namespace, got, want_all=True)
    await reader.quotas(namespace, got)
    view = replay.View(
        units=got.parsed_units(),
        quotas=got.parsed_quotas(),
        queues=(),
        complete=got.complete,
        unreadable_quotas=frozenset(got.unreadable_quotas),
        quotas_complete=got.quotas_complete,
    )
    rows = replay.quota_rows(view, time.time())
    if namespace is not None and not args.tree:
        rows = [r for r in rows if r.namespace in (namespace, "")]
    if args.output and args.output not in ("json", "yaml"):
        wanted = {(r.namespace, r.name) for r in rows}
        objects = [
            q
            for q in got.quotas
            if (
                str((q.get("metadata") or {}).get("namespace", "")),
                str((q.get("metadata") or {}).get("name", "")),
            )
            in wanted
        ]
        write_objects(args.output, objects, QUOTAS, out)
        return 0
    if args.output in ("json", "yaml"):
        items = []
        for r in rows:
            item = dataclasses.asdict(r)
            for key in ("min", "max", "used", "over_min", "waiting_request"):
                item[key] = render.resources(item[key], empty="")
            item["runtime"] = None if r.runtime is None else render.resources(r.runtime, empty="")
            item["decayed"] = None if r.decayed is None else render.resources(r.decayed, empty="")
            item["readable"] = r.name not in got.unreadable_quotas
            items.append(item)
        dump({"items": items, "usageComplete": got.complete}, args.output, out)
        return 0
    if not rows:
        out.write("No ElasticQuotas found.\n")
        return 0
    table_rows = []
    history = any(r.decayed is not None for r in rows)
    for r in rows:
        readable = r.name not in got.unreadable_quotas
        name = ("  " * r.depth + ("└─ " if r.depth else "") + r.name) if args.tree else r.name
        note = (
            " (ignored: another quota holds its name)" if r.ignored else "" if readable else " (not readable)"
        )
        if r.pool_quotas:
            note += f" (falls back through {', '.join(r.pool_quotas)})"
        used = ("" if r.used_complete else "≥") + render.resources(r.used, empty="0")
        waiting = f"{r.waiting} ({render.resources(r.waiting_request)})" if r.waiting else "0"
        decayed = (
            [] if not history else ["-" if r.decayed is None else render.resources(r.decayed, empty="0")]
        )
        table_rows.append(
            [
                name + note,
                r.namespace or "-",
                *([] if args.tree else [r.parent or "-"]),
                r.pool or "-",
                render.resources(r.min) if readable else "?",
                render.resources(r.max, empty="unlimited") if readable else "?",
                used,
                render.resources(r.over_min, empty="0"),
                *decayed,
                "-" if r.runtime is None else render.resources(r.runtime, empty="0"),
                str(r.admitted),
                style(waiting, "yellow") if r.waiting else waiting,
            ]
        )
    headers = ["QUOTA", "NAMESPACE", *([] if args.tree else ["PARENT"]), "POOL", "MIN", "MAX", "USED"]
    headers += ["BORROWED", *(["USAGE(DECAYED)"] if history else [])]
    headers += ["RUNTIME", "ADMITTED", "WAITING"]
    out.write(render.table(headers, table_rows) + "\n")
    notes = [
        "BORROWED = usage above min: below a parent quota, siblings within their min may reclaim it.",
        "RUNTIME = what the quota may use now, as the scheduler last published it on the quota "
        "(-: not published).",
    ]
    if history:
        notes.append(
            "USAGE(DECAYED) = what the quota held on average lately, from its koord-queue/usage-history "
            "record decayed to now; below a parent, less of its share gets spare capacity first "
            "(docs/compatibility.md#fair-over-time)."
        )
    if any(r.pool for r in rows):
        notes.append("POOL = the node pool whose tree the quota is in; a pool's root admits its min.")
    if not got.complete:
        notes.append("≥: only the QueueUnits you can read are counted.")
    out.write("\n".join(notes) + "\n")
    return 0


# --- hold, release, priority ----------------------------------------------------------------------


async def cmd_active(reader: Reader, args: Any, out: TextIO, style: render.Style, *, active: bool) -> int:
    got = Gathered()
    await reader.units(args.namespace, got, want_all=False)
    raw = find_unit(got.units, args.namespace, args.job)
    unit = parse_unit(raw)
    job, _ = await reader.patch_job_annotation(raw, names.ACTIVE_ANNOTATION, "true" if active else "false")
    if active:
        out.write(f"{job} released: it competes for admission again in queue {unit.quota or '-'}\n")
    elif is_waiting(unit):
        out.write(
            f"{job} held: it keeps its place in queue {unit.quota or '-'} and is not admitted until "
            "released\n"
        )
    else:
        out.write(
            f"{job} held: it was admitted, so koord-queue suspends it and gives its quota back; it waits "
            "in its queue until released\n"
        )
    return 0


async def cmd_priority(reader: Reader, args: Any, out: TextIO, style: render.Style) -> int:
    value = goparse.parse_go_int(args.priority, bits=32)
    if value is None:
        raise CliError(f'priority must be a 32-bit integer, got "{args.priority}"')
    got = Gathered()
    await reader.units(args.namespace, got, want_all=False)
    raw = find_unit(got.units, args.namespace, args.job)
    unit = parse_unit(raw)
    await reader.settings(got)
    quota_obj = None
    if unit.quota:
        await reader.quotas(args.namespace, got)
        quota_obj = next(
            (parse_quota(q) for q in got.quotas if (q.get("metadata") or {}).get("name") == unit.quota), None
        )
    cluster_cap = got.settings.max_user_priority if got.settings is not None else None
    cap = priority_cap(cluster_cap, quota_obj)
    if cap is not None and value > cap:
        sources = []
        if cluster_cap is not None:
            sources.append(f"maxUserPriority {cluster_cap} (cluster)")
        if quota_obj is not None and quota_obj.max_user_priority is not None:
            sources.append(
                f"{names.MAX_USER_PRIORITY_ANNOTATION} {quota_obj.max_user_priority} (quota {unit.quota})"
            )
        raise CliError(
            f"priority {value} is above the cap {cap} ({', '.join(sources)}): the job would be clamped to "
            f"{cap}; ask for at most {cap}, or ask a cluster admin for a PriorityClass"
        )
    job, _ = await reader.patch_job_annotation(raw, names.PRIORITY_ANNOTATION, str(value))
    out.write(f"{job} priority set to {value} ({names.PRIORITY_ANNOTATION}); its QueueUnit follows\n")
    if got.settings is None:
        out.write(
            "note: the cluster-wide priority cap cannot be read; the reconciler clamps to it if lower\n"
        )
    return 0
