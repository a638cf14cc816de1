// Command nvidia-device-plugin-image writes the image of NVIDIA's device
// plugin that the e2e suite runs (deviceplugin.Image: the binary hack/tools.sh
// built and the glibc it links) as a docker-archive tar, for a cluster that
// imports it, such as the GPU machine's (hack/gpu-cluster.sh --build).
//
//	go run ./e2e/deviceplugin/cmd/nvidia-device-plugin-image -o nvidia-device-plugin.tar
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
	"github.com/gpu-injector/gpu-injector/e2e/deviceplugin"
)

func main() {
	out := flag.String("o", "", "the docker-archive tar to write (required)")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-device-plugin-image:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	cache, err := cluster.CacheDir()
	if err != nil {
		return err
	}
	bin, err := deviceplugin.Binary(cache)
	if err != nil {
		return err
	}
	files, err := deviceplugin.ImageFiles(bin)
	if err != nil {
		return err
	}
	if err := cluster.WriteImage(out, deviceplugin.Image, files, cluster.ImageConfig{Env: deviceplugin.ImageEnv}); err != nil {
		return fmt.Errorf("failed to write the image: %w", err)
	}
	fmt.Printf("%s: %s\n", out, deviceplugin.Image)
	return nil
}
