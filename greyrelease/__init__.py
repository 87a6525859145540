"""GreyRelease: progressive canary and batch releases for Kubernetes Deployments."""

__version__ = "0.1.0"
