// Package nodeagent is what gpu-injector's two agents on every node, the
// probe and the NRI plugin, run alike: their log format and their health and
// metrics listeners.
package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger logs JSON lines to w; verbosity v shows V(v) and below.
func NewLogger(w io.Writer, verbosity int) logr.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), zapcore.Level(-verbosity))
	return zapr.NewLogger(zap.New(core))
}

// Serve listens now, so a bad address fails the caller at once, and serves h
// until ctx ends; a later failure is sent on errc. An address of "" or "0"
// serves nothing.
func Serve(ctx context.Context, addr string, h http.Handler, errc chan<- error) error {
	if addr == "" || addr == "0" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("failed to listen on %q: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("failed to serve on %q: %w", addr, err)
		}
	}()
	return nil
}
