package cluster

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// The node's bridge is made here with rtnetlink rather than the ip tool: the
// GPU machines have no iproute2, iptables or nft, and one code path must
// serve both. Only the three calls the launcher needs: make a bridge, give it
// addresses and bring it up, delete it.

// createBridge makes a Linux bridge named name, gives it each address (CIDR)
// and sets it up.
//
// The bridge gets a MAC address of its own at creation. Without one, the
// kernel gives a bridge the lowest MAC of its ports and changes it whenever
// a port with a lower one comes or the lowest one goes, that is whenever a
// pod starts or stops. Every other pod still has the old MAC cached for its
// gateway (this host) and sends its replies there, where nothing takes them,
// until its neighbour entry expires and it asks again: 10 to 50 s in which
// the API server's calls to a webhook pod and the kubelet's probes time out.
// A real node does not do that: udev (MACAddressPolicy=persistent) gives
// cni0 a fixed address as it is made, Docker does the same for docker0, and
// an address set this way is one the kernel never replaces.
func createBridge(name string, cidrs ...string) error {
	linkinfo := nlAttr(unix.IFLA_INFO_KIND, append([]byte("bridge"), 0))
	mac, err := localMAC()
	if err != nil {
		return fmt.Errorf("failed to make a MAC address for bridge %s: %w", name, err)
	}
	msg := ifinfo(0, unix.IFF_UP, unix.IFF_UP)
	msg = append(msg, nlAttr(unix.IFLA_IFNAME, append([]byte(name), 0))...)
	msg = append(msg, nlAttr(unix.IFLA_ADDRESS, mac)...)
	msg = append(msg, nlAttr(unix.IFLA_LINKINFO|unix.NLA_F_NESTED, linkinfo)...)
	if err := netlinkDo(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL, msg); err != nil {
		return fmt.Errorf("failed to create bridge %s: %w", name, err)
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("failed to find bridge %s: %w", name, err)
	}
	for _, cidr := range cidrs {
		ip, ipnet, err := net.ParseCIDR(cidr)
		if err != nil {
			return fmt.Errorf("failed to parse %s: %w", cidr, err)
		}
		ones, _ := ipnet.Mask.Size()
		ip4 := ip.To4()
		// struct ifaddrmsg: family, prefixlen, flags, scope, index.
		m := make([]byte, 8)
		m[0], m[1] = unix.AF_INET, byte(ones)
		binary.NativeEndian.PutUint32(m[4:], uint32(ifc.Index))
		m = append(m, nlAttr(unix.IFA_LOCAL, ip4)...)
		m = append(m, nlAttr(unix.IFA_ADDRESS, ip4)...)
		if err := netlinkDo(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, m); err != nil {
			return fmt.Errorf("failed to add %s to %s: %w", cidr, name, err)
		}
	}
	return nil
}

// localMAC is a random, locally administered unicast MAC address, as the
// kernel's eth_random_addr makes them.
func localMAC() (net.HardwareAddr, error) {
	mac := make(net.HardwareAddr, 6)
	if _, err := rand.Read(mac); err != nil {
		return nil, err
	}
	mac[0] = mac[0]&^0x01 | 0x02
	return mac, nil
}

// deleteLink removes the link named name; a missing link is no error.
func deleteLink(name string) error {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil
	}
	if err := netlinkDo(unix.RTM_DELLINK, 0, ifinfo(int32(ifc.Index), 0, 0)); err != nil && !errors.Is(err, syscall.ENODEV) {
		return fmt.Errorf("failed to delete link %s: %w", name, err)
	}
	return nil
}

// ifinfo is a struct ifinfomsg.
func ifinfo(index int32, flags, change uint32) []byte {
	m := make([]byte, unix.SizeofIfInfomsg)
	m[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(m[4:], uint32(index))
	binary.NativeEndian.PutUint32(m[8:], flags)
	binary.NativeEndian.PutUint32(m[12:], change)
	return m
}

func nlAttr(typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b := make([]byte, (l+unix.NLA_ALIGNTO-1) & ^(unix.NLA_ALIGNTO-1))
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], data)
	return b
}

// netlinkDo sends one request and waits for its acknowledgement.
func netlinkDo(typ uint16, flags uint16, payload []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("failed to open a netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("failed to bind the netlink socket: %w", err)
	}
	const seq = 1
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(payload))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(payload)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	msg = append(msg, payload...)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("failed to send a netlink request: %w", err)
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("failed to read the netlink answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("failed to parse the netlink answer: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return errors.New("short netlink error message")
			}
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				return syscall.Errno(-code)
			}
			return nil
		}
	}
}
