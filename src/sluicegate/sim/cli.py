"""`sluicegate sim`: run the simulated vLLM backend as its own process on a loopback port."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sluicegate.api.server import listen, serve
from sluicegate.sim.options import load_options
from sluicegate.sim.server import SimServer

# Seconds uvicorn waits for open requests at shutdown: a hung request would wait forever.
_GRACEFUL_SHUTDOWN_S = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the flags; values stay strings here and are checked by `load_options`."""
    add = parser.add_argument
    add("--config", metavar="FILE", help="YAML file of options (keys as the flags, with _)")
    add("--host", metavar="HOST", help="address to listen on (default 127.0.0.1)")
    add("--port", metavar="PORT", help="port to listen on (default 8001)")
    add("--model", metavar="NAME", action="append", help="served model, repeatable (sim-model)")
    add(
        "--guard-model",
        metavar="NAME",
        action="append",
        help="served model that answers Llama Guard verdicts, repeatable (see docs/simulator.md)",
    )
    add("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1 routes")
    add("--seed", metavar="N", help="seed of the fault draws (default 0)")
    add("--metrics-generation", metavar="{current,legacy}", help="vLLM metric names (current)")
    engine = parser.add_argument_group("engine").add_argument
    engine("--max-num-seqs", metavar="N", help="running batch size cap (default 32)")
    engine("--kv-cache-tokens", metavar="N", help="KV-cache pool in tokens (default 65536)")
    engine("--block-size", metavar="N", help="KV-cache block in tokens (default 16)")
    engine("--prefill-ms-per-token", metavar="MS", help="step cost per prefilled token (0.05)")
    engine("--step-base-ms", metavar="MS", help="fixed cost of a step (default 8)")
    engine("--step-per-seq-ms", metavar="MS", help="step cost per running sequence (0.6)")
    engine("--time-scale", metavar="X", help="multiplier on step time; 0 = no latency (1)")
    engine("--max-model-len", metavar="N", help="prompt + max_tokens limit (default 32768)")
    engine("--default-max-tokens", metavar="N", help="output length when absent (default 256)")
    engine("--scheduling-policy", metavar="{fcfs,priority}", help="waiting queue order (fcfs)")
    engine(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        help="reuse the KV blocks of prompts' cached prefixes, as vLLM does (default off)",
    )
    faults = parser.add_argument_group("faults (also settable at runtime via /sim/faults)")
    fault = faults.add_argument
    fault("--slowdown", metavar="X", help="factor on step time (default 1)")
    fault("--error-rate", metavar="P", help="fraction of requests answered with an error")
    fault("--error-status", metavar="STATUS", help="status of those errors (default 500)")
    fault("--throttle-rate", metavar="P", help="fraction of requests answered with 429")
    fault("--throttle-retry-after", metavar="S", help="Retry-After seconds on those 429s")
    fault("--hang", action=argparse.BooleanOptionalAction, help="accept requests, emit nothing")
    fault("--drop-after-tokens", metavar="N", help="cut responses after their N-th token")
    fault("--down", action=argparse.BooleanOptionalAction, help="answer 503 on inference/health")


def run(args: argparse.Namespace) -> int:
    try:
        options = load_options(vars(args), args.config)
    except ValueError as exc:
        print(f"sluicegate sim: {exc}", file=sys.stderr)
        return 2
    server = SimServer(options)
    try:
        listener = listen(options.host, options.port)
    except OSError as exc:
        where = f"{options.host}:{options.port}"
        print(f"sluicegate sim: cannot listen on {where}: {exc}", file=sys.stderr)
        return 1
    models = ", ".join(options.models)
    where = f"http://{options.host}:{options.port}"
    print(f"sluicegate sim listening on {where} ({models})", flush=True)
    serve(server.app, [listener], graceful_s=_GRACEFUL_SHUTDOWN_S)
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sluicegate sim", description=__doc__)
    add_arguments(parser)
    sys.exit(run(parser.parse_args(argv)))
