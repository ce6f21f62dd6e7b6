"""Stopping a whole queue (``koord-queue/stopped``, docs/compatibility.md#stopping-a-queue): a
stopped queue admits nothing, its waiting units keep their places and are told why, admitted units
are not touched, and resuming lets them compete again in the same order."""

from __future__ import annotations

import dataclasses

from koord_queue.shared.api import names
from koord_queue.shared.api.names import Message
from tests.unit.test_model import QueueBuilder, queue, quota, unit
from tests.unit.test_scheduling import World, admits, parked


def stopped(name: str, value: str = "true") -> QueueBuilder:
    return queue(name).annotate(names.STOPPED_ANNOTATION, value)


def test_the_annotation_is_parsed_and_a_bad_value_is_a_problem() -> None:
    assert stopped("q").build().stopped is True
    assert stopped("q", "false").build().stopped is False
    assert queue("q").build().stopped is False
    bad = stopped("q", "yes please").build()
    assert bad.stopped is False and any(names.STOPPED_ANNOTATION in p for p in bad.problems)


def test_a_stopped_queue_admits_nothing_and_says_why() -> None:
    w = World(quota("q", cpu="4"), queues=(stopped("q"),))
    w.add(unit("a").quota("q").priority(10).cpu("1"), unit("b").quota("q").priority(5).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == []
    for name in ("a", "b"):
        park = parked(plan, name)
        assert park is not None and park.message == Message.queue_stopped("q")
        assert park.message == (
            "queue q is stopped by an administrator; nothing is admitted until it is resumed"
        )
    assert w.cycle().decisions == ()  # told once, not on every cycle


def test_an_inactive_unit_of_a_stopped_queue_keeps_its_own_reason() -> None:
    w = World(quota("q", cpu="4"), queues=(stopped("q"),))
    w.add(unit("held").quota("q").cpu("1").active(False))
    w.add(unit("waiting").quota("q").cpu("1"))
    plan = w.cycle()
    assert parked(plan, "held") is None  # the stop does not overwrite why a held unit waits
    park = parked(plan, "waiting")
    assert park is not None and park.message == Message.queue_stopped("q")


def test_stopping_leaves_admitted_units_alone_and_resuming_keeps_the_order() -> None:
    w = World(quota("q", cpu="2"), queues=(queue("q"),))
    w.add(unit("running").quota("q").cpu("1"))
    assert admits(w.cycle()) == ["running"]
    w.cache.put_queue(stopped("q").build())
    w.add(unit("low").quota("q").priority(1).cpu("1"), unit("high").quota("q").priority(9).cpu("1"))
    plan = w.cycle()
    assert admits(plan) == []
    assert {d.key for d in plan.parks} == {"default/low", "default/high"}
    assert w.u("running").admissions and w.cache.ledger.used("q") == {"cpu": 1000}
    w.finish("running")  # a release does not wake a stopped queue into admitting
    assert admits(w.cycle()) == []
    w.cache.put_queue(queue("q").build())
    assert admits(w.cycle()) == ["high", "low"]


def test_stopping_one_queue_does_not_stop_another() -> None:
    w = World(quota("a", cpu="2"), quota("b", cpu="2"), queues=(stopped("a"), queue("b")))
    w.add(unit("x").quota("a").cpu("1"), unit("y").quota("b").cpu("1"))
    assert admits(w.cycle()) == ["y"]


def test_explain_and_the_plugin_name_a_stopped_queue() -> None:
    from koord_queue.cli.commands import short_reason
    from koord_queue.shared.core import explain, reasons
    from koord_queue.shared.core.reasons import Reason
    from tests.unit import test_explain as te

    ann = {names.STOPPED_ANNOTATION: "true"}
    e = explain.explain(
        te.view([te.unit("w", "q")], [te.quota("q", "4")], [te.queue("q", ann=ann)]), "ns/w", te.NOW
    )
    assert e.reason is Reason.STOPPED and e.waiting_now
    assert "stopped by an administrator" in e.summary
    assert e.next_steps == ("a cluster admin resumes it: kubectl koord-queue resume q",)
    found = reasons.classify(Message.queue_stopped("q"), "q")
    assert found is not None and (found.reason, found.quota) == (Reason.STOPPED, "q")
    parked = dataclasses.replace(te.unit("w", "q"), phase="Enqueued", message=Message.queue_stopped("q"))
    assert short_reason(parked) == "queue q is stopped by an administrator"


def test_the_webhook_refuses_a_stopped_value_that_is_not_a_boolean() -> None:
    from koord_queue.shared.admission import validation

    assert validation.validate_queue_annotations({names.STOPPED_ANNOTATION: "true"}) == []
    (error,) = validation.validate_queue_annotations({names.STOPPED_ANNOTATION: "yes please"})
    assert names.STOPPED_ANNOTATION in str(error) and "true" in str(error)
