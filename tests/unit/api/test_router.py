"""Routing: exact paths first, then the longest prefix; 404 and 405 otherwise."""

from __future__ import annotations

import orjson

from sluicegate.api.asgi import Router, send_json


def answering(name: str):
    async def handler(scope, receive, send):
        await send_json(send, 200, {"handler": name, "path": scope["path"]})

    return handler


async def call(router: Router, method: str, path: str) -> tuple[int, dict]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await router({"type": "http", "method": method, "path": path, "headers": []}, None, send)
    return sent[0]["status"], orjson.loads(sent[1]["body"])


def router() -> Router:
    routes = Router()
    routes.add("GET", "/v1/jobs", answering("list"))
    routes.add_prefix("GET", "/v1/jobs/", answering("job"))
    routes.add_prefix("DELETE", "/v1/jobs/", answering("cancel"))
    routes.add_prefix("GET", "/v1/", answering("anything"))
    return routes


async def test_an_exact_path_is_preferred_to_a_prefix():
    assert await call(router(), "GET", "/v1/jobs") == (200, {"handler": "list", "path": "/v1/jobs"})


async def test_the_longest_prefix_wins_and_each_method_has_its_handler():
    routes = router()
    assert (await call(routes, "GET", "/v1/jobs/job_1"))[1]["handler"] == "job"
    assert (await call(routes, "DELETE", "/v1/jobs/job_1"))[1]["handler"] == "cancel"
    assert (await call(routes, "GET", "/v1/files/f"))[1]["handler"] == "anything"


async def test_other_methods_get_405_and_other_paths_404():
    routes = router()
    status, body = await call(routes, "PUT", "/v1/jobs/job_1")
    assert (status, body["error"]["code"]) == (405, "method_not_allowed")
    status, body = await call(routes, "GET", "/v2/jobs")
    assert (status, body["error"]["code"]) == (404, "unknown_route")


async def test_a_path_is_quoted_escaped_and_cut_short_where_it_is_shown():
    """uvicorn decodes `%0a` into a newline: a raw path could forge a log line."""
    status, body = await call(router(), "GET", "/v2/x\nERROR forged")
    assert status == 404
    assert "\n" not in body["error"]["message"]
    assert "'/v2/x\\nERROR forged'" in body["error"]["message"]
    _, body = await call(router(), "GET", "/v2/" + "a" * 10_000)
    assert len(body["error"]["message"]) < 300
