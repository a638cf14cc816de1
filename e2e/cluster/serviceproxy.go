package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// serviceProxy makes the "kubernetes" Service work for pods: in-cluster
// clients (client-go's rest.InClusterConfig, hence the chart's webhook and
// probe) dial $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, which the
// kubelet sets to that Service's ClusterIP and port 443. The ClusterIP is an
// address of the node's bridge, so a pod's packets to it arrive on this host
// without forwarding or NAT, and this TCP relay hands each connection to the
// API server on loopback. TLS passes through untouched: the pod verifies the
// API server's certificate, which names the ClusterIP. It is kube-proxy's old
// userspace mode for this one Service; Services of pods (the webhook's) are
// resolved to endpoints by the API server itself (--enable-aggregator-routing).
type serviceProxy struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startServiceProxy(listen, target string) (*serviceProxy, error) {
	l, err := net.Listen("tcp4", listen)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s for a relay: %w", listen, err)
	}
	p := &serviceProxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *serviceProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *serviceProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *serviceProxy) relay(in net.Conn) {
	defer p.wg.Done()
	defer in.Close()
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	defer out.Close()
	p.track(in, true)
	p.track(out, true)
	defer p.track(in, false)
	defer p.track(out, false)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

// close stops listening and cuts every relayed connection.
func (p *serviceProxy) close() error {
	if p == nil {
		return nil
	}
	err := p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
