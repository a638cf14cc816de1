package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RestartKubelet stops the kubelet (SIGTERM, as a node agent upgrade does),
// starts it again with the same flags, and waits until its Node is Ready. A
// kubelet registers its Node when it starts: if the Node was deleted, it is
// created again with the labels of --node-labels, as a new node of a pool
// joins. Containers keep running across the restart.
func (c *Cluster) RestartKubelet(ctx context.Context) error {
	p := c.proc("kubelet")
	if p == nil {
		return errors.New("failed to restart the kubelet: not running")
	}
	p.stop(30 * time.Second)
	if gone, _ := p.exited(); !gone {
		return fmt.Errorf("failed to stop the kubelet (pid %d)", p.pid())
	}
	// The same command line: nsenter into the cluster's mount namespace, then
	// the kubelet with its flags.
	if _, err := c.start("kubelet", p.cmd.Path, p.cmd.Args[1:]); err != nil {
		return err
	}
	err := c.poll(ctx, "node "+c.NodeName+" Ready after the kubelet restart", []string{"kubelet"}, func(ctx context.Context) (bool, error) {
		n, err := c.Clientset.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return withLog(err, c.proc("kubelet"))
	}
	return nil
}
