"""The API: the GreyRelease and GreyReleasePolicy kinds as pydantic models, the CRDs generated from them
(:mod:`.crd`) and the README's field reference (:mod:`.reference`). Pure: no I/O, no Kubernetes client."""

from greyrelease.api.release import (
    ABORT_ANNOTATION,
    GROUP,
    KIND,
    PAUSE_ANNOTATION,
    PLURAL,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    VERSION,
    BatchState,
    GreyRelease,
    GreyReleasePolicy,
    GreyReleasePolicySpec,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Obj,
    Phase,
)

__all__ = [
    "ABORT_ANNOTATION",
    "GROUP",
    "KIND",
    "PAUSE_ANNOTATION",
    "PLURAL",
    "PROMOTE_ANNOTATION",
    "RETRY_ANNOTATION",
    "VERSION",
    "BatchState",
    "GreyRelease",
    "GreyReleasePolicy",
    "GreyReleasePolicySpec",
    "GreyReleaseSpec",
    "GreyReleaseStatus",
    "Obj",
    "Phase",
]
