//go:build linux

package main

import (
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"
)

// checkNode tells whether the scheduler could place the pod on the Node in
// file as far as labels go (nodeSelector and required node affinity, with the
// scheduler's own matcher): the mutated pod is pinned to the layout
// fingerprint, and running it here only proves something if this node is
// where it would land.
func checkNode(file string, pod podCandidate) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("failed to read node file: %w", err)
	}
	var node corev1.Node
	if err := yaml.Unmarshal(b, &node); err != nil {
		return "", fmt.Errorf("failed to decode node file %q: %w", file, err)
	}
	if node.Kind != "Node" {
		return "", fmt.Errorf("node file %q holds a %q, not a Node", file, node.Kind)
	}
	p := &corev1.Pod{ObjectMeta: pod.Meta, Spec: pod.Spec}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(&node)
	if err != nil {
		return "", fmt.Errorf("failed to match the pod's node affinity: %w", err)
	}
	if !ok {
		return "", fmt.Errorf("the pod's nodeSelector %v or required node affinity does not match node %q (labels %v): the scheduler would not place it there", pod.Spec.NodeSelector, node.Name, node.Labels)
	}
	return node.Name, nil
}
