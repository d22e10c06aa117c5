"""A tiny HTTP/JSON client over urllib for the HTTP API tests, and a light OpenAPI schema check.

Deliberately not aiohttp: what a script in any language does (one request, a status, a JSON body).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

TIMEOUT_S = 60.0


class Reply:
    def __init__(self, status: int, body: bytes, headers: Any) -> None:
        self.status = status
        self.raw = body
        self.headers = headers

    @property
    def json(self) -> Any:
        return json.loads(self.raw)

    def __repr__(self) -> str:
        return f"Reply({self.status}, {self.raw[:300]!r})"


def request(base: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
            content_type: str | None = None, headers: dict[str, str] | None = None,
            timeout_s: float = TIMEOUT_S) -> Reply:
    data = raw
    hdrs = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    if content_type is not None:
        hdrs["Content-Type"] = content_type
    req = urllib.request.Request(base + path, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return Reply(resp.status, resp.read(), resp.headers)
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, exc.read(), exc.headers)


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        schema = doc["components"]["schemas"][name]
    return schema


def schema_errors(doc: dict[str, Any], schema: dict[str, Any], value: Any, where: str = "$") -> list[str]:
    """What in ``value`` does not match ``schema`` (types, required properties, enums, arrays, oneOf)."""
    schema = _resolve(doc, schema)
    if value is None and schema.get("nullable"):
        return []
    if "oneOf" in schema:
        if any(not schema_errors(doc, s, value, where) for s in schema["oneOf"]):
            return []
        return [f"{where}: matches none of oneOf"]
    errors: list[str] = []
    kind = schema.get("type")
    checks = {"object": dict, "array": list, "string": str, "boolean": bool}
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{where}: {value!r} is not an integer"]
    elif kind in checks and not isinstance(value, checks[kind]):
        return [f"{where}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} not in {schema['enum']}")
    if kind == "object":
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where}: {name} is missing")
        props = schema.get("properties")
        if props is not None:
            for name, item in value.items():
                if name not in props:
                    errors.append(f"{where}: {name} is not described")
                else:
                    errors += schema_errors(doc, props[name], item, f"{where}.{name}")
    if kind == "array":
        for i, item in enumerate(value):
            errors += schema_errors(doc, schema["items"], item, f"{where}[{i}]")
    return errors


def check_reply(doc: dict[str, Any], method: str, path: str, reply: Reply) -> None:
    """Assert ``reply`` matches what ``doc`` says ``method path`` answers with its status."""
    operation = doc["paths"][path][method.lower()]
    response = operation["responses"].get(str(reply.status))
    assert response is not None, f"{method} {path} answered {reply.status}, which is not described"
    schema = response["content"]["application/json"]["schema"]
    errors = schema_errors(doc, schema, reply.json)
    assert not errors, f"{method} {path} {reply.status}: {errors}"
