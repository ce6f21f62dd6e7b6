"""The plugin's output and parsing without a cluster: the ``-o jsonpath`` subset (as kubectl
prints it), ``-o name``, the ``-o`` check, ``describe``'s layout, and completion of the new commands."""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest

from koord_queue.cli import admin, completion, formats, jsonpath, main
from koord_queue.cli.client import QUEUE_UNITS, QUOTAS

LISTED: dict[str, Any] = {
    "kind": "List",
    "items": [
        {"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "x"}}, "spec": {"priority": 5}},
        {"metadata": {"name": "b", "labels": {}}, "spec": {"priority": 7, "active": False}},
    ],
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{.items[*].metadata.name}", "a b"),
        ('{range .items[*]}{.metadata.name}{"\\n"}{end}', "a\nb\n"),
        ('{range .items[*]}{.metadata.name}{"\\t"}{.spec.priority}{"\\n"}{end}', "a\t5\nb\t7\n"),
        ("{.items[0].metadata.name}", "a"),
        ("{.items[-1].metadata.name}", "b"),
        ("{.items[5].metadata.name}", ""),
        ("{.items[0].metadata.labels.app\\.kubernetes\\.io/name}", "x"),
        ("{.items[0].metadata.labels['app.kubernetes.io/name']}", "x"),
        ("names: {.items[*].metadata.name}.", "names: a b."),
        ("{.items[1].spec.active}", "false"),
        ("{.items[0].spec}", '{"priority":5}'),
        ("{.kind}", "List"),
    ],
)
def test_jsonpath_subset_prints_as_kubectl(template: str, expected: str) -> None:
    assert jsonpath.render(template, LISTED) == expected


@pytest.mark.parametrize(
    "template", ["{.items[*]", "{range .items[*]}{.a}", "{end}", "{..name}", "{.items[x]}"]
)
def test_jsonpath_outside_the_subset_is_an_error(template: str) -> None:
    with pytest.raises(jsonpath.JsonPathError):
        jsonpath.parse(template)


def test_output_format_accepts_the_listed_formats_and_checks_templates() -> None:
    check = formats.output_format("wide", "json", "name", "jsonpath")
    assert check("name") == "name"
    assert check("jsonpath={.items[*].metadata.name}") == "jsonpath={.items[*].metadata.name}"
    for bad in ("yaml", "jsonpath", "jsonpath=", "jsonpath={..x}", "custom-columns=A:.a"):
        with pytest.raises(argparse.ArgumentTypeError):
            check(bad)


def test_o_name_prints_resource_and_name_as_kubectl_get() -> None:
    out = io.StringIO()
    assert formats.write_objects("name", LISTED["items"], QUEUE_UNITS, out)
    assert out.getvalue() == "queueunit.scheduling.x-k8s.io/a\nqueueunit.scheduling.x-k8s.io/b\n"
    out = io.StringIO()
    assert formats.write_objects("name", LISTED["items"][:1], QUOTAS, out)
    assert out.getvalue() == "elasticquota.scheduling.sigs.k8s.io/a\n"
    assert not formats.write_objects("wide", [], QUEUE_UNITS, io.StringIO())


def test_the_parser_knows_the_new_commands_and_flags() -> None:
    p = main.parser()
    args = p.parse_args(["list", "-l", "team=a", "-w", "-o", "jsonpath={.items[*].metadata.name}"])
    assert (args.selector, args.watch, args.output) == ("team=a", True, "jsonpath={.items[*].metadata.name}")
    assert p.parse_args(["stop", "team-a"]).queue == "team-a"
    assert p.parse_args(["resume", "team-a"]).command == "resume"
    assert p.parse_args(["describe", "job/train"]).job == "job/train"
    assert p.parse_args(["quotas", "-o", "name"]).output == "name"
    with pytest.raises(SystemExit):
        p.parse_args(["explain", "x", "-o", "name"])  # explain has no objects to name


def test_version_without_a_cluster_prints_the_plugin_version_and_unknown_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    missing = tmp_path / "no-kubeconfig"
    out, err = io.StringIO(), io.StringIO()
    assert main.main(["version", f"--kubeconfig={missing}"], out=out, err=err) == 0
    lines = out.getvalue().splitlines()
    assert lines == [f"Plugin version: {admin.plugin_version()}", "Server version: unknown"]
    assert lines[0] != "Plugin version: unknown"


def test_completion_offers_the_new_commands_and_flags() -> None:
    found = completion.candidates([""])
    for name in ("describe", "stop", "resume", "version"):
        assert name in found
    assert {"-l", "--selector", "-w", "--watch"} <= set(completion.candidates(["list", "-"]))
    assert "jsonpath=" in completion.candidates(["quotas", "-o", ""])
    assert "name" in completion.candidates(["list", "-o", ""])


def test_describe_lays_out_fields_tables_and_events() -> None:
    raw = {
        "metadata": {
            "name": "train-abc",
            "namespace": "ns",
            "uid": "u1",
            "labels": {"quota.scheduling.koordinator.sh/name": "team-a"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "consumerRef": {"apiVersion": "batch/v1", "kind": "Job", "name": "train"},
            "priority": 5,
            "podSet": [
                {
                    "name": "main",
                    "count": 2,
                    "template": {
                        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
                    },
                }
            ],
        },
        "status": {
            "phase": "Enqueued",
            "message": "limited quotaName:team-a, limited resKey:cpu,; preempt failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "Waiting"}],
        },
    }
    events = [
        {
            "type": "Normal",
            "reason": "Enqueued",
            "message": "queued",
            "count": 3,
            "lastTimestamp": "2026-01-01T00:00:10Z",
            "source": {"component": "koord-queue"},
        },
    ]
    now = 1767225600.0 + 70  # 2026-01-01T00:01:10Z
    text = admin.describe_text(raw, events, None, now)
    assert "Name:" in text and "train-abc" in text
    assert "Job:" in text and "Job/train" in text
    assert "Queue:" in text and "team-a" in text
    assert "Phase:" in text and "Enqueued" in text
    assert "limited quotaName:team-a" in text
    assert "Created:" in text and "2026-01-01T00:00:00Z (1m10s ago)" in text
    assert "Pod Sets:\n  NAME   COUNT   PER POD\n  main   2       cpu=1" in text
    assert "Admissions:\n  <none>" in text
    assert "Ready   False    Waiting" in text
    assert "Normal   Enqueued   1m (x3)   koord-queue   queued" in text
    refused = admin.describe_text(raw, [], "permission denied: you may not list", now)
    assert "Events:  cannot be read: permission denied" in refused
