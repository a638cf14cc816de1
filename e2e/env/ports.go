package env

import (
	"fmt"
	"net"
)

// freePort asks the kernel for a free loopback port. It is released before
// the program binds it; the window is short.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("failed to reserve a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
