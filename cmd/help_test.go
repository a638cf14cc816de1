package cmd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// commandWords are programs a usage string names; flag.UnquoteUsage takes a
// back-quoted one for the flag's argument name, which -h then prints as if
// the flag took the program.
var commandWords = []string{"kubectl", "docker", "podman", "helm", "crictl", "ctr", "nerdctl", "gpu-injector"}

// argName is what an argument name in -h may be: one word, or choices such as yaml|json.
var argName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.|-]*$`)

// helpProblems reads the flag lines of a -h text ("  -name argument") and
// names each argument that is no single word, or is a program.
func helpProblems(help string) []string {
	var problems []string
	flags := 0
	for _, line := range strings.Split(help, "\n") {
		if !strings.HasPrefix(line, "  -") {
			continue
		}
		flags++
		// A one-letter flag's usage follows on the same line, after a tab.
		line, _, _ = strings.Cut(line, "\t")
		name, arg, hasArg := strings.Cut(strings.TrimPrefix(line, "  -"), " ")
		if !hasArg {
			continue
		}
		if !argName.MatchString(arg) || slices.Contains(commandWords, strings.ToLower(arg)) {
			problems = append(problems, fmt.Sprintf("-%s reads as taking %q: back-quote only the argument's name in its usage", name, arg))
		}
	}
	if flags == 0 {
		problems = append(problems, "no flag in the help:\n"+help)
	}
	return problems
}

func checkHelp(t *testing.T, help string) {
	t.Helper()
	for _, p := range helpProblems(help) {
		t.Error(p)
	}
}

// TestHelpArgumentNames renders every command's -h.
func TestHelpArgumentNames(t *testing.T) {
	ctx := context.Background()
	for name, help := range map[string]func(stderr io.Writer){
		"webhook":    func(w io.Writer) { _, _ = parseWebhookFlags([]string{"-h"}, w) },
		"nri-plugin": func(w io.Writer) { _, _ = parseNRIPluginFlags([]string{"-h"}, w) },
		"mutate":     func(w io.Writer) { _, _ = parseMutateFlags([]string{"-h"}, w) },
		"status":     func(w io.Writer) { Status(ctx, []string{"-h"}, io.Discard, w) },
		"status pod": func(w io.Writer) { StatusPod(ctx, []string{"-h"}, io.Discard, w) },
		"cleanup":    func(w io.Writer) { _, _ = parseCleanupFlags([]string{"-h"}, w) },
		"config":     func(w io.Writer) { Config([]string{"validate", "-h"}, strings.NewReader(""), io.Discard, w) },
	} {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			help(&stderr)
			checkHelp(t, stderr.String())
			if name == "mutate" && !strings.Contains(stderr.String(), "\n  -nodes file\n") {
				t.Errorf("mutate -h does not name -nodes' argument file:\n%s", stderr.String())
			}
		})
	}
}

// TestCheckHelp: the check catches what -h printed for a usage string that
// back-quotes a command.
func TestCheckHelp(t *testing.T) {
	bad := "Usage: x\n  -nodes kubectl get nodes -o yaml\n    \tNode objects\n  -images docker\n    \tan image\n  -f file\n    \tmanifests\n"
	if p := helpProblems(bad); len(p) != 2 {
		t.Errorf("problems of -nodes kubectl get nodes -o yaml, -images docker and -f file: %q, want the first two", p)
	}
}
