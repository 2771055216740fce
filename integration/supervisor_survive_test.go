package integration

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/supervisor"
)

// What an agent does to the container's supervisor that outlives one run:
// a tree too deep for a descriptor per level, a directory hidden by an
// ACL, a git dir that is lost. Each is reported, none stops a boot, and a
// revert still leaves the trees exactly as the good commit.

// deepTree is the agent's script that makes depth nested directories "d"
// under dir, with a file at the bottom, through descriptors (the path is
// past PATH_MAX).
func deepTree(dir string, depth int) string {
	return fmt.Sprintf(`python3 -c '
import os
fd = os.open(%q, os.O_RDONLY)
for i in range(%d):
    os.mkdir("d", dir_fd=fd)
    n = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = n
os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o664, dir_fd=fd))
'`, dir, depth)
}

// goodFiles is what commit holds under src, sorted, as filesUnder lists.
func (e *supEnv) goodFiles(commit string) []string {
	want := strings.Split(e.git("ls-tree", []string{"-r", "--name-only"}, commit, "--", "src"), "\n")
	sort.Strings(want)
	return want
}

func (e *supEnv) exactlyGood(commit string) {
	e.t.Helper()
	want, got := e.goodFiles(commit), filesUnder(e.t, e.ws, "src")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		e.t.Errorf("the watched trees hold\n%s\nwant exactly the good commit's\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A 1,100-level tree planted by the agent is reported by name (not
// skipped), the supervisor boots over it again with 1,024 descriptors,
// and a revert removes it.
func TestSupervisorDeepTreeReportedAndReverted(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	var good string
	e.waitFor("first good commit", 10*time.Second, func() bool { st := e.status(); good = st.Good; return good != "" && good == st.Head })
	web := filepath.Join(e.ws, "src", "website")
	if out, err := e.asAgent(deepTree(web, 1100)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	reported := func() bool {
		st := e.status()
		return st.State == "degraded" && strings.Contains(st.Unrecorded, "more than 256 directories below src") && strings.Contains(st.Unrecorded, "src/website/d/d/")
	}
	e.waitFor("the tree reported", 15*time.Second, reported)

	// A restart with the container's descriptor limit: init hands the
	// tree over at any depth, the supervisor starts, and says it again.
	e.shutdown()
	e.wrap = []string{"prlimit", "--nofile=1024:1024", "--"}
	e.boot()
	e.waitFor("healthy after the restart", 15*time.Second, func() bool { return e.healthz() == 200 })
	e.waitFor("the tree reported after the restart", 15*time.Second, reported)

	// An edit that cannot be recorded restarts nothing; one made while
	// the supervisor is stopped runs at its start: a crash loop, whose
	// revert removes the tree, whatever its depth.
	e.shutdown()
	if out, err := e.asAgent(fmt.Sprintf(`printf '#!/bin/bash\necho broken\nexit 1\n' > %s/serve.sh`, web)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	e.boot()
	var st supervisor.Status
	e.waitFor("revert", 20*time.Second, func() bool { st = e.status(); return len(st.Reverts) > 0 })
	if r := st.Reverts[0]; r.Error != "" || r.To != good {
		t.Fatalf("revert %+v, good %s", r, good)
	}
	e.exactlyGood(good)
	e.waitFor("recorded and healthy after the revert", 15*time.Second, func() bool {
		st := e.status()
		return e.healthz() == 200 && st.Unrecorded == ""
	})
}

// aclHiding is the access ACL `setfacl -m u:UID:---` leaves on a
// directory of mode 0775: its owner and group keep their bits, uid gets
// nothing (the kernel's xattr format, so that no acl tools are needed).
func aclHiding(uid int) string {
	const undefined = 0xffffffff
	buf := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range []struct {
		tag, perm uint16
		id        uint32
	}{{0x01, 7, undefined}, {0x02, 0, uint32(uid)}, {0x04, 7, undefined}, {0x10, 7, undefined}, {0x20, 5, undefined}} {
		buf = binary.LittleEndian.AppendUint16(buf, e.tag)
		buf = binary.LittleEndian.AppendUint16(buf, e.perm)
		buf = binary.LittleEndian.AppendUint32(buf, e.id)
	}
	return hex.EncodeToString(buf)
}

// A directory the agent hides from the supervisor with an access ACL
// (u:app:---): commits are blocked with a message naming it, the revert
// that cannot remove it fails loudly, and the next start, whose init
// strips the agent's ACLs, finishes the revert: the trees end exactly as
// the good commit.
func TestSupervisorACLHiddenDirectory(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	var good string
	e.waitFor("first good commit", 10*time.Second, func() bool { st := e.status(); good = st.Good; return good != "" && good == st.Head })
	app, err := user.Lookup(e.app)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(app.Uid)
	web := filepath.Join(e.ws, "src", "website")
	// A bad edit, recorded while the trees still can be: the service it
	// starts never turns healthy (so never good) and breaks once the
	// hidden directory is there. Commits wait while the directory is
	// hidden, so it must be committed first.
	if out, err := e.asAgent(fmt.Sprintf(`printf '#!/bin/bash\nwhile [ ! -d hidden ]; do sleep 0.1; done\necho broken\nexit 1\n' > %s/serve.sh`, web)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	e.waitFor("the bad edit committed and running", 15*time.Second, func() bool {
		st := e.status()
		return st.Head != good && st.Unrecorded == "" && len(st.Services) > 0 && st.Services[0].State == supervisor.StateRunning
	})
	script := fmt.Sprintf(`mkdir %[1]s/hidden && echo implant > %[1]s/hidden/payload.sh &&
python3 -c 'import os; os.setxattr("%[1]s/hidden", "system.posix_acl_access", bytes.fromhex("%[2]s"))'`, web, aclHiding(uid))
	if out, err := e.asAgent(script); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	var st supervisor.Status
	e.waitFor("the revert fails, loudly", 20*time.Second, func() bool {
		st = e.status()
		return len(st.Reverts) > 0 && strings.Contains(st.Reverts[0].Error, "hidden")
	})
	e.waitFor("the hidden directory reported", 15*time.Second, func() bool {
		return strings.Contains(e.status().Unrecorded, "src/website/hidden cannot be read by the supervisor")
	})

	e.shutdown()
	e.boot()
	e.waitFor("the revert finished at the start", 15*time.Second, func() bool {
		st := e.status()
		n := len(st.Reverts)
		return n > 0 && st.Reverts[n-1].Error == "" && st.Reverts[n-1].To == good
	})
	e.exactlyGood(good)
	if _, err := os.Lstat(filepath.Join(web, "hidden")); !os.IsNotExist(err) {
		t.Errorf("the hidden directory survived: %v", err)
	}
	// Its payload is in the history all the same: recorded once init
	// made it readable, before the revert.
	if log := e.git("log", []string{"--all", "--name-only", "--format="}, "HEAD"); !strings.Contains(log, "src/website/hidden/payload.sh") {
		t.Errorf("the hidden file is not in the history:\n%s", log)
	}
	e.waitFor("healthy", 15*time.Second, func() bool { return e.healthz() == 200 })
}

// A git dir that is lost while the workspace stays (a new git dir
// volume): the next start says so, commits what it finds, and does not
// make it good until root acknowledges it; the agent cannot.
func TestSupervisorLostHistoryWaitsForAck(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("first good commit", 10*time.Second, func() bool { return e.status().Good != "" })
	if out, err := e.asAgent(fmt.Sprintf(`echo implant > %s/src/website/implant.sh`, e.ws)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	e.shutdown()
	if err := os.RemoveAll(e.gitDir); err != nil {
		t.Fatal(err)
	}
	e.boot()
	st := e.status()
	if st.AwaitingAck == "" || st.AwaitingAck != st.Head || st.Good != "" {
		t.Fatalf("after the git dir was lost: %+v", st)
	}
	if !strings.Contains(e.out.String(), "HISTORY MISSING") {
		t.Error("the missing history was not said loudly")
	}
	// Healthy for three times good_after (2s), and still not good.
	e.waitFor("healthy", 10*time.Second, func() bool { return e.healthz() == 200 })
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		if g := e.status().Good; g != "" {
			t.Fatalf("the adopted commit became good (%s) without an acknowledgement", g)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sup := bin(t, "supervisor")
	if out, err := e.asAgent(sup + " ack --config " + e.config); err == nil || !strings.Contains(out, "may acknowledge") {
		t.Errorf("supervisor ack as the agent: %v\n%s", err, out)
	}
	out, errs, code := runBin(t, sup, nil, "ack", "--config", e.config)
	if code != 0 || !strings.Contains(out, "acknowledged "+st.AwaitingAck) {
		t.Fatalf("supervisor ack as root: exit %d %s %s", code, out, errs)
	}
	e.waitFor("good after the acknowledgement", 10*time.Second, func() bool { return e.status().Good == st.Head })
}

// `init --log-format json`: every line, init's own and the services', is
// a JSON record, and a duration is a Go duration string.
func TestSupervisorInitLogsJSON(t *testing.T) {
	e := newSupEnv(t)
	e.initArgs = []string{"--log-format", "json"}
	e.boot()
	e.waitFor("first good commit", 10*time.Second, func() bool { return e.status().Good != "" })
	e.shutdown()
	sc := bufio.NewScanner(strings.NewReader(e.out.String()))
	sawDuration := false
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Errorf("not a JSON record: %q", sc.Text())
			continue
		}
		if v, ok := rec["healthy_for"]; ok {
			sawDuration = true
			if s, ok := v.(string); !ok || s != "2s" {
				t.Errorf("healthy_for = %#v, want the duration string \"2s\"", v)
			}
		}
	}
	if !sawDuration {
		t.Errorf("no healthy_for in the log:\n%s", e.out.String())
	}

	// A failing init says so as JSON too.
	_, errs, code := runBin(t, bin(t, "supervisor"), nil, "init", "--log-format", "json", "--config", filepath.Join(e.base, "missing.toml"), "--seed", e.seed)
	var rec map[string]any
	if code == 0 || json.Unmarshal([]byte(strings.TrimSpace(errs)), &rec) != nil || rec["level"] != "ERROR" {
		t.Errorf("failing init with --log-format json: exit %d, %q", code, errs)
	}
}

// health_socket is root's and app's: the agent cannot connect to it (so
// cannot hold it), root can, as a container's HEALTHCHECK does.
func TestSupervisorHealthSocketIsNotTheAgents(t *testing.T) {
	e := newSupEnv(t)
	sock := filepath.Join(e.base, "run", "health.sock")
	cfg, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, e.config, fmt.Sprintf("health_socket = %q\n", sock)+string(cfg), 0o644)
	e.boot()
	e.waitFor("healthy", 15*time.Second, func() bool { return e.healthz() == 200 })
	if out, err := exec.Command("curl", "-fsS", "--unix-socket", sock, "http://localhost/healthz").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Errorf("root on health_socket: %v %s", err, out)
	}
	if out, err := e.asAgent("curl -fsS --unix-socket " + sock + " http://localhost/healthz"); err == nil {
		t.Errorf("the agent reached health_socket: %s", out)
	}
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o770 {
		t.Errorf("the socket's directory has mode %v, want 0770 root:app", fi.Mode().Perm())
	}
}

// A file the agent makes unreadable to the supervisor (mode 000: init
// gives the group only what the owner has) fails git's add. With the
// history lost, that failed the first commit at every boot: the
// supervisor never started. It is named on /status as the reason the
// edits are unrecorded, and the boot goes on with an empty first commit.
func TestSupervisorUnreadableFileDoesNotStopABoot(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("first good commit", 10*time.Second, func() bool { return e.status().Good != "" })
	if out, err := e.asAgent(fmt.Sprintf(`cd %s/src/website && echo secret > locked && chmod 000 locked`, e.ws)); err != nil {
		t.Fatalf("agent: %v: %s", err, out)
	}
	e.waitFor("the unreadable file named", 10*time.Second, func() bool {
		return strings.Contains(e.status().Unrecorded, "src/website/locked")
	})
	e.shutdown()
	if err := os.RemoveAll(e.gitDir); err != nil {
		t.Fatal(err)
	}
	e.boot()
	e.waitFor("the unreadable file named after the boot", 10*time.Second, func() bool {
		return strings.Contains(e.status().Unrecorded, "src/website/locked' cannot be read by the supervisor")
	})
	if st := e.status(); st.AwaitingAck == "" || st.AwaitingAck != st.Head {
		t.Fatalf("after the git dir was lost: %+v", st)
	}
	e.waitFor("healthy", 10*time.Second, func() bool { return e.healthz() == 200 })
}
