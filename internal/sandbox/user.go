package sandbox

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// DefaultUser is the user sandbox probe runs bwrap as when root.
const DefaultUser = "nobody"

// User is the host identity the session (and bwrap itself) runs as.
type User struct {
	Name   string   `json:"name"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
	// Drop is true when sandbox runs as root and must switch to this user
	// before starting bwrap.
	Drop bool `json:"drop"`
	// Dynamic: run picks the uid at launch from its range (a uid of the
	// session's own, also its gid); until then UID and GID are unknownID.
	Dynamic bool `json:"dynamic,omitempty"`
}

// unknownID stands for the session's uid and gid before run picks them:
// (uid_t)-2, which owns no file, so access checks see "others".
const unknownID = 1<<32 - 2

// sessionUser picks the session's user. As root it is name, never uid 0
// (without a name, a uid of its own picked at launch: see acquireUID): bwrap maps the session's uid to the uid that starts
// it, so a root launcher would make the session host root. As anyone else
// it is the caller, since only root can switch users.
func sessionUser(name string) (User, error) {
	if os.Geteuid() != 0 {
		u := User{Name: strconv.Itoa(os.Getuid()), UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
		if pw, err := lookupPasswd(u.Name); err == nil {
			u.Name = pw.name
		}
		if name != "" && name != u.Name && name != strconv.Itoa(os.Getuid()) {
			return User{}, fmt.Errorf("--user %s: only root can run a session as another user (you are %s)", name, u.Name)
		}
		groups, err := os.Getgroups()
		if err != nil {
			return User{}, fmt.Errorf("read supplementary groups: %w", err)
		}
		for _, g := range groups {
			u.Groups = append(u.Groups, uint32(g))
		}
		return u, nil
	}
	if name == "" {
		return User{Name: dynamicName, UID: unknownID, GID: unknownID, Drop: true, Dynamic: true}, nil
	}
	pw, err := lookupPasswd(name)
	if err != nil {
		return User{}, fmt.Errorf("--user %s: %w", name, err)
	}
	if pw.uid == 0 || pw.gid == 0 {
		return User{}, fmt.Errorf("--user %s: the session never runs as uid or gid 0 on the host", name)
	}
	u := User{Name: pw.name, UID: pw.uid, GID: pw.gid, Drop: true, Groups: []uint32{pw.gid}}
	gids, err := memberOf(pw.name)
	if err != nil {
		return User{}, fmt.Errorf("--user %s: groups: %w", name, err)
	}
	for _, g := range gids {
		// Group 0 would let the session read root's group-readable files
		// under /etc; a session never holds it.
		if g != 0 && g != pw.gid {
			u.Groups = append(u.Groups, g)
		}
	}
	return u, nil
}

type passwd struct {
	name     string
	uid, gid uint32
}

// lookupPasswd finds a user by name or uid in /etc/passwd. It reads the
// file itself rather than through os/user, which would link the C library
// (cgo) and slow every start of the session by the dynamic loader.
func lookupPasswd(nameOrUID string) (passwd, error) {
	var found *passwd
	err := eachLine("/etc/passwd", func(f []string) bool {
		if len(f) < 4 || (f[0] != nameOrUID && f[2] != nameOrUID) {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		found = &passwd{name: f[0], uid: uint32(uid), gid: uint32(gid)}
		return false
	})
	if err != nil {
		return passwd{}, err
	}
	if found == nil {
		return passwd{}, fmt.Errorf("no such user in /etc/passwd")
	}
	return *found, nil
}

// memberOf lists the gids of /etc/group entries that name user as a member.
func memberOf(user string) ([]uint32, error) {
	var gids []uint32
	err := eachLine("/etc/group", func(f []string) bool {
		if len(f) < 4 || !slices.Contains(strings.Split(f[3], ","), user) {
			return true
		}
		if g, err := strconv.ParseUint(f[2], 10, 32); err == nil {
			gids = append(gids, uint32(g))
		}
		return true
	})
	return gids, err
}

// groupName is the name /etc/group gives gid, or "" if none.
func groupName(gid uint32) string {
	name := ""
	want := strconv.FormatUint(uint64(gid), 10)
	_ = eachLine("/etc/group", func(f []string) bool {
		if len(f) >= 3 && f[2] == want {
			name = f[0]
			return false
		}
		return true
	})
	return name
}

func eachLine(path string, fn func(fields []string) bool) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return nil
		}
	}
	return nil
}

func (u User) inGroup(gid uint32) bool { return gid == u.GID || slices.Contains(u.Groups, gid) }
