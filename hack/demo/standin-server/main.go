// Command standin-server is what the demo's tensorflow-style Deployment runs
// in place of TensorFlow, which this machine cannot run: it runs cuda-check
// once (loading libcuda.so.1 exactly as a CUDA program does), writes its
// output to the log, and serves that output over HTTP so the Service has
// something to answer with. It is built static: the image holds only it,
// cuda-check, glibc and the loader, and no driver file.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

const banner = "tensorflow-style stand-in: no TensorFlow in this image; cuda-check said:\n"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "standin-server:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", ":8888", "address to serve cuda-check's output on")
	check := flag.String("cuda-check", "/usr/bin/cuda-check", "the cuda-check program")
	flag.Parse()

	var out bytes.Buffer
	cmd := exec.Command(*check)
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	report := banner + out.String()
	if runErr != nil {
		report += fmt.Sprintf("cuda-check failed: %v\n", runErr)
	}
	fmt.Print(report)
	// A pod that cannot load the driver must not look healthy: crash, and
	// let the Deployment's restarts show it.
	if runErr != nil {
		return fmt.Errorf("cuda-check failed: %w", runErr)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(report))
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	fmt.Printf("serving this on %s\n", *listen)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("failed to serve on %s: %w", *listen, err)
	}
	return nil
}
