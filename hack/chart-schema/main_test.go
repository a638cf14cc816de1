package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestSchemaIsCurrent: the committed values schema carries the configuration's
// schema as its Go types say it now.
func TestSchemaIsCurrent(t *testing.T) {
	file := filepath.Join("..", "..", SchemaFile)
	committed, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Generate(committed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, want) {
		t.Errorf("%s is not what the configuration's types give: run go run ./hack/chart-schema", SchemaFile)
	}
	// Generating twice changes nothing: the rest of the file is kept.
	again, err := Generate(want)
	if err != nil || !bytes.Equal(again, want) {
		t.Errorf("a second run changed the file (%v)", err)
	}
}

func TestGenerateReplacesOnlyConfig(t *testing.T) {
	in := []byte("{\n  \"type\": \"object\",\n  \"properties\": {\"image\": {\"type\":  \"object\"}, \"config\": {\"type\": \"string\"},\n  \"webhook\": {}}\n}\n")
	out, err := Generate(in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(out, []byte("{\n  \"type\": \"object\",\n  \"properties\": {\"image\": {\"type\":  \"object\"}, \"config\": {\n      \"type\": \"object\",\n")) ||
		!bytes.HasSuffix(out, []byte("\n    },\n  \"webhook\": {}}\n}\n")) || !bytes.Contains(out, []byte(`"ldLibraryPath": {`)) || bytes.Contains(out, []byte(`"apiVersion"`)) {
		t.Errorf("unexpected output:\n%s", out)
	}
	if _, err := Generate([]byte(`{"properties": {"image": {}}}`)); err == nil {
		t.Error("want an error for a schema without properties.config")
	}
}
