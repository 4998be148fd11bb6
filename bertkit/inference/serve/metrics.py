"""The server's Prometheus metrics (GET /metrics): requests by endpoint and status, their latency,
the model calls' size and the requests abandoned by their clients."""
from __future__ import annotations

from typing import Iterable

from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest


class Metrics:
    """One app's metrics, in a registry of their own: two apps in one process count apart."""

    def __init__(self, known_paths: Iterable[str]):
        self.known_paths = frozenset(known_paths)  # any other path is counted as "other"
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("bertkit_requests", "HTTP requests", ["endpoint", "status"], registry=registry)
        self.latency = Histogram("bertkit_request_seconds", "request latency", ["endpoint"], registry=registry,
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
        self.batch_texts = Histogram("bertkit_batch_texts", "texts per model call", registry=registry,
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.tokens = Counter("bertkit_tokens", "tokens of the texts the model ran on", registry=registry)
        self.abandoned = Counter("bertkit_abandoned_requests", "requests whose client left before their answer; "
                                 "their queued work is dropped", registry=registry)

    def record(self, path: str, status: int, seconds: float) -> None:
        """One answer."""
        endpoint = path if path in self.known_paths else "other"
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def on_batch(self, n_texts: int, n_tokens: int) -> None:
        """One model call."""
        self.batch_texts.observe(n_texts)
        self.tokens.inc(n_tokens)

    def on_abandoned(self) -> None:
        self.abandoned.inc()

    def response(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
