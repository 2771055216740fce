package cmdline

import (
	"fmt"
	"io"
	"log/slog"
)

// Logger builds the log/slog logger that --log-format and --log-level ask
// for (bushostd and the supervisor share both flags): format "text" (or
// "") or "json", level debug, info (or ""), warn or error. An error names
// the flag.
func Logger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if level != "" {
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
		}
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
