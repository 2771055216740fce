package errdefs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestReasonsDocumented keeps reasons.go and docs/errors.md equal: every
// Reason constant has a row, every row names a constant, and the row's exit
// status is what ExitCode gives for its kind and reason. reasons.go is read
// with go/parser, so adding a reason is adding a const and a row.
func TestReasonsDocumented(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "reasons.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	inCode := map[string]bool{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Reason" {
				continue
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("%s: a reason is a string literal", fset.Position(v.Pos()))
				}
				r, _ := strconv.Unquote(lit.Value)
				if inCode[r] {
					t.Errorf("reason %s defined twice", r)
				}
				inCode[r] = true
			}
		}
	}
	if len(inCode) == 0 {
		t.Fatal("no reasons parsed from reasons.go")
	}

	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "errors.md"))
	if err != nil {
		t.Fatal(err)
	}
	kindByName := map[string]Kind{}
	for k := KindOK; k <= KindUnauthenticated; k++ {
		kindByName[k.String()] = k
	}
	row := regexp.MustCompile("^\\| `([A-Z0-9_]+)` \\| ([A-Za-z]+) \\| ([0-9]) \\|")
	inDoc := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		r := m[1]
		if inDoc[r] {
			t.Errorf("docs/errors.md lists %s twice", r)
		}
		inDoc[r] = true
		if !inCode[r] {
			t.Errorf("docs/errors.md lists %s, which internal/errdefs/reasons.go does not define", r)
			continue
		}
		kind, ok := kindByName[m[2]]
		if !ok {
			t.Errorf("%s: %q is no kind", r, m[2])
			continue
		}
		if want := ExitCode(New(kind, Reason(r), "x")); strconv.Itoa(want) != m[3] {
			t.Errorf("docs/errors.md: %s with kind %s says exit %s; the table in exit.go gives %d", r, m[2], m[3], want)
		}
	}
	for r := range inCode {
		if !inDoc[r] {
			t.Errorf("reason %s is defined in reasons.go but has no row in docs/errors.md", r)
		}
	}
}
