package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --housekeeping takes auto or off; anything else is refused before the
// home is made.
func TestHousekeepingFlag(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	err := Serve(context.Background(), Options{Home: home, Housekeeping: "sometimes"})
	if err == nil || !strings.Contains(err.Error(), "--housekeeping") {
		t.Fatalf("Serve with --housekeeping=sometimes: %v", err)
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Fatalf("a refused start made the home: %v", err)
	}
}
