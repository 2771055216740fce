package names

import (
	"errors"

	"github.com/bushost/bushost/internal/errdefs"
)

// Project is a business and a project whose names passed Check. Only
// ParseProject (and Task.Project) makes one, so code that holds a Project
// builds paths and refs from it without checking again; the zero value
// names nothing and is refused where a path would be built from it.
type Project struct{ business, project string }

// ParseProject validates business and project once, where a call enters:
// a refusal is InvalidArgument NAME_INVALID naming the part and the rule.
func ParseProject(business, project string) (Project, error) {
	for _, n := range [][2]string{{"business", business}, {"project", project}} {
		if err := Check(n[0], n[1]); err != nil {
			return Project{}, invalid(err)
		}
	}
	return Project{business, project}, nil
}

// Business is the project's business.
func (p Project) Business() string { return p.business }

// Name is the project's own name.
func (p Project) Name() string { return p.project }

// IsZero says p was not made by ParseProject.
func (p Project) IsZero() bool { return p.business == "" }

func (p Project) String() string { return p.business + "/" + p.project }

// Task parses task within p.
func (p Project) Task(task string) (Task, error) {
	if p.IsZero() {
		return Task{}, invalid(errors.New("no project for task " + clip(task)))
	}
	if err := Check("task", task); err != nil {
		return Task{}, invalid(err)
	}
	return Task{p, task}, nil
}

// Task is a task of a Project, its three names valid (ParseTask).
type Task struct {
	p    Project
	task string
}

// ParseTask validates business, project and task once, where a call
// enters (see ParseProject).
func ParseTask(business, project, task string) (Task, error) {
	p, err := ParseProject(business, project)
	if err != nil {
		return Task{}, err
	}
	return p.Task(task)
}

// Project is the task's project.
func (t Task) Project() Project { return t.p }

// Business is the task's business.
func (t Task) Business() string { return t.p.business }

// Name is the task's own name.
func (t Task) Name() string { return t.task }

// IsZero says t was not made by ParseTask.
func (t Task) IsZero() bool { return t.task == "" }

func (t Task) String() string { return t.p.String() + "/" + t.task }

// WorkRef is refs/work/<task>, the ref a push moves.
func (t Task) WorkRef() string { return "refs/work/" + t.task }

func invalid(err error) error {
	return errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err).Wrap(err)
}

// CheckFilter refuses, NAME_INVALID, a filter that no name can match:
// pairs are kind, value ("business", b, "task", t, ...), and "" (any)
// passes. A listing refuses such a filter rather than answer "nothing".
func CheckFilter(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			continue
		}
		if err := Check(pairs[i], pairs[i+1]); err != nil {
			return invalid(err)
		}
	}
	return nil
}
