package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// FuzzCheckPayload: a signature layer's payload and annotation come from a
// downloaded layout or a registry. Whatever they hold, checkPayload must
// not panic, and must accept only a payload signed by the key that names
// the repository and digest asked for.
func FuzzCheckPayload(f *testing.F) {
	k, err := newECDSAKey()
	if err != nil {
		f.Fatal(err)
	}
	repo, _ := name.NewRepository("registry.example.com/gpu-injector")
	digest := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("d", 64)}
	good, _ := payload.Cosign{Image: repo.Digest(digest.String())}.MarshalJSON()
	goodSig, _ := signBlob(k.signer, good)
	f.Add(good, goodSig)
	f.Add(good, "")
	f.Add([]byte(`{"critical":{"type":"cosign container image signature"}}`), goodSig)
	f.Add([]byte("null"), "AAAA")
	f.Fuzz(func(t *testing.T, p []byte, sig string) {
		if err := checkPayload(p, sig, k.verifier, repo, digest); err != nil {
			return
		}
		if err := verifyBlob(k.verifier, p, sig); err != nil {
			t.Fatalf("accepted a payload whose signature does not verify: %v", err)
		}
		var c payload.SimpleContainerImage
		if err := json.Unmarshal(p, &c); err != nil || c.Critical.Image.DockerManifestDigest != digest.String() ||
			c.Critical.Identity.DockerReference != repo.Name() || c.Critical.Type != payload.CosignSignatureType {
			t.Fatalf("accepted %q", p)
		}
	})
}
