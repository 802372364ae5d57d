"""The Kubernetes adapter: one package for every call this system makes to the Kubernetes API.

- `api`: `KubeApi` (the reads and writes outside the watches), `raw_call`, the one error hierarchy
  (`KubeError`, `KubeNotFound`, `KubeConflict`, `KubeGone`, built from the `Status` body by
  `kube_error`), `Obj` (an object as raw JSON) and `CallPath` (request or background).
- `watch`: list-then-watch loops (`ResourceWatch`) and their runner (`KubeWatcher`). Which kinds
  feed the admission caches, and how a pod is slimmed for them, is the caches' choice:
  `webhook.state.watches`.
- `events`: `EventRecorder`, Kubernetes Events about namespaces, sent in the background.
- `leader`: leader election on a Lease.
"""
