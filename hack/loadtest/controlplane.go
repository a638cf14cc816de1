package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// controlPlane is etcd and kube-apiserver on loopback, nothing else: no
// scheduler, controllers or kubelet, so only admission and storage spend
// CPU while the load runs.
type controlPlane struct {
	dir        string
	url        string
	token      string
	caFile     string
	kubeconfig string
	rest       *rest.Config
	client     *kubernetes.Clientset
	procs      []*exec.Cmd
}

// startControlPlane starts etcd and kube-apiserver; profiling serves the API
// server's /debug/pprof (-profile).
func startControlPlane(ctx context.Context, dir, etcdBin, apiserverBin string, profiling bool) (*controlPlane, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{dir: dir, url: fmt.Sprintf("https://127.0.0.1:%d", ports[2])}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := cp.start("etcd", etcdBin,
		"--name=default", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL, "--initial-cluster=default="+peerURL,
		"--unsafe-no-fsync=true", "--log-level=warn",
		// Room for 65,000 nodes, each written three times between the API
		// server's compactions.
		"--quota-backend-bytes=8589934592",
	); err != nil {
		return nil, err
	}

	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	cp.token = hex.EncodeToString(b)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(cp.token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return nil, err
	}
	saKey := filepath.Join(dir, "sa.key")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "apiserver")
	if err := cp.start("kube-apiserver", apiserverBin,
		"--etcd-servers="+clientURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(ports[2]),
		// A self-signed serving certificate for 127.0.0.1, written here.
		"--cert-dir="+certDir,
		"--token-auth-file="+tokens,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saKey, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
		"--allow-privileged=true", "--profiling="+strconv.FormatBool(profiling),
		// Three writes a node leave two old revisions each (5,000 nodes
		// made etcd's file 491 MiB): compacted every minute rather than
		// five, their pages are reused while 65,000 nodes are created.
		"--etcd-compaction-interval=1m",
	); err != nil {
		return nil, err
	}
	cp.caFile = filepath.Join(certDir, "apiserver.crt")

	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := os.Stat(cp.caFile); err == nil {
			cp.rest = &rest.Config{Host: cp.url, BearerToken: cp.token, TLSClientConfig: rest.TLSClientConfig{CAFile: cp.caFile}, QPS: 1000, Burst: 2000}
			if cp.client, err = kubernetes.NewForConfig(cp.rest); err != nil {
				return nil, err
			}
			body, err := cp.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			if err == nil && string(body) == "ok" {
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("kube-apiserver not ready after 90s; see %s", filepath.Join(dir, "kube-apiserver.log"))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
	cp.kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["loadtest"] = &clientcmdapi.Cluster{Server: cp.url, CertificateAuthority: cp.caFile}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cp.token}
	kc.Contexts["loadtest"] = &clientcmdapi.Context{Cluster: "loadtest", AuthInfo: "admin"}
	kc.CurrentContext = "loadtest"
	return cp, clientcmd.WriteToFile(*kc, cp.kubeconfig)
}

func (cp *controlPlane) start(name, bin string, args ...string) error {
	cmd, err := startProcess(cp.dir, name, bin, args...)
	if err != nil {
		return err
	}
	cp.procs = append(cp.procs, cmd)
	return nil
}

// stop ends the processes this script started, newest first, by PID.
func (cp *controlPlane) stop() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		stopProcess(cp.procs[i])
	}
}

func startProcess(dir, name, bin string, args ...string) (*exec.Cmd, error) {
	return startProcessEnv(dir, name, bin, nil, args...)
}

// startProcessEnv starts bin with the environment environ (nil: this
// process's), its output in name.log.
func startProcessEnv(dir, name, bin string, environ []string, args ...string) (*exec.Cmd, error) {
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a Ctrl-C of the script reaches it only
	// through stop, in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("failed to start %s: %w", name, err)
	}
	return cmd, nil
}

func stopProcess(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("failed to reserve a port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// httpGet reads a URL of a local process.
func httpGet(ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}
