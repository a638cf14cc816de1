package env

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// auditPolicy records every write to a Node or its status, with who made
// it: the drills count the probe's writes with it (a probe that rewrites an
// unchanged layout costs every watcher of Nodes an event).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete"]
    resources:
      - group: ""
        resources: ["nodes", "nodes/status"]
  - level: None
`

func (e *Env) auditFlags() ([]string, error) {
	policy := filepath.Join(e.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return nil, fmt.Errorf("failed to write %s: %w", policy, err)
	}
	e.AuditLog = filepath.Join(e.LogsDir, "audit-nodes.log")
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + e.AuditLog,
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
	}, nil
}

// NodeWrite is one audited write to a Node.
type NodeWrite struct {
	User, Verb, Node, Subresource string
	Code                          int
}

// NodeWrites returns the audited Node writes by user (every user when
// empty), in order. A restarted API server appends to the same file.
func (e *Env) NodeWrites(user string) ([]NodeWrite, error) {
	f, err := os.Open(e.AuditLog)
	if err != nil {
		return nil, fmt.Errorf("failed to open the audit log: %w", err)
	}
	defer f.Close()
	var out []NodeWrite
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct {
			Stage     string                    `json:"stage"`
			Verb      string                    `json:"verb"`
			User      struct{ Username string } `json:"user"`
			ObjectRef struct {
				Name        string `json:"name"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Stage != "ResponseComplete" {
			continue
		}
		if user != "" && ev.User.Username != user {
			continue
		}
		out = append(out, NodeWrite{User: ev.User.Username, Verb: ev.Verb, Node: ev.ObjectRef.Name,
			Subresource: ev.ObjectRef.Subresource, Code: ev.ResponseStatus.Code})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("failed to read the audit log: %w", err)
	}
	return out, nil
}

// ProbeUser is the username of the chart's probe service account.
func (e *Env) ProbeUser() string {
	return "system:serviceaccount:" + Namespace + ":" + e.ProbeSA
}
