// Package statedir is what the node probe and the NRI plugin, two containers
// of one pod, tell each other through the folder they share (an emptyDir in
// memory): the probe's current plan, and whether the runtime has registered
// the plugin. Each side writes only its own file, atomically, so the other
// never reads half of one.
package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpu-injector/gpu-injector/layout"
)

// File names inside the folder.
const (
	// LayoutFile is written by the probe after every probe.
	LayoutFile = "layout.json"
	// PluginFile is written by the plugin while the runtime has it registered.
	PluginFile = "nri-plugin.json"
)

// Heartbeats: the plugin refreshes PluginFile every HeartbeatInterval while
// registered; the probe trusts a file no older than HeartbeatTimeout, so a
// plugin killed without a chance to remove its file (SIGKILL, OOM) loses the
// node its label within HeartbeatTimeout plus the probe's poll.
const (
	HeartbeatInterval = 10 * time.Second
	HeartbeatTimeout  = 30 * time.Second
)

// maxFileBytes bounds what either side reads: a plan is at most
// layout.MaxAnnotationBytes, a record a few hundred bytes.
const maxFileBytes = layout.MaxAnnotationBytes + 1024

// NoLayout is LayoutFile's content when the node has no ready plan: the
// probe's state label and its reason, for the plugin's error message.
type NoLayout struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Plugin is PluginFile's content.
type Plugin struct {
	// Protocol is the marker protocol the plugin serves (layout.NRIProtocol).
	Protocol       string    `json:"protocol"`
	RuntimeName    string    `json:"runtimeName"`
	RuntimeVersion string    `json:"runtimeVersion"`
	RegisteredAt   time.Time `json:"registeredAt"`
	Heartbeat      time.Time `json:"heartbeat"`
	// StaleDriver is the plugin's last scan of the node's GPU containers for
	// deleted driver libraries; nil while it does not scan.
	StaleDriver *layout.StaleDriver `json:"staleDriver,omitempty"`
}

// WriteLayout writes the plan, or a NoLayout when plan is nil.
func WriteLayout(dir string, plan *layout.Plan, none NoLayout) error {
	var data []byte
	if plan != nil {
		s, err := layout.Encode(*plan)
		if err != nil {
			return err
		}
		data = []byte(s)
	} else {
		var err error
		if data, err = json.Marshal(none); err != nil {
			return fmt.Errorf("failed to encode the layout record: %w", err)
		}
	}
	return WriteFile(dir, LayoutFile, data)
}

// ReadLayout reads LayoutFile: the plan, or why there is none. The plan is
// decoded strictly but not checked against any rules: the reader does that
// with its own configuration.
func ReadLayout(dir string) (*layout.Plan, NoLayout, error) {
	data, err := readFile(filepath.Join(dir, LayoutFile))
	if err != nil {
		return nil, NoLayout{}, err
	}
	return ParseLayout(data)
}

// ParseLayout reads the content of LayoutFile.
func ParseLayout(data []byte) (*layout.Plan, NoLayout, error) {
	// A NoLayout has a state; a plan never has that field.
	var probe struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, NoLayout{}, fmt.Errorf("failed to decode %s: %w", LayoutFile, err)
	}
	if probe.State != "" {
		var none NoLayout
		dec := json.NewDecoder(strings.NewReader(string(data)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&none); err != nil {
			return nil, NoLayout{}, fmt.Errorf("failed to decode %s: %w", LayoutFile, err)
		}
		return nil, none, nil
	}
	plan, err := layout.Decode(string(data))
	if err != nil {
		return nil, NoLayout{}, fmt.Errorf("failed to decode %s: %w", LayoutFile, err)
	}
	return &plan, NoLayout{}, nil
}

// WritePlugin writes PluginFile.
func WritePlugin(dir string, p Plugin) error {
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("failed to encode the plugin record: %w", err)
	}
	return WriteFile(dir, PluginFile, data)
}

// RemovePlugin removes PluginFile; a file already gone is no error.
func RemovePlugin(dir string) error {
	if err := os.Remove(filepath.Join(dir, PluginFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("failed to remove %s: %w", PluginFile, err)
	}
	return nil
}

// ReadPlugin reads PluginFile; a missing file is (nil, nil).
func ReadPlugin(dir string) (*Plugin, error) {
	data, err := readFile(filepath.Join(dir, PluginFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var p Plugin
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("failed to decode %s: %w", PluginFile, err)
	}
	return &p, nil
}

// Registered says whether a plugin record shows a registered plugin that
// serves this code's marker protocol, with a heartbeat fresh at now.
func (p *Plugin) Registered(now time.Time) bool {
	if p == nil || p.Protocol != layout.NRIProtocol {
		return false
	}
	age := now.Sub(p.Heartbeat)
	// A heartbeat from the future (a clock stepped back) is as stale as an old one.
	return age < HeartbeatTimeout && age > -HeartbeatTimeout
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("failed to open %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", path, err)
	}
	if len(data) > maxFileBytes {
		return nil, fmt.Errorf("failed to read %s: larger than %d bytes", path, maxFileBytes)
	}
	return data, nil
}

// WriteFile replaces dir/name with data, mode 0644: a temporary file in the
// same folder renamed over it, so a reader sees the old or the new content,
// never a part. 0644 because the two containers run as different users.
func WriteFile(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("failed to create a temporary file for %s: %w", name, err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("failed to write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fmt.Errorf("failed to set the mode of %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("failed to write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("failed to replace %s: %w", name, err)
	}
	done = true
	return nil
}
