package main

import (
	"context"
	"debug/elf"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpu-injector/gpu-injector/e2e/cluster"
)

// TestPushPull pushes the index to the distribution registry of
// hack/tools.sh on loopback, as the e2e environment and hack/release.sh
// --push do, then pulls it back as a node of each platform would (the
// index's manifest for linux/<arch>) and checks the binary's ELF machine.
func TestPushPull(t *testing.T) {
	cache, err := cluster.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.FindRegistry(cache); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reg, err := cluster.StartRegistry(ctx, cache, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	archs := testArchs(t)
	target := reg.Host + "/gpu-injector:test"
	res, err := Build(ctx, Options{Ref: testRef, Version: "v0.0.0-test", Archs: archs, Created: time.Unix(0, 0).UTC(),
		Push: target, DigestFile: filepath.Join(t.TempDir(), "digest")})
	if err != nil {
		t.Fatal(err)
	}
	built, _ := res.Index.Digest()

	ref, err := name.ParseReference(target)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if pulled, _ := idx.Digest(); pulled != built {
		t.Errorf("the registry serves index %s, pushed %s", pulled, built)
	}
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	for _, arch := range archs {
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithPlatform(v1.Platform{OS: "linux", Architecture: arch}))
		if err != nil {
			t.Fatalf("pull linux/%s: %v", arch, err)
		}
		root := filepath.Join(t.TempDir(), arch)
		unpackImage(t, img, root)
		f, err := elf.Open(filepath.Join(root, binaryPath))
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != machines[arch] {
			t.Errorf("linux/%s pulled a %s binary", arch, f.Machine)
		}
		f.Close()
		d, _ := img.Digest()
		t.Logf("linux/%s: %s, binary %s", arch, d, f.Machine)
	}
}
