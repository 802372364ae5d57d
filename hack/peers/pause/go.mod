// Test infrastructure only: the sandbox container of the tests' real nodes (nothing can be pulled here).
module scheduling-webhook/hack/peers/pause

go 1.25.0
