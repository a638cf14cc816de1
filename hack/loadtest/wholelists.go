package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	jsonpatch "github.com/evanphx/json-patch/v5"
	jsonpatchops "gomodules.xyz/jsonpatch/v2"
)

// wholeLists makes the change ops make to pod as a patch in which each list
// ops append to ("path/-") is replaced whole by one operation; the other
// operations stay. The whole-lists floor answers with it: it shows whether
// the API server's cost of our patch is in its 41 operations or in the
// larger pod they make.
func wholeLists(pod []byte, ops []jsonpatchops.Operation) ([]byte, int, error) {
	raw, err := json.Marshal(ops)
	if err != nil {
		return nil, 0, err
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		return nil, 0, err
	}
	patched, err := patch.Apply(pod)
	if err != nil {
		return nil, 0, err
	}
	var doc any
	if err := json.Unmarshal(patched, &doc); err != nil {
		return nil, 0, err
	}
	var out []jsonpatchops.Operation
	done := map[string]bool{}
	for _, op := range ops {
		list, ok := strings.CutSuffix(op.Path, "/-")
		if !ok || op.Operation != "add" {
			out = append(out, op)
			continue
		}
		if done[list] {
			continue
		}
		done[list] = true
		v, err := at(doc, list)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, jsonpatchops.Operation{Operation: "add", Path: list, Value: v})
	}
	b, err := json.Marshal(out)
	return b, len(out), err
}

// at is the value at a JSON Pointer whose keys need no escaping.
func at(doc any, pointer string) (any, error) {
	for _, k := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		switch d := doc.(type) {
		case map[string]any:
			doc = d[k]
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(d) {
				return nil, fmt.Errorf("no item %q in %s", k, pointer)
			}
			doc = d[i]
		default:
			return nil, fmt.Errorf("nothing at %s", pointer)
		}
	}
	return doc, nil
}
