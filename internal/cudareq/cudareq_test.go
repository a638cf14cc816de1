package cudareq

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// ngcStyle is a requirement in the form NVIDIA's CUDA images state it: the
// CUDA release, or one of the driver branches its forward-compatibility
// package supports, on any brand.
func ngcStyle(cuda string, branches ...int) string {
	parts := []string{"cuda>=" + cuda}
	for _, b := range branches {
		for _, brand := range []string{"tesla", "unknown", "nvidia", "nvidiartx", "geforce", "geforcertx", "quadro", "quadrortx", "titan", "titanrtx"} {
			parts = append(parts, fmt.Sprintf("brand=%s,driver>=%d,driver<%d", brand, b, b+1))
		}
	}
	return strings.Join(parts, " ")
}

// t4 is the e2e suite's kubelet node: driver 535.104.05, CUDA 12.2.
var t4 = Node{Driver: "535.104.05", CUDA: "12.2"}

func TestCheck(t *testing.T) {
	tesla := Node{Driver: "535.104.05", CUDA: "12.2", Brand: "Tesla", Arch: "7.5"}
	const ok, unsatisfied, invalid = "ok", "unsatisfied", "invalid"
	for name, tc := range map[string]struct {
		req  string
		node Node
		want string
	}{
		"empty":                            {"", t4, ok},
		"only spaces":                      {"   ", t4, ok},
		"the node's CUDA":                  {"cuda>=12.2", t4, ok},
		"a newer CUDA":                     {"cuda>=12.3", t4, unsatisfied},
		"a strict greater than itself":     {"cuda>12.2", t4, unsatisfied},
		"an older CUDA":                    {"cuda>=11.8", t4, ok},
		"a third part":                     {"cuda>=12.2.1", t4, unsatisfied},
		"trailing zeros are equal":         {"cuda=12.2.0.0", t4, ok},
		"not equal":                        {"cuda!=12.2.0", t4, unsatisfied},
		"less than":                        {"cuda<12.10", t4, ok},
		"numbers, not text":                {"driver>=535.99", t4, ok},
		"the exact driver":                 {"driver<=535.104.05", t4, ok},
		"below the driver":                 {"driver<535.104", t4, unsatisfied},
		"case of the property":             {"CUDA>=12.0", t4, ok},
		"NGC, a forward-compatible branch": {ngcStyle("12.4", 470, 525, 535), t4, ok},
		"NGC, no branch of this driver":    {ngcStyle("12.4", 470, 525), t4, unsatisfied},
		"NGC, the driver's own CUDA":       {ngcStyle("12.2", 470), t4, ok},
		// The brand of the GPUs is unknown to the plugin: its clauses hold.
		"brand unknown":        {"brand=geforce", t4, ok},
		"the brand, any case":  {"brand=TESLA,cuda>=12.0", tesla, ok},
		"another brand":        {"brand=geforce", tesla, unsatisfied},
		"not the brand":        {"brand!=geforce", tesla, ok},
		"brand with <":         {"brand<tesla", tesla, invalid},
		"brand with < unknown": {"brand<tesla", t4, ok},
		"arch":                 {"arch>=7.0", tesla, ok},
		"newer arch":           {"arch>=8.0", tesla, unsatisfied},
		"arch unknown":         {"arch>=9.0", t4, ok},
		"CUDA unknown":         {"cuda>=99.0", Node{Driver: "535.104.05"}, ok},
		"second alternative":   {"cuda>=13.0 driver>=535", t4, ok},
		"no alternative holds": {"cuda>=13.0 driver>=550", t4, unsatisfied},
		"all of a group":       {"cuda>=12.0,driver>=550", t4, unsatisfied},
		"extra spaces":         {"  cuda>=13.0    driver>=535  ", t4, ok},
		"empty clauses":        {",cuda>=12.0,,", t4, ok},
		// An alternative of commas decides nothing: the one before it does.
		"commas after a failure": {"cuda>=13.0 ,", t4, unsatisfied},
		"commas first":           {", cuda>=13.0", t4, ok},
		// libnvidia-container stops at the first alternative that holds,
		// and at the first false clause of an alternative.
		"garbage after a match":       {"cuda>=12.0 garbage", t4, ok},
		"garbage after a false":       {"cuda>=13.0,garbage driver>=1", t4, ok},
		"garbage first":               {"garbage cuda>=12.0", t4, invalid},
		"garbage last":                {"cuda>=13.0 garbage", t4, invalid},
		"no operator":                 {"cuda", t4, invalid},
		"no value":                    {"cuda>=", t4, invalid},
		"no property":                 {">=12.0", t4, invalid},
		"an unknown operator":         {"cuda=>12.0", t4, invalid},
		"double equals":               {"cuda==12.2", t4, invalid},
		"an unknown property":         {"jetpack>=5", t4, invalid},
		"letters in the version":      {"cuda>=12.a", t4, invalid},
		"a leading dot":               {"cuda>=.5", t4, invalid},
		"a tab is no separator":       {"cuda>=12.0\tdriver>=1", t4, invalid},
		"a version at the limit":      {"driver<18446744073709551615", t4, invalid},
		"a version below the limit":   {"driver<18446744073709551614", t4, ok},
		"overflow after a difference": {"driver<600.99999999999999999999999", t4, ok},
		"overflow beyond the node":    {"driver>=535.104.05.99999999999999999999999", t4, unsatisfied},
		"the node's version is odd":   {"driver>=535", Node{Driver: "535.104.05-open"}, invalid},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse(tc.req); err != nil {
				t.Fatalf("Parse(%q) = %v", tc.req, err)
			}
			err := Check(tc.req, tc.node)
			var u *UnsatisfiedError
			got := ok
			switch {
			case errors.As(err, &u):
				got = unsatisfied
			case errors.Is(err, ErrInvalid):
				got = invalid
			case err != nil:
				t.Fatalf("Check = %v, neither unsatisfied nor invalid", err)
			}
			if got != tc.want {
				t.Errorf("Check(%q) on %+v = %v (%s), want %s", tc.req, tc.node, err, got, tc.want)
			}
			if want := modelCheck(tc.req, tc.node); want != got {
				t.Errorf("the model says %s", want)
			}
		})
	}
}

func TestUnsatisfiedNamesTheFirstAlternative(t *testing.T) {
	err := Check(ngcStyle("12.8", 470, 525), t4)
	if err == nil || err.Error() != "unsatisfied condition: cuda>=12.8" {
		t.Errorf("Check = %v, want NVIDIA's wording naming cuda>=12.8", err)
	}
	if err := Check("  brand=tesla,driver>=999 cuda>=99", t4); err == nil || err.Error() != "unsatisfied condition: brand=tesla,driver>=999" {
		t.Errorf("Check = %v", err)
	}
}

func TestLimit(t *testing.T) {
	at := strings.Repeat("cuda>=99 ", MaxBytes/9)
	if _, err := Parse(at); err != nil {
		t.Errorf("Parse at the limit: %v", err)
	}
	var u *UnsatisfiedError
	if err := Check(at, t4); !errors.As(err, &u) {
		t.Errorf("Check at the limit = %v, want unsatisfied", err)
	}
	over := strings.Repeat("x", MaxBytes+1)
	if _, err := Parse(over); !errors.Is(err, ErrInvalid) {
		t.Errorf("Parse over the limit = %v, want ErrInvalid", err)
	}
	if err := Check(over, t4); !errors.Is(err, ErrInvalid) {
		t.Errorf("Check over the limit = %v, want ErrInvalid", err)
	}
}

// TestCheckAllocations: a requirement that holds, as on most containers,
// costs no allocation, however long.
func TestCheckAllocations(t *testing.T) {
	req := ngcStyle("12.2", 470, 525, 535)
	if n := testing.AllocsPerRun(100, func() {
		if err := Check(req, t4); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Check allocates %v times", n)
	}
}

func TestParse(t *testing.T) {
	r, _ := Parse("cuda>=12.4 Brand=tesla,driver<471 bogus ,")
	want := [][]Clause{
		{{Text: "cuda>=12.4", Property: "cuda", Op: ">=", Value: "12.4"}},
		{{Text: "Brand=tesla", Property: "brand", Op: "=", Value: "tesla"}, {Text: "driver<471", Property: "driver", Op: "<", Value: "471"}},
		{{Text: "bogus", Invalid: "no operator (one of = != < <= > >=)"}},
		{},
	}
	if !reflect.DeepEqual(r.Alternatives, want) {
		t.Errorf("Parse =\n%+v\nwant\n%+v", r.Alternatives, want)
	}
}

func TestFromEnv(t *testing.T) {
	for name, tc := range map[string]struct {
		env      []string
		want     []Var
		disabled bool
	}{
		"none": {env: []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"}},
		"a CUDA image": {env: []string{"PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4", "CUDA_VERSION=12.4.1"},
			want: []Var{{"NVIDIA_REQUIRE_CUDA", "cuda>=12.4"}}},
		"every NVIDIA_REQUIRE_, sorted": {env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=12.4", "NVIDIA_REQUIRE_ARCH=arch>=8.0", "NVIDIA_REQUIRE_=driver>=1"},
			want: []Var{{"NVIDIA_REQUIRE_", "driver>=1"}, {"NVIDIA_REQUIRE_ARCH", "arch>=8.0"}, {"NVIDIA_REQUIRE_CUDA", "cuda>=12.4"}}},
		"Jetson's are not checked": {env: []string{"NVIDIA_REQUIRE_JETPACK=csv-mounts=all", "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=x"}},
		"the first of two":         {env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=11.0", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, want: []Var{{"NVIDIA_REQUIRE_CUDA", "cuda>=11.0"}}},
		"an empty value":           {env: []string{"NVIDIA_REQUIRE_CUDA="}, want: []Var{{"NVIDIA_REQUIRE_CUDA", ""}}},
		"no equals sign":           {env: []string{"NVIDIA_REQUIRE_CUDA"}},
		"disabled":                 {env: []string{"NVIDIA_REQUIRE_CUDA=cuda>=99.0", "NVIDIA_DISABLE_REQUIRE=true"}, disabled: true},
		"disabled by 1":            {env: []string{"NVIDIA_DISABLE_REQUIRE=1", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, disabled: true},
		"disabled by TRUE":         {env: []string{"NVIDIA_DISABLE_REQUIRE=TRUE", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, disabled: true},
		"not disabled by false": {env: []string{"NVIDIA_DISABLE_REQUIRE=false", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"},
			want: []Var{{"NVIDIA_REQUIRE_CUDA", "cuda>=99.0"}}},
		"not disabled by yes": {env: []string{"NVIDIA_DISABLE_REQUIRE=yes", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"},
			want: []Var{{"NVIDIA_REQUIRE_CUDA", "cuda>=99.0"}}},
		"the first disable decides": {env: []string{"NVIDIA_DISABLE_REQUIRE=false", "NVIDIA_DISABLE_REQUIRE=true", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"},
			want: []Var{{"NVIDIA_REQUIRE_CUDA", "cuda>=99.0"}}},
	} {
		t.Run(name, func(t *testing.T) {
			vars, disabled, err := FromEnv(tc.env)
			if !reflect.DeepEqual(vars, tc.want) || disabled != tc.disabled || err != nil {
				t.Errorf("FromEnv = %v, %v, %v; want %v, %v, nil", vars, disabled, err, tc.want, tc.disabled)
			}
		})
	}
}

// requireVars is n distinct requirement variables.
func requireVars(n int) []string {
	env := make([]string, n)
	for i := range env {
		env[i] = fmt.Sprintf("NVIDIA_REQUIRE_X%d=cuda>=1.0", i)
	}
	return env
}

// TestFromEnvBounded: at most MaxVars distinct names are kept, past them
// the environment is refused, unless the check is off; a name repeated any
// number of times is one.
func TestFromEnvBounded(t *testing.T) {
	if vars, _, err := FromEnv(requireVars(MaxVars)); err != nil || len(vars) != MaxVars {
		t.Errorf("FromEnv of %d variables = %d, %v; want them all", MaxVars, len(vars), err)
	}
	for _, n := range []int{MaxVars + 1, 100_000} {
		if vars, disabled, err := FromEnv(requireVars(n)); !errors.Is(err, ErrInvalid) || vars != nil || disabled {
			t.Errorf("FromEnv of %d variables = %d, %v, %v; want an error wrapping ErrInvalid", n, len(vars), disabled, err)
		}
		if vars, disabled, err := FromEnv(append(requireVars(n), EnvDisable+"=true")); err != nil || vars != nil || !disabled {
			t.Errorf("FromEnv of %d variables, disabled = %d, %v, %v; want disabled", n, len(vars), disabled, err)
		}
	}
	same := slices.Repeat([]string{"NVIDIA_REQUIRE_CUDA=cuda>=12.4", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"}, 50_000)
	if vars, _, err := FromEnv(same); err != nil || !reflect.DeepEqual(vars, []Var{{"NVIDIA_REQUIRE_CUDA", "cuda>=12.4"}}) {
		t.Errorf("FromEnv of one name 100,000 times = %v, %v", vars, err)
	}
}

// BenchmarkFromEnv is 100,000 distinct requirement variables: the time grows
// with the environment's length, not its square.
func BenchmarkFromEnv(b *testing.B) {
	env := requireVars(100_000)
	b.ReportAllocs()
	for b.Loop() {
		_, _, _ = FromEnv(env)
	}
}

func TestAffinityGt(t *testing.T) {
	for req, want := range map[string]int{
		"cuda>=12.4":           12039,
		ngcStyle("12.8", 470):  12079,
		"cuda>=12":             11999,
		"cuda>=12.4.0":         12039,
		"cuda>=12.4.1":         12049,
		"cuda>12.4":            12049,
		"CUDA>=13.0":           12999,
		" cuda>=12.4 driver>1": 12039,
	} {
		r, _ := Parse(req)
		if got, ok := r.AffinityGt(); !ok || got != want {
			t.Errorf("AffinityGt(%q) = %d, %v; want %d", req, got, ok, want)
		}
	}
	for _, req := range []string{"", "driver>=535", "cuda>=12.4,driver>=1", "cuda<13.0", "cuda=12.4", "cuda>=12.100", "cuda>=x", "cuda>=.4", "brand=tesla"} {
		r, _ := Parse(req)
		if got, ok := r.AffinityGt(); ok {
			t.Errorf("AffinityGt(%q) = %d, want none", req, got)
		}
	}
}
