"""``ub serve``: a run's checkpoints behind vLLM's OpenAI-compatible server (docs/serving.md)."""

from __future__ import annotations

import argparse
import os

from ub.cli.args import add_root_argument, port_number, run_dir


def add_parser(sub) -> None:
    serve = sub.add_parser("serve", help="serve a run's checkpoints with vLLM's OpenAI-compatible "
                           "server (docs/serving.md)")
    serve.add_argument("run", help="run name (under --root) or run directory")
    add_root_argument(serve)
    serve.add_argument("--checkpoint", default="latest",
                       help="checkpoint number, latest (default) or all")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1; 0.0.0.0: every interface, "
                       "which needs an API key)")
    serve.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    serve.add_argument("--api-key",
                       help="the key every request must bring (Authorization: Bearer KEY); "
                       "default: $VLLM_API_KEY. Prefer the variable: a command line is visible "
                       "to the machine's other users")
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ub.serve import serve
    from ub.serve_plan import plan_server

    return serve(plan_server(run_dir(args), args.checkpoint, host=args.host, port=args.port,
                             api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None))
