"""The hostile tenant's attacks on the metrics endpoints (``chaos/tenant_metrics.py``,
docs/operations.md#metrics): which sockets are the processes' metrics ports, and how a set of
scrapes is judged (a 200 anywhere is a breach; 401, 403 and a refused handshake are refusals;
anything else is left unjudged, never counted as a defence)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from chaos import tenant_metrics as metrics
from testenv import scraping

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5B83 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:74FB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0A00000F:2710 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue
   0: 00000000000000000000000000000000:1F91 00000000000000000000000000000000:0000 0A 00000000
   1: 00000000000000000000000001000000:1F92 00000000000000000000000000000000:0000 0A 00000000
   2: 0000000000000000FFFF00000100007F:1F93 00000000000000000000000000000000:0000 01 00000000
"""


def test_only_listening_sockets_a_loopback_client_reaches_are_ports() -> None:
    # 127.0.0.1:23427 and 0.0.0.0:29947 listen; an established connection and 10.0.0.15 do not count.
    assert metrics.listening_ports([TCP]) == {0x5B83, 0x74FB}
    assert metrics.listening_ports([TCP, TCP6]) == {0x5B83, 0x74FB, 0x1F91, 0x1F92}
    assert metrics.listening_ports(["", "garbage\nnot a table at all"]) == set()


def test_the_harness_credentials_tell_the_reconciler_port_from_the_webhook_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scraping, "_BY_PORT", {})  # this test's registrations only
    reconciler, webhook, stranger = 0x5B83, 0x74FB, 0x1F91
    scraping.register(reconciler, scraping.Credentials(token="t"))
    scraping.register(webhook, scraping.Credentials(client_cert=tmp_path / "c", client_key=tmp_path / "k"))
    assert metrics.metrics_ports({stranger, reconciler, webhook}) == (reconciler, webhook)
    # Neither process listening (a fault restarting both): nothing to attack, not a wrong port.
    assert metrics.metrics_ports({stranger}) == (None, None)


def test_a_scrape_served_anywhere_is_a_breach() -> None:
    outcome, detail = metrics.verdict({"no token": 401, "own token": 200})
    assert outcome == "SUCCEEDED" and "own token: 200" in detail


def test_every_scrape_refused_is_a_refusal() -> None:
    answers: dict[str, int | str] = {"no token": 401, "forged token": 401, "own token": 403}
    assert metrics.verdict(answers)[0] == "refused"
    assert metrics.verdict({"no client certificate": "tls-refused"})[0] == "refused"


def test_an_answer_that_decides_nothing_leaves_the_attack_unjudged() -> None:
    # A 503 (the reviews could not be made), a closed port or no try at all is no defence.
    assert metrics.verdict({"no token": 401, "own token": 503})[0] == "skipped"
    assert metrics.verdict({"own token": "closed"})[0] == "skipped"
    assert metrics.verdict({})[0] == "skipped"


def test_the_attacks_are_in_the_report() -> None:
    from chaos.tenant import ATTACKS

    assert set(metrics.ATTACKS) <= set(ATTACKS)


def test_a_refusal_the_control_scrape_does_not_confirm_is_no_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "RETRY_S", 0.01)
    monkeypatch.setattr(metrics, "_ports", lambda: (4242, None))
    monkeypatch.setattr(metrics, "_scrape", lambda port, context, token: 403)
    controlled = {"served": False}
    monkeypatch.setattr(metrics, "_control", lambda port: controlled["served"])
    context = ssl.create_default_context()
    # A dying process (or a stranger on its port) refuses the harness's own scraper too.
    answer = asyncio.run(metrics._settled(0, context, "t"))
    assert answer == "unconfirmed 403" and metrics.verdict({"own token": answer})[0] == "skipped"
    controlled["served"] = True
    assert asyncio.run(metrics._settled(0, context, "t")) == 403
    # No port at all (the process restarting for the whole window): nothing to judge.
    monkeypatch.setattr(metrics, "_ports", lambda: (None, None))
    assert asyncio.run(metrics._settled(0, context, "t")) is None
