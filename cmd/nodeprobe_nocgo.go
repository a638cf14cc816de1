//go:build !cgo

package cmd

import (
	"context"
	"errors"
	"io"
)

// NodeProbe needs NVML, which go-nvml reaches only through cgo. A build
// without cgo (the release's command-line archives, which also run on macOS)
// has every command but this one; the node agent runs from the image.
func NodeProbe(context.Context, []string, io.Writer, io.Writer) error {
	return errors.New("this build has no NVML (built with CGO_ENABLED=0): nodeprobe runs from the gpu-injector image, whose binary is built with cgo")
}
