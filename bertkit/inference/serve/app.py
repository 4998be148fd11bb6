"""The app, assembled: the endpoints (routes.py), their error handlers (errors.py), the metrics
(metrics.py) and middleware (middleware.py) around the model folder (served.py); and `serve`,
which runs it on uvicorn."""
from __future__ import annotations

import errno
import os
import socket
from contextlib import asynccontextmanager

from fastapi_offline import FastAPIOffline

from ...errors import BertkitError
from .batching import Batcher
from .config import Limits, ServeConfig
from .connection import MAX_HEADER_BYTES, Connection
from .errors import HANDLERS
from .metrics import Metrics
from .middleware import BodyLimit, Measure
from .routes import router
from .served import Served


def create_app(cfg: ServeConfig, served: Served | None = None):
    """The app serving cfg.model (or `served`, already open); its endpoints find the folder, the
    batcher, the limits and the metrics in app.state."""
    cfg.check()
    served = served or Served(cfg.model, cfg.backend)
    limits = Limits.of(cfg, served.config.max_position_embeddings, served.encoder.default_max_len)
    served.encoder.default_max_len = limits.tokens  # what /encode reads whole (texts over it are refused)
    metrics = Metrics(route.path for route in router.routes)
    batcher = Batcher(cfg.batch_window_ms / 1000, cfg.batch_tokens, cfg.batching, metrics.on_batch, cfg.max_queue,
                      metrics.on_abandoned)
    # FastAPIOffline: /docs (Swagger UI) and /redoc load their scripts from this server, not a CDN,
    # so they work on a machine without internet
    app = FastAPIOffline(title="bertkit", version=_version(), lifespan=_lifespan, exception_handlers=HANDLERS,
                         description=f"BERT model {served.name} ({served.backend} backend)")
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    app.add_middleware(Measure, record=metrics.record)  # outermost: it sees the body limit's 413s too
    app.state.served, app.state.batcher, app.state.limits, app.state.metrics = served, batcher, limits, metrics
    return app


@asynccontextmanager
async def _lifespan(app):
    app.state.batcher.start()
    yield
    await app.state.batcher.stop()


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("bertkit")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "0"


def _listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use or a host that is not this
    machine's is one line naming the flag (where uvicorn would log its own line and exit 3)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise BertkitError(f"--host {host!r}: not a host name or address this machine knows "
                           f"({getattr(e, 'strerror', None) or e})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart reuses the port
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        why = {errno.EADDRINUSE: f"--port {port}: already in use on {host} (another server listens there); "
                                 "choose another --port",
               errno.EADDRNOTAVAIL: f"--host {host!r}: not an address of this machine",
               errno.EACCES: f"--port {port}: permission denied (ports below 1024 need root); choose another --port"}
        raise BertkitError(why.get(e.errno, f"--host {host} --port {port}: cannot listen there ({e.strerror})")) from None
    sock.set_inheritable(True)
    return sock


SERVING_KERNEL_CACHE = 0


def uvicorn_config(app, **where):
    """uvicorn's options for the app: the connection with a deadline for headers and JSON refusals
    (connection.py); an idle keep-alive connection closed after 5 s (uvicorn's default, named here)."""
    import uvicorn
    return uvicorn.Config(app, log_level="warning", timeout_keep_alive=5, http=Connection,
                          h11_max_incomplete_event_size=MAX_HEADER_BYTES, **where)


def serve(cfg: ServeConfig) -> None:
    import uvicorn

    cfg.check()
    sock = _listen(cfg.host, cfg.port)
    # oneDNN keeps a kernel for every input shape it meets (1,024 by default), and a server meets
    # a new (texts, tokens) shape with nearly every batch: MiniLM on mixed requests grew 18% after
    # warm-up and kept growing; with none kept it holds flat (benchmarks/serve_load.py). Read when
    # the first kernel is made: set before the model loads, and the user's own setting wins.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(SERVING_KERNEL_CACHE))
    try:
        app = create_app(cfg)
        print(f"bertkit: serving {cfg.model} ({cfg.backend}) on http://{cfg.host}:{cfg.port}/ "
              f"(API docs: /docs, /openapi.json)", flush=True)
        uvicorn.Server(uvicorn_config(app)).run(sockets=[sock])
    finally:
        sock.close()
