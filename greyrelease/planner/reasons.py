"""Event reasons and condition types: named once, so `kubectl describe gr` tells a consistent story."""

from __future__ import annotations

# Event reasons
RELEASE_STARTED = "ReleaseStarted"
BATCH_STARTED = "BatchStarted"
BATCH_READY = "BatchReady"
BATCH_PASSED = "BatchPassed"
WAITING_FOR_APPROVAL = "WaitingForApproval"
PROMOTED = "Promoted"
PAUSED = "Paused"
RESUMED = "Resumed"
PROMOTING = "Promoting"
SUCCEEDED = "Succeeded"
ALREADY_AT_TARGET = "AlreadyAtTarget"
ABORTED = "Aborted"
ROLLING_BACK = "RollingBack"
ROLLED_BACK = "RolledBack"
RESTARTED = "Restarted"
RETRIED = "Retried"
INVALID_SPEC = "InvalidSpec"
PROGRESS_DEADLINE = "ProgressDeadlineExceeded"
TARGET_DELETED = "TargetDeleted"
CANARY_CONFLICT = "CanaryConflict"
CANARY_LOST = "CanaryLost"
ROUTING_ERROR = "RoutingError"
ANALYSIS_FAILED = "AnalysisFailed"
METRIC_CHECK_FAILED = "MetricCheckFailed"
CLEANED_UP = "CleanedUp"
WAITING = "Waiting"
QUEUED = "Queued"
APPROVAL_EXPIRED = "ApprovalExpired"
# Webhook checks: an answer that failed or erred (a confirm's no is not one), a confirm's wait and its yes
WEBHOOK_CHECK_FAILED = "WebhookCheckFailed"
WAITING_FOR_CONFIRMATION = "WaitingForConfirmation"
CONFIRMED = "Confirmed"
# Follow mode
ENROLLED = "Enrolled"
HELD = "TemplateHeld"
HOLD_RELEASED = "HoldReleased"
SUPERSEDED = "Superseded"
REVERTED = "Reverted"
HANDED_BACK = "HandedBack"
# Follow mode, on the Deployment: a release ended and left it paused (its template held) or half-rolled
RELEASE_ABORTED = "ReleaseAborted"
RELEASE_FAILED = "ReleaseFailed"

# Condition types (Kubernetes style: each True/False with a reason)
COND_PROGRESSING = "Progressing"
COND_PAUSED = "Paused"
COND_COMPLETED = "Completed"
COND_INVALID_SPEC = "InvalidSpec"
COND_HEALTHY = "Healthy"
# kstatus's (Flux health checks, kubectl wait): Ready, Reconciling (in progress), Stalled (failed)
COND_READY = "Ready"
COND_RECONCILING = "Reconciling"
COND_STALLED = "Stalled"
# Follow mode: whether the API server would hold a new template (the self-test of the hold, one per
# controller process; its reasons are greyrelease.reconcile.held's)
COND_HELD = "Held"
