// Command standin-node builds a fake GPU node in a folder: the project's
// stand-in NVIDIA driver (e2e/standin: real ELF libraries and an nvidia-smi,
// built with gcc, that say they are not a driver) installed in one of the
// classic layouts. `hack/gpu-cluster.sh --fake` installs it at /usr/local/nvidia
// (in a private mount namespace) to rehearse the GPU run on a machine without
// a GPU.
//
//	go run ./hack/gpu/standin-node --root DIR [--layout usr-local-nvidia] [--version 580.159.04]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpu-injector/gpu-injector/e2e/standin"
)

func main() {
	root := flag.String("root", "", "folder that stands for the node's / (required)")
	layout := flag.String("layout", string(standin.UsrLocalNvidia), fmt.Sprintf("driver layout, one of %v", standin.Layouts()))
	version := flag.String("version", "580.159.04", "driver version the stand-in reports")
	flag.Parse()
	if *root == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	abs, err := filepath.Abs(*root)
	if err != nil {
		fmt.Fprintf(os.Stderr, "standin-node: failed to resolve root: %v\n", err)
		os.Exit(1)
	}
	if err := standin.Install(abs, standin.Layout(*layout), *version); err != nil {
		fmt.Fprintf(os.Stderr, "standin-node: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "standin-node: stand-in driver %s installed in layout %s under %s\n", *version, *layout, abs)
}
