"""Text output of ``kubectl koord-queue``: tables as kubectl prints them, durations as kubectl's
AGE column, colour only when asked or on a terminal (and never with ``NO_COLOR``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from koord_queue.shared.api import quantities
from koord_queue.shared.core.replay import UNKNOWN_RESOURCE

_CODES = {"bold": "1", "red": "31", "green": "32", "yellow": "33", "blue": "34", "dim": "2"}


class Style:
    """ANSI styling that is a no-op when colour is off."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles or not text:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\033[{codes}m{text}\033[0m"


def use_colour(mode: str, stream: TextIO = sys.stdout) -> bool:
    if mode == "always":
        return True
    if mode == "never" or os.environ.get("NO_COLOR"):
        return False
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def age(seconds: float | None) -> str:
    """kubectl's short duration: 45s, 3m12s, 2h5m, 3d4h."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s}s" if s and m < 10 else f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m}m" if m and h < 10 else f"{h}h"
    d, h = divmod(h, 24)
    return f"{d}d{h}h" if h and d < 10 else f"{d}d"


def resources(res: Mapping[str, int], *, empty: str = "-") -> str:
    shown = quantities.format_resource_list({k: v for k, v in res.items() if k != UNKNOWN_RESOURCE})
    return ",".join(f"{k}={v}" for k, v in shown.items()) or empty


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], style: Style | None = None) -> str:
    """Columns separated by three spaces, as ``kubectl get`` prints them. ANSI codes in cells do
    not count towards the width."""
    widths = [len(h) for h in headers]

    def visible(cell: str) -> int:
        out, skip = 0, False
        for ch in cell:
            if ch == "\033":
                skip = True
            elif skip and ch == "m":
                skip = False
            elif not skip:
                out += 1
        return out

    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], visible(cell))
    lines = []
    for row in [list(headers), *[list(r) for r in rows]]:
        cells = [cell + " " * (widths[i] - visible(cell)) for i, cell in enumerate(row)]
        lines.append("   ".join(cells).rstrip())
    return "\n".join(lines)


def truncate(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
