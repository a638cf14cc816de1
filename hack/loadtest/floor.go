package main

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
)

// floorWebhook answers every admission request at once, without decoding
// it: allowed, and with patches[size] when the pod carries that size's
// label. With no patches it is the no-op floor, what any webhook costs the
// API server; with ours it is the same-patch floor, which adds what the API
// server spends applying a patch of our size.
type floorWebhook struct {
	url     string
	srv     *http.Server
	patches map[string]string // size -> base64 JSON Patch
}

func startFloor(certFile, keyFile string, patches map[string][]byte) (*floorWebhook, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("failed to load the webhook certificate: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &floorWebhook{url: "https://" + l.Addr().String() + "/mutate-v1-pod", patches: map[string]string{}}
	for size, p := range patches {
		f.patches[size] = base64.StdEncoding.EncodeToString(p)
	}
	f.srv = &http.Server{Handler: f, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	go func() { _ = f.srv.ServeTLS(l, "", "") }()
	return f, nil
}

func (f *floorWebhook) close() { _ = f.srv.Close() }

var uidKey = []byte(`"uid":"`)

func (f *floorWebhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	uid := requestUID(body)
	if uid == "" {
		http.Error(w, "no request uid", http.StatusBadRequest)
		return
	}
	patch := ""
	for size, p := range f.patches {
		if bytes.Contains(body, []byte(`"`+sizeLabelKey+`":"`+size+`"`)) {
			patch = `,"patchType":"JSONPatch","patch":"` + p + `"`
			break
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"`+uid+`","allowed":true`+patch+`}}`)
}

// requestUID finds the request's uid: the API server writes it as the
// first field of the request, before the object and its own uid.
func requestUID(body []byte) string {
	i := bytes.Index(body, uidKey)
	if i < 0 {
		return ""
	}
	rest := body[i+len(uidKey):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 || j > 64 {
		return ""
	}
	return string(rest[:j])
}
