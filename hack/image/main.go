// Command image builds gpu-injector's container image without a Docker
// engine, with go-containerregistry: the cgo binary, the glibc files it links
// (it loads the host's NVML with dlopen), nothing else, for linux/amd64 and
// linux/arm64. It writes the image index as an OCI image layout (a folder, a
// tar of it, or both), pushes it to a registry, and writes this machine's
// platform as a docker-archive tar for the machines that import images
// (`ctr images import`, `docker load`, `kind load image-archive`).
//
//	go run ./hack/image                                # make image
//	go run ./hack/image -o= -oci= -push 127.0.0.1:5000/gpu-injector:0.1.0
//
// Equal sources give equal digests: timestamps are SOURCE_DATE_EPOCH's (the
// Unix epoch when unset) and every archive's entries are sorted.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var o Options
	flag.StringVar(&o.Archive, "o", "_output/gpu-injector-image.tar", "where to write the image of this machine's platform as a docker-archive tar; empty skips it")
	flag.StringVar(&o.OCITar, "oci", "_output/gpu-injector-image-oci.tar", "where to write the image index as a tar of an OCI image layout; empty skips it")
	flag.StringVar(&o.Layout, "layout", "", "where to write the image index as an OCI image layout folder (replaced if it holds one); empty skips it")
	flag.StringVar(&o.Push, "push", "", "push the image index to this reference (registry/repository:tag), with the credentials of ~/.docker/config.json; loopback and private addresses speak plain HTTP")
	flag.BoolVar(&o.Insecure, "insecure", false, "with -push: plain HTTP to any registry")
	flag.StringVar(&o.DigestFile, "digest-file", "", "write the image index's digest (sha256:...) to this file")
	platformList := flag.String("platforms", "linux/amd64,linux/arm64", "platforms of the image index (-oci, -layout, -push)")
	flag.StringVar(&o.Ref, "ref", "", "image reference the archives name (default ghcr.io/gpu-injector/gpu-injector:<chart appVersion>)")
	flag.StringVar(&o.Version, "version", "", "version stamped in the binary (default: v<the chart's appVersion>)")
	flag.Parse()

	appVersion, err := chartAppVersion("charts/gpu-injector/Chart.yaml")
	if err != nil {
		return err
	}
	if o.Ref == "" {
		o.Ref = "ghcr.io/gpu-injector/gpu-injector:" + appVersion
	}
	if o.Version == "" {
		o.Version = "v" + appVersion
	}
	for _, p := range strings.Split(*platformList, ",") {
		goos, arch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos != "linux" {
			return fmt.Errorf("-platforms: %q is not linux/<arch>", p)
		}
		o.Archs = append(o.Archs, arch)
	}
	if o.Created, err = sourceDateEpoch(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	_, err = Build(ctx, o)
	return err
}

// sourceDateEpoch is the time of every timestamp in the image: the
// SOURCE_DATE_EPOCH convention of reproducible builds, the Unix epoch when unset.
func sourceDateEpoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q is not seconds since the epoch: %w", v, err)
	}
	return time.Unix(n, 0).UTC(), nil
}

func chartAppVersion(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("failed to read %s: %w", file, err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "appVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`), nil
		}
	}
	return "", fmt.Errorf("no appVersion in %s", file)
}
