package server

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
)

// TestCloseWhileDrainingMovesClients: over a real TLS connection, a client
// keeps reusing one connection until the replica drains; the first answer
// while draining makes it dial a new one, and no request fails meanwhile.
// Over HTTP/1.1 keep-alive, which is how the API server calls a webhook
// behind a Service (it sets NextProtos to http/1.1 so that its calls spread
// over the replicas), and over HTTP/2, which it speaks to a webhook URL on
// loopback and other clients may.
func TestCloseWhileDrainingMovesClients(t *testing.T) {
	for proto, http2 := range map[string]bool{"HTTP/1.1": false, "HTTP/2.0": true} {
		t.Run(proto, func(t *testing.T) { testCloseWhileDraining(t, proto, http2) })
	}
}

func testCloseWhileDraining(t *testing.T, wantProto string, http2 bool) {
	var draining atomic.Bool
	srv := httptest.NewUnstartedServer(closeWhileDraining(&draining, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"allowed":true}`))
	})))
	srv.EnableHTTP2 = http2
	srv.StartTLS()
	defer srv.Close()
	client := srv.Client()
	if !http2 {
		tr := client.Transport.(*http.Transport)
		tr.ForceAttemptHTTP2 = false
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}

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

	if proto, _ := post(); proto != wantProto {
		t.Fatalf("protocol %s, want %s", proto, wantProto)
	}
	if _, reused := post(); !reused {
		t.Fatal("a serving replica's connection was not reused")
	}
	draining.Store(true)
	// This answer carries "Connection: close": HTTP/1.1 closes the
	// connection after it, HTTP/2 sends a graceful GOAWAY; either way the
	// connection is gone for new requests once the client has read it.
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
