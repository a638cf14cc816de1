package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certValidity covers any test run; a fresh PKI is made per cluster, so nothing
// long-lived ever depends on these keys.
const certValidity = 24 * time.Hour

// pki is the cluster's certificate authority and the files made from it.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
	// CAFile is the CA certificate, PEM.
	CAFile string
}

// keyPair names a certificate and its key on disk.
type keyPair struct {
	CertFile string
	KeyFile  string
}

func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("failed to create pki dir: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("failed to generate ca key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "gpu-injector-local-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("failed to self-sign ca: %w", err)
	}
	caCert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("failed to parse ca: %w", err)
	}
	p := &pki{dir: dir, caCert: caCert, caKey: key, CAFile: filepath.Join(dir, "ca.crt")}
	if err := writePEM(p.CAFile, "CERTIFICATE", der, 0o644); err != nil {
		return nil, err
	}
	if err := writeKey(filepath.Join(dir, "ca.key"), key); err != nil {
		return nil, err
	}
	return p, nil
}

// issue signs a certificate for name. A cert with hosts serves TLS; one with
// org or without hosts authenticates a client (Kubernetes reads CN as the user
// and O as its groups).
func (p *pki) issue(name, cn string, orgs []string, hosts []string) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, fmt.Errorf("failed to generate key for %s: %w", name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return keyPair{}, fmt.Errorf("failed to sign certificate for %s: %w", name, err)
	}
	kp := keyPair{CertFile: filepath.Join(p.dir, name+".crt"), KeyFile: filepath.Join(p.dir, name+".key")}
	if err := writePEM(kp.CertFile, "CERTIFICATE", der, 0o644); err != nil {
		return keyPair{}, err
	}
	if err := writeKey(kp.KeyFile, key); err != nil {
		return keyPair{}, err
	}
	return kp, nil
}

// serviceAccountKeys writes the RSA pair that signs service-account tokens. RSA
// because every JWT consumer accepts RS256.
func (p *pki) serviceAccountKeys() (keyPair, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return keyPair{}, fmt.Errorf("failed to generate service account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return keyPair{}, fmt.Errorf("failed to marshal service account public key: %w", err)
	}
	kp := keyPair{CertFile: filepath.Join(p.dir, "sa.pub"), KeyFile: filepath.Join(p.dir, "sa.key")}
	if err := writePEM(kp.CertFile, "PUBLIC KEY", pub, 0o644); err != nil {
		return keyPair{}, err
	}
	if err := writeKey(kp.KeyFile, key); err != nil {
		return keyPair{}, err
	}
	return kp, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial would still be valid.
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("failed to marshal key %s: %w", path, err)
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, kind string, der []byte, mode os.FileMode) error {
	data := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
	if err := os.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("failed to write %s: %w", path, err)
	}
	return nil
}

// ServingCerts writes into dir a fresh test CA (ca.crt) and a serving
// certificate for hosts signed by it (tls.crt, tls.key: the names
// controller-runtime's webhook server reads), and returns the CA in PEM for
// a webhook configuration's caBundle.
func ServingCerts(dir string, hosts ...string) ([]byte, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("failed to issue a serving certificate: no host named")
	}
	p, err := newPKI(dir)
	if err != nil {
		return nil, err
	}
	if _, err := p.issue("tls", hosts[0], nil, hosts); err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(p.CAFile)
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", p.CAFile, err)
	}
	return ca, nil
}
