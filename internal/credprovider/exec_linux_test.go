package credprovider

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTimeoutStopsPluginChildren: a plugin stopped at its timeout takes
// down the children it started, which would otherwise run on in the
// webhook's container and hold the plugin's stdout open.
func TestTimeoutStopsPluginChildren(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	env := map[string]string{"FAKE_MODE": "fork", "FAKE_PIDFILE": pidFile}
	n := newFakeNode(t, fakeProvider{name: "forking", matchImages: []string{"r.example.com"}, env: env})
	k := n.load(t, Options{Timeout: time.Second})
	if got := resolve(t, k, "r.example.com/app"); got != "" {
		t.Fatalf("credentials %q from a plugin that timed out", got)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the plugin did not start its child: %v", err)
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		// Gone, or dead and waiting for its new parent to reap it.
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin's child %d still runs after the plugin's timeout: %s", pid, stat)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
