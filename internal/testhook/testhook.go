//go:build !bushost_testhook

// Package testhook holds what only a test's build does. It marks the
// points where root has checked a path a caller named and has yet to use
// it: a binary built with the tag bushost_testhook (the integration tests
// build one) can swap a path there, as a caller racing root would at the
// worst moment. Such a binary can also be made to take the fallback a
// machine without idmapped mounts takes, and bushostd to skip a check
// (Skips). In every other build these do nothing and read nothing.
package testhook

// Swap marks a point between a check and its use.
func Swap(point string) {}

// SwapEntry marks a point between a check of the entry name of a
// directory and its use.
func SwapEntry(point, name string) {}

// NoIDMap reports whether sandbox run must hand a session's trees over
// by walking them, as where idmapped mounts are missing: never, but in a
// test's build.
func NoIDMap() bool { return false }

// Step marks a step of a session's start, which a test's build can time.
func Step(name string) {}

// Skipped is what a test's build turns off in bushostd: nothing.
func Skipped() Skips { return Skips{} }
