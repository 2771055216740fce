//go:build !bushost_testhook

// Package testhook marks the points where root has checked a path a
// caller named and has yet to use it. A binary built with the tag
// bushost_testhook (the integration tests build one) can swap a path
// there, as a caller racing root would at the worst moment; in every other
// build Swap does nothing and reads nothing.
package testhook

// Swap marks a point between a check and its use.
func Swap(point string) {}

// SwapEntry marks a point between a check of the entry name of a
// directory and its use.
func SwapEntry(point, name string) {}
