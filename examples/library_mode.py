"""Library mode: a team keeps its own OpenAI client and lets Sluicegate govern its calls.

    sluicegate sim --port 8001 &       # or any OpenAI-compatible backend
    BACKEND_URL=http://127.0.0.1:8001/v1 BACKEND_KEY=... \\
        python examples/library_mode.py --config examples/library_mode.yaml --calls 12

Redis must be running (`REDIS_URL`, default redis://127.0.0.1:6379/0). Without what it
needs, it stops with one line that says what is missing.

Every call first takes an attempt from the Governor (the tenant's limits, the lane's
turn in the fair queue, the pool's permits, the backend gate), then calls the
deployment the grant names with the team's own client, and reports the usage. A
refusal with a known wait is retried after it; a provider's 429 is reported, so the
pool cools for every caller; a failed call moves to a deployment the grant says is
left. Prints one line per call and a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import collections

import openai

from sluicegate import ConfigError, GatewayError, Governor

QUESTION = "In one sentence: why keep a gateway's limits in one place?"


async def ask(governor: Governor, clients: dict[str, openai.AsyncOpenAI], tenant: str) -> str:
    """One answer, or the reason there is none; retries and fallback are this caller's."""
    avoid: frozenset[str] = frozenset()
    for _ in range(4):
        tried, left = avoid, ()
        try:
            async with governor.attempt(
                model="chat", tenant=tenant, prompt_tokens=len(QUESTION) // 4 + 8, max_tokens=32
            ) as grant:
                tried, left = grant.tried, grant.left
                client = clients.get(grant.deployment)
                if client is None:
                    client = clients[grant.deployment] = openai.AsyncOpenAI(
                        base_url=grant.base_url, api_key=grant.api_key or "none", max_retries=0
                    )
                try:
                    reply = await client.chat.completions.create(
                        model=grant.upstream_model,
                        messages=[{"role": "user", "content": QUESTION}],
                        max_tokens=32,
                    )
                except openai.RateLimitError as limited:
                    grant.throttled(retry_after_s(limited.response.headers.get("retry-after")))
                    raise
                if reply.usage is not None:
                    grant.report(reply.usage.prompt_tokens, reply.usage.completion_tokens)
                return f"ok via {grant.deployment}"
        except GatewayError as refused:
            if refused.retry_after_s is None:
                return f"refused: {refused.code}"
            await asyncio.sleep(refused.retry_after_s)
        except openai.APIError as failed:
            if not left:
                return f"failed: {failed.__class__.__name__}"
            avoid = tried
    return "gave up"


def retry_after_s(header: str | None) -> float | None:
    try:
        return float(header) if header is not None else None
    except ValueError:
        return None


async def main(config: str, calls: int) -> None:
    async with Governor.from_config(config) as governor:
        clients: dict[str, openai.AsyncOpenAI] = {}
        tenants = ["team-a", "team-b"]
        outcomes = await asyncio.gather(
            *(ask(governor, clients, tenants[i % 2]) for i in range(calls))
        )
        for client in clients.values():
            await client.close()
    for number, outcome in enumerate(outcomes):
        print(f"call {number}: {outcome}")
    summary = collections.Counter(outcome.split(":")[0].split(" via")[0] for outcome in outcomes)
    print("summary:", ", ".join(f"{kind} {count}" for kind, count in sorted(summary.items())))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/library_mode.yaml")
    parser.add_argument("--calls", type=int, default=12)
    args = parser.parse_args()
    try:
        asyncio.run(main(args.config, args.calls))
    except (ConfigError, OSError, RuntimeError) as problem:
        raise SystemExit(f"library_mode.py: {problem}") from None
