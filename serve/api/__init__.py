"""OpenAI-compatible HTTP API over the embedded engine: `run_server(opts, host, port)`."""

from serve.api.server import build_app, run_server

__all__ = ["build_app", "run_server"]
