package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/shardmap"
)

// certificate issues a certificate for name signed by parent (self-signed when parent is nil).
func certificate(t *testing.T, name string, parent *tls.Certificate, isCA bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  isCA,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		BasicConstraintsValid: true,
	}
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		signer, signerKey = parent.Leaf, parent.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// With tls.client_ca_file set, the API is served only to clients presenting a certificate that
// CA signed.
func TestServeRequiresClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := certificate(t, "shardgate test CA", nil, true)
	server := certificate(t, "127.0.0.1", &ca, false)
	client := certificate(t, "payments-api", &ca, false)
	stranger := certificate(t, "stranger", nil, false)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Certificate[0])
	writePEM(t, filepath.Join(dir, "server.pem"), "CERTIFICATE", server.Certificate[0])
	keyDER, err := x509.MarshalECPrivateKey(server.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, "server-key.pem"), "EC PRIVATE KEY", keyDER)

	cfg, err := config.Parse(filepath.Join(dir, "router.yaml"), []byte(`auth:
  mode: none
tls:
  cert_file: server.pem
  key_file: server-key.pem
  client_ca_file: ca.pem
`))
	if err != nil {
		t.Fatal(err)
	}
	mapPath := filepath.Join(dir, "shardmap.yaml")
	if err := os.WriteFile(mapPath, []byte(oneShardMap), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startServe(t, cfg, mapPath)

	roots := x509.NewCertPool()
	roots.AddCert(ca.Leaf)
	get := func(certs ...tls.Certificate) (int, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}}}
		resp, err := c.Get("https://" + addr + "/healthz")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := get(client); err != nil || code != http.StatusOK {
		t.Errorf("client with a CA-signed certificate: %d, %v; want 200", code, err)
	}
	if _, err := get(); err == nil {
		t.Error("client without a certificate was served")
	}
	if _, err := get(stranger); err == nil {
		t.Error("client with a certificate from another CA was served")
	}
}

// mapFile writes shard maps for the reload tests, replacing the file by a rename as editors
// and Kubernetes do.
type mapFile struct {
	t    *testing.T
	path string
}

func (f mapFile) write(version int, ranges string) {
	f.t.Helper()
	body := "version: " + strconv.Itoa(version) + "\nshards:\n  - name: s\n    dsn: postgres://u@127.0.0.1:1/db\n    ranges: [" + ranges + "]\n"
	if err := os.WriteFile(f.path+".tmp", []byte(body), 0o600); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(f.path+".tmp", f.path); err != nil {
		f.t.Fatal(err)
	}
}

// startReloadServe writes version 1 of a map, serves it, and returns a function that waits
// until the router serves version want (failing after 10s) and one that reads the version.
func startReloadServe(t *testing.T) (f mapFile, waitVersion func(want int64), version func() int64) {
	dir := t.TempDir()
	f = mapFile{t: t, path: filepath.Join(dir, "shardmap.yaml")}
	f.write(1, `"-"`)
	cfg, err := config.Parse(filepath.Join(dir, "router.yaml"), []byte("auth:\n  mode: none\n"))
	if err != nil {
		t.Fatal(err)
	}
	addr := startServe(t, cfg, f.path)
	version = func() int64 {
		resp, err := http.Get("http://" + addr + "/admin/shardmap")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct{ Version int64 }
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v.Version
	}
	waitVersion = func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for version() != want {
			if time.Now().After(deadline) {
				t.Fatalf("serving version %d, want %d", version(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return f, waitVersion, version
}

// serve reloads the shard map when the file changes, even right after it started and with the
// same size (a timestamp could not tell these edits apart), and keeps serving the old map when
// the new one is invalid.
func TestServeReloadsOnFileChange(t *testing.T) {
	f, waitVersion, version := startReloadServe(t)
	f.write(2, `"-"`) // at once, same size: only the content differs
	waitVersion(2)
	f.write(3, `"-80"`) // invalid: a gap; refused, version 2 keeps serving
	time.Sleep(3 * service.MapPollInterval)
	if v := version(); v != 2 {
		t.Fatalf("after an invalid map: serving version %d, want 2", v)
	}
	f.write(4, `"-"`)
	waitVersion(4)
}

// SIGHUP reloads the map, with the file watch taken out of the way.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	service.MapPollInterval = time.Hour
	t.Cleanup(func() { service.MapPollInterval = time.Second })
	f, waitVersion, version := startReloadServe(t)
	f.write(2, `"-"`)
	time.Sleep(500 * time.Millisecond)
	if v := version(); v != 1 {
		t.Fatalf("serving version %d before SIGHUP with the watch off, want 1", v)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitVersion(2)
}

// A SIGHUP sent the moment the router says it is ready reloads the map; it must not find the
// signal unhandled (Go's default for SIGHUP is to exit, which would end this test binary).
func TestServeTakesSIGHUPRightAfterReady(t *testing.T) {
	service.MapPollInterval = time.Hour
	t.Cleanup(func() { service.MapPollInterval = time.Second })
	f, waitVersion, _ := startReloadServe(t)
	f.write(2, `"-"`)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitVersion(2)
}

// startServe runs serveOn on a loopback listener with cfg and the map at mapPath until the test
// ends, and returns the address once the router accepts requests.
func startServe(t *testing.T, cfg *config.Config, mapPath string) string {
	t.Helper()
	m, err := shardmap.Load(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- serveOn(ctx, ln, cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string) { close(ready) })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve ended before it was ready: %v", err)
	}
	return ln.Addr().String()
}

// oneShardMap is a valid map whose only shard is never reached by these tests.
const oneShardMap = "version: 1\nshards:\n  - name: s\n    dsn: postgres://u@127.0.0.1:1/db\n    ranges: [\"-\"]\n"

// serve runs the periodic reconcile unless reconcile.enabled is false: its series are on
// /metrics from the start, at 0 until it has checked.
func TestServeRunsPeriodicReconcile(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want bool
	}{{"", true}, {"reconcile:\n  enabled: false\n", false}} {
		dir := t.TempDir()
		mapPath := filepath.Join(dir, "shardmap.yaml")
		if err := os.WriteFile(mapPath, []byte(oneShardMap), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Parse(filepath.Join(dir, "router.yaml"), []byte("auth:\n  mode: none\n"+tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + startServe(t, cfg, mapPath) + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(body), "shardgate_reconcile_leader 0"); got != tc.want {
			t.Errorf("config %q: shardgate_reconcile_leader 0 on /metrics is %t, want %t", tc.yaml, got, tc.want)
		}
	}
}
