"""The commands: ``greyrelease`` (run the controller, plan a release, write the CRDs) and the kubectl
plugin ``kubectl gr``."""

from greyrelease.cli.main import main

__all__ = ["main"]
