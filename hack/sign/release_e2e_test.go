//go:build e2e

package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

// krewPlugin is the part of krew's plugin manifest that install reads.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		ShortDescription string `json:"shortDescription"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			SHA256 string `json:"sha256"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
			Bin string `json:"bin"`
		} `json:"platforms"`
	} `json:"spec"`
}

// TestRelease runs hack/release.sh with a key made for the test, as
// maintainers run it with theirs, for the chart and this machine's
// command-line archive; the other three platforms are the same build for
// another GOOS/GOARCH, the image is hack/image's and its signature is
// TestImageLayout's. The archive's binary must print the release's version,
// alone and as kubectl's plugin; the krew manifest must name the archive and
// its digest; the signatures must verify as cosign verifies them, and a
// tampered chart must not. It runs with the e2e suite: built without cgo,
// the archive compiles the dependency tree a second time.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a release")
	}
	cache, err := cluster.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cache, "helm-"+cluster.HelmVersion, "helm")); err != nil {
		t.Skipf("helm is not built (hack/tools.sh helm): %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	k := cosignKey(t)
	keyFile := filepath.Join(t.TempDir(), "cosign.key")
	if err := os.WriteFile(keyFile, k.priv, 0o600); err != nil {
		t.Fatal(err)
	}
	const v, url = "9.8.7-rc.2", "https://downloads.example.com/gpu-injector/v9.8.7-rc.2"
	platform := runtime.GOOS + "/" + runtime.GOARCH
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "release.sh"), "--out", out, "--key", keyFile,
		"--platforms", platform, "--skip-image", "--skip-sbom", "v"+v)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD="+testPassword, "RELEASE_URL="+url+"/", "COSIGN_KEY=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, b)
	}

	archive := "gpu-injector-" + v + "-" + runtime.GOOS + "-" + runtime.GOARCH + ".tar.gz"
	bin := unpackBinary(t, filepath.Join(out, archive))
	if runtime.GOOS == "linux" {
		assertStatic(t, bin)
	}
	plugin := filepath.Join(filepath.Dir(bin), "kubectl-gpu_injector")
	if err := os.Symlink(bin, plugin); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{bin, plugin} {
		got, err := exec.Command(b, "version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(got), "v"+v) {
			t.Errorf("%s version = %q, %v; want v%s", filepath.Base(b), got, err, v)
		}
	}
	// kubectl gpu-injector -h is status's help.
	if got, err := exec.Command(plugin, "-h").CombinedOutput(); err != nil || !strings.Contains(string(got), "gpu-injector status") {
		t.Errorf("kubectl-gpu_injector -h = %q, %v; want status's help", got, err)
	}

	checkKrewManifest(t, filepath.Join(out, "gpu-injector.yaml"), "v"+v, url+"/"+archive, sha256File(t, filepath.Join(out, archive)))
	sums := checkSums(t, out)
	for _, f := range []string{"gpu-injector-" + v + ".tgz", archive, "gpu-injector.yaml", "gpu-injector-" + v + ".tgz.sig"} {
		if _, ok := sums[f]; !ok {
			t.Errorf("SHA256SUMS lacks %s", f)
		}
	}

	for _, f := range []string{"SHA256SUMS", "gpu-injector-" + v + ".tgz"} {
		if err := verifyFile(k.verifier, "", filepath.Join(out, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	chart := filepath.Join(out, "gpu-injector-"+v+".tgz")
	b, err := os.ReadFile(chart)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(chart, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := verifyFile(k.verifier, "", chart); err == nil {
		t.Error("a tampered chart verified")
	}
	if sha256File(t, chart) == sums[filepath.Base(chart)] {
		t.Error("a tampered chart matches SHA256SUMS")
	}
	if err := verifyFile(otherKey(t).verifier, "", filepath.Join(out, "SHA256SUMS")); err == nil {
		t.Error("SHA256SUMS verified with another key")
	}
}

func unpackBinary(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	bin := filepath.Join(t.TempDir(), "gpu-injector")
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name != "gpu-injector" || h.Mode&0o111 == 0 || h.Uid != 0 || h.Uname != "" {
			t.Errorf("archive entry %s mode %o uid %d %q: want gpu-injector alone, executable, owned by 0", h.Name, h.Mode, h.Uid, h.Uname)
			continue
		}
		w, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(w, tr); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	if len(names) != 1 {
		t.Fatalf("%s holds %v, want gpu-injector alone", archive, names)
	}
	return bin
}

// assertStatic: built without cgo, the binary needs no dynamic loader, so
// it runs on any distribution (and on macOS, which has no glibc).
func assertStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has a dynamic loader: it was built with cgo", bin)
		}
	}
}

func checkKrewManifest(t *testing.T, file, version, uri, sum string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	if err := yaml.Unmarshal(b, &p); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "gpu-injector" ||
		p.Spec.Version != version || p.Spec.ShortDescription == "" || strings.Contains(p.Spec.ShortDescription, "\n") {
		t.Errorf("krew manifest header: %+v", p)
	}
	if len(p.Spec.Platforms) != 1 {
		t.Fatalf("krew manifest has %d platforms, want 1: %s", len(p.Spec.Platforms), b)
	}
	pl := p.Spec.Platforms[0]
	want := map[string]string{"os": runtime.GOOS, "arch": runtime.GOARCH}
	if pl.Selector.MatchLabels["os"] != want["os"] || pl.Selector.MatchLabels["arch"] != want["arch"] || len(pl.Selector.MatchLabels) != 2 {
		t.Errorf("selector %v, want %v", pl.Selector.MatchLabels, want)
	}
	if pl.URI != uri || pl.SHA256 != sum || pl.Bin != "gpu-injector" || len(pl.Files) != 1 || pl.Files[0].From != "gpu-injector" || pl.Files[0].To != "." {
		t.Errorf("platform %+v; want uri %s sha256 %s bin gpu-injector", pl, uri, sum)
	}
}

// checkSums checks every line of SHA256SUMS against its file, as
// `sha256sum -c` does, and that it lists every file but its own signature.
func checkSums(t *testing.T, dir string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	sums := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		sum, f, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		sums[f] = sum
		if got := sha256File(t, filepath.Join(dir, f)); got != sum {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %s", f, got, sum)
		}
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if _, ok := sums[e.Name()]; !ok && e.Name() != "SHA256SUMS" && e.Name() != "SHA256SUMS.sig" {
			t.Errorf("SHA256SUMS lacks %s", e.Name())
		}
	}
	return sums
}

func sha256File(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
