// Package names is the one validator for business, project and task names,
// and for the refs and paths built from them. Every name that reaches a path
// or a ref passes through here first; nothing else builds those paths.
package names

import (
	"fmt"
	"strings"

	"github.com/bushost/bushost/internal/textsafe"
)

// Pattern is the rule for every name of the project: business, project,
// task, and the roles and services that sit beside them.
const Pattern = `^[a-z0-9][a-z0-9._-]{0,62}$`

// Matches reports whether s matches Pattern. It is written out rather than
// a regexp so that no binary pays to compile one at start (every client and
// session start imports this package; the regexp's {0,62} unrolls into 62
// states, several milliseconds each time).
func Matches(s string) bool {
	const alnum = "abcdefghijklmnopqrstuvwxyz0123456789"
	return len(s) > 0 && len(s) <= 63 && strings.Contains(alnum, s[:1]) && strings.Trim(s, alnum+"._-") == ""
}

// Check returns an error naming kind ("business", "project", "task") and the
// rule when s is not a valid name.
func Check(kind, s string) error {
	if !Matches(s) {
		return fmt.Errorf("invalid %s name %q: must match %s", kind, clip(s), Pattern)
	}
	if strings.Contains(s, "..") {
		return fmt.Errorf("invalid %s name %q: must not contain '..'", kind, s)
	}
	// A ref component may not end in ".lock" or "."; keep names usable as
	// ref components and as file names alike.
	if strings.HasSuffix(s, ".lock") || strings.HasSuffix(s, ".") {
		return fmt.Errorf("invalid %s name %q: must not end in '.' or '.lock'", kind, s)
	}
	return nil
}

// Scope is a validated business/project/task triple. Task may be empty for
// project-level operations.
type Scope struct {
	Business, Project, Task string
}

// CheckScope validates each non-empty part of s; business and project are
// required.
func CheckScope(s Scope) error {
	if err := Check("business", s.Business); err != nil {
		return err
	}
	if err := Check("project", s.Project); err != nil {
		return err
	}
	if s.Task != "" {
		return Check("task", s.Task)
	}
	return nil
}

// WorkRef is refs/work/<task>, after validation.
func WorkRef(task string) (string, error) { return taskRef("refs/work/", task) }

// ReviewRef is refs/review/<task>, after validation.
func ReviewRef(task string) (string, error) { return taskRef("refs/review/", task) }

func taskRef(prefix, task string) (string, error) {
	if err := Check("task", task); err != nil {
		return "", err
	}
	return prefix + task, nil
}

// clip keeps error messages short when a hostile caller sends a huge name.
func clip(s string) string { return textsafe.Clip(s, 80) }
