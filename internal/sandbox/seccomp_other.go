//go:build !amd64 && !arm64

package sandbox

// No filter is built for other architectures: Filter fails, and with it
// every launch, rather than run a session without one.
const (
	auditArch = 0
	x32Bit    = 0
)

var modeCalls []modeArg
