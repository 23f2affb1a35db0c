package protocol

import "time"

// Limits on what an agent's replies may carry to a client. The gateway
// enforces them on every call whatever the agent sends, so that a faulty
// or compromised agent cannot flood a client or the gateway; a correct
// agent stays within them by itself.
const (
	// MaxOutputBytes is the text bash, read and search show at most
	// (with at most 2000 lines); larger output is cut with a note.
	MaxOutputBytes = 50 << 10

	// MaxProgressBytes bounds the message of one progress notification
	// relayed to a client: the latest output of a running call, or a
	// progress note. ProgressInterval is the least time between two of a
	// call's notifications (at most ten a second). Progress and output
	// frames beyond these are coalesced or dropped; the final result
	// never is.
	MaxProgressBytes = 8 << 10
	ProgressInterval = 100 * time.Millisecond

	// MaxResultBytes bounds one encoded result. Images, and the data of
	// read with binary_base64, whose size each host sets, are bounded by
	// it alone.
	MaxResultBytes = 128 << 20
	// MaxShortResultText bounds the text, and the structured content,
	// of a result of bash, read (of text), search and task_status: their
	// output limit (an anchored read shows up to 1.5 times it) and room
	// for notes.
	MaxShortResultText = 128 << 10
	// MaxResultText bounds the text, and the structured content, of a
	// result of any other tool (a skill's SKILL.md is up to 1 MiB, a
	// listing up to 1000 entries).
	MaxResultText = 16 << 20
	// MaxErrorMessage bounds the message of an Error.
	MaxErrorMessage = 8 << 10
)

// ResultTextLimit returns the most text (and structured content) a
// result of tool may carry. data marks a read with binary_base64, whose
// text is the file's data.
func ResultTextLimit(tool string, data bool) int {
	switch {
	case data:
		return MaxResultBytes
	case tool == ToolBash, tool == ToolRead, tool == ToolSearch, tool == ToolTaskStatus:
		return MaxShortResultText
	}
	return MaxResultText
}
