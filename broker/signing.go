package broker

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Authorship of the log (issue 31). The hash chain proves order, not who
// wrote an event: HashEvent is public, so whoever can write the database
// can append an event with a hash that fits. So each host signs the hash
// of every event it appends with its own Ed25519 key, which never enters
// the database (the daemon keeps it in a 0600 file), as Certificate
// Transparency logs sign their tree heads. The keys that verify come from
// outside the database too (a file on each host listing every host's
// public key; with one host, its own key), never from the log: an event
// is proven when its content hashes to its hash and a trusted key signed
// that hash. docs/broker.md, "Who wrote an event", states the threat
// model.

// sigContext separates an event signature from anything else the key
// could ever sign.
const sigContext = "bushost-event-sig-v1\x00"

// MaxTrustedKeys bounds the keys one trusted-keys file may list.
const MaxTrustedKeys = 1024

// KeyID names a public key in a signature: the first 8 bytes of its
// SHA-256, in hex. It only says which trusted key to try; the signature
// itself is the proof.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Signer signs the events one host appends.
type Signer struct {
	key ed25519.PrivateKey
	id  string
}

// NewSigner returns the signer of key.
func NewSigner(key ed25519.PrivateKey) *Signer {
	return &Signer{key: key, id: KeyID(key.Public().(ed25519.PublicKey))}
}

// Public returns the key that verifies s's signatures.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// sign returns the signature of an event whose hash is hash, as stored in
// the sig column: "KEYID:BASE64".
func (s *Signer) sign(hash string) string {
	return s.id + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(s.key, []byte(sigContext+hash)))
}

// Keyring is the public keys whose signatures a broker accepts.
type Keyring struct {
	keys map[string]ed25519.PublicKey
}

// NewKeyring trusts pubs.
func NewKeyring(pubs ...ed25519.PublicKey) *Keyring {
	k := &Keyring{keys: map[string]ed25519.PublicKey{}}
	for _, p := range pubs {
		k.keys[KeyID(p)] = p
	}
	return k
}

// ids lists the trusted keys' ids, sorted.
func (k *Keyring) ids() []string {
	return slices.Sorted(maps.Keys(k.keys))
}

// prove returns nil when e is proven: its content hashes to its hash, and
// a trusted key signed that hash. Otherwise it says what is wrong, in a
// phrase that follows "event N".
func (k *Keyring) prove(e Event) error {
	if HashEvent(e) != e.Hash {
		return fmt.Errorf("does not match its hash %.12s: it was changed after it was appended", e.Hash)
	}
	if e.Sig == "" {
		return errors.New("carries no signature: no host wrote it")
	}
	id, b64, ok := strings.Cut(e.Sig, ":")
	if !ok {
		return fmt.Errorf("has a malformed signature %q", clip(e.Sig))
	}
	pub, ok := k.keys[id]
	if !ok {
		return fmt.Errorf("is signed by key %s, which is not a trusted host's key (trusted: %s)", clip(id), strings.Join(k.ids(), ", "))
	}
	sig, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(sig) != ed25519.SignatureSize || !ed25519.Verify(pub, []byte(sigContext+e.Hash), sig) {
		return fmt.Errorf("has a signature that key %s did not make: forged", id)
	}
	return nil
}

// NewSigningKey makes a host's key and returns it as the PEM file holds it
// (PKCS #8, as `openssl genpkey -algorithm ed25519` writes it).
func NewSigningKey() (ed25519.PrivateKey, []byte, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseSigningKey reads a key file: one PEM "PRIVATE KEY" block holding an
// Ed25519 key.
func ParseSigningKey(data []byte) (ed25519.PrivateKey, error) {
	blk, rest := pem.Decode(data)
	if blk == nil || blk.Type != "PRIVATE KEY" || strings.TrimSpace(string(rest)) != "" {
		return nil, errors.New("not one PEM PRIVATE KEY block (openssl genpkey -algorithm ed25519)")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	key, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an Ed25519 key", k)
	}
	return key, nil
}

// PublicKeyPEM is pub as a trusted-keys file lists it (a PEM "PUBLIC KEY"
// block, as `openssl pkey -pubout` writes it), after a comment line naming
// it.
func PublicKeyPEM(pub ed25519.PublicKey, name string) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(fmt.Sprintf("broker: marshal an Ed25519 public key: %v", err))
	}
	return append([]byte(fmt.Sprintf("# %s, key %s\n", name, KeyID(pub))), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
}

// ParseTrustedKeys reads a trusted-keys file: PEM "PUBLIC KEY" blocks of
// Ed25519 keys, with comment lines (#) between them; anything else is
// refused, so that a mangled block is not silently skipped.
func ParseTrustedKeys(data []byte) ([]ed25519.PublicKey, error) {
	var out []ed25519.PublicKey
	rest := data
	for n := 1; ; n++ {
		rest = skipComments(rest)
		if len(rest) == 0 {
			break
		}
		// pem.Decode would skip text before a block: refuse it instead.
		blk, r := pem.Decode(rest)
		if !bytes.HasPrefix(rest, []byte("-----BEGIN PUBLIC KEY-----")) || blk == nil || blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("key %d: not a PEM PUBLIC KEY block", n)
		}
		rest = r
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", n, err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("key %d: a %T, not an Ed25519 key", n, k)
		}
		if len(out) == MaxTrustedKeys {
			return nil, fmt.Errorf("more than %d keys", MaxTrustedKeys)
		}
		out = append(out, pub)
	}
	if len(out) == 0 {
		return nil, errors.New("no key: list each host's public key (its HOME/log.pub)")
	}
	return out, nil
}

// skipComments drops blank lines and lines starting with '#', and the
// blanks before what follows.
func skipComments(b []byte) []byte {
	for len(b) > 0 {
		line, rest, _ := bytes.Cut(b, []byte("\n"))
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			return bytes.TrimLeft(b, " \t\r")
		}
		b = rest
	}
	return b
}
