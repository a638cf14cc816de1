package cmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gpu-injector/gpu-injector/config"
)

const configUsage = `Usage: gpu-injector config validate -f FILE

Checks a configuration file as the webhook and the probe do when they start,
and prints every invalid field at once, unknown or with an invalid value,
each with its line, counted from the file's first (in a ConfigMap, from the
first of its config.yaml). FILE is the file itself, the chart's ConfigMap, or the output
of helm template (every configuration in it is checked); - reads standard
input:

  helm template gpu-injector charts/gpu-injector -f my-values.yaml | gpu-injector config validate -f -

Exit status: 0 valid, 1 invalid (or unreadable, or no configuration found),
2 a wrong command line.

Flags:
`

// Config is "gpu-injector config": its one subcommand, validate, is what
// the chart's install hook runs.
func Config(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpu-injector config validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), configUsage)
		fs.PrintDefaults()
	}
	file := fs.String("f", "", "the file to check; - for standard input")
	if len(args) == 0 || args[0] != "validate" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		}
		fs.Usage()
		return 2
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *file == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "gpu-injector config validate: -f FILE is required, and nothing else")
		fs.Usage()
		return 2
	}
	var data []byte
	var err error
	if *file == "-" {
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(*file)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector config validate: failed to read %s: %v\n", *file, err)
		return 1
	}
	name := *file
	if name == "-" {
		name = "standard input"
	}
	verdicts, err := config.Check(data)
	if errors.Is(err, config.ErrNoConfiguration) && *file == "-" && len(strings.TrimSpace(string(data))) == 0 {
		// A pipe from helm template that failed: helm's error is the one to read.
		fmt.Fprintf(stderr, "gpu-injector config validate: standard input is empty: %v (did the command before the pipe fail?)\n", err)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-injector config validate: %s: %v\n", name, err)
		return 1
	}
	code := 0
	for _, v := range verdicts {
		where := name
		if len(v.Sources) > 0 {
			where += ": " + strings.Join(v.Sources, ", ")
		}
		switch {
		case v.Err != nil:
			fmt.Fprintf(stderr, "gpu-injector config validate: %s: %v\n", where, v.Err)
			code = 1
		case len(v.Errs) > 0:
			fmt.Fprintf(stderr, "gpu-injector config validate: %s: invalid configuration:\n", where)
			for _, e := range v.Errs {
				fmt.Fprintf(stderr, "  %v\n", e)
			}
			code = 1
		default:
			fmt.Fprintf(stdout, "%s: valid configuration\n", where)
		}
	}
	return code
}
