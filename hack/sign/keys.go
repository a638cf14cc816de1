package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/options"
)

// The PEM types of cosign's encrypted private keys: cosign writes the first
// and still reads the second, which its older releases wrote.
const (
	sigstorePrivateKeyPEM = "ENCRYPTED SIGSTORE PRIVATE KEY"
	cosignPrivateKeyPEM   = "ENCRYPTED COSIGN PRIVATE KEY"
)

// passwordEnv is where cosign, and so this tool, reads a key's password.
const passwordEnv = "COSIGN_PASSWORD"

// generateKeyPair makes the key pair `cosign generate-key-pair` makes: ECDSA
// P-256, the private key PKCS#8 encrypted with the password (scrypt and
// NaCl secretbox, go-securesystemslib's format), the public key PKIX PEM.
func generateKeyPair(password []byte) (privatePEM, publicPEM []byte, err error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to generate a key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to encode the private key: %w", err)
	}
	enc, err := encrypted.Encrypt(der, password)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to encrypt the private key: %w", err)
	}
	if publicPEM, err = cryptoutils.MarshalPublicKeyToPEM(priv.Public()); err != nil {
		return nil, nil, fmt.Errorf("failed to encode the public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: sigstorePrivateKeyPEM, Bytes: enc}), publicPEM, nil
}

// readKeyRef reads a key as cosign names one: a file, or env://NAME for the
// PEM in an environment variable (a CI secret that never touches the disk).
func readKeyRef(ref string) ([]byte, error) {
	if name, ok := strings.CutPrefix(ref, "env://"); ok {
		v, ok := os.LookupEnv(name)
		if !ok || v == "" {
			return nil, fmt.Errorf("failed to read the key: $%s is empty", name)
		}
		return []byte(v), nil
	}
	b, err := os.ReadFile(ref)
	if err != nil {
		return nil, fmt.Errorf("failed to read the key: %w", err)
	}
	return b, nil
}

// signerFromRef reads and decrypts the private key a cosign key reference
// names.
func signerFromRef(ref string, password []byte) (signature.SignerVerifier, error) {
	priv, err := readKeyRef(ref)
	if err != nil {
		return nil, err
	}
	return loadSigner(priv, password)
}

// loadSigner decrypts a cosign private key, as cosign's LoadPrivateKey does.
func loadSigner(privatePEM, password []byte) (signature.SignerVerifier, error) {
	p, _ := pem.Decode(privatePEM)
	if p == nil {
		return nil, errors.New("failed to decode the private key: no PEM block")
	}
	if p.Type != sigstorePrivateKeyPEM && p.Type != cosignPrivateKeyPEM {
		return nil, fmt.Errorf("failed to load the private key: PEM type %q is not a cosign key's (cosign generate-key-pair, or this tool's generate-key-pair)", p.Type)
	}
	der, err := encrypted.Decrypt(p.Bytes, password)
	if err != nil {
		return nil, fmt.Errorf("failed to decrypt the private key (password from $%s): %w", passwordEnv, err)
	}
	pk, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the private key: %w", err)
	}
	sv, err := signature.LoadDefaultSignerVerifier(pk, options.WithED25519ph())
	if err != nil {
		return nil, fmt.Errorf("failed to load the private key: %w", err)
	}
	return sv, nil
}

// loadVerifier reads a public key PEM as `cosign verify --key` does.
func loadVerifier(publicPEM []byte) (signature.Verifier, error) {
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(publicPEM)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the public key: %w", err)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("failed to load the public key: %w", err)
	}
	return v, nil
}

// publicPEM is the signer's public key as PEM, what `cosign public-key` prints.
func publicPEM(sv signature.SignerVerifier) ([]byte, error) {
	pub, err := sv.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("failed to read the public key: %w", err)
	}
	return cryptoutils.MarshalPublicKeyToPEM(pub)
}
