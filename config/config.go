// Package config is gpu-injector's versioned configuration file: its types
// (types.go), defaults in one place (defaults.go), and validation that names
// every bad field (validation.go). Parse and Load read a file through them.
package config

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// Parse decodes, defaults and validates a configuration file; unknown fields
// are errors so that a typo does not silently fall back to a default.
func Parse(data []byte) (*Configuration, error) {
	c, errs, err := decode(data)
	if err != nil {
		return nil, err
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid configuration: %w", errs.ToAggregate())
	}
	return c, nil
}

// decode reads a configuration file strictly, fills the defaults and validates
// it: the one decoder of Parse and Check. err is why the file cannot be read at
// all; errs are its invalid fields at once, the unknown keys and Validate's
// errors, each with its line, in the file's order.
func decode(data []byte) (*Configuration, field.ErrorList, error) {
	c := &Configuration{}
	facts := fileFacts{}
	if len(bytes.TrimSpace(data)) > 0 {
		facts = readFacts(data)
		unmarshal := yaml.UnmarshalStrict
		if len(facts.unknown) > 0 {
			// The strict decoder would stop at the first unknown key, which
			// the walk has named already with every other; decoding around
			// them lets Validate name the invalid values in the same run.
			unmarshal = yaml.Unmarshal
		}
		if err := unmarshal(data, c); err != nil {
			if len(facts.unknown) > 0 {
				return nil, facts.unknown, nil
			}
			if fix := facts.boolFixes(); fix != "" && strings.Contains(err.Error(), "cannot unmarshal bool") {
				return nil, nil, fmt.Errorf("failed to parse configuration: %w; %s", err, fix)
			}
			return nil, nil, fmt.Errorf("failed to parse configuration: %w", err)
		}
	}
	SetDefaults(c)
	errs := append(slices.Clip(facts.unknown), facts.annotate(c.Validate())...)
	return c, facts.byLine(errs), nil
}

// Load reads a configuration file; an empty path gives the defaults.
func Load(file string) (*Configuration, error) {
	if file == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("failed to read configuration %q: %w", file, err)
	}
	return Parse(data)
}
