"""The local test environment, one module per concern:

- process: where things live, free ports, components as supervised processes, stale work directories
- controlplane: a cluster however it was started (Cluster) and the local one (LocalCluster: etcd,
  kube-apiserver, kube-controller-manager, kube-scheduler, KWOK)
- pki: the local cluster's certificates
- prometheus: Prometheus and the test exporter
- exporter: that exporter, the application's metrics as the tests set them (python -m e2e.harness.exporter)
- podnet: the pod network (a network namespace per local cluster where pod IPs are local)
- responders: the pod watch that makes every Running pod answer HTTP at its IP (python -m e2e.harness.responders)
- responder: the HTTP server it drives, answering as the pods (python -m e2e.harness.responder)
- dataplane: Traefik with the Gateway API and Ingress providers, in front of those pods
- cli: `python -m e2e.cluster up|status|down`

and what the tests, the demo and bench/ drive on it:

- controller: the CRDs as shipped, the controller as its own process (``greyrelease run``), apps to release
- load: an open-loop HTTP load at a fixed rate, every request recorded
- reliability: the API server's audit log read back, a late Prometheus, a controller killed at random
- hostile_inputs: bad GreyReleases and what must happen to each (python -m e2e.harness.hostile_inputs)
- responder_client: the responder driven from a test over its stdin/stdout protocol, no cluster needed
- gitops: a directory of manifests applied as Argo CD or Flux apply it, re-applied in a loop (selfHeal),
  with their drift check
- hpa: the HorizontalPodAutoscaler's writes, through the scale subresource under its service account
- follow: follow mode as a GitOps user drives it: the app's manifests, the controller with its webhook, kubectl gr
- observe: objects read in-process while a test waits, a release's Events in order, the audit log's times
- receivers: notification receivers (HTTP servers on 127.0.0.1) and the Secrets holding their URLs
"""
