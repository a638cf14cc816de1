// Command sign signs and verifies a release's files with a cosign key, in
// the formats the stock cosign command line verifies (docs/release.md):
//
//	go run ./hack/sign generate-key-pair [-output-key-prefix cosign]
//	go run ./hack/sign public-key -key REF
//	go run ./hack/sign blob -key REF FILE...
//	go run ./hack/sign image -key REF -repository REPO [-push] LAYOUT.oci.tar
//	go run ./hack/sign verify -key PUB [-repository REPO] FILE...
//
// A key REF is a file, or env://NAME for the PEM in $NAME; its password is
// $COSIGN_PASSWORD, as for cosign. `blob` writes FILE.sig next to each FILE
// (cosign sign-blob's signature). `image` signs the image index of an OCI
// image layout tar and writes the tar again with the signature beside the
// index as `cosign save` lays it out; -push also pushes the signature to
// REPO:sha256-<hex>.sig, where `cosign verify` looks. `verify` checks each
// FILE against FILE.sig, and each *.oci.tar against the signature it holds.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/gpu-injector/gpu-injector/hack/ociimage"
	"github.com/sigstore/sigstore/pkg/signature"
)

const usage = `usage: sign COMMAND [flags] [FILE...]
  generate-key-pair [-output-key-prefix P]   P.key (encrypted with $COSIGN_PASSWORD) and P.pub
  public-key -key REF                        print the key's public half
  blob -key REF FILE...                      write FILE.sig for each FILE
  image -key REF -repository R [-push] TAR   sign the image index of an OCI layout tar, in place
  verify -key PUB [-repository R] FILE...    check FILE.sig, or an .oci.tar's own signature
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "sign: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	key := fs.String("key", "", "key: a file or env://NAME (private for signing, public for verify)")
	prefix := fs.String("output-key-prefix", "cosign", "generate-key-pair: where to write PREFIX.key and PREFIX.pub")
	repository := fs.String("repository", "", "image: the repository the signature names (REGISTRY/PATH/gpu-injector)")
	push := fs.Bool("push", false, "image: also push the signature to REPOSITORY:sha256-<hex>.sig")
	insecure := fs.Bool("insecure", false, "image -push: plain HTTP to the registry")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	password := []byte(os.Getenv(passwordEnv))
	switch args[0] {
	case "generate-key-pair":
		return writeKeyPair(*prefix, password)
	case "public-key":
		return printPublicKey(*key, password)
	case "blob":
		return signFiles(*key, password, fs.Args())
	case "image":
		if fs.NArg() != 1 || *repository == "" {
			return errors.New("image needs -repository and one layout tar")
		}
		var opts []name.Option
		if *insecure {
			opts = append(opts, name.Insecure)
		}
		repo, err := name.NewRepository(*repository, opts...)
		if err != nil {
			return fmt.Errorf("failed to parse -repository: %w", err)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		return signImage(ctx, *key, password, repo, fs.Arg(0), *push)
	case "verify":
		return verifyFiles(*key, *repository, fs.Args())
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func writeKeyPair(prefix string, password []byte) error {
	if len(password) == 0 {
		fmt.Fprintf(os.Stderr, "sign: $%s is empty: the private key is encrypted with an empty password\n", passwordEnv)
	}
	priv, pub, err := generateKeyPair(password)
	if err != nil {
		return err
	}
	if err := os.WriteFile(prefix+".key", priv, 0o600); err != nil {
		return fmt.Errorf("failed to write the private key: %w", err)
	}
	if err := os.WriteFile(prefix+".pub", pub, 0o644); err != nil {
		return fmt.Errorf("failed to write the public key: %w", err)
	}
	fmt.Fprintf(os.Stderr, "sign: wrote %s.key (private, encrypted) and %s.pub\n", prefix, prefix)
	return nil
}

func printPublicKey(ref string, password []byte) error {
	sv, err := signerFromRef(ref, password)
	if err != nil {
		return err
	}
	pub, err := publicPEM(sv)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(pub)
	return err
}

func signFiles(ref string, password []byte, files []string) error {
	sv, err := signerFromRef(ref, password)
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("failed to read %s: %w", f, err)
		}
		sig, err := signBlob(sv, data)
		if err != nil {
			return fmt.Errorf("failed to sign %s: %w", f, err)
		}
		if err := os.WriteFile(f+".sig", []byte(sig), 0o644); err != nil {
			return fmt.Errorf("failed to write %s.sig: %w", f, err)
		}
	}
	return nil
}

func signImage(ctx context.Context, ref string, password []byte, repo name.Repository, tarFile string, push bool) error {
	sv, err := signerFromRef(ref, password)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "gpu-injector-sign-")
	if err != nil {
		return fmt.Errorf("failed to create a temp folder: %w", err)
	}
	defer os.RemoveAll(tmp)
	in, out := tmp+"/in", tmp+"/out"
	if err := untar(tarFile, in); err != nil {
		return err
	}
	digest, sig, err := signLayout(in, out, sv, repo)
	if err != nil {
		return err
	}
	if err := ociimage.WriteLayoutTar(out, tarFile); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sign: signed %s@%s in %s\n", repo, digest, tarFile)
	if !push {
		return nil
	}
	if err := pushSignature(ctx, repo, digest, sig); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sign: pushed %s:%s\n", repo, signatureTag(digest))
	return nil
}

func verifyFiles(ref, repository string, files []string) error {
	pub, err := readKeyRef(ref)
	if err != nil {
		return err
	}
	v, err := loadVerifier(pub)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := verifyFile(v, repository, f); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		fmt.Fprintf(os.Stderr, "sign: verified %s\n", f)
	}
	return nil
}

func verifyFile(v signature.Verifier, repository, f string) error {
	if isLayoutTar(f) {
		if repository == "" {
			return errors.New("verifying an image layout needs -repository")
		}
		repo, err := name.NewRepository(repository)
		if err != nil {
			return fmt.Errorf("failed to parse -repository: %w", err)
		}
		tmp, err := os.MkdirTemp("", "gpu-injector-verify-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := untar(f, tmp); err != nil {
			return err
		}
		_, err = verifyLayout(tmp, v, repo)
		return err
	}
	data, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	sig, err := os.ReadFile(f + ".sig")
	if err != nil {
		return fmt.Errorf("failed to read the signature: %w", err)
	}
	return verifyBlob(v, data, string(sig))
}
