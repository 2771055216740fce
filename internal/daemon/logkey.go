package daemon

import (
	"cmp"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/bushost/bushost/broker"
	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/safepath"
)

// The broker signs every event it appends with this host's key, which
// never enters the store; it accepts the events of the hosts whose public
// keys it is given (docs/broker.md, "Who wrote an event").
// Its files in the home are home.LogKey (PEM, 0600, made at first start
// unless --log-key names another file) and home.LogPub, its public key,
// written at each start: the line to add to every host's
// --log-trusted-keys.

// maxKeyFile bounds what is read of a key file or a trusted-keys file.
const maxKeyFile = 1 << 20

// logKeys returns the host's signing key (path, or HOME/log.key) and
// the keys it trusts besides (trustedPath's, or none), and writes the
// public key to HOME/log.pub. A key not made yet is made (below): then
// made is true, and keep must be called once the broker opened with it.
func logKeys(h home.Home, path, trustedPath, hostID string) (key ed25519.PrivateKey, trusted []ed25519.PublicKey, made bool, keep func() error, err error) {
	key, made, keep, err = logKey(cmp.Or(path, h.LogKey()))
	if err != nil {
		return nil, nil, false, nil, err
	}
	if trustedPath != "" {
		data, err := readKeyFile(trustedPath, 0o022, true)
		if err != nil {
			return nil, nil, false, nil, fmt.Errorf("--log-trusted-keys %s: %w", trustedPath, err)
		}
		if trusted, err = broker.ParseTrustedKeys(data); err != nil {
			return nil, nil, false, nil, fmt.Errorf("--log-trusted-keys %s: %w", trustedPath, err)
		}
	}
	pub := h.LogPub()
	if err := os.Remove(pub); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, false, nil, fmt.Errorf("log public key %s: %w", pub, err)
	}
	if err := writeNew(pub, 0o644, string(broker.PublicKeyPEM(key.Public().(ed25519.PublicKey), "bus host "+hostID))); err != nil {
		return nil, nil, false, nil, fmt.Errorf("log public key %s: %w", pub, safepath.Linked(pub, err))
	}
	return key, trusted, made, keep, nil
}

// logKey reads the signing key at path. Without one, the key is made
// into PATH.new first (or read from there: a start that made it failed
// before it was kept), and keep moves it to path once the broker opened
// with it: a key that exists is the sign that the broker took it, and
// signed the log written before signing, if any (broker.Options.
// AdoptUnsigned). A key file that is a link, another user's, or readable
// by others is refused: it is what proves this host's events.
func logKey(path string) (key ed25519.PrivateKey, made bool, keep func() error, err error) {
	key, err = readSigningKey(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, false, nil, err
	}
	pending := path + ".new"
	key, err = readSigningKey(pending)
	if errors.Is(err, fs.ErrNotExist) {
		var data []byte
		if key, data, err = broker.NewSigningKey(); err != nil {
			return nil, false, nil, err
		}
		if err = writeNew(pending, 0o600, string(data)); err != nil {
			err = fmt.Errorf("log signing key %s: %w", pending, safepath.Linked(pending, err))
		}
	}
	if err != nil {
		return nil, false, nil, err
	}
	keep = func() error {
		if err := os.Rename(pending, path); err != nil {
			return fmt.Errorf("log signing key: %w", err)
		}
		return bundle.Sync(filepath.Dir(path))
	}
	return key, true, keep, nil
}

// readSigningKey reads and parses the key file at path.
func readSigningKey(path string) (ed25519.PrivateKey, error) {
	data, err := readKeyFile(path, 0o077, false)
	if err != nil {
		return nil, fmt.Errorf("log signing key %s: %w", path, err)
	}
	key, err := broker.ParseSigningKey(data)
	if err != nil {
		return nil, fmt.Errorf("log signing key %s: %w", path, err)
	}
	return key, nil
}

// readKeyFile reads path, opened once without following a link, after
// checking the descriptor: a regular file of the daemon's user (or, with
// rootOK, of root), with none of the permission bits in deny.
func readKeyFile(path string, deny fs.FileMode, rootOK bool) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, safepath.Linked(path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	uid := os.Geteuid()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && rootOK && st.Uid == 0 {
		uid = 0
	}
	if err := safepath.File(path, fi, uid); err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&deny != 0 {
		return nil, fmt.Errorf("mode %v: chmod it to %v", fi.Mode().Perm(), fi.Mode().Perm()&^deny)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("larger than %d bytes", maxKeyFile)
	}
	return data, nil
}
