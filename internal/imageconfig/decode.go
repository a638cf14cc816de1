package imageconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// A registry's answer is decoded as a stream of tokens, keeping only the
// fields the reader uses: a field it skips builds nothing, and every array
// or object, kept or skipped, is refused past a count. An answer under the
// size cap can still hold a million empty entries, and encoding/json into
// go-containerregistry's types would build each of them before anything
// could count them.
const (
	// maxIndexManifests bounds an index's manifests: a multi-platform
	// image has one per platform and one attestation per platform.
	maxIndexManifests = 1024
	// maxLayers bounds a manifest's layers, which are counted, not kept:
	// Docker refuses more than 127, and no runtime pulls thousands.
	maxLayers = 4096
	// maxEnv and maxLabels bound the configuration's ENV and labels, in
	// entries; MaxFactsBytes bounds them in bytes.
	maxEnv    = 4096
	maxLabels = 4096
	// maxSkippedElements bounds any array or object in a field the reader
	// skips (history, rootfs.diff_ids, annotations): one per layer at most
	// in an honest answer.
	maxSkippedElements = 10000
	// maxDepth bounds nesting: json.Decoder keeps a stack entry per level.
	maxDepth = 64
)

// descriptor is what the reader uses of an OCI descriptor.
type descriptor struct {
	MediaType string
	Digest    string
	Size      int64
	OS        string
	Arch      string
	Variant   string
}

// manifest is what the reader uses of a manifest or an index.
type manifest struct {
	MediaType string
	Config    descriptor
	// Manifests are an index's; HasManifests says the field was there.
	Manifests    []descriptor
	HasManifests bool
	// Layers is the count of the manifest's layers.
	Layers int
}

// config is what the reader uses of an image's configuration.
type config struct {
	Env    []string
	Labels map[string]string
}

// walker reads one JSON value from a stream, token by token, within the
// bounds above.
type walker struct {
	dec   *json.Decoder
	depth int
}

func newWalker(r io.Reader) *walker {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	return &walker{dec: dec}
}

func (w *walker) token() (json.Token, error) {
	t, err := w.dec.Token()
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			// The message quotes the answer's bytes; the offset says enough.
			return nil, fmt.Errorf("invalid JSON at byte %d", se.Offset)
		}
		if errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return t, nil
}

// end refuses anything but white space after the value, as json.Unmarshal
// does, which runtimes decode the same bytes with.
func (w *walker) end() error {
	if _, err := w.dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON value")
	}
	return nil
}

// composite reads an object (open '{') or an array (open '['), or null,
// calling each for every member (with its key; "" in an array), and refuses
// more than limit members. It reports whether the value was null.
func (w *walker) composite(path string, open json.Delim, limit int, each func(key string) error) (null bool, err error) {
	t, err := w.token()
	if err != nil {
		return false, fmt.Errorf("failed to read %s: %w", path, err)
	}
	if t == nil {
		return true, nil
	}
	if d, ok := t.(json.Delim); !ok || d != open {
		kind := "an object"
		if open == '[' {
			kind = "an array"
		}
		return false, fmt.Errorf("%s is not %s", path, kind)
	}
	return false, w.members(path, open, limit, each)
}

func (w *walker) members(path string, open json.Delim, limit int, each func(key string) error) error {
	if w.depth++; w.depth > maxDepth {
		return fmt.Errorf("%s is nested more than %d deep", path, maxDepth)
	}
	defer func() { w.depth-- }()
	for n := 0; w.dec.More(); n++ {
		if n >= limit {
			return fmt.Errorf("%s has more than %d entries", path, limit)
		}
		key := ""
		if open == '{' {
			t, err := w.token()
			if err != nil {
				return fmt.Errorf("failed to read %s: %w", path, err)
			}
			key, _ = t.(string)
		}
		if err := each(key); err != nil {
			return err
		}
	}
	if _, err := w.token(); err != nil { // the closing delimiter
		return fmt.Errorf("failed to read %s: %w", path, err)
	}
	return nil
}

// skip reads a value the reader does not use, building nothing of it.
func (w *walker) skip(path string) error {
	t, err := w.token()
	if err != nil {
		return fmt.Errorf("failed to read %s: %w", path, err)
	}
	d, ok := t.(json.Delim)
	if !ok {
		return nil
	}
	return w.members(path, d, maxSkippedElements, func(string) error { return w.skip(path) })
}

// str reads a string, or null as "" (as encoding/json leaves a string).
func (w *walker) str(path string) (string, error) {
	t, err := w.token()
	if err != nil {
		return "", fmt.Errorf("failed to read %s: %w", path, err)
	}
	switch t := t.(type) {
	case nil:
		return "", nil
	case string:
		return t, nil
	}
	return "", fmt.Errorf("%s is not a string", path)
}

func (w *walker) int64(path string) (int64, error) {
	t, err := w.token()
	if err != nil {
		return 0, fmt.Errorf("failed to read %s: %w", path, err)
	}
	switch t := t.(type) {
	case nil:
		return 0, nil
	case json.Number:
		n, err := t.Int64()
		if err != nil {
			return 0, fmt.Errorf("%s is not an integer", path)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s is not a number", path)
}

// field is a key as encoding/json matches it to a struct field: without
// regard to case.
func field(key, name string) bool { return strings.EqualFold(key, name) }

// decodeManifest reads a manifest or an index.
func decodeManifest(r io.Reader) (*manifest, error) {
	w := newWalker(r)
	m := &manifest{}
	null, err := w.composite("the manifest", '{', maxSkippedElements, func(key string) error {
		var err error
		switch {
		case field(key, "mediaType"):
			m.MediaType, err = w.str("mediaType")
		case field(key, "config"):
			m.Config = descriptor{}
			err = w.descriptor("config", &m.Config)
		case field(key, "manifests"):
			m.Manifests, m.HasManifests = m.Manifests[:0], true
			_, err = w.composite("manifests", '[', maxIndexManifests, func(string) error {
				var d descriptor
				if err := w.descriptor("manifests[]", &d); err != nil {
					return err
				}
				m.Manifests = append(m.Manifests, d)
				return nil
			})
		case field(key, "layers"):
			m.Layers = 0
			_, err = w.composite("layers", '[', maxLayers, func(string) error {
				m.Layers++
				return w.skip("layers[]")
			})
		default:
			err = w.skip("a field of the manifest")
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if null {
		return nil, errors.New("the manifest is null")
	}
	return m, w.end()
}

func (w *walker) descriptor(path string, d *descriptor) error {
	_, err := w.composite(path, '{', maxSkippedElements, func(key string) error {
		var err error
		switch {
		case field(key, "mediaType"):
			d.MediaType, err = w.str(path + ".mediaType")
		case field(key, "digest"):
			d.Digest, err = w.str(path + ".digest")
		case field(key, "size"):
			d.Size, err = w.int64(path + ".size")
		case field(key, "platform"):
			_, err = w.composite(path+".platform", '{', maxSkippedElements, func(key string) error {
				switch {
				case field(key, "os"):
					d.OS, err = w.str(path + ".platform.os")
				case field(key, "architecture"):
					d.Arch, err = w.str(path + ".platform.architecture")
				case field(key, "variant"):
					d.Variant, err = w.str(path + ".platform.variant")
				default:
					err = w.skip(path + ".platform")
				}
				return err
			})
		default:
			err = w.skip(path)
		}
		return err
	})
	return err
}

// decodeConfig reads an image's configuration: its ENV and labels, within
// maxEnv, maxLabels and, together, MaxFactsBytes as Facts.size counts them.
func decodeConfig(r io.Reader) (*config, error) {
	w := newWalker(r)
	c := &config{}
	size := 0
	null, err := w.composite("the configuration", '{', maxSkippedElements, func(key string) error {
		if !field(key, "config") {
			return w.skip("a field of the configuration")
		}
		_, err := w.composite("config", '{', maxSkippedElements, func(key string) error {
			switch {
			case field(key, "Env"):
				// A repeated key replaces the list, as encoding/json does.
				for _, e := range c.Env {
					size -= 32 + len(e)
				}
				c.Env = nil
				_, err := w.composite("config.Env", '[', maxEnv, func(string) error {
					e, err := w.str("config.Env[]")
					if err != nil {
						return err
					}
					if size += 32 + len(e); size > MaxFactsBytes {
						return fmt.Errorf("the configuration's ENV and labels take more than %d bytes", MaxFactsBytes)
					}
					c.Env = append(c.Env, e)
					return nil
				})
				return err
			case field(key, "Labels"):
				// A repeated key adds to the labels, as encoding/json does.
				_, err := w.composite("config.Labels", '{', maxLabels, func(k string) error {
					v, err := w.str("config.Labels")
					if err != nil {
						return err
					}
					if old, ok := c.Labels[k]; ok {
						size -= 64 + len(k) + len(old)
					} else if len(c.Labels) >= maxLabels {
						return fmt.Errorf("config.Labels has more than %d entries", maxLabels)
					}
					if size += 64 + len(k) + len(v); size > MaxFactsBytes {
						return fmt.Errorf("the configuration's ENV and labels take more than %d bytes", MaxFactsBytes)
					}
					if c.Labels == nil {
						c.Labels = map[string]string{}
					}
					c.Labels[k] = v
					return nil
				})
				return err
			}
			return w.skip("a field of config")
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	if null {
		return nil, errors.New("the configuration is null")
	}
	return c, w.end()
}
