package ociimage

import (
	"slices"
	"strings"
	"testing"
)

func TestParseLDD(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []string
		wantErr string
	}{
		"debian bookworm": {
			in:   "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n",
			want: []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"},
		},
		"old glibc with libdl": {
			in:   "\tlinux-vdso.so.1 =>  (0x00007ffc)\n\tlibdl.so.2 => /lib64/libdl.so.2 (0x00007f)\n\tlibc.so.6 => /lib64/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n",
			want: []string{"/lib64/libdl.so.2", "/lib64/libc.so.6", "/lib64/ld-linux-x86-64.so.2"},
		},
		"missing library": {
			in:      "\tlibcuda.so.1 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n",
			wantErr: "missing library",
		},
		"static binary": {
			in:      "\tnot a dynamic executable\n",
			wantErr: "statically linked",
		},
		"empty": {in: "", wantErr: "no library paths"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseLDD([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("parseLDD = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
