package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBoundedInFlight: past maxInFlight admissions at once, a request waits
// at most queueWait and is answered 429, and a slot freed serves the next.
func TestBoundedInFlight(t *testing.T) {
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(2)
	h := bounded(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started.Done()
		<-release
	}), 2, time.Second)
	srv := httptest.NewServer(h)
	defer srv.Close()
	var done sync.WaitGroup
	for range 2 {
		done.Add(1)
		go func() {
			defer done.Done()
			resp, err := http.Post(srv.URL, "application/json", nil)
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	started.Wait()
	start := time.Now()
	resp, err := http.Post(srv.URL, "application/json", nil)
	if err != nil {
		t.Fatalf("failed to post: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "--max-in-flight") || !strings.Contains(string(body), "webhook.replicas") {
		t.Errorf("busy answer %q does not say what to change", body)
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("third request in flight: status %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if took := time.Since(start); took > 3*queueWait {
		t.Errorf("busy answer took %s", took)
	}
	close(release)
	done.Wait()
}
