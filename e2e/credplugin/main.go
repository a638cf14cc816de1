// Command credplugin is a kubelet image credential provider plugin for the
// e2e suite: the node's plugin that the webhook runs, as a cloud's
// (ecr-credential-provider) would give the registry's token. It reads a
// CredentialProviderRequest on stdin and answers, for the request's
// registry, the user and password of E2E_REGISTRY_USER and
// E2E_REGISTRY_PASSWORD, which the CredentialProviderConfig's env sets. It
// is built static (CGO_ENABLED=0): it runs in the webhook's image, which
// holds glibc and nothing else.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

func main() {
	var req struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Image      string `json:"image"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil || req.Kind != "CredentialProviderRequest" {
		fmt.Fprintf(os.Stderr, "not a CredentialProviderRequest (%v)\n", err)
		os.Exit(1)
	}
	registry, _, _ := strings.Cut(req.Image, "/")
	resp := map[string]any{
		"apiVersion":    req.APIVersion,
		"kind":          "CredentialProviderResponse",
		"cacheKeyType":  "Registry",
		"cacheDuration": "5m",
		"auth": map[string]any{registry: map[string]string{
			"username": os.Getenv("E2E_REGISTRY_USER"), "password": os.Getenv("E2E_REGISTRY_PASSWORD"),
		}},
	}
	if err := json.NewEncoder(os.Stdout).Encode(resp); err != nil {
		os.Exit(1)
	}
}
