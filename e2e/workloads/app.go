package workloads

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gpu-injector/gpu-injector/hack/ociimage"
)

// AppCheck is where BuildAppCheck places app-check in an image, and AppLibDir
// the folder of its library, which only the image's LD_LIBRARY_PATH names.
const (
	AppCheck  = "/usr/bin/app-check"
	AppLibDir = "/opt/app/lib"
)

// appLibSource is the image's own library.
const appLibSource = `int app_answer(void) { return 42; }
`

// appCheckSource needs both the image's library (the loader resolves it
// before main, through LD_LIBRARY_PATH) and the driver's libcuda.so.1.
const appCheckSource = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
int app_answer(void);
int main(void) {
	const char *p = getenv("LD_LIBRARY_PATH");
	struct link_map *m = NULL;
	void *h;
	printf("LD_LIBRARY_PATH=%s\n", p ? p : "");
	printf("libapp: %d\n", app_answer());
	h = dlopen("libcuda.so.1", RTLD_NOW);
	if (h == NULL) {
		printf("cannot load libcuda.so.1: %s\n", dlerror());
		return 1;
	}
	if (dlinfo(h, RTLD_DI_LINKMAP, &m) != 0 || m == NULL) {
		printf("loaded libcuda.so.1 from an unknown file\n");
		return 1;
	}
	printf("loaded libcuda.so.1 from %s\n", m->l_name);
	return 0;
}
`

// BuildAppCheck compiles app-check and its library into outDir and returns
// the files of an image that runs it: cuda-check's (Build), the library in
// AppLibDir and app-check at AppCheck. It prints the LD_LIBRARY_PATH it got,
// the library's answer (42) and the file libcuda.so.1 came from, and fails
// unless the loader finds both: the image must set
// LD_LIBRARY_PATH=AppLibDir, and the pod must see the driver.
func BuildAppCheck(outDir string) ([]ociimage.File, error) {
	files, err := Build(outDir)
	if err != nil {
		return nil, err
	}
	lib, err := compile(outDir, "libapp.so", appLibSource, "-shared", "-fPIC")
	if err != nil {
		return nil, err
	}
	// -ldl for glibc older than 2.34, where dlopen lived there.
	app, err := compile(outDir, "app-check", appCheckSource, "-L"+outDir, "-lapp", "-ldl")
	if err != nil {
		return nil, err
	}
	return append(files,
		ociimage.File{Source: lib, Dest: AppLibDir + "/libapp.so", Mode: 0o755},
		ociimage.File{Source: app, Dest: AppCheck, Mode: 0o755}), nil
}

// compile runs the C compiler ($CC, else gcc) on src in dir and returns the
// output's path.
func compile(dir, out, src string, args ...string) (string, error) {
	c := filepath.Join(dir, out+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		return "", fmt.Errorf("failed to write %q: %w", c, err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	bin := filepath.Join(dir, out)
	if b, err := exec.Command(cc, append([]string{"-O2", "-o", bin, c}, args...)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("failed to compile %s: %w\n%s", out, err, b)
	}
	return bin, nil
}
