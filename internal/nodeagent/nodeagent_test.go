package nodeagent

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	for _, off := range []string{"", "0"} {
		if err := Serve(ctx, off, http.NotFoundHandler(), errc); err != nil {
			t.Errorf("Serve(%q) = %v, want nil: it serves nothing", off, err)
		}
	}
	// A port in use fails at once, not later on errc.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := Serve(ctx, ln.Addr().String(), http.NotFoundHandler(), errc); err == nil || !strings.Contains(err.Error(), "failed to listen") {
		t.Errorf("Serve on a port in use = %v, want a listen error", err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	if err := Serve(ctx, addr, h, errc); err != nil {
		t.Fatalf("Serve(%s) = %v", addr, err)
	}
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Errorf("body %q, want ok", b)
	}
	cancel()
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf, 1)
	log.V(1).Info("shown", "someKey", 1)
	log.V(2).Info("hidden")
	if !strings.Contains(buf.String(), `"msg":"shown"`) || !strings.Contains(buf.String(), `"someKey":1`) || strings.Contains(buf.String(), "hidden") {
		t.Errorf("log output %q: want V(1) shown with its key, V(2) hidden", buf.String())
	}
}
