"""``-o name`` and ``-o jsonpath=TEMPLATE``: output over the objects themselves, as ``kubectl get``
prints them, for scripts (the tables and ``-o json`` carry the plugin's own figures instead)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from koord_queue.cli import jsonpath
from koord_queue.shared import kube

Obj = dict[str, Any]


def output_format(*allowed: str) -> Any:
    """An argparse ``type`` for ``-o``: one of ``allowed``, or ``jsonpath=TEMPLATE`` when allowed
    (checked here, so that a bad template is a usage error before anything is read)."""

    def check(text: str) -> str:
        kind, sep, template = text.partition("=")
        if kind == "jsonpath" and "jsonpath" in allowed:
            if not sep or not template:
                raise argparse.ArgumentTypeError(
                    "jsonpath needs a template: -o jsonpath='{.items[*].metadata.name}'"
                )
            try:
                jsonpath.parse(template)
            except jsonpath.JsonPathError as err:
                raise argparse.ArgumentTypeError(str(err)) from None
            return text
        if text in allowed and text != "jsonpath":
            return text
        shown = ", ".join(a if a != "jsonpath" else "jsonpath=TEMPLATE" for a in allowed)
        raise argparse.ArgumentTypeError(f"invalid output format {text!r} (choose from {shown})")

    check.__name__ = "output format"
    return check


def write_objects(output: str, objects: list[Obj], res: kube.Resource, out: TextIO) -> bool:
    """``-o name`` and ``-o jsonpath=`` over the raw objects, as ``kubectl get`` prints them;
    False for any other format (the command prints its own)."""
    if output == "name":
        prefix = f"{res.kind.lower()}.{res.group}" if res.group else res.kind.lower()
        out.write("".join(f"{prefix}/{(o.get('metadata') or {}).get('name', '')}\n" for o in objects))
        return True
    if output.startswith("jsonpath="):
        listed = {"apiVersion": "v1", "kind": "List", "items": objects, "metadata": {"resourceVersion": ""}}
        out.write(jsonpath.render(output.split("=", 1)[1], listed))
        return True
    return False
