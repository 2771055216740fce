//go:build !bushost_failpoints

package broker

import "context"

// Without the bushost_failpoints build tag, the failpoints of
// failpoint_on.go do nothing.

func failBeforeCommit(context.Context, *sqlStore, *writeTx, []*op) error { return nil }

func failAfterCommit(context.Context, *sqlStore, []*op) error { return nil }

func failOutcomeRead() error { return nil }
