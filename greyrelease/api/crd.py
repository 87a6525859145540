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

from greyrelease.api.release import (
    GROUP,
    KIND,
    PLURAL,
    POLICY_KIND,
    POLICY_PLURAL,
    POLICY_SHORT_NAMES,
    POLICY_SINGULAR,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    GreyReleasePolicySpec,
    GreyReleaseSpec,
    GreyReleaseStatus,
)

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


def _definition(
    *,
    kind: str,
    plural: str,
    singular: str,
    short: list[str],
    scope: str,
    description: str,
    spec: Schema,
    status: Schema | None,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    properties: Schema = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
    }
    version: dict[str, Any] = {"name": VERSION, "served": True, "storage": True}
    if status is not None:
        properties["status"] = status
        version["subresources"] = {"status": {}}
    version["additionalPrinterColumns"] = columns
    root = {"type": "object", "description": description, "required": ["spec"], "properties": properties}
    version["schema"] = {"openAPIV3Schema": root}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": short,
            },
            "versions": [version],
        },
    }


def crd() -> dict[str, Any]:
    spec_schema = schema_of(GreyReleaseSpec)
    spec_schema["description"] = "What to release and how."
    status_schema = schema_of(GreyReleaseStatus, in_status=True)
    status_schema["description"] = "Where the release is; written by the controller only."
    return _definition(
        kind=KIND,
        plural=PLURAL,
        singular=SINGULAR,
        short=SHORT_NAMES,
        scope="Namespaced",
        description="A progressive release of a new version of a Deployment, in batches.",
        spec=spec_schema,
        status=status_schema,
        columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Batch", "type": "string", "jsonPath": ".status.batch"},
            {"name": "Weight", "type": "integer", "jsonPath": ".status.canaryWeight"},
            {"name": "Target", "type": "string", "jsonPath": ".spec.targetVersion"},
            {"name": "Stable", "type": "string", "jsonPath": ".status.stableVersion"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
            # Follow mode: the first image of the template held and of the one the pods run (the digests, which
            # tell templates apart by more than an image, are in the status and the message).
            {"name": "Held", "type": "string", "jsonPath": ".status.held.images[0].image", "priority": 1},
            {"name": "Runs", "type": "string", "jsonPath": ".status.stable.images[0].image", "priority": 1},
            {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
        ],
    )


def policy_crd() -> dict[str, Any]:
    spec_schema = schema_of(GreyReleasePolicySpec)
    spec_schema["description"] = "Which releases it governs, and the rules they follow."
    return _definition(
        kind=POLICY_KIND,
        plural=POLICY_PLURAL,
        singular=POLICY_SINGULAR,
        short=POLICY_SHORT_NAMES,
        scope="Cluster",
        description="Release windows, freezes and a concurrency limit for the GreyReleases it selects.",
        spec=spec_schema,
        status=None,
        columns=[
            {"name": "Namespaces", "type": "string", "jsonPath": ".spec.namespaces"},
            {"name": "Max", "type": "integer", "jsonPath": ".spec.concurrency.maxProgressing"},
            {"name": "Per", "type": "string", "jsonPath": ".spec.concurrency.per"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )


#: The files of ``crds/``, each generated from the models.
FILES = {
    f"{GROUP}_{PLURAL}.yaml": crd,
    f"{GROUP}_{POLICY_PLURAL}.yaml": policy_crd,
}


def render(which: str = f"{GROUP}_{PLURAL}.yaml") -> str:
    return "# Generated from greyrelease/api/ by `greyrelease crd`. Do not edit.\n" + yaml.safe_dump(
        FILES[which](), sort_keys=False, width=120
    )
