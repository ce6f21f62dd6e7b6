"""Fuzzing the running webhook: whatever the body, the answer is a 4xx or a well-formed review.

The real server runs in a background thread (its own event loop) on 127.0.0.1; hypothesis drives
plain ``http.client`` requests at it: random bytes, truncated and corrupted reviews, invalid UTF-8,
wrong kinds and versions, wrong-typed fields, deep nesting, Content-Encodings (refused) and bodies
over the size limit (with and without a Content-Length). Allowed outcomes: HTTP 400, 404, 405 or
413; or HTTP 200 with an AdmissionReview whose response echoes the uid and says ``allowed: true``
or ``allowed: false`` with a message. Never a 5xx, never a dropped connection, and the server
still answers afterwards. Example counts are bounded so the module runs in well under 30 seconds.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from koord_queue.shared.admission.decisions import AdmissionConfig
from koord_queue.shared.api import names
from koord_queue.shared.jobs import registry
from koord_queue.webhook import server
from tests.unit.test_admission import review_body
from tests.unit.test_job_adapters import SAMPLES

LIMIT = 64 * 1024
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    """Serve the real app from a thread; yields ``(host, port)``."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}
    config = server.ServerConfig(
        admission=AdmissionConfig(enabled_extensions=frozenset(registry.EXTENSIONS)), max_body_bytes=LIMIT
    )

    async def start() -> None:
        runner = server.make_runner(server.make_app(config))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        holder["runner"], holder["port"] = runner, runner.addresses[0][1]

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(holder["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="webhook-fuzz-server", daemon=True)
    thread.start()
    assert ready.wait(10), "the webhook did not start"
    yield "127.0.0.1", holder["port"]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def send(
    address: tuple[str, int],
    body: Any,
    *,
    path: str = "/validate",
    chunked: bool = False,
    encoding: str | None = None,
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=10)
    try:
        headers = {"Content-Type": "application/json"}
        if encoding is not None:
            headers["Content-Encoding"] = encoding
        if chunked:
            chunks = iter([body[i : i + 8192] for i in range(0, len(body), 8192)])
            connection.request("POST", path, body=chunks, headers=headers, encode_chunked=True)
        else:
            connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def check(status: int, payload: bytes, *, uid: object = None) -> None:
    """The only acceptable outcomes (see the module docstring)."""
    assert status in (200, 400, 404, 405, 413), (status, payload[:200])
    if status != 200:
        assert b"Traceback" not in payload
        return
    answer = json.loads(payload)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    if uid is not None:
        assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    if not response["allowed"]:
        assert isinstance(response["status"]["message"], str) and response["status"]["message"]
        assert response["status"]["code"] in (403, 422, 500)


def valid_body(extension: str, operation: str = "CREATE") -> dict[str, Any]:
    obj = SAMPLES[extension]()
    return review_body(obj, operation=operation, old=obj if operation == "UPDATE" else None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=15,
)
paths = st.sampled_from(["/mutate", "/validate", "/mutate/jobs", "/validate/x", "/nowhere"])


@FUZZ
@given(body=st.binary(max_size=2048), path=paths)
def test_random_bytes(address: tuple[str, int], body: bytes, path: str) -> None:
    check(*send(address, body, path=path))


@FUZZ
@given(extension=st.sampled_from(registry.EXTENSIONS), cut=st.floats(0, 1, exclude_max=True), path=paths)
def test_truncated_reviews(address: tuple[str, int], extension: str, cut: float, path: str) -> None:
    data = json.dumps(valid_body(extension)).encode()
    check(*send(address, data[: int(len(data) * cut)], path=path))


@FUZZ
@given(
    extension=st.sampled_from(registry.EXTENSIONS),
    position=st.floats(0, 1, exclude_max=True),
    junk=st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\xf8\x88\x80\x80\x80"]),
)
def test_invalid_utf8(address: tuple[str, int], extension: str, position: float, junk: bytes) -> None:
    data = json.dumps(valid_body(extension), ensure_ascii=False).encode()
    at = int(len(data) * position)
    check(*send(address, data[:at] + junk + data[at:]))


@FUZZ
@given(
    api_version=st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1", "", "v1", None]),
    kind=st.sampled_from(["AdmissionReview", "ConversionReview", "", None]),
    group_kind=st.sampled_from(
        [(a.api_version, a.kind) for a in registry.ADAPTERS]
        + [(names.API_VERSION, "Queue"), ("v1", "Pod"), ("apps/v1", "Deployment"), ("x/y/z", "")]
    ),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "create", ""]),
)
def test_wrong_kinds_and_versions(
    address: tuple[str, int],
    api_version: str | None,
    kind: str | None,
    group_kind: tuple[str, str],
    operation: str,
) -> None:
    body = valid_body("job")
    body["apiVersion"], body["kind"] = api_version, kind
    group, _, version = group_kind[0].rpartition("/")
    body["request"]["kind"] = {"group": group, "version": version, "kind": group_kind[1]}
    body["request"]["operation"] = operation
    body["request"]["oldObject"] = body["request"]["object"]
    status, payload = send(address, json.dumps(body).encode())
    check(status, payload, uid="uid-1")


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in items:
        found += _leaf_paths(child, (*prefix, key))
    return found


@FUZZ
@given(
    data=st.data(),
    extension=st.sampled_from(registry.EXTENSIONS),
    operation=st.sampled_from(["CREATE", "UPDATE"]),
)
def test_wrong_typed_fields(
    address: tuple[str, int], data: st.DataObject, extension: str, operation: str
) -> None:
    body = valid_body(extension, operation)
    targets = _leaf_paths(body)
    for path in data.draw(st.lists(st.sampled_from(targets), min_size=1, max_size=4)):
        node: Any = body
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = data.draw(json_values)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed this path
    for route in ("/mutate", "/validate"):
        uid = body.get("request", {}).get("uid") if isinstance(body.get("request"), dict) else None
        check(
            *send(address, json.dumps(body).encode(), path=route), uid=uid if isinstance(uid, str) else None
        )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(LIMIT + 1, 4 * LIMIT), chunked=st.booleans())
def test_huge_bodies_get_413(address: tuple[str, int], size: int, chunked: bool) -> None:
    status, payload = send(address, b" " * size, chunked=chunked)
    assert status == 413, payload
    assert str(LIMIT).encode() in payload


@FUZZ
@given(
    encoding=st.sampled_from(["gzip", "deflate", "br", "zstd", "identity", "bogus"]),
    body=st.binary(max_size=512),
)
def test_garbage_content_encodings(address: tuple[str, int], encoding: str, body: bytes) -> None:
    check(*send(address, body, encoding=encoding))


def test_compressed_bodies_are_refused(address: tuple[str, int]) -> None:
    for body in (gzip.compress(b" " * (64 * LIMIT)), gzip.compress(json.dumps(valid_body("job")).encode())):
        status, payload = send(address, body, encoding="gzip")
        assert status == 400 and b"Content-Encoding" in payload


def test_deep_nesting_and_huge_strings(address: tuple[str, int]) -> None:
    check(*send(address, b"[" * 5000 + b"]" * 5000))
    # Nested just under orjson's depth limit of 1024 (the envelope adds a few levels).
    body = valid_body("job")
    body["request"]["object"]["spec"]["template"]["spec"]["x"] = "NESTED"
    text = json.dumps(body).replace('"NESTED"', '{"a":' * 1000 + '"leaf"' + "}" * 1000)
    for route in ("/mutate", "/validate"):
        check(*send(address, text.encode(), path=route), uid="uid-1")
    body = valid_body("workflow")
    body["request"]["object"]["metadata"]["annotations"] = {names.MIN_RESOURCES_ANNOTATION: "[" * 20000}
    check(*send(address, json.dumps(body).encode()), uid="uid-1")


def test_the_server_still_answers_afterwards(address: tuple[str, int]) -> None:
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert (response.status, response.read()) == (200, b"ok")
    finally:
        connection.close()
    status, payload = send(address, json.dumps(valid_body("job")).encode(), path="/mutate")
    assert status == 200 and json.loads(payload)["response"]["patchType"] == "JSONPatch"
