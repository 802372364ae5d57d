// The sandbox ("pause") container of the tests' real nodes: containerd starts one per pod to hold
// the pod's namespaces, and no image can be pulled here. It waits for SIGINT or SIGTERM and exits;
// as PID 1 of a pod that shares its PID namespace it also reaps the orphans handed to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
