package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// globalValueFlags are runc's global flags that take a value as the next
// argument: the command is the first argument that is neither a flag nor
// such a flag's value.
var globalValueFlags = []string{"--root", "--log", "--log-format", "--criu", "--rootless"}

// specFile returns the file whose capabilities runc is about to apply: the
// bundle's config.json for create and run, the --process file for exec; ""
// for any other command (and for an exec without --process, whose
// capabilities come from the command line, which CRI-O does not use).
func specFile(args []string) string {
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			break
		}
		if slices.Contains(globalValueFlags, a) {
			i++
		}
	}
	if i >= len(args) {
		return ""
	}
	cmd, rest := args[i], args[i+1:]
	switch cmd {
	case "create", "run":
		bundle, ok := flagValue(rest, "--bundle", "-b")
		if !ok {
			bundle = "."
		}
		return filepath.Join(bundle, "config.json")
	case "exec":
		p, _ := flagValue(rest, "--process", "-p")
		return p
	}
	return ""
}

// flagValue finds a flag's value in runc's command arguments, in the forms
// "--name value", "--name=value" and "-n value".
func flagValue(args []string, long, short string) (string, bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		if v, ok := strings.CutPrefix(a, long+"="); ok {
			return v, true
		}
		if (a == long || a == short) && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// boundingSet parses CapBnd of /proc/self/status.
func boundingSet(status string) (uint64, error) {
	for l := range strings.SplitSeq(status, "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("failed to parse CapBnd %q: %w", strings.TrimSpace(v), err)
			}
			return set, nil
		}
	}
	return 0, fmt.Errorf("failed to find CapBnd in /proc/self/status")
}

// capabilityBits are Linux's capability numbers (linux/capability.h).
var capabilityBits = map[string]uint{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3,
	"CAP_FSETID": 4, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8,
	"CAP_LINUX_IMMUTABLE": 9, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11,
	"CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13, "CAP_IPC_LOCK": 14, "CAP_IPC_OWNER": 15,
	"CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_CHROOT": 18, "CAP_SYS_PTRACE": 19,
	"CAP_SYS_PACCT": 20, "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23,
	"CAP_SYS_RESOURCE": 24, "CAP_SYS_TIME": 25, "CAP_SYS_TTY_CONFIG": 26, "CAP_MKNOD": 27,
	"CAP_LEASE": 28, "CAP_AUDIT_WRITE": 29, "CAP_AUDIT_CONTROL": 30, "CAP_SETFCAP": 31,
	"CAP_MAC_OVERRIDE": 32, "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35,
	"CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37, "CAP_PERFMON": 38, "CAP_BPF": 39,
	"CAP_CHECKPOINT_RESTORE": 40,
}

// held reports whether the bounding set holds the capability; a name this
// table lacks is kept, for runc to judge.
func held(name string, bounding uint64) bool {
	bit, ok := capabilityBits[strings.ToUpper(name)]
	return !ok || bounding&(1<<bit) != 0
}

// capabilitySets are the sets of an OCI process's capabilities.
var capabilitySets = []string{"bounding", "effective", "inheritable", "permitted", "ambient"}

// restrictCapabilities removes from an OCI process's capabilities (the JSON
// object "process.capabilities" of a bundle, or "capabilities" of an exec's
// process file) every capability the bounding set lacks. It edits the
// object in place and reports whether anything was removed.
func restrictCapabilities(caps map[string]json.RawMessage, bounding uint64) (bool, error) {
	changed := false
	for _, set := range capabilitySets {
		raw, ok := caps[set]
		if !ok {
			continue
		}
		var names []string
		if err := json.Unmarshal(raw, &names); err != nil {
			return false, fmt.Errorf("failed to decode the %s capabilities: %w", set, err)
		}
		kept := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !held(n, bounding) })
		if len(kept) == len(names) {
			continue
		}
		out, err := json.Marshal(kept)
		if err != nil {
			return false, err
		}
		caps[set], changed = out, true
	}
	return changed, nil
}

// restrictSpec applies restrictCapabilities to a bundle's config.json (with
// a "process" object) or an exec's process file (the process itself). Every
// other field is kept as it was: objects are decoded only as far as the
// capabilities.
func restrictSpec(data []byte, bounding uint64) ([]byte, bool, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, false, fmt.Errorf("failed to decode: %w", err)
	}
	process, inner := top, false
	if raw, ok := top["process"]; ok {
		if err := json.Unmarshal(raw, &process); err != nil {
			return nil, false, fmt.Errorf("failed to decode process: %w", err)
		}
		inner = true
	}
	raw, ok := process["capabilities"]
	if !ok || string(raw) == "null" {
		return data, false, nil
	}
	var caps map[string]json.RawMessage
	if err := json.Unmarshal(raw, &caps); err != nil {
		return nil, false, fmt.Errorf("failed to decode process.capabilities: %w", err)
	}
	changed, err := restrictCapabilities(caps, bounding)
	if err != nil || !changed {
		return data, false, err
	}
	if process["capabilities"], err = json.Marshal(caps); err != nil {
		return nil, false, err
	}
	if inner {
		if top["process"], err = json.Marshal(process); err != nil {
			return nil, false, err
		}
	}
	out, err := json.Marshal(top)
	return out, true, err
}

func restrictFile(path string, bounding uint64) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", path, err)
	}
	out, changed, err := restrictSpec(data, bounding)
	if err != nil {
		return fmt.Errorf("failed to restrict the capabilities of %s: %w", path, err)
	}
	if !changed {
		return nil
	}
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("failed to stat %s: %w", path, err)
	}
	if err := os.WriteFile(path, out, info.Mode().Perm()); err != nil {
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	return nil
}
