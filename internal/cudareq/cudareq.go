// Package cudareq reads what a CUDA image requires of the node's driver, the
// NVIDIA_REQUIRE_* variables of its environment
// (NVIDIA_REQUIRE_CUDA="cuda>=12.4 brand=tesla,driver>=470,driver<471 ..."),
// and checks it against what a node has, as NVIDIA's container toolkit does
// before it starts a container in its legacy mode.
//
// The semantics are NVIDIA's, read from their sources:
//
//   - which variables: every NVIDIA_REQUIRE_* but NVIDIA_REQUIRE_JETPACK*,
//     all of which must hold, none when NVIDIA_DISABLE_REQUIRE is true as
//     strconv.ParseBool reads it (nvidia-container-toolkit,
//     internal/config/image/cuda_image.go, GetRequirements and
//     HasDisableRequire);
//   - the expression and its evaluation: libnvidia-container,
//     src/cli/dsl.c (dsl_evaluate, evaluate_rule, dsl_compare_version,
//     dsl_compare_string) and src/cli/configure.c (the rules cuda, driver,
//     arch, brand). Space-separated alternatives, any one of which
//     satisfies; in each, comma-separated clauses PROPERTY OP VALUE that must
//     all hold; OP one of = != < <= > >=; property names and brands compared
//     without case; versions compared number by number.
//
// libnvidia-container evaluates lazily, and this package does too: a clause
// it never reaches (after a satisfied alternative, or after a false clause of
// the same alternative) cannot make the requirement invalid, so an image
// that starts under NVIDIA's toolkit is never refused here for its syntax. A
// clause on a property the node does not know holds, as libnvidia-container
// has it when it sees no device: the brand and architecture of a GPU are
// unknown to the NRI plugin, so only cuda and driver clauses can fail there.
//
// The CUDA_VERSION of images older than NVIDIA_REQUIRE_CUDA, which the
// toolkit also turns into cuda>=, is not read.
package cudareq

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-injector/gpu-injector/layout"
)

// Variables of a container's environment.
const (
	// EnvPrefix starts every requirement variable.
	EnvPrefix = "NVIDIA_REQUIRE_"
	// EnvRequireCUDA is the one CUDA images set.
	EnvRequireCUDA = "NVIDIA_REQUIRE_CUDA"
	// EnvDisable turns every check off when strconv.ParseBool reads true.
	EnvDisable = "NVIDIA_DISABLE_REQUIRE"
	// envJetpack variables are NVIDIA's for Jetson boards, which the toolkit
	// does not check either.
	envJetpack = "NVIDIA_REQUIRE_JETPACK"
)

// MaxBytes bounds one requirement: NVIDIA's CUDA images write about 1.5 KiB.
const MaxBytes = 64 << 10

// ErrInvalid wraps every error about a requirement's syntax or a value that
// cannot be compared: NVIDIA's toolkit refuses such a container too.
var ErrInvalid = errors.New("invalid requirement")

// Var is one requirement variable of an environment.
type Var struct {
	Name, Value string
}

// MaxVars bounds the distinct requirement variables of one environment:
// NVIDIA's CUDA images set one, NVIDIA_REQUIRE_CUDA, and an image that
// splits its needs over a few more stays far below it. FromEnv reads every
// entry once whatever the count, and keeps no more than MaxVars of them, so
// that a pod's author cannot make the NRI plugin, which checks each at every
// container creation on the node, work past NRI's timeout.
const MaxVars = 64

// FromEnv returns the requirement variables of env, entries KEY=VALUE as an
// OCI spec holds them, sorted by name, and whether NVIDIA_DISABLE_REQUIRE
// turns the check off. A name given twice counts once, with its first value,
// which is the one getenv(3) returns to the container's programs. More than
// MaxVars distinct names is an error wrapping ErrInvalid, unless the check
// is off.
func FromEnv(env []string) (vars []Var, disabled bool, err error) {
	sawDisable := false
	seen := map[string]struct{}{}
	tooMany := false
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "NVIDIA_") {
			continue
		}
		switch {
		case k == EnvDisable:
			if !sawDisable {
				disabled, _ = strconv.ParseBool(v)
			}
			sawDisable = true
		case strings.HasPrefix(k, EnvPrefix) && !strings.HasPrefix(k, envJetpack):
			if _, dup := seen[k]; dup || tooMany {
				continue
			}
			if len(vars) == MaxVars {
				tooMany = true
				continue
			}
			seen[k] = struct{}{}
			vars = append(vars, Var{Name: k, Value: v})
		}
	}
	if disabled {
		return nil, true, nil
	}
	if tooMany {
		return nil, false, fmt.Errorf("%w: more than %d %s* variables", ErrInvalid, MaxVars, EnvPrefix)
	}
	slices.SortFunc(vars, func(a, b Var) int { return strings.Compare(a.Name, b.Name) })
	return vars, false, nil
}

// Node is what a check knows of the node. An empty field is unknown, and a
// clause on it holds.
type Node struct {
	// Driver is the driver version, e.g. 580.159.04.
	Driver string
	// CUDA is the CUDA version the driver supports, e.g. 13.0.
	CUDA string
	// Arch is the GPUs' compute capability, e.g. 9.0.
	Arch string
	// Brand is the GPUs' brand as NVML names it, e.g. Tesla.
	Brand string
}

// The properties a clause may name.
const (
	PropertyCUDA   = "cuda"
	PropertyDriver = "driver"
	PropertyArch   = "arch"
	PropertyBrand  = "brand"
)

// Clause is one PROPERTY OP VALUE of an alternative.
type Clause struct {
	// Text is the clause as written.
	Text string
	// Property is lowercase; Op and Value as written. All three are empty
	// when Invalid is set.
	Property, Op, Value string
	// Invalid says why the clause is no expression; an evaluation that
	// reaches it fails with ErrInvalid.
	Invalid string
}

// Requirement is one variable's value, parsed.
type Requirement struct {
	// Alternatives, any one of which satisfies the requirement; each is
	// clauses that must all hold. An alternative of only commas has no
	// clause and, as in libnvidia-container, decides nothing of its own.
	Alternatives [][]Clause
}

// Parse reads a requirement's structure, for a reader that looks at its
// clauses (AffinityGt). Only a value over MaxBytes is an error: a clause that
// is no expression is marked Invalid, and fails Check only if Check reaches
// it.
func Parse(s string) (Requirement, error) {
	if len(s) > MaxBytes {
		return Requirement{}, fmt.Errorf("%w: %d bytes exceeds the limit of %d", ErrInvalid, len(s), MaxBytes)
	}
	var r Requirement
	for _, alt := range strings.Split(s, " ") {
		if alt == "" {
			continue
		}
		clauses := []Clause{}
		for _, text := range strings.Split(alt, ",") {
			if text != "" {
				clauses = append(clauses, parseClause(text))
			}
		}
		r.Alternatives = append(r.Alternatives, clauses)
	}
	return r, nil
}

const operatorChars = "<>=!"

func parseClause(text string) Clause {
	c := Clause{Text: text}
	n := strings.IndexAny(text, operatorChars)
	end := n
	for end >= 0 && end < len(text) && strings.IndexByte(operatorChars, text[end]) >= 0 {
		end++
	}
	switch {
	case n < 0:
		c.Invalid = "no operator (one of = != < <= > >=)"
	case n == 0:
		c.Invalid = "no property before the operator"
	case !operator(text[n:end]):
		c.Invalid = fmt.Sprintf("%q is not one of the operators = != < <= > >=", layout.Truncate(text[n:end], 16))
	case end == len(text):
		c.Invalid = "no value after the operator"
	default:
		for _, p := range []string{PropertyCUDA, PropertyDriver, PropertyArch, PropertyBrand} {
			if asciiEqualFold(text[:n], p) {
				c.Property, c.Op, c.Value = p, text[n:end], text[end:]
				return c
			}
		}
		c.Invalid = fmt.Sprintf("unknown property %q (one of cuda, driver, arch, brand)", layout.Truncate(text[:n], 64))
	}
	return c
}

// asciiEqualFold compares folding ASCII letters only, as strcasecmp(3) does
// in the C locale: no other letter may pass for one of "cuda".
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if x >= 'A' && x <= 'Z' {
			x += 'a' - 'A'
		}
		if y >= 'A' && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func operator(op string) bool {
	switch op {
	case "=", "!=", "<", "<=", ">", ">=":
		return true
	}
	return false
}

// UnsatisfiedError is a requirement the node does not satisfy.
type UnsatisfiedError struct {
	// First is the first alternative as written: what NVIDIA's toolkit names
	// ("unsatisfied condition: cuda>=12.8"), the one CUDA images put first.
	First string
}

func (e *UnsatisfiedError) Error() string {
	return "unsatisfied condition: " + e.First
}

// Check evaluates a requirement on the node as libnvidia-container does:
// nil when it holds, an *UnsatisfiedError when it does not, or an error
// wrapping ErrInvalid for a value over MaxBytes, or a clause reached that is
// no expression or whose versions are no dotted numbers. It reads the text as
// it goes, and allocates nothing for a requirement that holds.
func Check(req string, n Node) error {
	if len(req) > MaxBytes {
		return fmt.Errorf("%w: %d bytes exceeds the limit of %d", ErrInvalid, len(req), MaxBytes)
	}
	held, first := true, ""
	for rest, more := req, true; more; {
		var alt string
		alt, rest, more = strings.Cut(rest, " ")
		if alt == "" {
			continue
		}
		if first == "" {
			first = alt
		}
		all := true
		for clauses, more := alt, true; more; {
			var text string
			text, clauses, more = strings.Cut(clauses, ",")
			if text == "" {
				continue
			}
			c := parseClause(text)
			ok, err := c.eval(n)
			if err != nil {
				return fmt.Errorf("%w: %q: %s", ErrInvalid, layout.Truncate(c.Text, 128), err)
			}
			held = ok
			if !ok {
				all = false
				break
			}
		}
		// The first alternative whose clauses all held decides, with the
		// last clause evaluated: true, or, for one without clauses, the
		// value the alternative before it left.
		if all {
			break
		}
	}
	if held {
		return nil
	}
	return &UnsatisfiedError{First: layout.Truncate(first, 256)}
}

func (c Clause) eval(n Node) (bool, error) {
	if c.Invalid != "" {
		return false, errors.New(c.Invalid)
	}
	var have string
	switch c.Property {
	case PropertyCUDA:
		have = n.CUDA
	case PropertyDriver:
		have = n.Driver
	case PropertyArch:
		have = n.Arch
	case PropertyBrand:
		if n.Brand == "" {
			return true, nil
		}
		switch c.Op {
		case "=":
			return asciiEqualFold(n.Brand, c.Value), nil
		case "!=":
			return !asciiEqualFold(n.Brand, c.Value), nil
		}
		return false, fmt.Errorf("a brand compares only with = or !=, not %s", c.Op)
	}
	if have == "" {
		return true, nil
	}
	return compareVersions(have, c.Op, c.Value, c.Property)
}

// compareVersions is dsl_compare_version: both sides only digits and dots,
// compared number by number; where one side runs out, the other is greater
// unless all it has left is zeros and dots (12.0 equals 12).
func compareVersions(have, op, want, property string) (bool, error) {
	if !digitsAndDots(have) {
		return false, fmt.Errorf("the node's %s version %q is not a dotted number", property, layout.Truncate(have, 64))
	}
	if !digitsAndDots(want) {
		return false, fmt.Errorf("%q is not a dotted number", layout.Truncate(want, 64))
	}
	v1, v2 := have, want
	for v1 != "" && v2 != "" {
		n1, rest1, err := leadingNumber(v1)
		if err != nil {
			return false, fmt.Errorf("the node's %s version %q: %w", property, layout.Truncate(have, 64), err)
		}
		n2, rest2, err := leadingNumber(v2)
		if err != nil {
			return false, fmt.Errorf("%q: %w", layout.Truncate(want, 64), err)
		}
		if n1 != n2 {
			switch op {
			case "=":
				return false, nil
			case "!=":
				return true, nil
			case "<", "<=":
				return n1 < n2, nil
			default:
				return n1 > n2, nil
			}
		}
		v1, v2 = strings.TrimLeft(rest1, "."), strings.TrimLeft(rest2, ".")
	}
	v1, v2 = strings.TrimLeft(v1, ".0"), strings.TrimLeft(v2, ".0")
	switch op {
	case "!=":
		return v1 != "" || v2 != "", nil
	case "=":
		return v1 == "" && v2 == "", nil
	case "<=", ">=":
		if v1 == "" && v2 == "" {
			return true, nil
		}
	}
	if op == "<" || op == "<=" {
		return v1 == "" && v2 != "", nil
	}
	return v1 != "" && v2 == "", nil
}

func digitsAndDots(s string) bool {
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && s[i] != '.' {
			return false
		}
	}
	return true
}

// leadingNumber reads the digits s starts with, as strtoumax(3) would; the
// largest value is its overflow mark, so it is refused too.
func leadingNumber(s string) (uint64, string, error) {
	end := 0
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	if end == 0 {
		return 0, "", errors.New("a part is empty")
	}
	n, err := strconv.ParseUint(s[:end], 10, 64)
	if err != nil || n == math.MaxUint64 {
		return 0, "", errors.New("a number is too large")
	}
	return n, s[end:], nil
}

// AffinityGt is the value of a nodeAffinity Gt term on
// layout.LabelCUDADriverVersionNumber that selects the nodes whose CUDA
// version satisfies the requirement's first alternative, when that is one
// clause cuda>=X or cuda>X (what CUDA images put first): the largest version
// number that does not. ok is false for any other requirement, or a version
// the label's encoding cannot hold.
func (r Requirement) AffinityGt() (gt int, ok bool) {
	if len(r.Alternatives) == 0 || len(r.Alternatives[0]) != 1 {
		return 0, false
	}
	c := r.Alternatives[0][0]
	if c.Property != PropertyCUDA || (c.Op != ">=" && c.Op != ">") {
		return 0, false
	}
	// Runs of dots separate numbers, as in the comparison.
	parts := strings.FieldsFunc(c.Value, func(r rune) bool { return r == '.' })
	if strings.HasPrefix(c.Value, ".") || len(parts) == 0 || !digitsAndDots(c.Value) {
		return 0, false
	}
	minor := "0"
	if len(parts) > 1 {
		minor = parts[1]
	}
	n, ok := layout.CUDAVersionNumber(parts[0] + "." + minor)
	if !ok {
		return 0, false
	}
	rest := strings.Join(parts[min(2, len(parts)):], "")
	// Drivers report major.minor only (n is a multiple of 10), so anything
	// beyond the minor, or a strict >, needs the next minor.
	if c.Op == ">=" && strings.Trim(rest, "0") == "" {
		return n - 1, true
	}
	return n + 9, true
}
