package bundle

import (
	"fmt"
	"os"
	"path/filepath"
)

// LooseEstimate is about how many loose objects the object directory
// objects holds, from its 16 fan-out directories 00 to 0f (a sixteenth of
// them, object names being uniform), the way `git gc --auto` samples one.
// The bus host's housekeeping and the client's tidying both decide by it.
func LooseEstimate(objects string) int {
	n := 0
	for i := 0; i < 16; i++ {
		des, err := os.ReadDir(filepath.Join(objects, fmt.Sprintf("%02x", i)))
		if err != nil {
			continue
		}
		for _, de := range des {
			if len(de.Name()) == 38 {
				n++
			}
		}
	}
	return n * 16
}
