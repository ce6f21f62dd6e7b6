"""Shell completion for ``kubectl-koord_queue`` (bash, zsh) and for ``kubectl koord-queue`` through
kubectl's plugin completion hook (``kubectl_complete-koord_queue``).

Both ask :func:`answer` with the words typed after the command, the last one being the word being
completed, and read cobra's ``__complete`` format: one candidate a line, then ``:<directive>``
(4: do not fall back to file names), which is what kubectl expects from a plugin's hook. Job names
come from the QueueUnits of the namespace (a short read with the flags already typed); anything
that fails just completes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

COMMANDS: Final = (
    "list",
    "explain",
    "describe",
    "quotas",
    "hold",
    "release",
    "priority",
    "stop",
    "resume",
    "version",
    "uninstall",
    "dashboard",
    "completion",
)
GLOBAL_FLAGS: Final = (
    "--kubeconfig",
    "--context",
    "--namespace",
    "-n",
    "--as",
    "--color",
    "--koord-queue-namespace",
)
LIST_FLAGS: Final = (
    "-A",
    "--all-namespaces",
    "--queue",
    "--phase",
    "-l",
    "--selector",
    "-w",
    "--watch",
    "-o",
)
FLAGS: Final = {
    "list": (*LIST_FLAGS, "--output"),
    "ls": (*LIST_FLAGS, "--output"),
    "explain": ("-o", "--output"),
    "quotas": ("--tree", "-A", "--all-namespaces", "-o", "--output"),
    "hold": (),
    "release": (),
    "priority": (),
    "describe": (),
    "stop": (),
    "resume": (),
    "version": (),
    "dashboard": ("--port", "--no-browser", "-A", "--all-namespaces"),
    "uninstall": ("--held", "--yes", "--dry-run", "--follow"),
}
VALUES: Final = {
    "--color": ("auto", "always", "never"),
    "--held": ("release", "delete"),
    "--phase": (
        "Pending",
        "Enqueued",
        "Reserved",
        "Dequeued",
        "Running",
        "TimeoutBackoff",
        "Succeed",
        "Failed",
    ),
}
OUTPUTS: Final = {
    "list": ("wide", "json", "yaml", "name", "jsonpath="),
    "ls": ("wide", "json", "yaml", "name", "jsonpath="),
    "explain": ("json", "yaml"),
    "quotas": ("json", "yaml", "name", "jsonpath="),
}
#: Every global flag takes a value; so do these command flags.
TAKES_VALUE: Final = frozenset(
    {
        *GLOBAL_FLAGS,
        "--queue",
        "--phase",
        "-l",
        "--selector",
        "-o",
        "--output",
        "--held",
    }
)
NO_FILES: Final = ":4\n"


def _positional(words: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            skip = word in TAKES_VALUE
            continue
        out.append(word)
    return out


def _flag_value(words: Sequence[str], *flags: str) -> str | None:
    for i, word in enumerate(words):
        for flag in flags:
            if word == flag and i + 1 < len(words):
                return words[i + 1]
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
    return None


def _job_names(words: Sequence[str]) -> list[str]:
    from koord_queue.cli import client as cli_client
    from koord_queue.shared import kube

    async def read() -> list[str]:
        path = cli_client.kubeconfig_path(_flag_value(words, "--kubeconfig"))
        context = _flag_value(words, "--context")
        namespace = _flag_value(words, "-n", "--namespace") or cli_client.default_namespace(path, context)
        api = await cli_client.connect(path, context, _flag_value(words, "--as"))
        try:
            items, _ = await asyncio.wait_for(api.list(cli_client.QUEUE_UNITS, namespace=namespace), 3.0)
        finally:
            await api.close()
        found = []
        for item in items:
            ref = (item.get("spec") or {}).get("consumerRef") or {}
            found.append(str(ref.get("name") or (item.get("metadata") or {}).get("name", "")))
        return sorted(set(found))

    try:
        return asyncio.run(read())
    except (cli_client.CliError, kube.KubeError, TimeoutError, OSError):
        return []


def _queue_names(words: Sequence[str]) -> list[str]:
    """The Queues, for ``stop`` and ``resume`` (only who may read them gets any)."""
    from koord_queue.cli import client as cli_client
    from koord_queue.shared import kube

    async def read() -> list[str]:
        path = cli_client.kubeconfig_path(_flag_value(words, "--kubeconfig"))
        home = cli_client.component_namespace(_flag_value(words, "--koord-queue-namespace"))
        api = await cli_client.connect(path, _flag_value(words, "--context"), _flag_value(words, "--as"))
        try:
            items, _ = await asyncio.wait_for(api.list(cli_client.QUEUES, namespace=home), 3.0)
        finally:
            await api.close()
        return sorted({str((i.get("metadata") or {}).get("name", "")) for i in items} - {""})

    try:
        return asyncio.run(read())
    except (cli_client.CliError, kube.KubeError, TimeoutError, OSError):
        return []


def candidates(words: Sequence[str]) -> list[str]:
    """What may follow ``words[:-1]``, for the partial word ``words[-1]``."""
    if not words:
        words = [""]
    current, before = words[-1], list(words[:-1])
    previous = before[-1] if before else ""
    positional = _positional(before)
    command = positional[0] if positional else ""
    if previous in ("-o", "--output"):
        return list(OUTPUTS.get(command, ("json", "yaml")))
    if previous in VALUES:
        return list(VALUES[previous])
    if previous in TAKES_VALUE:
        return []  # a namespace, a context, a file, a user: nothing to offer safely
    if not command:
        return list(GLOBAL_FLAGS) if current.startswith("-") else list(COMMANDS)
    if command == "completion":
        return ["bash", "zsh"] if len(positional) == 1 else []
    if current.startswith("-"):
        return [*FLAGS.get(command, ()), *GLOBAL_FLAGS]
    if command in ("explain", "describe", "hold", "release", "priority") and len(positional) == 1:
        return _job_names(before)
    if command in ("stop", "resume") and len(positional) == 1:
        return _queue_names(before)
    return []


def answer(words: Sequence[str]) -> str:
    current = words[-1] if words else ""
    found = [c for c in candidates(words) if c.startswith(current)]
    return "".join(f"{c}\n" for c in found) + NO_FILES


_BASH = """\
# bash completion for kubectl-koord_queue (kubectl koord-queue completes through
# kubectl_complete-koord_queue once kubectl's own completion is loaded).
# Load with:  source <(kubectl-koord_queue completion bash)
_kubectl_koord_queue() {
    local IFS=$'\\n'
    local words=("${COMP_WORDS[@]:1:COMP_CWORD}")
    [[ ${#words[@]} -eq 0 ]] && words=("")
    COMPREPLY=($(kubectl-koord_queue __complete "${words[@]}" 2>/dev/null | grep -v '^:'))
}
complete -o nosort -F _kubectl_koord_queue kubectl-koord_queue
"""

_ZSH = """\
#compdef kubectl-koord_queue
# zsh completion for kubectl-koord_queue (kubectl koord-queue completes through
# kubectl_complete-koord_queue once kubectl's own completion is loaded).
# Load with:  source <(kubectl-koord_queue completion zsh)
_kubectl_koord_queue() {
    local -a found
    found=(${(f)"$(kubectl-koord_queue __complete "${(@)words[2,CURRENT]}" 2>/dev/null | grep -v '^:')"})
    compadd -a found
}
if (( $+functions[compdef] )); then
    compdef _kubectl_koord_queue kubectl-koord_queue
fi
"""


def script(shell: str) -> str:
    return _BASH if shell == "bash" else _ZSH
