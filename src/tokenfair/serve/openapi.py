"""The service's OpenAPI document: request bodies, responses and errors of every route.

The generation routes read their body themselves (size cap, strict parsing off the event
loop), so FastAPI cannot infer what they take; :func:`install_openapi` writes it in: the
request models of :mod:`tokenfair.serve.openai_schema` as ``components.schemas``, the 200
responses (JSON, or ``text/event-stream`` when ``stream`` is true), the OpenAI error body for
every error status a route can answer, and the bearer-key security scheme.
"""

from __future__ import annotations

from fastapi.openapi.utils import get_openapi

from .openai_schema import (ChatCompletionRequest, ChatCompletionResponse, CompletionRequest, CompletionResponse,
                            ErrorResponse, ModelList)

REF = "#/components/schemas/{model}"
GENERATION_ERRORS = {400: "Invalid request (the field is in error.param)", 401: "Missing or unknown API key",
                     403: "Class not allowed for the tenant", 404: "Unknown model",
                     413: "Request body too large, or prompt beyond the KV capacity",
                     429: "Queue full, overloaded or rate limited (Retry-After, x-ratelimit-*)",
                     499: "Client closed the connection", 500: "The request failed in the engine",
                     502: "A backend failed", 503: "Shutting down, no backend, or unschedulable (Retry-After)",
                     504: "Deadline cannot be met / expired"}
ROUTES = {
    "/v1/chat/completions": ("post", ChatCompletionRequest, ChatCompletionResponse, GENERATION_ERRORS),
    "/v1/completions": ("post", CompletionRequest, CompletionResponse, GENERATION_ERRORS),
    "/v1/models": ("get", None, ModelList, {401: "Missing or unknown API key"}),
    "/metrics": ("get", None, None, {401: "The metrics key is required (--metrics-key-sha256)"}),
    "/healthz": ("get", None, None, {503: "Not ready (shutting down, engine broken, no backend up)"}),
}
PUBLIC = {"/healthz", "/metrics"}
_ADMIN_AUTH = {401: "The admin key is required (not a tenant key)",
               403: "Admin endpoints are off (start with --admin-key-sha256)"}
ADMIN_ROUTES = {     # serve/admin.py: the contract in force, live changes, canaries
    ("/admin/contract", "get"): _ADMIN_AUTH,
    ("/admin/contract", "post"): {**_ADMIN_AUTH, 400: "The contract (YAML body) or a query parameter is invalid; "
                                  "the contract in force stays", 413: "Contract body too large"},
    ("/admin/contract/rollback", "post"): {**_ADMIN_AUTH, 409: "No previous version to roll back to"},
    ("/admin/contract/reload", "post"): {**_ADMIN_AUTH, 400: "The contract file is invalid; the one in force stays"},
}


def _add_schema(components: dict, model) -> dict:
    schema = model.model_json_schema(ref_template=REF)
    for name, sub in schema.pop("$defs", {}).items():
        components.setdefault(name, sub)
    components[model.__name__] = schema
    return {"$ref": REF.format(model=model.__name__)}


def build_openapi(app) -> dict:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    comps = doc.setdefault("components", {}).setdefault("schemas", {})
    error_ref = _add_schema(comps, ErrorResponse)
    doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, (method, req_model, resp_model, errors) in ROUTES.items():
        op = doc.get("paths", {}).get(path, {}).get(method)
        if op is None:
            continue
        if req_model is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": _add_schema(comps, req_model)}}}
        ok: dict = {"description": "OK"}
        if resp_model is not None:
            content = {"application/json": {"schema": _add_schema(comps, resp_model)}}
            if req_model is not None:
                content["text/event-stream"] = {"schema": {"type": "string"}}
            ok["content"] = content
        elif path == "/metrics":
            ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
        else:
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        op["responses"] = {"200": ok, **{str(s): {"description": d, "content": {"application/json": {
            "schema": error_ref if path != "/healthz" else {"type": "object"}}}} for s, d in errors.items()}}
        if path not in PUBLIC:
            op["security"] = [{"bearer": []}]
    for (path, method), errors in ADMIN_ROUTES.items():
        op = doc.get("paths", {}).get(path, {}).get(method)
        if op is None:
            continue
        op.setdefault("responses", {}).update({str(s): {"description": d, "content": {"application/json": {
            "schema": error_ref}}} for s, d in errors.items()})
        op["security"] = [{"bearer": []}]
    return doc


def install_openapi(app) -> None:
    """Serve :func:`build_openapi`'s document at ``/openapi.json`` (built once)."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema
    app.openapi = openapi
