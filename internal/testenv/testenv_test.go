package testenv

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	var n atomic.Int32
	if !Poll(5*time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("a condition that becomes true was not seen")
	}
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds was reported as held")
	}
}
