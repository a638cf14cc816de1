package cudareq

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-injector/gpu-injector/layout"
)

// fuzzNodes are the nodes each input is checked on: what the plugin knows
// (driver and CUDA), everything known, nothing known, and versions that
// are no dotted numbers.
var fuzzNodes = []Node{
	t4,
	{Driver: "580.159.04", CUDA: "13.0", Arch: "9.0", Brand: "Nvidia"},
	{},
	{Driver: "535.104.05-open", CUDA: "12.x"},
}

// FuzzRequirement feeds NVIDIA_REQUIRE_* values, which come from any image,
// to Parse and Check, as the NRI plugin does inside a container creation:
// never a panic or an error from Parse under MaxBytes; on every node, Check
// answers what a model transliterated from libnvidia-container's dsl.c,
// written apart from the code, answers; and where AffinityGt gives a
// threshold, a node's CUDA version is above it exactly when the first
// alternative holds there.
func FuzzRequirement(f *testing.F) {
	for _, s := range []string{
		"cuda>=12.4", ngcStyle("12.4", 470, 525, 535), "cuda>12.2", "driver>=535,driver<536",
		"brand=tesla", "arch>=8.0", "CUDA>=12.0", "cuda", "cuda>=", ">=1", "cuda=>1", "cuda==1",
		"cuda>=1 garbage", "garbage cuda>=1", " , cuda>=99", "cuda>=99 ,", "cuda>=.5", "cuda>=12..4",
		"driver<18446744073709551615", "cuda>=12.4.1", "cuda!=12.2.0.0", "brand<x", "a\tb", "é>=1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(s)
		if len(s) > MaxBytes {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse of %d bytes = %v, want ErrInvalid", len(s), err)
			}
			return
		}
		if err != nil {
			t.Fatalf("Parse = %v", err)
		}
		for _, n := range fuzzNodes {
			err := Check(s, n)
			var u *UnsatisfiedError
			got := "ok"
			switch {
			case errors.As(err, &u):
				got = "unsatisfied"
			case errors.Is(err, ErrInvalid):
				got = "invalid"
			case err != nil:
				t.Fatalf("Check = %v", err)
			}
			if want := modelCheck(s, n); got != want {
				t.Fatalf("Check(%q) on %+v = %v (%s), the model says %s", s, n, err, got, want)
			}
		}
		gt, ok := r.AffinityGt()
		if !ok {
			return
		}
		first := ""
		for _, alt := range strings.Split(s, " ") {
			if alt != "" {
				first = alt
				break
			}
		}
		for major := 0; major <= 20; major++ {
			for _, minor := range []int{0, 1, 4, 9, 10, 99} {
				v := strconv.Itoa(major) + "." + strconv.Itoa(minor)
				num, _ := layout.CUDAVersionNumber(v)
				if holds := Check(first, Node{CUDA: v}) == nil; holds != (num > gt) {
					t.Fatalf("%q on CUDA %s (%d): holds=%v, but the affinity Gt %d says %v", s, v, num, holds, gt, num > gt)
				}
			}
		}
	})
}

// modelCheck is libnvidia-container's dsl_evaluate restated: "ok",
// "unsatisfied" or "invalid".
func modelCheck(pred string, n Node) string {
	ret := 1
	for _, orExpr := range strings.Split(pred, " ") {
		if orExpr == "" {
			continue
		}
		broke := false
		for _, andExpr := range strings.Split(orExpr, ",") {
			if andExpr == "" {
				continue
			}
			ret = modelRule(andExpr, n)
			if ret < 0 {
				return "invalid"
			}
			if ret == 0 {
				broke = true
				break
			}
		}
		if !broke {
			break
		}
	}
	if ret == 0 {
		return "unsatisfied"
	}
	return "ok"
}

var modelExpr = regexp.MustCompile(`(?s)^([^<>=!]+)([<>=!]+)(.*)$`)

// modelRule is evaluate_rule with configure.c's rules: 1, 0, or -1 for an
// invalid expression.
func modelRule(expr string, n Node) int {
	m := modelExpr.FindStringSubmatch(expr)
	if m == nil || m[3] == "" {
		return -1
	}
	name, op, val := m[1], m[2], m[3]
	switch op {
	case "=", "!=", "<", "<=", ">", ">=":
	default:
		return -1
	}
	var have string
	switch {
	case strings.EqualFold(name, "cuda") && isASCII(name):
		have = n.CUDA
	case strings.EqualFold(name, "driver") && isASCII(name):
		have = n.Driver
	case strings.EqualFold(name, "arch") && isASCII(name):
		have = n.Arch
	case strings.EqualFold(name, "brand") && isASCII(name):
		if n.Brand == "" {
			return 1
		}
		eq := isASCII(val) && strings.EqualFold(n.Brand, val)
		switch op {
		case "=":
			return b2i(eq)
		case "!=":
			return b2i(!eq)
		}
		return -1
	default:
		return -1
	}
	if have == "" {
		return 1
	}
	return modelVersion(have, op, val)
}

// modelVersion is dsl_compare_version over the lists of numbers: compared
// pair by pair while both have one (each read only when reached), then the
// longer is greater if anything it has left is not zero.
func modelVersion(v1, op, v2 string) int {
	valid := regexp.MustCompile(`^[0-9.]*$`)
	if !valid.MatchString(v1) || !valid.MatchString(v2) {
		return -1
	}
	p1, p2 := numbers(v1), numbers(v2)
	cmp := 0
	i := 0
	for ; i < len(p1) && i < len(p2); i++ {
		a, err1 := strconv.ParseUint(p1[i], 10, 64)
		b, err2 := strconv.ParseUint(p2[i], 10, 64)
		if p1[i] == "" || p2[i] == "" || err1 != nil || err2 != nil || a == 1<<64-1 || b == 1<<64-1 {
			return -1
		}
		if a != b {
			cmp = map[bool]int{true: -1, false: 1}[a < b]
			break
		}
	}
	if cmp == 0 {
		rest1, rest2 := strings.Join(p1[min(i, len(p1)):], ""), strings.Join(p2[min(i, len(p2)):], "")
		switch {
		case strings.Trim(rest1, "0") != "":
			cmp = 1
		case strings.Trim(rest2, "0") != "":
			cmp = -1
		}
	}
	switch op {
	case "=":
		return b2i(cmp == 0)
	case "!=":
		return b2i(cmp != 0)
	case "<":
		return b2i(cmp < 0)
	case "<=":
		return b2i(cmp <= 0)
	case ">":
		return b2i(cmp > 0)
	}
	return b2i(cmp >= 0)
}

// numbers splits a version at its runs of dots; a leading dot leaves an
// empty first part, which strtoumax cannot read.
func numbers(v string) []string {
	if v == "" {
		return nil
	}
	parts := strings.FieldsFunc(v, func(r rune) bool { return r == '.' })
	if strings.HasPrefix(v, ".") {
		parts = append([]string{""}, parts...)
	}
	return parts
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// FuzzFromEnv: whatever the environment (lines of KEY=VALUE, each repeated
// as the fuzzer says, up to a few hundred entries), FromEnv keeps each
// requirement name once with its first value, sorted, at most MaxVars of
// them, or refuses the environment only past MaxVars.
func FuzzFromEnv(f *testing.F) {
	f.Add("NVIDIA_REQUIRE_CUDA=cuda>=12.4\nPATH=/bin", uint8(1))
	f.Add("NVIDIA_REQUIRE_CUDA=a\nNVIDIA_REQUIRE_CUDA=b\nNVIDIA_DISABLE_REQUIRE=true", uint8(3))
	f.Add("NVIDIA_REQUIRE_JETPACK=x\nNVIDIA_REQUIRE_=y\nNVIDIA_REQUIRE_Z", uint8(0))
	f.Fuzz(func(t *testing.T, lines string, copies uint8) {
		var env []string
		for i := range int(copies%8) + 1 {
			for _, l := range strings.Split(lines, "\n") {
				// Copies after the first get distinct names where the line
				// names a requirement, to cross MaxVars.
				if i > 0 && strings.HasPrefix(l, EnvPrefix) {
					l = strings.Replace(l, EnvPrefix, EnvPrefix+strconv.Itoa(i), 1)
				}
				env = append(env, l)
			}
		}
		first := map[string]string{}
		for _, kv := range env {
			k, v, ok := strings.Cut(kv, "=")
			if _, seen := first[k]; ok && !seen && strings.HasPrefix(k, EnvPrefix) && !strings.HasPrefix(k, envJetpack) {
				first[k] = v
			}
		}
		vars, disabled, err := FromEnv(env)
		switch {
		case disabled:
			if vars != nil || err != nil {
				t.Fatalf("disabled, yet %v, %v", vars, err)
			}
			return
		case len(first) > MaxVars:
			if !errors.Is(err, ErrInvalid) || vars != nil {
				t.Fatalf("%d names: %d, %v; want an error", len(first), len(vars), err)
			}
			return
		case err != nil:
			t.Fatalf("%d names: %v", len(first), err)
		}
		if len(vars) != len(first) {
			t.Fatalf("%d variables kept of %d names", len(vars), len(first))
		}
		for i, v := range vars {
			if first[v.Name] != v.Value {
				t.Errorf("%s=%q, want its first value %q", v.Name, v.Value, first[v.Name])
			}
			if i > 0 && vars[i-1].Name >= v.Name {
				t.Errorf("not sorted, or twice: %s after %s", v.Name, vars[i-1].Name)
			}
		}
	})
}
