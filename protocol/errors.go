package protocol

import "fmt"

// Code classifies why a call could not be carried out. The set is
// append-only: never renumber or reuse a code, old gateways and agents must
// keep understanding each other.
type Code string

const (
	// CodeBadRequest: the call was malformed (bad JSON, invalid arguments).
	CodeBadRequest Code = "bad_request"
	// CodeUnknownTool: the agent does not serve this tool.
	CodeUnknownTool Code = "unknown_tool"
	// CodeBusy: the agent's worker pool and queue are full.
	CodeBusy Code = "busy"
	// CodeVersion: the call's protocol version is not supported.
	CodeVersion Code = "version"
	// CodeIncomplete: parts of a multi-part call never arrived.
	CodeIncomplete Code = "incomplete"
	// CodeTooLarge: the result needs more parts than MaxParts. (A call
	// larger than the agent accepts is answered CodeIncomplete.)
	CodeTooLarge Code = "too_large"
	// CodeUnknownCall: a fetch named a call the agent does not know (any
	// more).
	CodeUnknownCall Code = "unknown_call"
	// CodeShuttingDown: the agent is draining and takes no new calls.
	CodeShuttingDown Code = "shutting_down"
	// CodeCancelled: the call was cancelled before it finished.
	CodeCancelled Code = "cancelled"
	// CodeInternal: anything else that went wrong inside the agent.
	CodeInternal Code = "internal"
	// CodeDenied: host policy refuses the call.
	CodeDenied Code = "denied"
	// CodeRefused: the call's signed envelope does not hold at this
	// host (expired, issued in its future: clocks apart).
	CodeRefused Code = "refused"
	// CodeResultDropped: a fetch or a repeat named a call the agent ran
	// but whose result it no longer keeps (its byte limit for kept
	// results dropped it before its time). It is never run again.
	CodeResultDropped Code = "result_dropped"
)

// Error is a protocol-level failure reported by an agent.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Code, e.Message) }
