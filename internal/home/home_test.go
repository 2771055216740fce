package home

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// Every path a Home names is in the home, one name each, and the layout
// in docs/architecture.md lists exactly those names: operators and
// backups read the layout there.
func TestLayoutIsDocumented(t *testing.T) {
	h := At("/h")
	var code []string
	v := reflect.ValueOf(h)
	for i := range v.NumMethod() {
		m := v.Type().Method(i)
		if m.Type.NumIn() != 1 || m.Type.NumOut() != 1 || m.Type.Out(0).Kind() != reflect.String || m.Name == "Dir" {
			continue
		}
		p := v.Method(i).Call(nil)[0].String()
		if filepath.Dir(p) != "/h" {
			t.Errorf("%s() = %s: not at the top of the home", m.Name, p)
		}
		code = append(code, filepath.Base(p))
	}
	slices.Sort(code)
	if len(slices.Compact(slices.Clone(code))) != len(code) {
		t.Errorf("two paths share a name: %v", code)
	}

	_, file, _, _ := runtime.Caller(0)
	doc, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## The bus host home\n")
	if !ok {
		t.Fatal("docs/architecture.md has no section \"The bus host home\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var documented []string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "    ") {
			continue
		}
		name, _, _ := strings.Cut(strings.Fields(line)[0], "/")
		if !slices.Contains(documented, name) {
			documented = append(documented, name)
		}
	}
	slices.Sort(documented)
	if !slices.Equal(code, documented) {
		t.Errorf("internal/home names %v,\ndocs/architecture.md lists %v", code, documented)
	}
}
