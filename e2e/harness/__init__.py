"""The local test environment, one module per concern:

- process: where things live, free ports, components as supervised processes, stale work directories
- controlplane: a cluster however it was started (Cluster) and the local one (LocalCluster: etcd,
  kube-apiserver, kube-controller-manager, kube-scheduler, KWOK)
- pki: the local cluster's certificates
- prometheus: Prometheus and the test exporter
- podnet: the pod network (a network namespace per local cluster where pod IPs are local)
- responders: the pod watch that makes every Running pod answer HTTP at its IP (python -m e2e.harness.responders)
- dataplane: Traefik with the Gateway API and Ingress providers, in front of those pods
- cli: `python -m e2e.cluster up|status|down`
"""
