package gateway

import (
	"context"
	"log/slog"
)

// The MCP SDK logs every session's start and end at info, and a stateless
// request is a session of its own: several lines per tool call. Its info
// lines go to debug; warnings and errors stay as they are. The gateway
// logs what an operator needs at info itself (refused calls, host state
// changes).

// sdkLogger returns the logger the SDK gets: log, for component, with its
// info lines at debug.
func sdkLogger(log *slog.Logger, component string) *slog.Logger {
	return slog.New(demoteInfo{log.Handler()}).With("component", component)
}

// demoteInfo is a handler that logs info records at debug.
type demoteInfo struct{ h slog.Handler }

func demote(l slog.Level) slog.Level {
	if l >= slog.LevelInfo && l < slog.LevelWarn {
		return slog.LevelDebug
	}
	return l
}

func (d demoteInfo) Enabled(ctx context.Context, l slog.Level) bool {
	return d.h.Enabled(ctx, demote(l))
}

func (d demoteInfo) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return d.h.Handle(ctx, r)
}

func (d demoteInfo) WithAttrs(attrs []slog.Attr) slog.Handler {
	return demoteInfo{d.h.WithAttrs(attrs)}
}

func (d demoteInfo) WithGroup(name string) slog.Handler { return demoteInfo{d.h.WithGroup(name)} }
