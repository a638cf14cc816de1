/*
 * app-env: an application of an image that keeps its own libraries in a
 * folder only the image's ENV LD_LIBRARY_PATH names (as NGC's framework images
 * do), then starts the CUDA program given as its arguments.
 *
 *   app-env /usr/local/bin/cuda-smoke
 *
 * The loader resolves libapp.so before main, through LD_LIBRARY_PATH: with the
 * image's folder gone from it (a pod's env that replaces the image's), the
 * program does not start. The CUDA program it runs then needs the driver's
 * libcuda.so.1 through the same variable: with the driver's folder missing
 * from it, CUDA finds no driver. Both lines in the log prove the merge.
 *
 * Built with the library it needs (hack/gpu-cluster.sh):
 *   gcc -O2 -shared -fPIC -o libapp.so -x c - <<<'int app_answer(void) { return 42; }'
 *   gcc -O2 -o app-env hack/gpu/csrc/app-env.c -L. -lapp
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int app_answer(void);

int main(int argc, char **argv)
{
	const char *p = getenv("LD_LIBRARY_PATH");

	printf("LD_LIBRARY_PATH=%s\n", p ? p : "");
	printf("libapp: %d\n", app_answer());
	if (argc < 2)
		return 0;
	fflush(stdout);
	execv(argv[1], argv + 1);
	perror("app-env: exec");
	return 127;
}
