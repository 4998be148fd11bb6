"""`bertkit serve`: a model folder behind HTTP, on FastAPI and uvicorn.

Endpoints: POST /encode, /v1/embeddings (OpenAI-compatible), /fill-mask, /predict (the folder's
fine-tuned task), /attention; GET /health, /info, /metrics (Prometheus), /openapi.json, the API
docs at /docs and /redoc (their scripts served from here: they work offline) and the page at /.

Dynamic batching: requests queue while the model is busy; when it is free, the compatible
requests waiting (up to `batch_tokens` tokens, after an optional `batch_window_ms` wait) are
joined into one model call, run on one worker thread, off the event loop. Every limit is checked
before a request is queued, so a bad request fails alone, with a JSON error naming the limit or
the field.

The package: the options and limits (config.py), the folder opened for serving (served.py), the
request bodies (schemas.py), dynamic batching (batching.py), the errors and their handlers
(errors.py), the endpoints (routes.py), the metrics (metrics.py), the middleware (middleware.py),
and the app that puts them together (app.py).
"""
from .app import create_app, serve
from .config import ServeConfig
from .errors import RequestError
from .served import Served

__all__ = ["ServeConfig", "RequestError", "Served", "create_app", "serve"]
