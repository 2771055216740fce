package gitobj

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ReadRef reads what git reads, loose before packed, and refuses a value
// that is not a canonical id: upper or mixed case (which git itself would
// read), the zero id, junk.
func TestReadRef(t *testing.T) {
	dir := t.TempDir()
	git(t, dir, nil, "init", "-q", "--bare")
	id := strings.Repeat("1234567890abcdef", 3)[:40]
	other := strings.Repeat("fedcba0987654321", 3)[:40]
	packed := "# pack-refs with: peeled fully-peeled sorted \n" + other + " refs/heads/a\n^" + id + "\n" + id + " refs/heads/b\n"
	if err := os.WriteFile(filepath.Join(dir, "packed-refs"), []byte(packed), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(ref, v string) {
		p := filepath.Join(dir, ref)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("refs/heads/b", other+"\n") // the loose file wins
	write("refs/heads/sym", "ref: refs/heads/a\n")
	for ref, want := range map[string]string{"refs/heads/a": other, "refs/heads/b": other, "refs/heads/none": ""} {
		if got, err := ReadRef(dir, ref); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", ref, got, err, want)
		}
		if got := strings.TrimSpace(git(t, dir, nil, "for-each-ref", "--format=%(objectname)", ref)); got != want {
			t.Errorf("%s: git reads %q, want %q", ref, got, want)
		}
	}
	if _, err := ReadRef(dir, "refs/heads/sym"); !errors.Is(err, ErrSymbolic) {
		t.Errorf("symbolic: %v", err)
	}
	for name, v := range map[string]string{
		"upper": strings.ToUpper(id), "mixed": strings.ToUpper(id[:20]) + id[20:],
		"zero": strings.Repeat("0", 40), "junk": "not-an-id", "empty": "",
	} {
		write("refs/heads/loose-"+name, v+"\n")
		packed += v + " refs/heads/packed-" + name + "\n"
	}
	os.WriteFile(filepath.Join(dir, "packed-refs"), []byte(packed), 0o644)
	for _, name := range []string{"upper", "mixed", "zero", "junk", "empty"} {
		for _, where := range []string{"loose-", "packed-"} {
			if got, err := ReadRef(dir, "refs/heads/"+where+name); err == nil || !strings.Contains(err.Error(), "not an object id") {
				t.Errorf("%s%s: %q, %v; want refused", where, name, got, err)
			}
		}
	}
}
