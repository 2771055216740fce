package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// What the supervisor must remember across a restart lives in its git dir,
// which only its user (and root) can write: a halt, and a first commit
// that adopted a workspace it had no history of and that waits for an
// acknowledgement.

// stateFile, in the git dir, holds the persisted state.
const stateFile = "bushost-supervisor.json"

// seededFile, in the git dir, is left by init when it seeded an empty
// workspace: the first commit then holds the seed, which needs no
// acknowledgement. The supervisor removes it with the first commit.
const seededFile = "bushost-seeded"

// ackFile, in the git dir, is what `supervisor ack` writes: the adopted
// commit it acknowledges.
const ackFile = "bushost-ack"

// persisted is the state kept in stateFile.
type persisted struct {
	Halted      bool   `json:"halted,omitempty"`
	HaltReason  string `json:"halt_reason,omitempty"`
	HaltService string `json:"halt_service,omitempty"`
	// AwaitingAck is the first commit of a workspace the supervisor had
	// no history of: no commit becomes good until `supervisor ack`
	// acknowledges it.
	AwaitingAck string `json:"awaiting_ack,omitempty"`
	// UnfinishedRevert is the reason of a revert that failed: the next
	// start finishes it before the services run.
	UnfinishedRevert string `json:"unfinished_revert,omitempty"`
}

// maxStateBytes bounds what is read from the git dir's state files.
const maxStateBytes = 64 << 10

func readSmall(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err == nil && len(b) > maxStateBytes {
		err = fmt.Errorf("%s is larger than %d bytes", path, maxStateBytes)
	}
	return b, err
}

// loadState reads the persisted state of gitDir; a missing file is the
// zero state.
func loadState(gitDir string) (persisted, error) {
	var p persisted
	b, err := readSmall(filepath.Join(gitDir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%s: %w", filepath.Join(gitDir, stateFile), err)
	}
	return p, nil
}

func saveState(gitDir string, p persisted) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(gitDir, stateFile), append(b, '\n'), 0o640)
}

// acknowledged reports whether `supervisor ack` acknowledged commit.
func acknowledged(gitDir, commit string) bool {
	b, err := readSmall(filepath.Join(gitDir, ackFile))
	return err == nil && strings.TrimSpace(string(b)) == commit
}

// Ack acknowledges the commit the supervisor of cfg adopted without
// history, so that it (or the commit it is at then) may become good once
// healthy for good_after. Only root and the git dir's owner may: the agent
// can read the git dir, never write it. It returns the commit
// acknowledged, or "" when nothing waits for an acknowledgement.
func Ack(cfg *Config) (string, error) {
	fi, err := os.Lstat(cfg.GitDir)
	if err != nil {
		return "", fmt.Errorf("git_dir: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if euid := os.Geteuid(); st == nil || (euid != 0 && int(st.Uid) != euid) {
		return "", fmt.Errorf("only root or the owner of git_dir %s (the supervisor's user) may acknowledge", cfg.GitDir)
	}
	p, err := loadState(cfg.GitDir)
	if err != nil {
		return "", err
	}
	if p.AwaitingAck == "" {
		return "", nil
	}
	return p.AwaitingAck, writeFileAtomic(filepath.Join(cfg.GitDir, ackFile), []byte(p.AwaitingAck+"\n"), 0o644)
}

// markSeeded is init's note, in the git dir it prepared, that it seeded
// the workspace this boot.
func markSeeded(gitDir string, uid, gid int) error {
	path := filepath.Join(gitDir, seededFile)
	if err := writeFileAtomic(path, []byte("seeded by supervisor init\n"), 0o640); err != nil {
		return err
	}
	return os.Lchown(path, uid, gid)
}
