//go:build linux

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// These tests run the real podsim binary (built static, as for the GPU
// machine) on a root folder that holds only a test program, libc and the
// dynamic loader, with a stub libcuda.so.1 built by gcc as the host driver.
// They need root (namespaces, mounts) and gcc.

// probeSource is the program run inside the container; its first argument
// picks what it checks.
const probeSource = `
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
  const char *op = argc > 1 ? argv[1] : "dlopen";
  if (!strcmp(op, "dlopen")) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    const char *(*id)(void) = (const char *(*)(void))dlsym(h, "podsim_stub_driver");
    printf("loaded %s\n", id ? id() : "(no id)");
    return 0;
  }
  if (!strcmp(op, "write") && argc > 2) {
    FILE *f = fopen(argv[2], "w");
    if (!f) { printf("write failed: %s\n", strerror(errno)); return 1; }
    fputs("written by podsim test\n", f);
    if (fclose(f)) { printf("write failed: %s\n", strerror(errno)); return 1; }
    printf("write ok\n");
    return 0;
  }
  if (!strcmp(op, "stat") && argc > 2) {
    struct stat st;
    if (stat(argv[2], &st)) { printf("missing: %s\n", strerror(errno)); return 1; }
    printf("exists\n");
    return 0;
  }
  if (!strcmp(op, "env")) { for (char **e = environ; *e; e++) puts(*e); return 0; }
  if (!strcmp(op, "args")) { for (int i = 2; i < argc; i++) printf("arg=%s\n", argv[i]); return 0; }
  if (!strcmp(op, "self")) {
    char cwd[4096], host[256];
    if (!getcwd(cwd, sizeof cwd) || gethostname(host, sizeof host)) { perror("self"); return 1; }
    printf("pid=%d uid=%d gid=%d cwd=%s host=%s\n", getpid(), getuid(), getgid(), cwd, host);
    return 0;
  }
  if (!strcmp(op, "exit") && argc > 2) return atoi(argv[2]);
  fprintf(stderr, "unknown op %s\n", op);
  return 2;
}
`

const stubDriverSource = `const char *podsim_stub_driver(void) { return "stub-driver-580.159.04"; }`

// fixture is what every integration test shares.
type fixture struct {
	podsim string
	root   string
	// driver is a fake host driver folder holding the stub libcuda.so.1.
	driver string
	// probe is the test program on the host.
	probe string
}

var (
	fx         *fixture
	fixtureErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "podsim-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fx, fixtureErr = buildFixture(dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func buildFixture(dir string) (*fixture, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("needs root for mount namespaces")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		return nil, errors.New("needs gcc to build the stub driver and the test program")
	}
	f := &fixture{
		podsim: filepath.Join(dir, "podsim"),
		root:   filepath.Join(dir, "root"),
		driver: filepath.Join(dir, "host", "driver"),
	}
	build := exec.Command("go", "build", "-o", f.podsim, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("failed to build podsim: %w: %s", err, out)
	}
	if err := os.MkdirAll(f.driver, 0o755); err != nil {
		return nil, err
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return nil, err
	}
	for name, body := range map[string]string{"probe.c": probeSource, "stub.c": stubDriverSource} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			return nil, err
		}
	}
	probe := filepath.Join(src, "probe")
	f.probe = probe
	for _, args := range [][]string{
		{"-O1", "-o", probe, filepath.Join(src, "probe.c")},
		{"-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", filepath.Join(f.driver, "libcuda.so.1"), filepath.Join(src, "stub.c")},
	} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("failed to run gcc %v: %w: %s", args, err, out)
		}
	}
	if err := buildRoot(f.root, probe); err != nil {
		return nil, err
	}
	return f, nil
}

// lddPath matches the absolute paths in ldd's output.
var lddPath = regexp.MustCompile(`(?m)(/\S+)\s+\(0x`)

// buildRoot makes a root holding only the program, at /usr/local/bin/probe,
// and the libraries and loader ldd names, at the paths ldd prints.
func buildRoot(root, program string) error {
	out, err := exec.Command("ldd", program).Output()
	if err != nil {
		return fmt.Errorf("failed to run ldd: %w", err)
	}
	files := map[string]string{"/usr/local/bin/probe": program}
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		files[m[1]] = m[1]
	}
	for dst, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		full := filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, data, 0o755); err != nil {
			return err
		}
	}
	return nil
}

func needFixture(t *testing.T) *fixture {
	t.Helper()
	if fixtureErr != nil {
		t.Skipf("integration test not run: %v", fixtureErr)
	}
	return fx
}

type result struct {
	stdout, stderr string
	code           int
}

func (f *fixture) run(t *testing.T, manifest string, args ...string) result {
	t.Helper()
	file := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(f.podsim, append([]string{"-f", file, "--root", f.root}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("failed to run podsim: %v", err)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// pod builds a one-container Pod manifest; extra is YAML appended to the
// container (indented by 4) and volumes to the spec (indented by 2).
func pod(args, containerExtra, volumes string) string {
	return `apiVersion: v1
kind: Pod
metadata:
  name: cuda-test
  namespace: ml
  annotations:
    gpu-injector.io/injected: '{"driverVersion":"580.159.04","containers":["main"],"volumes":["gpu-injector-lib64"]}'
spec:
  containers:
  - name: main
    image: driverless:latest
    command: ["/usr/local/bin/probe"]
    args: ` + args + `
` + containerExtra + `
  volumes:
` + volumes
}

func mutated(f *fixture, args string) string {
	return pod(args, `    env:
    - name: LD_LIBRARY_PATH
      value: /usr/local/nvidia/lib64
    volumeMounts:
    - name: gpu-injector-lib64
      mountPath: /usr/local/nvidia/lib64
      readOnly: true`, `  - name: gpu-injector-lib64
    hostPath:
      path: `+f.driver+`
      type: Directory
`)
}

func TestDriverInjection(t *testing.T) {
	f := needFixture(t)
	fileMount := pod(`["dlopen"]`, `    env:
    - name: LD_LIBRARY_PATH
      value: /usr/local/nvidia/lib64
    volumeMounts:
    - name: libcuda
      mountPath: /usr/local/nvidia/lib64/libcuda.so.1
      readOnly: true`, `  - name: libcuda
    hostPath:
      path: `+filepath.Join(f.driver, "libcuda.so.1")+`
      type: File
`)
	noEnv := pod(`["dlopen"]`, `    volumeMounts:
    - name: gpu-injector-lib64
      mountPath: /usr/local/nvidia/lib64
      readOnly: true`, `  - name: gpu-injector-lib64
    hostPath:
      path: `+f.driver+`
      type: Directory
`)
	for name, tc := range map[string]struct {
		manifest   string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		"mutated pod loads the host driver": {
			manifest: mutated(f, `["dlopen"]`), wantCode: 0, wantStdout: "loaded stub-driver-580.159.04",
			wantStderr: "podsim: mount /usr/local/nvidia/lib64 <- hostPath " + f.driver + " (ro",
		},
		"a single-file mount works like a folder mount": {
			manifest: fileMount, wantCode: 0, wantStdout: "loaded stub-driver-580.159.04",
		},
		"unmutated pod cannot find libcuda": {
			manifest: pod(`["dlopen"]`, "", "    []\n"), wantCode: 1, wantStderr: "libcuda.so.1: cannot open shared object file",
		},
		"the mount alone is not enough without LD_LIBRARY_PATH": {
			manifest: noEnv, wantCode: 1, wantStderr: "libcuda.so.1: cannot open shared object file",
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := f.run(t, tc.manifest, "--gpu-devices=false")
			if r.code != tc.wantCode || !strings.Contains(r.stdout, tc.wantStdout) || !strings.Contains(r.stderr, tc.wantStderr) {
				t.Fatalf("got code %d, stdout %q, stderr %q; want code %d, stdout containing %q, stderr containing %q",
					r.code, r.stdout, r.stderr, tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
		})
	}
}

func TestMountsAndIsolation(t *testing.T) {
	f := needFixture(t)
	hostOnly := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(hostOnly, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	rwDir := t.TempDir()
	rwPod := pod(`["write", "/data/out.txt"]`, `    volumeMounts:
    - name: data
      mountPath: /data`, `  - name: data
    hostPath:
      path: `+rwDir+`
      type: Directory
`)
	emptyDir := pod(`["write", "/scratch/out.txt"]`, `    volumeMounts:
    - name: scratch
      mountPath: /scratch`, "  - name: scratch\n    emptyDir: {}\n")
	for name, tc := range map[string]struct {
		manifest   string
		wantCode   int
		wantStdout string
	}{
		"a read-only mount refuses writes": {
			manifest: mutated(f, `["write", "/usr/local/nvidia/lib64/evil.so"]`), wantCode: 1, wantStdout: "write failed: Read-only file system",
		},
		"a read-write hostPath takes writes": {
			manifest: rwPod, wantCode: 0, wantStdout: "write ok",
		},
		"an emptyDir takes writes": {
			manifest: emptyDir, wantCode: 0, wantStdout: "write ok",
		},
		"the host's /etc is not visible": {
			manifest: mutated(f, `["stat", "/etc/hostname"]`), wantCode: 1, wantStdout: "missing: No such file or directory",
		},
		"a host file outside the root is not visible": {
			manifest: mutated(f, `["stat", "`+hostOnly+`"]`), wantCode: 1, wantStdout: "missing: No such file or directory",
		},
		"the driver folder is visible only where mounted": {
			manifest: mutated(f, `["stat", "`+f.driver+`/libcuda.so.1"]`), wantCode: 1, wantStdout: "missing: No such file or directory",
		},
		"the container is pid 1 of its own namespace, named after the pod": {
			manifest: mutated(f, `["self"]`), wantCode: 0, wantStdout: "pid=1 uid=0 gid=0 cwd=/ host=cuda-test",
		},
		"/proc is the container's own": {
			manifest: mutated(f, `["stat", "/proc/2"]`), wantCode: 1, wantStdout: "missing",
		},
		"/dev/null works": {
			manifest: mutated(f, `["write", "/dev/null"]`), wantCode: 0, wantStdout: "write ok",
		},
		"the exit code is the container's": {
			manifest: mutated(f, `["exit", "42"]`), wantCode: 42,
		},
	} {
		for _, entry := range []string{"--no-pivot=false", "--no-pivot"} {
			t.Run(name+"/"+entry, func(t *testing.T) {
				r := f.run(t, tc.manifest, "--gpu-devices=false", entry)
				if r.code != tc.wantCode || !strings.Contains(r.stdout, tc.wantStdout) {
					t.Fatalf("got code %d, stdout %q, stderr %q; want code %d, stdout containing %q", r.code, r.stdout, r.stderr, tc.wantCode, tc.wantStdout)
				}
			})
		}
	}
	if b, err := os.ReadFile(filepath.Join(rwDir, "out.txt")); err != nil || !strings.Contains(string(b), "written by podsim test") {
		t.Errorf("the read-write hostPath write did not reach the host: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(f.driver, "evil.so")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the read-only driver folder was written to on the host: %v", err)
	}
}

func TestEnvironment(t *testing.T) {
	f := needFixture(t)
	t.Setenv("PODSIM_HOST_ONLY", "leaked")
	manifest := pod(`["env"]`, `    env:
    - name: LD_LIBRARY_PATH
      value: /usr/local/nvidia/lib64
    - name: BASE
      value: /opt
    - name: DERIVED
      value: $(BASE)/lib:$(UNDEFINED):$$(BASE)
    - name: POD
      valueFrom:
        fieldRef:
          fieldPath: metadata.name`, "    []\n")
	r := f.run(t, manifest, "--gpu-devices=false")
	if r.code != 0 {
		t.Fatalf("podsim failed with %d: %s", r.code, r.stderr)
	}
	got := strings.Split(strings.TrimSpace(r.stdout), "\n")
	sort.Strings(got)
	want := []string{"BASE=/opt", "DERIVED=/opt/lib:$(UNDEFINED):$(BASE)", "LD_LIBRARY_PATH=/usr/local/nvidia/lib64", "PATH=" + defaultPath, "POD=cuda-test"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("container env:\n%s\nwant exactly:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestCommandLookupAndArgs(t *testing.T) {
	f := needFixture(t)
	manifest := `apiVersion: v1
kind: Pod
metadata: {name: args}
spec:
  containers:
  - name: main
    image: x
    command: ["probe"]
    args: ["args", "$(WHO)", "$$(WHO)"]
    workingDir: /work/here
    env: [{name: WHO, value: world}]
    securityContext: {runAsUser: 1000, runAsGroup: 2000}
  - name: second
    image: x
    command: ["probe", "self"]
    workingDir: /work/here
    securityContext: {runAsUser: 1000, runAsGroup: 2000}
`
	r := f.run(t, manifest, "--gpu-devices=false")
	if r.code != 0 || r.stdout != "arg=world\narg=$(WHO)\n" {
		t.Fatalf("got code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, manifest, "--gpu-devices=false", "--", "probe", "args", "$(WHO)")
	if r.code != 0 || r.stdout != "arg=$(WHO)\n" {
		t.Fatalf("command override: got code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = f.run(t, manifest, "--gpu-devices=false", "--container", "second")
	if r.code != 0 || !strings.Contains(r.stdout, "uid=1000 gid=2000 cwd=/work/here") {
		t.Fatalf("got code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestWorkloadSelection(t *testing.T) {
	f := needFixture(t)
	manifest := `apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated}
---
apiVersion: batch/v1
kind: Job
metadata: {name: first, namespace: ml}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: x, command: [probe, exit, "3"]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: second}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: x}}
    spec:
      containers: [{name: c, image: x, command: [probe, self]}]
`
	for name, tc := range map[string]struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		"the first pod template by default": {wantCode: 3},
		"a workload by name":                {args: []string{"--pod", "second"}, wantStdout: "host=second"},
		"an unknown name":                   {args: []string{"--pod", "nope"}, wantCode: exitSetup, wantStderr: `no Pod or workload named "nope"`},
		"an unknown container":              {args: []string{"--container", "nope"}, wantCode: exitSetup, wantStderr: `no container named "nope"`},
	} {
		t.Run(name, func(t *testing.T) {
			r := f.run(t, manifest, append([]string{"--gpu-devices=false"}, tc.args...)...)
			if r.code != tc.wantCode || !strings.Contains(r.stdout, tc.wantStdout) || !strings.Contains(r.stderr, tc.wantStderr) {
				t.Fatalf("got code %d stdout %q stderr %q; want code %d, stdout containing %q, stderr containing %q", r.code, r.stdout, r.stderr, tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	f := needFixture(t)
	for name, tc := range map[string]struct {
		manifest   string
		wantCode   int
		wantStderr string
	}{
		"a configMap volume": {
			manifest: pod(`["dlopen"]`, "    volumeMounts: [{name: cm, mountPath: /cfg}]", "  - {name: cm, configMap: {name: x}}\n"),
			wantCode: exitSetup, wantStderr: `volume "cm": podsim supports hostPath and emptyDir volumes, not configMap`,
		},
		"a hostPath of the wrong type": {
			manifest: pod(`["dlopen"]`, "    volumeMounts: [{name: d, mountPath: /d}]", "  - {name: d, hostPath: {path: "+f.driver+", type: File}}\n"),
			wantCode: exitSetup, wantStderr: "is not of type File",
		},
		"a missing hostPath": {
			manifest: pod(`["dlopen"]`, "    volumeMounts: [{name: d, mountPath: /d}]", "  - {name: d, hostPath: {path: /nonexistent/podsim, type: Directory}}\n"),
			wantCode: exitSetup, wantStderr: `failed to stat hostPath "/nonexistent/podsim"`,
		},
		"no command": {
			manifest: "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: x}]}\n",
			wantCode: exitSetup, wantStderr: "must set command",
		},
		"a command not in the root": {
			manifest: "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: c, image: x, command: [/usr/local/nvidia/bin/nvidia-smi]}]}\n",
			wantCode: exitNotFound, wantStderr: `command "/usr/local/nvidia/bin/nvidia-smi" not found in the container`,
		},
		"no pod at all": {
			manifest: "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n",
			wantCode: exitSetup, wantStderr: "no Pod or workload pod template in the manifest",
		},
	} {
		t.Run(name, func(t *testing.T) {
			r := f.run(t, tc.manifest, "--gpu-devices=false")
			if r.code != tc.wantCode || !strings.Contains(r.stderr, tc.wantStderr) {
				t.Fatalf("got code %d stderr %q; want code %d, stderr containing %q", r.code, r.stderr, tc.wantCode, tc.wantStderr)
			}
		})
	}
}

func TestInjectedReadWriteWarning(t *testing.T) {
	f := needFixture(t)
	manifest := strings.Replace(mutated(f, `["dlopen"]`), "readOnly: true", "readOnly: false", 1)
	r := f.run(t, manifest, "--gpu-devices=false")
	if r.code != 0 || !strings.Contains(r.stderr, `podsim: warning: volume "gpu-injector-lib64" was injected by gpu-injector but is mounted read-write`) {
		t.Fatalf("got code %d stderr %q", r.code, r.stderr)
	}
}

// TestGPUDevices stands in for /dev/nvidia* with character devices of the
// null driver in a fake host /dev.
func TestGPUDevices(t *testing.T) {
	f := needFixture(t)
	hostDev := t.TempDir()
	for _, n := range []string{"nvidia0", "nvidiactl"} {
		if err := unix.Mknod(filepath.Join(hostDev, n), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("failed to create fake device: %v", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(hostDev, "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostDev, "nvidia-other"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args       []string
		target     string
		wantCode   int
		wantStdout string
	}{
		"a GPU device node is bound and usable":  {args: []string{"write", "/dev/nvidia0"}, wantStdout: "write ok"},
		"the control node is bound":              {args: []string{"stat", "/dev/nvidiactl"}, wantStdout: "exists"},
		"the caps folder is bound":               {args: []string{"stat", "/dev/nvidia-caps"}, wantStdout: "exists"},
		"a regular file named nvidia is skipped": {args: []string{"stat", "/dev/nvidia-other"}, wantCode: 1, wantStdout: "missing"},
	} {
		t.Run(name, func(t *testing.T) {
			r := f.run(t, mutated(f, `["`+strings.Join(tc.args, `", "`)+`"]`), "--host-dev", hostDev)
			if r.code != tc.wantCode || !strings.Contains(r.stdout, tc.wantStdout) {
				t.Fatalf("got code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stderr, "podsim: devices /dev/nvidia-caps /dev/nvidia0 /dev/nvidiactl (from the host") {
				t.Fatalf("header does not list the devices: %q", r.stderr)
			}
		})
	}
	r := f.run(t, mutated(f, `["stat", "/dev/nvidia0"]`), "--host-dev", hostDev, "--gpu-devices=false")
	if r.code != 1 {
		t.Fatalf("with --gpu-devices=false /dev/nvidia0 exists: %q", r.stdout)
	}
}

// TestRootStaysUntouched checks that mount points land in the tmpfs layer,
// so a root checked for "no NVIDIA file" stays as checked.
func TestRootStaysUntouched(t *testing.T) {
	f := needFixture(t)
	before := listTree(t, f.root)
	r := f.run(t, mutated(f, `["write", "/tmp-file"]`), "--gpu-devices=false")
	if r.code != 0 {
		t.Fatalf("podsim failed with %d: %s %s", r.code, r.stdout, r.stderr)
	}
	if after := listTree(t, f.root); after != before {
		t.Fatalf("root changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Without the overlay the mount points are created in a copy of the root.
	// A ',' in its path is something overlayfs cannot take, so podsim must
	// fall back by itself, and say so.
	copyRoot := filepath.Join(t.TempDir(), "root,copy")
	if err := os.Mkdir(copyRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", f.root+"/.", copyRoot).CombinedOutput(); err != nil {
		t.Fatalf("failed to copy root: %v: %s", err, out)
	}
	for _, overlay := range []string{"--overlay=false", "--overlay=true"} {
		cmd := exec.Command(f.podsim, "-f", "-", "--root", copyRoot, overlay, "--gpu-devices=false")
		cmd.Stdin = strings.NewReader(mutated(f, `["dlopen"]`))
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "loaded stub-driver") {
			t.Fatalf("podsim %s failed: %v: %s", overlay, err, out)
		}
		if overlay == "--overlay=true" && !strings.Contains(string(out), "podsim: warning: overlayfs cannot take root") {
			t.Fatalf("podsim did not say it fell back from overlayfs: %s", out)
		}
	}
	if fi, err := os.Stat(filepath.Join(copyRoot, "usr/local/nvidia/lib64")); err != nil || !fi.IsDir() {
		t.Fatalf("mount point not created in the root with --overlay=false: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(copyRoot, "usr/local/nvidia/lib64")); len(entries) != 0 {
		t.Fatalf("the mount point holds files after the run: %v", entries)
	}
}

func listTree(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintln(&b, strings.TrimPrefix(p, root))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestDriverlessRootScript builds the root with hack/gpu/make-driverless-root.sh,
// as the GPU smoke test does, and runs the same pod with and without the driver.
func TestDriverlessRootScript(t *testing.T) {
	f := needFixture(t)
	script, err := filepath.Abs("../gpu/make-driverless-root.sh")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("bash", script, root, f.probe).CombinedOutput(); err != nil {
		t.Fatalf("make-driverless-root.sh failed: %v: %s", err, out)
	}
	withRoot := *f
	withRoot.root = root
	r := withRoot.run(t, mutated(f, `["dlopen"]`), "--gpu-devices=false")
	if r.code != 0 || !strings.Contains(r.stdout, "loaded stub-driver-580.159.04") {
		t.Fatalf("mutated pod on the script's root: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	r = withRoot.run(t, pod(`["dlopen"]`, "", "    []\n"), "--gpu-devices=false")
	if r.code != 1 || !strings.Contains(r.stderr, "libcuda.so.1: cannot open shared object file") {
		t.Fatalf("unmutated pod on the script's root: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}

	// A program linked against the driver would smuggle it into the root.
	linked := filepath.Join(t.TempDir(), "linked")
	src := linked + ".c"
	if err := os.WriteFile(src, []byte("const char *podsim_stub_driver(void);\nint main(void) { return podsim_stub_driver() == 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-o", linked, src, "-L"+f.driver, "-l:libcuda.so.1").CombinedOutput(); err != nil {
		t.Fatalf("gcc failed: %v: %s", err, out)
	}
	cmd := exec.Command("bash", script, filepath.Join(t.TempDir(), "bad-root"), linked)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+f.driver)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "a file of the NVIDIA driver") {
		t.Fatalf("make-driverless-root.sh accepted a program linked to libcuda: %v: %s", err, out)
	}
}

func TestNodeCheck(t *testing.T) {
	f := needFixture(t)
	manifest := strings.Replace(mutated(f, `["dlopen"]`), "  volumes:\n", "  nodeSelector: {gpu-injector.io/layout-fingerprint: abc}\n  volumes:\n", 1)
	dir := t.TempDir()
	nodes := map[string]string{
		"match":    "apiVersion: v1\nkind: Node\nmetadata: {name: gpu-1, labels: {gpu-injector.io/layout-fingerprint: abc}}\n",
		"mismatch": "apiVersion: v1\nkind: Node\nmetadata: {name: gpu-2, labels: {gpu-injector.io/layout-fingerprint: def}}\n",
		"notnode":  "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n",
	}
	for name, tc := range map[string]struct {
		node       string
		wantCode   int
		wantStderr string
	}{
		"a node the pod is pinned to": {node: "match", wantStderr: `podsim: node "gpu-1" matches the pod's nodeSelector`},
		"another layout's node":       {node: "mismatch", wantCode: exitSetup, wantStderr: `does not match node "gpu-2"`},
		"not a node":                  {node: "notnode", wantCode: exitSetup, wantStderr: `holds a "Pod", not a Node`},
	} {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(dir, tc.node+".yaml")
			if err := os.WriteFile(file, []byte(nodes[tc.node]), 0o644); err != nil {
				t.Fatal(err)
			}
			r := f.run(t, manifest, "--gpu-devices=false", "--node", file)
			if r.code != tc.wantCode || !strings.Contains(r.stderr, tc.wantStderr) {
				t.Fatalf("got code %d stdout %q stderr %q; want code %d, stderr containing %q", r.code, r.stdout, r.stderr, tc.wantCode, tc.wantStderr)
			}
		})
	}
}
