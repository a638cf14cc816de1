package cluster

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
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

// A pod's veth joining and leaving the bridge must not change the bridge's
// MAC: pods cache it for their gateway, and a bridge that took its lowest
// port's address and dropped it with the port left every other pod sending
// its replies to an address nothing answers, for tens of seconds.
func TestBridgeKeepsItsMAC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a bridge needs root")
	}
	name := "git" + randomHex(3)
	if err := createBridge(name, "10.87.252.1/24"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteLink(name) })
	br, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	mac := br.HardwareAddr.String()
	if b, err := os.ReadFile("/sys/class/net/" + name + "/addr_assign_type"); err != nil || strings.TrimSpace(string(b)) != "3" {
		t.Errorf("bridge %s addr_assign_type %q (%v), want 3 (set at creation)", name, b, err)
	}

	// A port whose MAC sorts below any the bridge can have: a kernel that
	// picks the bridge's address from its ports would take this one.
	port, peer := "gip"+randomHex(3), "gic"+randomHex(3)
	if err := createVethPort(port, peer, net.HardwareAddr{0, 0, 0, 0, 0, 1}, br.Index); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteLink(port) })
	if got := macOf(t, name); got != mac {
		t.Errorf("bridge MAC %s after a port with a lower MAC joined, want %s", got, mac)
	}
	if err := deleteLink(port); err != nil {
		t.Fatal(err)
	}
	if got := macOf(t, name); got != mac {
		t.Errorf("bridge MAC %s after the port left, want %s", got, mac)
	}
}

func macOf(t *testing.T, name string) string {
	t.Helper()
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return ifc.HardwareAddr.String()
}

// createVethPort makes a veth pair, as the CNI bridge plugin does for a pod,
// with the given MAC on name, and makes name a port of the bridge master.
func createVethPort(name, peer string, mac net.HardwareAddr, master int) error {
	peerMsg := ifinfo(0, 0, 0)
	peerMsg = append(peerMsg, nlAttr(unix.IFLA_IFNAME, append([]byte(peer), 0))...)
	data := nlAttr(1 /* VETH_INFO_PEER */ |unix.NLA_F_NESTED, peerMsg)
	linkinfo := nlAttr(unix.IFLA_INFO_KIND, append([]byte("veth"), 0))
	linkinfo = append(linkinfo, nlAttr(unix.IFLA_INFO_DATA|unix.NLA_F_NESTED, data)...)
	msg := ifinfo(0, 0, 0)
	msg = append(msg, nlAttr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	msg = append(msg, nlAttr(unix.IFLA_ADDRESS, mac)...)
	msg = append(msg, nlAttr(unix.IFLA_LINKINFO|unix.NLA_F_NESTED, linkinfo)...)
	if err := netlinkDo(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, msg); err != nil {
		return fmt.Errorf("failed to create veth %s: %w", name, err)
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("failed to find veth %s: %w", name, err)
	}
	set := ifinfo(int32(ifc.Index), 0, 0)
	m := make([]byte, 4)
	binary.NativeEndian.PutUint32(m, uint32(master))
	set = append(set, nlAttr(unix.IFLA_MASTER, m)...)
	if err := netlinkDo(unix.RTM_NEWLINK, 0, set); err != nil {
		return fmt.Errorf("failed to add %s to the bridge: %w", name, err)
	}
	return nil
}

// Clusters on one machine never share a network: claims are all different
// (40 at random from 254 would collide 19 times in 20 without the locks),
// a claimed N cannot be locked again while held, and is free once released.
// Only 40: the suite may be starting a cluster beside this test.
func TestClaimNetwork(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the network locks live under /run/lock")
	}
	held := map[int]*os.File{}
	t.Cleanup(func() {
		for _, f := range held {
			f.Close()
		}
	})
	for range 40 {
		n, f, err := claimNetwork()
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := held[n]; dup {
			t.Fatalf("10.88.%d.0/24 claimed twice", n)
		}
		held[n] = f
	}
	for n, f := range held {
		lock := filepath.Join(networkLockDir, strconv.Itoa(n)+".lock")
		other, err := os.Open(lock)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			t.Errorf("%s could be locked while its network is claimed", lock)
		}
		f.Close()
		delete(held, n)
		if err := syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Errorf("%s is still locked after its network was released: %v", lock, err)
		}
		break
	}
}
