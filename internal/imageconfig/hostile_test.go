package imageconfig

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// rawRegistry serves fixed answers: manifests by repository (any tag),
// blobs by digest, and whatever else handler says, with a count of the
// requests it got.
type rawRegistry struct {
	srv       *httptest.Server
	host      string
	manifests map[string][]byte
	blobs     map[string][]byte
	handler   func(w http.ResponseWriter, r *http.Request) bool
	requests  atomic.Int64
}

func newRawRegistry(t *testing.T) *rawRegistry {
	t.Helper()
	rr := &rawRegistry{manifests: map[string][]byte{}, blobs: map[string][]byte{}}
	rr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rr.requests.Add(1)
		if rr.handler != nil && rr.handler(w, r) {
			return
		}
		if r.URL.Path == "/v2/" {
			return
		}
		repo, id, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), "/manifests/")
		if ok {
			if b, found := rr.manifests[repo]; found && id != "" {
				w.Header().Set("Content-Type", string(types.OCIManifestSchema1))
				w.Write(b)
				return
			}
		}
		if _, d, ok := strings.Cut(r.URL.Path, "/blobs/"); ok {
			if b, found := rr.blobs[d]; found {
				w.Write(b)
				return
			}
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(rr.srv.Close)
	rr.host = strings.TrimPrefix(rr.srv.URL, "http://")
	return rr
}

func digestOf(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// addImage serves repo's manifest pointing at config.
func (rr *rawRegistry) addImage(repo string, config []byte, layers string) {
	d := digestOf(config)
	rr.blobs[d] = config
	rr.manifests[repo] = fmt.Appendf(nil, `{"schemaVersion":2,"mediaType":%q,"config":{"mediaType":%q,"digest":%q,"size":%d},"layers":[%s]}`,
		types.OCIManifestSchema1, types.OCIConfigJSON, d, len(config), layers)
}

func (rr *rawRegistry) reader() *Reader {
	return New(Options{
		Registries: []string{rr.host}, Insecure: []string{rr.host}, TagTTL: time.Minute,
		MaxEntries: 100, MaxBytes: 1 << 20, Platform: &v1.Platform{OS: "linux", Architecture: "amd64"},
	})
}

// emptyEntries is as many "{}" entries, comma separated, as fit in
// maxResponseBytes less room.
func emptyEntries(room int) string {
	n := (maxResponseBytes - room) / 3
	return strings.TrimSuffix(strings.Repeat("{},", n), ",")
}

// hostileShapes are answers under the 4 MiB cap that decode into hundreds
// of MiB through encoding/json and go-containerregistry's types.
func hostileShapes(rr *rawRegistry, prefix string) []string {
	// 1.4 M empty layers in a manifest.
	rr.addImage(prefix+"layers", []byte(`{"config":{}}`), emptyEntries(512))
	// 1.4 M empty history entries in a configuration.
	rr.addImage(prefix+"history", []byte(`{"config":{},"history":[`+emptyEntries(64)+`]}`), "")
	// One string of nearly 4 MiB in a field the reader skips.
	rr.addImage(prefix+"string", []byte(`{"config":{},"comment":"`+strings.Repeat("x", maxResponseBytes-64)+`"}`), "")
	return []string{prefix + "layers", prefix + "history", prefix + "string"}
}

// heapWatch samples the heap in use until stopped and gives its highest
// value above the start, and the bytes allocated meanwhile.
func heapWatch() (stop func() (peak, allocated uint64)) {
	runtime.GC()
	var start runtime.MemStats
	runtime.ReadMemStats(&start)
	var (
		mu   sync.Mutex
		peak uint64
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	sample := func() {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		mu.Lock()
		if m.HeapInuse > start.HeapInuse && m.HeapInuse-start.HeapInuse > peak {
			peak = m.HeapInuse - start.HeapInuse
		}
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
				sample()
			}
		}
	})
	return func() (uint64, uint64) {
		close(done)
		wg.Wait()
		sample()
		var end runtime.MemStats
		runtime.ReadMemStats(&end)
		return peak, end.TotalAlloc - start.TotalAlloc
	}
}

// TestHostileAnswersBounded: a manifest of 1.4 M empty layers and a
// configuration of 1.4 M empty history entries, each under the 4 MiB cap,
// are refused by count, and a read of each keeps the heap small.
func TestHostileAnswersBounded(t *testing.T) {
	rr := newRawRegistry(t)
	shapes := hostileShapes(rr, "one-")
	want := map[string]string{
		"one-layers":  "layers has more than 4096 entries",
		"one-history": "has more than 10000 entries",
		"one-string":  "",
	}
	r := rr.reader()
	for _, repo := range shapes {
		t.Run(repo, func(t *testing.T) {
			stop := heapWatch()
			_, err := read(t, r, rr.host+"/"+repo+":v1", Anonymous, 30*time.Second)
			peak, allocated := stop()
			t.Logf("%s: heap in use +%d KiB at most, %d KiB allocated", repo, peak>>10, allocated>>10)
			if w := want[repo]; w != "" && (err == nil || !strings.Contains(err.Error(), w)) {
				t.Errorf("err = %v, want %q", err, w)
			}
			if peak > 64<<20 || allocated > 64<<20 {
				t.Errorf("heap in use +%d MiB, %d MiB allocated: want both under 64 MiB", peak>>20, allocated>>20)
			}
		})
	}
}

// TestHostilePodBounded: sixteen images of one pod, each a hostile
// answer, read at once as the webhook reads a pod's images, take the
// shared bytes in flight at most, whatever each holds.
func TestHostilePodBounded(t *testing.T) {
	rr := newRawRegistry(t)
	var repos []string
	for i := range 6 {
		repos = append(repos, hostileShapes(rr, fmt.Sprintf("pod%d-", i))...)
	}
	repos = repos[:16]
	r := rr.reader()
	stop := heapWatch()
	var wg sync.WaitGroup
	errs := make([]error, len(repos))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, repo := range repos {
		wg.Go(func() { _, errs[i] = r.Read(ctx, rr.host+"/"+repo+":v1", Anonymous) })
	}
	wg.Wait()
	peak, allocated := stop()
	t.Logf("16 hostile images at once: heap in use +%d KiB at most, %d KiB allocated", peak>>10, allocated>>10)
	for i, err := range errs {
		if err == nil && !strings.HasSuffix(repos[i], "string") {
			t.Errorf("%s: read, want refused", repos[i])
		}
	}
	if peak > 128<<20 {
		t.Errorf("heap in use +%d MiB at most: want under 128 MiB", peak>>20)
	}
}

// TestBytesInFlight: answers held open past the bound fail the read that
// asks for more, and closing them gives the bytes back.
func TestBytesInFlight(t *testing.T) {
	big := bytes.Repeat([]byte("z"), 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(big) }))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	r := New(Options{Registries: []string{host}, Insecure: []string{host}})
	client := &http.Client{Transport: r.transport}
	var open []*http.Response
	defer func() {
		for _, resp := range open {
			resp.Body.Close()
		}
	}()
	var err error
	for range maxBytesInFlight>>20 + 1 {
		resp, gerr := client.Get(srv.URL)
		if gerr != nil {
			t.Fatal(gerr)
		}
		open = append(open, resp)
		buf := make([]byte, 1<<20)
		if _, err = io.ReadFull(resp.Body, buf); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrBytesInFlight) {
		t.Fatalf("reading %d MiB at once: err = %v, want ErrBytesInFlight", len(open), err)
	}
	for _, resp := range open {
		resp.Body.Close()
	}
	open = nil
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	open = append(open, resp)
	if _, err := io.ReadFull(resp.Body, make([]byte, 1<<20)); err != nil {
		t.Errorf("after closing the answers: %v, want the bytes given back", err)
	}
}

// TestReadsOnlyListedHosts: a listed registry's redirect and its token
// service's realm, on hosts not listed (localhost, by name, beside the
// listed 127.0.0.1), are refused before any request reaches them, so the
// pod's credentials go nowhere else.
func TestReadsOnlyListedHosts(t *testing.T) {
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Write([]byte(`{"token":"t"}`))
	}))
	defer other.Close()
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)
	cases := map[string]func(w http.ResponseWriter, r *http.Request) bool{
		"redirect": func(w http.ResponseWriter, r *http.Request) bool {
			if strings.Contains(r.URL.Path, "/manifests/") {
				http.Redirect(w, r, otherURL+r.URL.Path, http.StatusTemporaryRedirect)
				return true
			}
			return false
		},
		"token realm": func(w http.ResponseWriter, r *http.Request) bool {
			if r.Header.Get("Authorization") == "" {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="registry"`, otherURL+"/token"))
				w.WriteHeader(http.StatusUnauthorized)
				return true
			}
			return false
		},
	}
	for name, handler := range cases {
		t.Run(name, func(t *testing.T) {
			rr := newRawRegistry(t)
			rr.addImage("app", []byte(`{"config":{"Env":["A=1"]}}`), "")
			rr.handler = handler
			before := elsewhere.Load()
			creds := Credentials{Keychain: &staticKeychain{auth: &authn.Basic{Username: "alice", Password: "s3cret"}}, ID: "ml/regcred"}
			_, err := read(t, rr.reader(), rr.host+"/app:v1", creds, 5*time.Second)
			var he *HostError
			if !errors.As(err, &he) || !strings.HasPrefix(he.Host, "localhost:") {
				t.Errorf("err = %v, want the unlisted host refused", err)
			}
			if n := elsewhere.Load() - before; n != 0 {
				t.Errorf("the unlisted host got %d requests, want none", n)
			}
			if rr.requests.Load() == 0 {
				t.Error("the listed registry got no request: the test proves nothing")
			}
		})
	}
}

// TestRegistryTextNotQuoted: a registry's error body, its token
// service's and its JSON's bytes reach no error: only a status or the
// reader's own words.
func TestRegistryTextNotQuoted(t *testing.T) {
	const secret = "AKIAIOSFODNN7EXAMPLE-leaked"
	body := `{"errors":[{"code":"UNKNOWN","message":"` + secret + `"}]}`
	cases := map[string]func(w http.ResponseWriter, r *http.Request) bool{
		"ping": func(w http.ResponseWriter, r *http.Request) bool {
			http.Error(w, body, http.StatusInternalServerError)
			return true
		},
		"manifest": func(w http.ResponseWriter, r *http.Request) bool {
			if strings.Contains(r.URL.Path, "/manifests/") {
				http.Error(w, body, http.StatusInternalServerError)
				return true
			}
			return false
		},
		"token": func(w http.ResponseWriter, r *http.Request) bool {
			switch {
			case r.URL.Path == "/token":
				w.Write([]byte(`{"not_a_token":"` + secret + `"}`))
			case r.Header.Get("Authorization") == "":
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s/token"`, r.Host))
				w.WriteHeader(http.StatusUnauthorized)
			default:
				return false
			}
			return true
		},
		"bad JSON": func(w http.ResponseWriter, r *http.Request) bool {
			if strings.Contains(r.URL.Path, "/manifests/") {
				w.Write([]byte(`{"` + secret + `":[}`))
				return true
			}
			return false
		},
	}
	for name, handler := range cases {
		t.Run(name, func(t *testing.T) {
			rr := newRawRegistry(t)
			rr.addImage("app", []byte(`{"config":{}}`), "")
			rr.handler = handler
			_, err := read(t, rr.reader(), rr.host+"/app:v1", Anonymous, 5*time.Second)
			t.Logf("%s: %v", name, err)
			if err == nil || strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "UNKNOWN") {
				t.Errorf("err = %v, want an error without the registry's text", err)
			}
		})
	}
}
