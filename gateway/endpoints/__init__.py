"""One object per OpenAI API the gateway serves (``base.Endpoint``): its name, path, checks, stream tap, cache
question and replay, and for the Responses API where each answer lives. A request's context holds its API's
object, and the steps call it (openai_api, the cache, the relay, the pipeline, the records).

A shared leaf, beside the context: it imports only errors, sse and the policy's schema, so that the context may
hold an endpoint and the cache, the upstream relay and the pipeline may call one without any of them importing
another. (The other way, with the endpoints importing the cache's Entry and the relay's Relayed, the context
could not name the type it holds.)
"""

from __future__ import annotations

from gateway.endpoints.base import Endpoint
from gateway.endpoints.chat import CHAT
from gateway.endpoints.completions import COMPLETIONS
from gateway.endpoints.embeddings import EMBEDDINGS
from gateway.endpoints.responses import RESPONSES, RETRIEVE

SERVED: tuple[Endpoint, ...] = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)  # the POST APIs (edge and batch lines)
BY_PATH: dict[str, Endpoint] = {endpoint.path: endpoint for endpoint in SERVED}

__all__ = ["BY_PATH", "CHAT", "COMPLETIONS", "EMBEDDINGS", "RESPONSES", "RETRIEVE", "SERVED", "Endpoint"]
