// Test infrastructure only: the CustomResourceDefinitions of add-ons the install can use (cert-manager,
// the Prometheus Operator), so that their objects are checked against the real apiserver. Nothing is built.
module scheduling-webhook/hack/peers/crds

go 1.26.0

require (
	github.com/cert-manager/cert-manager v1.21.2 // indirect
	github.com/prometheus-operator/prometheus-operator v0.85.0 // indirect
)
