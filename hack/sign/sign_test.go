package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/gpu-injector/gpu-injector/hack/ociimage"
	"github.com/sigstore/sigstore/pkg/signature"
)

// testKey is a key pair as `cosign generate-key-pair` writes it, loaded.
type testKey struct {
	priv, pub []byte
	signer    signature.SignerVerifier
	verifier  signature.Verifier
}

const testPassword = "correct horse"

// sharedKey is made once: scrypt makes each encryption and decryption cost
// a fraction of a second and 64 MiB, by design.
var sharedKey = sync.OnceValues(func() (testKey, error) {
	priv, pub, err := generateKeyPair([]byte(testPassword))
	if err != nil {
		return testKey{}, err
	}
	s, err := loadSigner(priv, []byte(testPassword))
	if err != nil {
		return testKey{}, err
	}
	v, err := loadVerifier(pub)
	return testKey{priv: priv, pub: pub, signer: s, verifier: v}, err
})

func cosignKey(t *testing.T) testKey {
	t.Helper()
	k, err := sharedKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// otherKey is someone else's key, unencrypted.
func otherKey(t *testing.T) testKey {
	t.Helper()
	k, err := newECDSAKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newECDSAKey() (testKey, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return testKey{}, err
	}
	sv, err := signature.LoadECDSASignerVerifier(priv, crypto.SHA256)
	return testKey{signer: sv, verifier: sv}, err
}

func TestKeyFormat(t *testing.T) {
	k := cosignKey(t)
	p, _ := pem.Decode(k.priv)
	if p == nil || p.Type != sigstorePrivateKeyPEM || !bytes.Contains(p.Bytes, []byte(`"scrypt"`)) || !bytes.Contains(p.Bytes, []byte(`"nacl/secretbox"`)) {
		t.Fatalf("the private key is not cosign's encrypted format:\n%s", k.priv)
	}
	if _, err := loadSigner(k.priv, []byte("wrong")); err == nil || !strings.Contains(err.Error(), "decrypt") {
		t.Errorf("a wrong password = %v, want a decryption error", err)
	}
	// Keys of cosign releases before the SIGSTORE type still load.
	old := pem.EncodeToMemory(&pem.Block{Type: cosignPrivateKeyPEM, Bytes: p.Bytes})
	if _, err := loadSigner(old, []byte(testPassword)); err != nil {
		t.Errorf("%s: %v", cosignPrivateKeyPEM, err)
	}
	if _, err := loadSigner(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p.Bytes}), nil); err == nil {
		t.Error("an unencrypted PEM type was accepted")
	}
	pub, err := publicPEM(k.signer)
	if err != nil || !bytes.Equal(pub, k.pub) {
		t.Errorf("public-key = %s, %v; want %s", pub, err, k.pub)
	}
	t.Setenv("RELEASE_TEST_KEY", string(k.priv))
	if got, err := readKeyRef("env://RELEASE_TEST_KEY"); err != nil || !bytes.Equal(got, k.priv) {
		t.Errorf("env://: %v", err)
	}
	if _, err := readKeyRef("env://RELEASE_TEST_UNSET"); err == nil {
		t.Error("an unset env:// key was read")
	}
}

func TestBlob(t *testing.T) {
	k, other := cosignKey(t), otherKey(t)
	data := []byte("a chart's bytes\n")
	sig, err := signBlob(k.signer, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyBlob(k.verifier, data, sig+"\n"); err != nil {
		t.Errorf("own signature: %v", err)
	}
	for name, tc := range map[string]struct {
		v    signature.Verifier
		data []byte
		sig  string
	}{
		"tampered file":  {k.verifier, []byte("a chart's bytes!\n"), sig},
		"another key":    {other.verifier, data, sig},
		"not base64":     {k.verifier, data, "%%%"},
		"empty":          {k.verifier, data, ""},
		"truncated":      {k.verifier, data, sig[:len(sig)/2]},
		"other sig blob": {k.verifier, data, mustSign(t, k.signer, []byte("other"))},
	} {
		if err := verifyBlob(tc.v, tc.data, tc.sig); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

func mustSign(t *testing.T, s signature.Signer, data []byte) string {
	t.Helper()
	sig, err := signBlob(s, data)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// writeIndexTar writes a two-platform index as hack/image writes the
// release's layout tar.
func writeIndexTar(t *testing.T, file string) v1.Hash {
	t.Helper()
	idx, err := random.Index(256, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	top := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: idx, Descriptor: v1.Descriptor{Annotations: map[string]string{
		"io.containerd.image.name":          "registry.example.com/gpu-injector:1.2.3",
		"org.opencontainers.image.ref.name": "1.2.3",
	}}})
	dir := filepath.Join(t.TempDir(), "layout")
	if _, err := layout.Write(dir, top); err != nil {
		t.Fatal(err)
	}
	if err := ociimage.WriteLayoutTar(dir, file); err != nil {
		t.Fatal(err)
	}
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestImageLayout(t *testing.T) {
	k, other := cosignKey(t), otherKey(t)
	repo, _ := name.NewRepository("registry.example.com/gpu-injector")
	tarFile := filepath.Join(t.TempDir(), "image.oci.tar")
	digest := writeIndexTar(t, tarFile)
	keyFile := filepath.Join(t.TempDir(), "cosign.key")
	if err := os.WriteFile(keyFile, k.priv, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := signImage(context.Background(), keyFile, []byte(testPassword), repo, tarFile, false); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := untar(tarFile, dir); err != nil {
		t.Fatal(err)
	}
	got, err := verifyLayout(dir, k.verifier, repo)
	if err != nil || got != digest {
		t.Fatalf("verifyLayout = %v, %v; want %v", got, err, digest)
	}

	// The layout is `cosign save`'s: the index marked imageIndex with its
	// names kept, the signature marked sigs and named by cosign's tag.
	top, _ := layout.Path(dir).ImageIndex()
	m, _ := top.IndexManifest()
	kinds := map[string]map[string]string{}
	for _, d := range m.Manifests {
		kinds[d.Annotations[kindAnnotation]] = d.Annotations
	}
	if a := kinds[kindImageIndex]; a == nil || a[refNameAnnotation] != "1.2.3" || a["io.containerd.image.name"] == "" {
		t.Errorf("index entry: %v", kinds)
	}
	if a := kinds[kindSignatures]; len(m.Manifests) != 2 || a == nil || a[refNameAnnotation] != "sha256-"+digest.Hex+".sig" {
		t.Errorf("signature entry: %v", kinds)
	}
	// cosign's payload, byte for byte as cosign writes it.
	sigImg, _ := top.Image(m.Manifests[1].Digest)
	layers, _ := sigImg.Layers()
	rc, _ := layers[0].Compressed()
	var p bytes.Buffer
	_, _ = p.ReadFrom(rc)
	want := `{"critical":{"identity":{"docker-reference":"registry.example.com/gpu-injector"},"image":{"docker-manifest-digest":"` + digest.String() + `"},"type":"cosign container image signature"},"optional":null}`
	if p.String() != want {
		t.Errorf("payload:\n%s\nwant\n%s", p.String(), want)
	}

	elsewhere, _ := name.NewRepository("evil.example.com/gpu-injector")
	if _, err := verifyLayout(dir, other.verifier, repo); err == nil {
		t.Error("verified with another key")
	}
	if _, err := verifyLayout(dir, k.verifier, elsewhere); err == nil {
		t.Error("verified for another repository")
	}
	// Signed twice: the earlier signature is replaced, not kept beside.
	if err := signImage(context.Background(), keyFile, []byte(testPassword), repo, tarFile, false); err != nil {
		t.Fatal(err)
	}
	dir2 := t.TempDir()
	if err := untar(tarFile, dir2); err != nil {
		t.Fatal(err)
	}
	top2, _ := layout.Path(dir2).ImageIndex()
	if m2, _ := top2.IndexManifest(); len(m2.Manifests) != 2 {
		t.Errorf("signed twice: %d entries, want 2", len(m2.Manifests))
	}
}

func TestSignatureForAnotherDigest(t *testing.T) {
	k := cosignKey(t)
	repo, _ := name.NewRepository("registry.example.com/gpu-injector")
	a, b := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("a", 64)}, v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("b", 64)}
	sig, err := signatureImage(k.signer, repo, a)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifySignatureImage(sig, k.verifier, repo, a); err != nil {
		t.Errorf("own digest: %v", err)
	}
	if err := verifySignatureImage(sig, k.verifier, repo, b); err == nil {
		t.Error("a signature of one digest verified another")
	}
}

// TestPushSignature pushes the signature to a registry and reads it back
// from where cosign looks: REPO:sha256-<hex>.sig.
func TestPushSignature(t *testing.T) {
	k := cosignKey(t)
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	repo, err := name.NewRepository(u.Host+"/gpu-injector", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	digest := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("c", 64)}
	sig, err := signatureImage(k.signer, repo, digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := pushSignature(context.Background(), repo, digest, sig); err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Image(repo.Tag("sha256-" + digest.Hex + ".sig"))
	if err != nil {
		t.Fatal(err)
	}
	if err := verifySignatureImage(pulled, k.verifier, repo, digest); err != nil {
		t.Error(err)
	}
}

func TestUntarRefusesEscapes(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	writeTarEntry(t, &buf, "../outside")
	f := filepath.Join(dir, "bad.tar")
	if err := os.WriteFile(f, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := untar(f, filepath.Join(dir, "out")); err == nil || !strings.Contains(err.Error(), "leaves the folder") {
		t.Errorf("untar = %v, want a refusal", err)
	}
}

func writeTarEntry(t *testing.T, w *bytes.Buffer, entry string) {
	t.Helper()
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: entry, Mode: 0o644, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCosignWrittenKey(t *testing.T) {
	priv, err := os.ReadFile("testdata/cosign-generated.key")
	if err != nil {
		t.Fatal(err)
	}
	s, err := loadSigner(priv, []byte("hello"))
	if err != nil {
		t.Fatalf("a key cosign wrote: %v", err)
	}
	pub, err := publicPEM(s)
	if err != nil {
		t.Fatal(err)
	}
	v, err := loadVerifier(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyBlob(v, []byte("SHA256SUMS"), mustSign(t, s, []byte("SHA256SUMS"))); err != nil {
		t.Error(err)
	}
}
