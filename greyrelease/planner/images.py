"""Image references and versions. Pure."""

from __future__ import annotations

import re

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]")


def split_tag(image: str) -> tuple[str, str]:
    """``registry:5000/app:v1`` -> (``registry:5000/app``, ``v1``); a digest or no tag gives ``""``.

    The tag is what follows the last ``:`` after the last ``/``, so a registry port is not a tag.
    """
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, ""


def version_of(image: str) -> str:
    """The version a user reads for an image: its tag, else the whole reference."""
    return split_tag(image)[1] or image


def target_image(stable_image: str, target_version: str) -> str:
    """The image to release: ``targetVersion`` is a tag for the stable image's repository, or a full
    reference when it contains ``:`` or ``/``.

    >>> target_image("nginx:1.25", "1.27")
    'nginx:1.27'
    >>> target_image("nginx:1.25", "ghcr.io/acme/web:2.0")
    'ghcr.io/acme/web:2.0'
    """
    if ":" in target_version or "/" in target_version:
        return target_version
    return f"{split_tag(stable_image)[0]}:{target_version}"


def label_value(text: str) -> str:
    """``text`` made fit for a label value (63 characters of ``[A-Za-z0-9_.-]``, alphanumeric ends)."""
    value = _LABEL_VALUE_BAD.sub("-", text)[:63]
    return value.strip("-_.")
