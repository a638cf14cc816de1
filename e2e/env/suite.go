package env

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// RunSuite is a suite's TestMain: it brings the environment up (what names
// it in messages), hands it to set, runs the tests and stops it, and returns
// the exit code. Ctrl-C or SIGTERM stops the environment, while it comes up
// or while the tests run (they are abandoned), so nothing is left behind.
// A failed run, or E2E_KEEP=1 (to read the logs and kubeconfigs of a
// passing one), keeps the environment's folder.
func RunSuite(m *testing.M, what string, opts Options, set func(*Env)) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	e, err := Up(ctx, opts)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "failed to bring the %s environment up: %v\n", what, err)
		return 1
	}
	set(e)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintf(os.Stderr, "interrupted: stopping the %s environment\n", what)
		e.MarkFailed()
		_ = e.Down()
		os.Exit(1)
	}()
	code := m.Run()
	signal.Stop(sig)
	if code != 0 || os.Getenv("E2E_KEEP") != "" {
		e.MarkFailed()
	}
	if err := e.Down(); err != nil {
		fmt.Fprintf(os.Stderr, "failed to stop the %s environment: %v\n", what, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
