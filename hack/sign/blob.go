package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/sigstore/sigstore/pkg/signature"
)

// signBlob is `cosign sign-blob --key ... --tlog-upload=false`'s signature:
// the signature of the file's SHA-256, base64-encoded, as one line.
func signBlob(s signature.Signer, data []byte) (string, error) {
	sig, err := s.SignMessage(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("failed to sign: %w", err)
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}

// verifyBlob checks a signature file as `cosign verify-blob --key
// --signature --insecure-ignore-tlog` does.
func verifyBlob(v signature.Verifier, data []byte, b64sig string) error {
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64sig))
	if err != nil {
		return fmt.Errorf("failed to decode the signature: %w", err)
	}
	if err := v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(data)); err != nil {
		return fmt.Errorf("failed to verify the signature: %w", err)
	}
	return nil
}
