package cluster

import (
	"net"
	"os"
	"slices"
	"testing"
)

// The bridge the launcher makes without iproute2: created up, with both
// addresses, and gone after deleteLink.
func TestCreateBridge(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a bridge needs root")
	}
	name := "git" + randomHex(3)
	if err := createBridge(name, "10.87.250.1/24", "10.87.251.1/32"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteLink(name) })
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if ifc.Flags&net.FlagUp == 0 {
		t.Errorf("bridge %s is not up: %v", name, ifc.Flags)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		got = append(got, a.String())
	}
	for _, want := range []string{"10.87.250.1/24", "10.87.251.1/32"} {
		if !slices.Contains(got, want) {
			t.Errorf("bridge addresses %v, want %s", got, want)
		}
	}
	if _, err := os.Stat("/sys/class/net/" + name + "/bridge"); err != nil {
		t.Errorf("%s is not a bridge: %v", name, err)
	}
	if err := deleteLink(name); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(name); err == nil {
		t.Errorf("%s still exists after deleteLink", name)
	}
	if err := deleteLink(name); err != nil {
		t.Errorf("deleting a missing link: %v", err)
	}
}
