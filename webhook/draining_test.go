package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
)

// TestCloseWhileDrainingMovesHTTP2Clients: over a real TLS connection with
// HTTP/2, as the API server calls the webhook, a client keeps reusing one
// connection until the replica drains; the first answer while draining
// makes it dial a new one, and no request fails meanwhile.
func TestCloseWhileDrainingMovesHTTP2Clients(t *testing.T) {
	var draining atomic.Bool
	srv := httptest.NewUnstartedServer(closeWhileDraining(&draining, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"allowed":true}`))
	})))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()

	var conns []string
	post := func() (proto string, reused bool) {
		t.Helper()
		var got httptrace.GotConnInfo
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { got = i }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost, srv.URL, strings.NewReader(`{"kind":"AdmissionReview"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("request failed: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d", resp.StatusCode)
		}
		conns = append(conns, got.Conn.LocalAddr().String())
		return resp.Proto, got.Reused
	}

	if proto, _ := post(); proto != "HTTP/2.0" {
		t.Fatalf("protocol %s, want HTTP/2.0", proto)
	}
	if _, reused := post(); !reused {
		t.Fatal("a serving replica's connection was not reused")
	}
	draining.Store(true)
	// This answer carries the GOAWAY; the connection is gone for new
	// requests once the client has read it.
	post()
	_, reused := post()
	if reused || conns[3] == conns[0] {
		t.Errorf("the client kept the draining replica's connection: connections %v", conns)
	}
	// A serving replica's answers do not close anything.
	draining.Store(false)
	post()
	if _, reused := post(); !reused {
		t.Error("after draining ended, the new connection was not reused")
	}
}
