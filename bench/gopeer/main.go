// Command gopeer is the bench's peer: the webhook a Go engineer would write with
// controller-runtime for the mutation /mutate/pods makes to a plain project pod, so that
// bench/real_cluster.py can set the cost of one call of ours beside one call of theirs.
//
// It serves one path, /mutate/pods, over TLS with the bench's certificate, through a typed
// admission.Defaulter[*corev1.Pod]: controller-runtime decodes the pod, Default changes it,
// and controller-runtime answers with the JSON patch between the two.
//
// What it adds comes from a JSON file (-mutation) that the bench writes from what the product
// stored for the same pod, so that both make the same change; the runai/queue label is the
// pod's namespace, as for a bound project.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Mutation is what a project's pods get: required node-affinity expressions merged into each of
// the pod's own required terms (or one term of their own when it has none), pod anti-affinity
// terms appended, the priority class with its value and preemption policy, and labels.
type Mutation struct {
	NodeExpressions  []corev1.NodeSelectorRequirement `json:"nodeExpressions"`
	PreferredNode    []corev1.PreferredSchedulingTerm `json:"preferredNode"`
	AntiAffinity     []corev1.WeightedPodAffinityTerm `json:"antiAffinity"`
	RequiredAnti     []corev1.PodAffinityTerm         `json:"requiredAntiAffinity"`
	PriorityClass    string                           `json:"priorityClassName"`
	Priority         *int32                           `json:"priority"`
	PreemptionPolicy *corev1.PreemptionPolicy         `json:"preemptionPolicy"`
	Labels           map[string]string                `json:"labels"`
	QueueLabel       string                           `json:"queueLabel"`
}

type podDefaulter struct{ m Mutation }

func (d *podDefaulter) Default(_ context.Context, pod *corev1.Pod) error {
	m := d.m
	if len(m.NodeExpressions) > 0 || len(m.PreferredNode) > 0 || len(m.AntiAffinity) > 0 || len(m.RequiredAnti) > 0 {
		if pod.Spec.Affinity == nil {
			pod.Spec.Affinity = &corev1.Affinity{}
		}
		a := pod.Spec.Affinity
		if len(m.NodeExpressions) > 0 || len(m.PreferredNode) > 0 {
			if a.NodeAffinity == nil {
				a.NodeAffinity = &corev1.NodeAffinity{}
			}
			if len(m.NodeExpressions) > 0 {
				req := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
				if req == nil || len(req.NodeSelectorTerms) == 0 {
					a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{
						NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: m.NodeExpressions}},
					}
				} else {
					// Terms are ORed: each of the pod's own terms must also meet the project's.
					for i := range req.NodeSelectorTerms {
						t := &req.NodeSelectorTerms[i]
						t.MatchExpressions = append(t.MatchExpressions, m.NodeExpressions...)
					}
				}
			}
			a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(
				a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution, m.PreferredNode...)
		}
		if len(m.AntiAffinity) > 0 || len(m.RequiredAnti) > 0 {
			if a.PodAntiAffinity == nil {
				a.PodAntiAffinity = &corev1.PodAntiAffinity{}
			}
			a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(
				a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, m.AntiAffinity...)
			a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(
				a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, m.RequiredAnti...)
		}
	}
	if m.PriorityClass != "" && pod.Spec.PriorityClassName == "" {
		pod.Spec.PriorityClassName = m.PriorityClass
		pod.Spec.Priority = m.Priority
		pod.Spec.PreemptionPolicy = m.PreemptionPolicy
	}
	if len(m.Labels) > 0 || m.QueueLabel != "" {
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		for k, v := range m.Labels {
			pod.Labels[k] = v
		}
		if m.QueueLabel != "" {
			pod.Labels[m.QueueLabel] = pod.Namespace
		}
	}
	return nil
}

func main() {
	port := flag.Int("port", 9443, "TLS port on 127.0.0.1")
	certDir := flag.String("cert-dir", "", "folder with tls.crt and tls.key")
	mutation := flag.String("mutation", "", "JSON file of the Mutation")
	flag.Parse()
	var m Mutation
	raw, err := os.ReadFile(*mutation)
	if err == nil {
		err = json.Unmarshal(raw, &m)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gopeer: mutation:", err)
		os.Exit(2)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, "gopeer:", err)
		os.Exit(1)
	}
	server := webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: *port, CertDir: *certDir})
	server.Register("/mutate/pods", admission.WithDefaulter[*corev1.Pod](scheme, &podDefaulter{m: m}))
	fmt.Println("gopeer: serving on", *port)
	if err := server.Start(ctrl.SetupSignalHandler()); err != nil {
		fmt.Fprintln(os.Stderr, "gopeer:", err)
		os.Exit(1)
	}
}
