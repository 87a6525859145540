"""A real local Kubernetes (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK) and
Prometheus for GreyRelease's end-to-end tests and demo. See e2e/README.md."""
