package daemon

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/safepath"
)

// hostID returns the host's id for project placement: flag when given
// (it must be a valid name), else the one kept in HOME/host-id, made at
// first start from the machine's name and random bytes, so that a host
// keeps its id across restarts and two hosts never share one by accident.
func hostID(h home.Home, flag string) (string, error) {
	if flag != "" {
		if err := names.Check("host id", flag); err != nil {
			return "", fmt.Errorf("--host-id: %w", err)
		}
		return flag, nil
	}
	path := h.HostID()
	raw, err := readSmall(path)
	if err == nil {
		id := strings.TrimSpace(raw)
		if err := names.Check("host id", id); err != nil {
			return "", fmt.Errorf("%s: %w (remove it or give --host-id)", path, err)
		}
		return id, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("host id %s: %w", path, safepath.Linked(path, err))
	}
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", err
	}
	id := hostnamePart() + "-" + hex.EncodeToString(rnd[:])
	if err := writeNew(path, 0o644, id+"\n"); err != nil {
		return "", fmt.Errorf("host id %s: %w", path, safepath.Linked(path, err))
	}
	return id, nil
}

// hostnamePart is the machine's name reduced to the name grammar.
func hostnamePart() string {
	h, _ := os.Hostname()
	var b strings.Builder
	for _, c := range strings.ToLower(h) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			b.WriteRune(c)
		case c == '-' || c == '.' || c == '_':
			if b.Len() > 0 {
				b.WriteRune('-')
			}
		}
		if b.Len() >= 32 {
			break
		}
	}
	return cmp.Or(strings.Trim(b.String(), "-"), "host")
}

// readSmall reads a file of at most 4 KiB without following a link.
func readSmall(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	buf := make([]byte, 4096)
	n, err := f.Read(buf)
	if err != nil && n == 0 {
		return "", err
	}
	return string(buf[:n]), nil
}
