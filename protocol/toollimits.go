package protocol

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The limits of the per-host tools. The agent applies them and the tool
// descriptions state them, both from these constants (see Describe). The
// ones called host defaults are what an agent applies unless its operator
// configures others; the rest are fixed.
const (
	// MaxOutputLines is, with MaxOutputBytes, what bash, read and search
	// show at most.
	MaxOutputLines = 2000

	// ReadAnchorContext is the lines an anchored read shows before and
	// after its anchor unless the call says otherwise; at most
	// ReadMaxAnchorContext. An anchor is at most ReadMaxAnchorBytes and
	// ReadMaxAnchorLines lines long.
	ReadAnchorContext    = 10
	ReadMaxAnchorContext = 500
	ReadMaxAnchorBytes   = 4 << 10
	ReadMaxAnchorLines   = 64
	// ImageMaxDimension and ImageMaxBytes bound the images read shows
	// (host defaults): the longest side in pixels, and the size once
	// base64-encoded.
	ImageMaxDimension = 2000
	ImageMaxBytes     = 4_500_000
	// BinaryMaxBytes is the largest file read loads whole, an image or any
	// file with binary_base64 (host default).
	BinaryMaxBytes = 20 << 20

	// BashTimeout applies to a bash call that gives no timeout, and
	// BashMaxTimeout caps any it gives (host defaults).
	BashTimeout    = 120 * time.Second
	BashMaxTimeout = 600 * time.Second
	// SpillMaxBytes is how much of a command's output the agent keeps in
	// its full-output file, and SpillMaxAge how long it keeps the file
	// (host defaults).
	SpillMaxBytes = 100 << 20
	SpillMaxAge   = 7 * 24 * time.Hour

	// TaskTimeout and TaskMaxTimeout are bash's timeouts with background:
	// true (host defaults). TaskMaxRunning tasks run at once and
	// TaskMaxQueued more wait; beyond that a new one is refused as busy
	// (host defaults). TaskMaxOutputBytes bounds one task's output file: a
	// task that writes more is killed (host default).
	TaskTimeout        = time.Hour
	TaskMaxTimeout     = 24 * time.Hour
	TaskMaxRunning     = 8
	TaskMaxQueued      = 32
	TaskMaxOutputBytes = 100 << 20
	// TaskRetention, TaskMaxKept and TaskMaxKeptBytes bound the finished
	// tasks a host keeps: their age, number and output (host defaults).
	TaskRetention    = 30 * 24 * time.Hour
	TaskMaxKept      = 1000
	TaskMaxKeptBytes = 1 << 30
	// TaskTailLines and TaskTailBytes bound the end of a task's output
	// that task_status and task_cancel return (host defaults).
	TaskTailLines = 50
	TaskTailBytes = 8 << 10
	// TaskWait is how long task_status waits for a task to end unless the
	// call says otherwise; at most TaskMaxWait.
	TaskWait    = 30 * time.Second
	TaskMaxWait = 60 * time.Second
	// TaskShownCommand is how much of a task's command its status shows;
	// task_list shows TaskListedCommand in its structured content and
	// TaskTableCommand in its text.
	TaskShownCommand  = 2000
	TaskListedCommand = 200
	TaskTableCommand  = 80
	// TaskListSize is how many tasks task_list returns unless the call
	// says otherwise; at most TaskMaxListSize.
	TaskListSize    = 20
	TaskMaxListSize = 200

	// ListDepth is how deep list goes unless the call says otherwise; at
	// most ListMaxDepth. A listing has at most ListMaxEntries entries.
	ListDepth      = 2
	ListMaxDepth   = 10
	ListMaxEntries = 1000

	// SearchResults is how many matching lines search shows unless the
	// call says otherwise; at most SearchMaxResults. Each is cut to
	// SearchLineWidth characters. Files over SearchMaxFileSize are
	// skipped; a search examines at most SearchMaxEntries entries, for at
	// most SearchTimeBudget. A query is at most SearchMaxQuery bytes.
	SearchResults     = 100
	SearchMaxResults  = 1000
	SearchLineWidth   = 300
	SearchMaxFileSize = 10 << 20
	SearchMaxEntries  = 50_000
	SearchTimeBudget  = 20 * time.Second
	SearchMaxQuery    = 4096

	// TreeMaxEntries bounds the entries a delete or move of a directory
	// checks, and so the directories it handles.
	TreeMaxEntries = 100_000

	// PatchMaxBytes and PatchMaxFiles bound one patch.
	PatchMaxBytes = 16 << 20
	PatchMaxFiles = 1000
)

// limitTextsOnce is limitTexts, made once.
var limitTextsOnce = sync.OnceValue(limitTexts)

// limitTexts are the limits as the tool descriptions show them, by the
// name a description refers to them with ({{name}}).
func limitTexts() map[string]string {
	return map[string]string{
		"output_lines": strconv.Itoa(MaxOutputLines),
		// The pi coding agent's notation, which the output notes use too.
		"output_bytes": strconv.Itoa(MaxOutputBytes>>10) + "KB",

		"anchor_context":     strconv.Itoa(ReadAnchorContext),
		"anchor_max_context": strconv.Itoa(ReadMaxAnchorContext),
		"anchor_max_bytes":   SizeText(ReadMaxAnchorBytes),
		"anchor_max_lines":   strconv.Itoa(ReadMaxAnchorLines),
		"image_max_px":       strconv.Itoa(ImageMaxDimension),
		"image_max_bytes":    strconv.FormatFloat(ImageMaxBytes/1e6, 'f', -1, 64) + " MB",
		"binary_max":         SizeText(BinaryMaxBytes),

		"bash_timeout":     seconds(BashTimeout),
		"bash_max_timeout": seconds(BashMaxTimeout),
		"spill_max":        SizeText(SpillMaxBytes),
		"spill_age":        DurationText(SpillMaxAge),

		"task_timeout":        DurationText(TaskTimeout),
		"task_max_timeout":    DurationText(TaskMaxTimeout),
		"task_timeout_s":      seconds(TaskTimeout),
		"task_max_timeout_s":  seconds(TaskMaxTimeout),
		"task_running":        strconv.Itoa(TaskMaxRunning),
		"task_queued":         strconv.Itoa(TaskMaxQueued),
		"task_output":         SizeText(TaskMaxOutputBytes),
		"task_retention":      DurationText(TaskRetention),
		"task_kept":           strconv.Itoa(TaskMaxKept),
		"task_kept_bytes":     SizeText(TaskMaxKeptBytes),
		"task_tail_lines":     strconv.Itoa(TaskTailLines),
		"task_tail_bytes":     SizeText(TaskTailBytes),
		"task_wait":           seconds(TaskWait),
		"task_max_wait":       seconds(TaskMaxWait),
		"task_shown_command":  strconv.Itoa(TaskShownCommand),
		"task_listed_command": strconv.Itoa(TaskListedCommand),
		"task_table_command":  strconv.Itoa(TaskTableCommand),
		"task_list":           strconv.Itoa(TaskListSize),
		"task_max_list":       strconv.Itoa(TaskMaxListSize),

		"list_depth":       strconv.Itoa(ListDepth),
		"list_max_depth":   strconv.Itoa(ListMaxDepth),
		"list_max_entries": strconv.Itoa(ListMaxEntries),

		"search_results":     strconv.Itoa(SearchResults),
		"search_max_results": strconv.Itoa(SearchMaxResults),
		"search_line":        strconv.Itoa(SearchLineWidth),
		"search_max_file":    SizeText(SearchMaxFileSize),
		"search_max_entries": strconv.Itoa(SearchMaxEntries),
		"search_time":        DurationText(SearchTimeBudget),

		"tree_max_entries": strconv.Itoa(TreeMaxEntries),
		"patch_max_bytes":  SizeText(PatchMaxBytes),
		"patch_max_files":  strconv.Itoa(PatchMaxFiles),

		"cwd_max":          strconv.Itoa(MaxCwdBytes),
		"params_max":       strconv.Itoa(MaxScriptParameters),
		"params_max_bytes": SizeText(MaxScriptParametersBytes),
	}
}

// Describe returns text with every {{name}} replaced by the limit of that
// name as descriptions show it. It panics on a name it does not know:
// descriptions are constants of this module, checked by its tests.
func Describe(text string) string {
	limits := limitTextsOnce()
	var b strings.Builder
	for {
		i := strings.Index(text, "{{")
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		j := strings.Index(text[i:], "}}")
		if j < 0 {
			panic(fmt.Sprintf("protocol.Describe: unclosed {{ in %q", text))
		}
		name := text[i+2 : i+j]
		v, ok := limits[name]
		if !ok {
			panic(fmt.Sprintf("protocol.Describe: no limit named %q", name))
		}
		b.WriteString(text[:i])
		b.WriteString(v)
		text = text[i+j+2:]
	}
}

// SizeText writes a byte count as the descriptions do: "100 MiB",
// "4 KiB", "1 GiB", or bytes when it is no whole number of KiB.
func SizeText(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + " GiB"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// DurationText writes a duration as the descriptions do: "7 days",
// "24 h", "20 s".
func DurationText(d time.Duration) string {
	const day = 24 * time.Hour
	switch {
	case d >= 2*day && d%day == 0:
		return strconv.FormatInt(int64(d/day), 10) + " days"
	case d >= time.Hour && d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + " h"
	case d >= time.Minute && d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + " min"
	}
	return seconds(d) + " s"
}

// seconds writes a duration as a number of seconds.
func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }
