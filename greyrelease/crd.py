"""The CustomResourceDefinition, generated from the pydantic models (``greyrelease crd``).

pydantic's JSON Schema is turned into a Kubernetes structural schema: references inlined, optional
fields unwrapped, ``int | "20%"`` marked int-or-string, titles dropped. The CEL rules declared on the
models travel along as ``x-kubernetes-validations``, so the API server refuses bad input with a message
that names the field.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from .api import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, GreyReleaseSpec, GreyReleaseStatus

Schema = dict[str, Any]
_DROP = {"title", "additionalProperties", "$defs"}


def _inline(node: Any, defs: dict[str, Schema]) -> Any:
    if isinstance(node, list):
        return [_inline(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _inline(merged, defs)
    return {k: _inline(v, defs) for k, v in node.items()}


def _structural(node: Any, *, in_status: bool = False) -> Any:
    if isinstance(node, list):
        return [_structural(x, in_status=in_status) for x in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        types = {o.get("type") for o in options}
        if len(options) == 1:
            node = {**options[0], **node}
        elif types == {"integer", "string"}:
            # Structural schemas allow exactly this anyOf for int-or-string; the branches' own limits
            # (minimum, pattern) are expressed as a CEL rule on the field instead.
            node["x-kubernetes-int-or-string"] = True
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            lengths = [o["maxLength"] for o in options if "maxLength" in o]
            if lengths:
                node["maxLength"] = max(lengths)
        else:
            raise ValueError(f"cannot express {options} in a structural schema")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("default", ...) is None or in_status:
        node.pop("default", None)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"], in_status=in_status)
        keep_ap = True
    else:
        keep_ap = False
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP and not (key == "additionalProperties" and keep_ap):
            continue
        if key == "properties":
            out[key] = {k: _structural(v, in_status=in_status) for k, v in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = _structural(value, in_status=in_status)
        else:
            out[key] = value
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def schema_of(model: type[BaseModel], *, in_status: bool = False) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: Schema = _structural(_inline(raw, raw.get("$defs", {})), in_status=in_status)
    return schema


def crd() -> dict[str, Any]:
    spec_schema = schema_of(GreyReleaseSpec)
    spec_schema["description"] = "What to release and how."
    status_schema = schema_of(GreyReleaseStatus, in_status=True)
    status_schema["description"] = "Where the release is; written by the controller only."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Batch", "type": "string", "jsonPath": ".status.batch"},
                        {"name": "Weight", "type": "integer", "jsonPath": ".status.canaryWeight"},
                        {"name": "Target", "type": "string", "jsonPath": ".spec.targetVersion"},
                        {"name": "Stable", "type": "string", "jsonPath": ".status.stableVersion"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A progressive release of a new version of a Deployment, in batches.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    return "# Generated from greyrelease/api.py by `greyrelease crd`. Do not edit.\n" + yaml.safe_dump(
        crd(), sort_keys=False, width=120
    )
