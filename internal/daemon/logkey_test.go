package daemon

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/broker"
	"github.com/bushost/bushost/internal/home"
)

// The log signing key: made 0600 at first start, kept (HOME/log.key) only
// once the broker opened with it, so that a start that failed before
// makes the same key again; read back the same at the next start; its
// public key in HOME/log.pub. A key file that is a link, readable by
// others or not a key is refused and left as it was.
func TestLogKey(t *testing.T) {
	h := home.At(t.TempDir())
	path := h.LogKey()
	key, trusted, made, _, err := logKeys(h, "", "", "host-a")
	if err != nil || !made || trusted != nil {
		t.Fatalf("first start: made %v, trusted %v, %v", made, trusted, err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("the key was kept before the broker took it")
	}
	failed, _, made, keep, err := logKeys(h, "", "", "host-a")
	if err != nil || !made || !failed.Equal(key) {
		t.Fatalf("a start after one that failed: made %v, same key %v, %v", made, failed.Equal(key), err)
	}
	if err := keep(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, _, made, _, err := logKeys(h, "", "", "host-a")
	if err != nil || made || !again.Equal(key) {
		t.Fatalf("the next start: made %v, same key %v, %v", made, again.Equal(key), err)
	}
	pub, err := os.ReadFile(h.LogPub())
	if err != nil {
		t.Fatal(err)
	}
	listed, err := broker.ParseTrustedKeys(pub)
	if err != nil || len(listed) != 1 || !listed[0].Equal(key.Public()) || !strings.Contains(string(pub), "host-a") {
		t.Fatalf("log.pub %q: %v %v", pub, listed, err)
	}

	refused := func(name string, setup func(path string)) {
		t.Helper()
		dir := t.TempDir()
		p := filepath.Join(dir, "k")
		setup(p)
		before, _ := os.ReadFile(p)
		if _, _, _, _, err := logKeys(home.At(t.TempDir()), p, "", "host-a"); err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if after, _ := os.ReadFile(p); !bytes.Equal(before, after) {
			t.Fatalf("%s: the file changed", name)
		}
	}
	_, data, _ := broker.NewSigningKey()
	refused("readable by others", func(p string) { os.WriteFile(p, data, 0o644) })
	refused("a link to a key", func(p string) {
		os.WriteFile(p+".real", data, 0o600)
		os.Symlink(p+".real", p)
	})
	refused("not a key", func(p string) { os.WriteFile(p, []byte("hello\n"), 0o600) })
	refused("two keys", func(p string) { os.WriteFile(p, append(append([]byte{}, data...), data...), 0o600) })
	refused("an ECDSA key", func(p string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, _ := x509.MarshalPKCS8PrivateKey(k)
		os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	})
}

// The trusted-keys file: PEM public keys with comment lines between them;
// anything else in it (text between blocks, another kind of key, no key,
// too many, a file others may write) is refused, naming the key.
func TestLogTrustedKeys(t *testing.T) {
	var list []byte
	var pubs []ed25519.PublicKey
	for i := 0; i < 3; i++ {
		k, _, err := broker.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, k.Public().(ed25519.PublicKey))
		list = append(list, broker.PublicKeyPEM(pubs[i], "host")...)
		list = append(list, "\n# a blank line and a comment\n"...)
	}
	dir := t.TempDir()
	file := func(data []byte, mode os.FileMode) string {
		f, err := os.CreateTemp(dir, "trusted-")
		if err != nil {
			t.Fatal(err)
		}
		f.Write(data)
		f.Close()
		os.Chmod(f.Name(), mode)
		return f.Name()
	}
	_, trusted, _, _, err := logKeys(home.At(t.TempDir()), "", file(list, 0o644), "host-a")
	if err != nil || len(trusted) != 3 {
		t.Fatalf("three keys: %v %v", trusted, err)
	}
	for i := range pubs {
		if !trusted[i].Equal(pubs[i]) {
			t.Fatalf("key %d differs", i)
		}
	}

	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	many := bytes.Repeat(broker.PublicKeyPEM(pubs[0], "again"), broker.MaxTrustedKeys+1)
	for _, c := range []struct {
		name  string
		data  []byte
		mode  os.FileMode
		wants string
	}{
		{"text between keys", append(append([]byte{}, list...), "ssh-ed25519 AAAA host\n"...), 0o644, "key 4: not a PEM PUBLIC KEY block"},
		{"text before a key", append([]byte("junk\n"), list...), 0o644, "key 1: not a PEM PUBLIC KEY block"},
		{"an ECDSA key", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER}), 0o644, "not an Ed25519 key"},
		{"a private key", func() []byte { _, d, _ := broker.NewSigningKey(); return d }(), 0o644, "not a PEM PUBLIC KEY block"},
		{"no key", []byte("# nobody\n"), 0o644, "no key"},
		{"too many", many, 0o644, "more than 1024 keys"},
		{"writable by others", list, 0o666, "writable by group or others"},
	} {
		_, _, _, _, err := logKeys(home.At(t.TempDir()), "", file(c.data, c.mode), "host-a")
		if err == nil || !strings.Contains(err.Error(), "--log-trusted-keys") || !strings.Contains(err.Error(), c.wants) {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
}
