"""The request's structured-output fields -> SamplingParams.structured, in one place.

    response_format (OpenAI)                       structured_outputs (vLLM)
      {"type": "text"}          -> None              {"json": schema | schema text}
      {"type": "json_object"}   -> json_object       {"regex": str}
      {"type": "json_schema",                        {"choice": [str, ...]}
       "json_schema": {"name", "schema",             {"grammar": Lark text}
                       "strict", "description"}}     {"json_object": true}
                                -> json              + optional "whitespace_pattern"

Chat, completions and /generate take both; a request that sets both is a 400. Only the
shape is checked here: the tokenizer pool compiles the spec (tokenizer_worker.grammar) and
its 400 names `structured`, renamed by `structured_alias` to the field the client sent.
"""

from __future__ import annotations

import json
from typing import Any

from frontend.errors import invalid

_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def structured_from_request(req: Any) -> dict[str, str] | None:
    """SamplingParams.structured for a parsed request (None: unconstrained); a 400
    naming the field for a malformed one."""
    rf = getattr(req, "response_format", None)
    so = getattr(req, "structured_outputs", None)
    from_rf = _from_response_format(rf) if rf is not None else None
    if so is None:
        return from_rf
    if from_rf is not None:
        raise invalid(
            "response_format and structured_outputs: set one of them, not both",
            "structured_outputs",
        )
    return _from_structured_outputs(so)


def structured_alias(req: Any) -> dict[str, str]:
    """{"structured": the request field it came from}, for errors (frontend.errors.renamed)."""
    so = getattr(req, "structured_outputs", None)
    if isinstance(so, dict):
        keys = [k for k in _STRUCTURED_KEYS if so.get(k) not in (None, False)]
        return {"structured": f"structured_outputs.{keys[0]}" if keys else "structured_outputs"}
    return {"structured": "response_format"}


def _from_response_format(rf: Any) -> dict[str, str] | None:
    if not isinstance(rf, dict):
        raise invalid("response_format: must be an object", "response_format")
    kind = rf.get("type")
    extra = set(rf) - {"type", "json_schema"}
    if extra:
        name = sorted(extra)[0]
        raise invalid(f"response_format.{name}: unknown field", f"response_format.{name}")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"kind": "json_object", "spec": ""}
    if kind != "json_schema":
        raise invalid(
            f"response_format.type: must be 'text', 'json_object' or 'json_schema', got {kind!r}",
            "response_format.type",
        )
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise invalid(
            "response_format.json_schema: must be an object with name and schema",
            "response_format.json_schema",
        )
    unknown = set(js) - {"name", "schema", "strict", "description"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid(
            f"response_format.json_schema.{name}: unknown field",
            f"response_format.json_schema.{name}",
        )
    if not isinstance(js.get("name"), str):  # OpenAI requires it
        raise invalid(
            "response_format.json_schema.name: required, a string",
            "response_format.json_schema.name",
        )
    schema = js.get("schema")
    if schema is None:  # OpenAI's default: any JSON object
        return {"kind": "json_object", "spec": ""}
    if not isinstance(schema, (dict, bool)):
        raise invalid(
            "response_format.json_schema.schema: must be a JSON schema object",
            "response_format.json_schema.schema",
        )
    return {"kind": "json", "spec": json.dumps(schema)}


def _from_structured_outputs(so: Any) -> dict[str, str] | None:
    if not isinstance(so, dict):
        raise invalid("structured_outputs: must be an object", "structured_outputs")
    unknown = set(so) - {*_STRUCTURED_KEYS, "whitespace_pattern"}
    if unknown:
        name = sorted(unknown)[0]
        raise invalid(
            f"structured_outputs.{name}: not supported by this server (supported: "
            f"{', '.join(_STRUCTURED_KEYS)}, whitespace_pattern)",
            f"structured_outputs.{name}",
        )
    set_keys = [k for k in _STRUCTURED_KEYS if so.get(k) not in (None, False)]
    if len(set_keys) > 1:
        raise invalid(
            f"structured_outputs: set one of {', '.join(_STRUCTURED_KEYS)}, got {set_keys}",
            "structured_outputs",
        )
    ws = so.get("whitespace_pattern")
    if ws is not None and not isinstance(ws, str):
        raise invalid(
            "structured_outputs.whitespace_pattern: must be a string",
            "structured_outputs.whitespace_pattern",
        )
    if not set_keys:
        if ws is not None:
            raise invalid(
                "structured_outputs.whitespace_pattern: needs json or json_object",
                "structured_outputs.whitespace_pattern",
            )
        return None
    key = set_keys[0]
    value, param = so[key], f"structured_outputs.{key}"
    out: dict[str, str]
    if key == "json":
        if isinstance(value, str):
            out = {"kind": "json", "spec": value}
        elif isinstance(value, (dict, bool)):
            out = {"kind": "json", "spec": json.dumps(value)}
        else:
            raise invalid(f"{param}: must be a JSON schema (an object or its text)", param)
    elif key == "json_object":
        if value is not True:
            raise invalid(f"{param}: must be true", param)
        out = {"kind": "json_object", "spec": ""}
    elif key == "choice":
        if not (isinstance(value, list) and value and all(isinstance(c, str) for c in value)):
            raise invalid(f"{param}: must be a non-empty list of strings", param)
        out = {"kind": "choice", "spec": json.dumps(value)}
    else:  # regex, grammar
        if not isinstance(value, str) or not value:
            raise invalid(f"{param}: must be a non-empty string", param)
        out = {"kind": key, "spec": value}
    if ws is not None:
        if out["kind"] not in ("json", "json_object"):
            raise invalid(
                "structured_outputs.whitespace_pattern: applies to json and json_object only",
                "structured_outputs.whitespace_pattern",
            )
        out["whitespace_pattern"] = ws
    return out
