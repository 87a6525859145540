"""Metric analysis, pure: a check's value judged against its metric's threshold, the verdicts of a batch
folded into the status, and when the next check is due; the same for webhook checks' answers
(:mod:`.webhooks`). The queries and calls themselves are made by :mod:`greyrelease.reconcile.gates`."""

from greyrelease.analysis.verdicts import Check, Sample, Verdict, fold, judge, render_query, verdict

__all__ = ["Check", "Sample", "Verdict", "fold", "judge", "render_query", "verdict"]
