"""The admission webhook's decisions, pure: :func:`admit` answers an AdmissionReview for an UPDATE of a
Deployment enrolled in follow mode (label ``greyrelease.io/release``) by holding a new pod template back
(``spec.paused: true`` and the annotation ``greyrelease.io/held``), and :func:`configuration` is the
MutatingWebhookConfiguration that sends it those requests; :mod:`.probe` is the controller's self-test of
the hold (the dry-run change it sends, and how it reads the answer). The server that answers is
:mod:`greyrelease.runtime.webhook`; nothing here does I/O or reads a clock."""

from greyrelease.admission.configuration import (
    CONFIGURATION_NAME,
    PATH,
    WEBHOOK_NAME,
    configuration,
    service_client_config,
    url_client_config,
)
from greyrelease.admission.hold import (
    BYPASS_ANNOTATION,
    FIELD_MANAGER,
    HELD_ANNOTATION,
    admit,
    decide,
    is_held,
    release_patch,
    template_digest,
)

__all__ = [
    "BYPASS_ANNOTATION",
    "CONFIGURATION_NAME",
    "FIELD_MANAGER",
    "HELD_ANNOTATION",
    "PATH",
    "WEBHOOK_NAME",
    "admit",
    "configuration",
    "decide",
    "is_held",
    "release_patch",
    "service_client_config",
    "template_digest",
    "url_client_config",
]
