"""``kubectl koord-queue``: where your jobs stand in the queue, and why.

Installed with the package as ``kubectl-koord_queue`` (kubectl finds it on PATH as the plugin
``koord-queue``) and ``kubectl_complete-koord_queue`` (kubectl's completion hook for plugins).
Everything it reads goes through ``shared.kube`` with your own credentials, so it shows exactly what
RBAC lets you see; ``explain`` replays the scheduler's own code (``shared.core.explain``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from koord_queue.cli import admin, commands, completion, formats, listing, render, uninstall
from koord_queue.cli.client import (
    NAMESPACE_ENV,
    CliError,
    Reader,
    component_namespace,
    connect,
    default_namespace,
    kubeconfig_path,
)
from koord_queue.dashboard import server
from koord_queue.shared import kube
from koord_queue.shared.api import names

EPILOG = """\
exit status:
  0  success
  1  failure (API error, invalid input, a priority above the cap)
  2  usage error
  3  not found (no QueueUnit for that job, no such queue)
  4  permission denied by RBAC (the message names the missing permission)
  5  refused by the cluster's admission (a webhook or an admission policy)

examples:
  kubectl koord-queue list                      units of the current namespace, with positions
  kubectl koord-queue list -A --phase Enqueued  every waiting unit (needs cluster-wide read)
  kubectl koord-queue explain my-job            why my-job waits and what would let it run
  kubectl koord-queue quotas --tree             the quota tree: min, max, used, waiting work
  kubectl koord-queue hold my-job               keep my-job from being admitted (release undoes it)
  kubectl koord-queue priority my-job 50        ask for priority 50 (within the cluster's cap)
  kubectl koord-queue describe my-job           the QueueUnit's fields, admissions and events
  kubectl koord-queue list -w -l team=a         list units labelled team=a, again on every change
  kubectl koord-queue --koord-queue-namespace=platform-queue explain my-job
                                                koord-queue installed in namespace platform-queue
  kubectl koord-queue list -o jsonpath='{range .items[*]}{.metadata.name}{"\\n"}{end}'
  kubectl koord-queue stop team-a               admins: admit nothing more from queue team-a
  kubectl koord-queue resume team-a             admins: let queue team-a admit again
  kubectl koord-queue dashboard                 the same answers in a browser, as you (Ctrl-C stops it)
  kubectl koord-queue uninstall --held=release --dry-run
                                                admins: what taking the queue out would do
"""


def _global_flags(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--kubeconfig", default=default, help="path to the kubeconfig file")
    parser.add_argument("--context", default=default, help="the kubeconfig context to use")
    parser.add_argument("-n", "--namespace", default=default, help="namespace (default: the context's)")
    parser.add_argument("--as", dest="as_user", default=default, metavar="USER", help="impersonate USER")
    parser.add_argument(
        "--koord-queue-namespace",
        default=default,
        metavar="NAMESPACE",
        help="the namespace koord-queue is installed in: its Queues, configuration and reconciler "
        f"(default: ${NAMESPACE_ENV}, else {names.COMPONENT_NAMESPACE})",
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default=argparse.SUPPRESS if suppress else "auto",
        help="colour output: auto (only on a terminal; NO_COLOR turns it off), always, never",
    )


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="kubectl koord-queue",
        description="Where your jobs stand in koord-queue, and why.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_flags(main, suppress=False)
    sub = main.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name: str, help_text: str, **kw: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, **kw)
        _global_flags(p, suppress=True)
        return p

    ls = command("list", "list QueueUnits: phase, priority, queue, position, wait and reason", aliases=["ls"])
    ls.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    ls.add_argument("--queue", help="only units of this queue (quota)")
    ls.add_argument("--phase", help="only units in this phase (Pending, Enqueued, Reserved, Dequeued, ...)")
    ls.add_argument("-l", "--selector", help="only units matching this label selector (as kubectl get -l)")
    ls.add_argument(
        "-w", "--watch", action="store_true", help="print again whenever a unit changes (Ctrl-C ends)"
    )
    ls.add_argument(
        "-o",
        "--output",
        type=formats.output_format("wide", "json", "yaml", "name", "jsonpath"),
        help="output format: wide, json, yaml, name, jsonpath=TEMPLATE (over the QueueUnit objects)",
    )

    ex = command("explain", "why a job waits, from the scheduler's own decision code")
    ex.add_argument("job", metavar="JOB|UNIT", help="job name, KIND/NAME, or QueueUnit name")
    ex.add_argument("-o", "--output", choices=("json", "yaml"), help="output format")

    qt = command("quotas", "the quota tree: min, max, used, borrowed and waiting work per quota")
    qt.add_argument("--tree", action="store_true", help="show quotas as a tree under their parents")
    qt.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace's quotas")
    qt.add_argument(
        "-o",
        "--output",
        type=formats.output_format("json", "yaml", "name", "jsonpath"),
        help="output format: json, yaml, name, jsonpath=TEMPLATE (over the ElasticQuota objects)",
    )

    hold = command("hold", "keep a job from being admitted (scheduling.x-k8s.io/active=false)")
    hold.add_argument("job", metavar="JOB", help="job name or KIND/NAME")
    release = command("release", "let a held job compete again (scheduling.x-k8s.io/active=true)")
    release.add_argument("job", metavar="JOB", help="job name or KIND/NAME")

    prio = command("priority", "set a job's priority (scheduling.x-k8s.io/priority), within the cap")
    prio.add_argument("job", metavar="JOB", help="job name or KIND/NAME")
    prio.add_argument("priority", metavar="N", help="the priority (a 32-bit integer)")

    desc = command("describe", "a QueueUnit's fields, conditions, admissions and recent events")
    desc.add_argument("job", metavar="UNIT|JOB", help="job name, KIND/NAME, or QueueUnit name")

    stop = command("stop", "admins: stop a queue, which then admits nothing (koord-queue/stopped=true)")
    stop.add_argument("queue", metavar="QUEUE", help="the queue (named after its ElasticQuota)")
    resume = command("resume", "admins: resume a stopped queue")
    resume.add_argument("queue", metavar="QUEUE", help="the queue (named after its ElasticQuota)")

    command("version", "the plugin's version, and the server's when it can be read")

    dash = command(
        "dashboard",
        "a web dashboard on 127.0.0.1 that reads and writes as you (docs/dashboard.md); Ctrl-C stops it",
    )
    dash.add_argument("--port", type=int, default=0, help="the local port (default 0: any free port)")
    dash.add_argument("--no-browser", action="store_true", help="print the URL only; open no browser")
    dash.add_argument("-A", "--all-namespaces", action="store_true", help="show every namespace's units")

    out = command(
        "uninstall",
        "admins: take the queue out of the way before removing the release: stop the reconciler, "
        "delete the webhooks and admission policies, release or delete every held job, ungate pods",
    )
    out.add_argument(
        "--held",
        required=True,
        choices=("release", "delete"),
        help="what to do with each job the queue holds: release it (it runs without the queue) or delete it",
    )
    out.add_argument("--yes", action="store_true", help="really do it (required unless --dry-run)")
    out.add_argument("--dry-run", action="store_true", help="print what would be done and change nothing")
    out.add_argument(
        "--follow",
        action="store_true",
        help="then ungate the new pods of started Jobs whose template keeps the gate, until they finish",
    )

    comp = sub.add_parser("completion", help="print a shell completion script (bash or zsh)")
    comp.add_argument("shell", choices=("bash", "zsh"))
    return main


async def _run(args: argparse.Namespace, out: TextIO) -> int:
    path = kubeconfig_path(args.kubeconfig)
    if not args.namespace:
        args.namespace = default_namespace(path, args.context)
    args.koord_queue_namespace = component_namespace(args.koord_queue_namespace)
    style = render.Style(render.use_colour(args.color, out))
    client = await connect(path, args.context, args.as_user)
    try:
        reader = Reader(client, args.koord_queue_namespace)
        name = args.command
        if name in ("list", "ls"):
            return await listing.cmd_list(reader, args, out, style)
        if name == "explain":
            return await commands.cmd_explain(reader, args, out, style)
        if name == "quotas":
            return await commands.cmd_quotas(reader, args, out, style)
        if name in ("hold", "release"):
            return await commands.cmd_active(reader, args, out, style, active=name == "release")
        if name == "priority":
            return await commands.cmd_priority(reader, args, out, style)
        if name == "describe":
            return await admin.cmd_describe(reader, args, out)
        if name in ("stop", "resume"):
            return await admin.cmd_stop(reader, args, out, stop=name == "stop")
        if name == "version":
            return await admin.cmd_version(reader, out)
        if name == "uninstall":
            return await uninstall.cmd_uninstall(client, args, out)
        if name == "dashboard":
            return await server.serve(reader, args, out, args.as_user or "")
        raise CliError(f"unknown command {name}")
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the plugin; returns the exit status (see ``EPILOG``)."""
    stdout, stderr = out or sys.stdout, err or sys.stderr
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["__complete"]:  # the words being completed may look like any flag
        stdout.write(completion.answer(words[1:]))
        return 0
    args = parser().parse_args(words)
    if args.command == "completion":
        stdout.write(completion.script(args.shell))
        return 0
    if args.command == "version":
        try:  # the plugin's own version does not need a cluster
            return asyncio.run(_run(args, stdout))
        except (CliError, kube.KubeError, OSError):
            return asyncio.run(admin.cmd_version(None, stdout))
    try:
        if args.command == "uninstall":
            uninstall.check_args(args)  # before any credentials are read
        return asyncio.run(_run(args, stdout))
    except CliError as failure:
        stderr.write(f"error: {failure}\n")
        return failure.code
    except kube.KubeError as failure:
        stderr.write(f"error: {failure}\n")
        return 1
    except KeyboardInterrupt:  # list --watch ends here
        return 130


def entry() -> None:
    """Console script ``kubectl-koord_queue``."""
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())


def complete_entry() -> None:
    """Console script ``kubectl_complete-koord_queue``: kubectl's completion hook for the plugin
    (called with the words after ``kubectl koord-queue``, the last one being completed)."""
    sys.stdout.write(completion.answer(sys.argv[1:]))


if __name__ == "__main__":
    entry()
