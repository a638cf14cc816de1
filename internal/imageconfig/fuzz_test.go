package imageconfig

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

// FuzzDecodeConfig: the configuration decoder stays within its bounds,
// and what it accepts, encoding/json (which runtimes use) reads the same.
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{
		`{"config":{"Env":["PATH=/usr/bin","LD_LIBRARY_PATH=/opt/lib"],"Labels":{"a":"b"}},"history":[{}]}`,
		`{"config":{"env":null,"labels":{"a":null}}}`,
		`{"Config":{"Env":["A=1"],"Env":["B=2"],"Labels":{"a":"1"},"Labels":{"b":"2"}}}`,
		`{"config":{},"rootfs":{"diff_ids":[[[[]]]]}}`,
		`{"config":{"Env":[1]}}`,
		`{"config":{}} x`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeConfig(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(c.Env) > maxEnv || len(c.Labels) > maxLabels {
			t.Fatalf("%d env, %d labels: past the bounds", len(c.Env), len(c.Labels))
		}
		var std struct {
			Config struct {
				Env    []string
				Labels map[string]string
			}
		}
		if json.Unmarshal(b, &std) != nil {
			return
		}
		if !slices.Equal(c.Env, std.Config.Env) || !maps.Equal(c.Labels, std.Config.Labels) {
			t.Fatalf("decoded %q %q, encoding/json %q %q", c.Env, c.Labels, std.Config.Env, std.Config.Labels)
		}
	})
}

// FuzzDecodeManifest: the manifest decoder stays within its bounds, and
// agrees with encoding/json on what it accepts.
func FuzzDecodeManifest(f *testing.F) {
	for _, s := range []string{
		`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":2},"layers":[{},{}]}`,
		`{"manifests":[{"digest":"sha256:00","size":1,"platform":{"os":"linux","architecture":"amd64","variant":"v8"}}]}`,
		`{"manifests":null,"layers":null,"config":null}`,
		`{"config":{"size":1e3}}`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeManifest(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(m.Manifests) > maxIndexManifests || m.Layers > maxLayers {
			t.Fatalf("%d manifests, %d layers: past the bounds", len(m.Manifests), m.Layers)
		}
		type platform struct{ OS, Architecture, Variant string }
		type desc struct {
			MediaType, Digest string
			Size              int64
			Platform          *platform
		}
		var std struct {
			MediaType string
			Config    desc
			Manifests []desc
			Layers    []json.RawMessage
		}
		if json.Unmarshal(b, &std) != nil {
			return
		}
		if m.MediaType != std.MediaType || m.Config.Digest != std.Config.Digest || m.Config.Size != std.Config.Size ||
			len(m.Manifests) != len(std.Manifests) || m.Layers != len(std.Layers) {
			t.Fatalf("decoded %+v, encoding/json %+v", m, std)
		}
		for i, d := range std.Manifests {
			got := m.Manifests[i]
			if d.Platform == nil {
				d.Platform = &platform{}
			}
			if got.Digest != d.Digest || got.OS != d.Platform.OS || got.Arch != d.Platform.Architecture || got.Variant != d.Platform.Variant {
				t.Fatalf("manifest %d: decoded %+v, encoding/json %+v", i, got, d)
			}
		}
	})
}
