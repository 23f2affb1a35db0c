package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

const (
	// bashGrace is how long output is still read after the shell exits.
	// Whatever a left-behind background process writes later is not part
	// of the result.
	bashGrace = 200 * time.Millisecond
	// bashReadSize is the size of the chunks read from the output pipe.
	bashReadSize = 32 << 10
	// spillMaxAge, spillMaxFiles, spillMaxBytes and spillMaxTotal are
	// the defaults of toolboxConfig's bounds on the full-output files
	// kept in StateDir/output.
	spillMaxAge   = protocol.SpillMaxAge
	spillMaxFiles = 500
	spillMaxBytes = protocol.SpillMaxBytes
	spillMaxTotal = 1 << 30
)

// bash runs a shell command and returns its merged output, tail-truncated
// to the output limits, with its exit status.
func (t *toolbox) bash(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.BashArgs
	if r := decodeArgs(tc, protocol.ToolBash, &a); r != nil {
		return r
	}
	if strings.TrimSpace(a.Command) == "" {
		return toolBadArgs(tc, "bash", "command is empty; give a shell command to run")
	}
	if err := protocol.ValidateScriptParameters(a.Parameters); err != nil {
		return toolBadArgs(tc, "bash", "%v", err)
	}
	if len(a.Parameters) > 0 && !isPowerShell(t.shell) {
		return toolBadArgs(tc, "bash", "%v", errParamsNeedPowerShell)
	}
	dir, r := t.commandDir(tc, a.Cwd)
	if r != nil {
		return r
	}
	if err := t.guard.checkCommandIn(a.Command, dir); err != nil {
		return deniedResult(tc, err)
	}
	if a.Background {
		return t.bashBackground(tc, a, dir)
	}
	timeout, r := t.bashTimeout(tc, a.Timeout)
	if r != nil {
		return r
	}
	if ctx.Err() != nil {
		// Never start a command whose call is already over.
		return toolFailure(tc, "(no output)\n\nCommand cancelled")
	}
	inv, cleanup, err := invocation(t.shell, t.scriptBase(tc.ID), a.Command, a.Parameters)
	if err != nil {
		return toolFailure(tc, "cannot run %s: %v", t.shell, err)
	}
	defer cleanup()
	if inv, err = t.jail.wrapInvocation(inv); err != nil {
		return toolFailure(tc, "cannot run %s: %v", t.shell, err)
	}
	out := newOutputSink(tc.Output, t.spillPath(tc.ID), t.cfg.bashLimits())
	out.maxSpill, out.maxAge, out.maxFiles, out.maxTotal = t.cfg.SpillMaxBytes, t.cfg.SpillMaxAge, t.cfg.SpillMaxFiles, t.cfg.SpillMaxTotal
	st, err := t.runShell(ctx, inv, dir, timeout, out)
	if err != nil {
		return toolFailure(tc, "cannot run %s: %v", t.shell, err)
	}
	return bashResult(tc, out, st, timeout)
}

// commandDir returns the directory a command runs in: the agent's
// working directory, or cwd resolved like a file tool's path, which must
// be a directory the host policy lets the tools read.
func (t *toolbox) commandDir(tc *toolCall, cwd string) (string, *protocol.Result) {
	if cwd == "" {
		return t.cfg.Cwd, nil
	}
	if len(cwd) > protocol.MaxCwdBytes || strings.ContainsRune(cwd, 0) {
		return "", toolBadArgs(tc, "bash", "cwd: give a directory path of at most %d bytes", protocol.MaxCwdBytes)
	}
	path, target, r := t.checkedPath(tc, cwd, policy.Read)
	if r != nil {
		return "", r
	}
	fi, err := os.Stat(target)
	switch {
	case err != nil:
		return "", toolFailure(tc, "cwd: %s", safefs.Problem(path, err))
	case !fi.IsDir():
		return "", toolFailure(tc, "cwd: %s is not a directory; give the directory the command should run in", path)
	}
	return target, nil
}

// scriptBase is where the script files of call id go (see invocation):
// StateDir/run, which no tool reads.
func (t *toolbox) scriptBase(id string) string {
	return filepath.Join(t.cfg.StateDir, "run", strings.TrimSuffix(filepath.Base(t.spillPath(id)), ".log"))
}

// bashTimeout returns the time limit for a call that asked for sec
// seconds (nil: the default), capped at the maximum.
func (t *toolbox) bashTimeout(tc *toolCall, sec *float64) (time.Duration, *protocol.Result) {
	switch {
	case sec == nil:
		return t.cfg.BashDefaultTimeout, nil
	case !(*sec > 0):
		return 0, toolBadArgs(tc, "bash", "timeout must be a positive number of seconds, not %v", *sec)
	case *sec >= t.cfg.BashMaxTimeout.Seconds():
		return t.cfg.BashMaxTimeout, nil
	}
	return max(time.Duration(*sec*float64(time.Second)), 1), nil
}

// spillPath returns where the full output of call id goes.
func (t *toolbox) spillPath(id string) string {
	if protocol.ValidateCallID(id) != nil {
		id = "call-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	}
	return filepath.Join(t.cfg.StateDir, "output", id+".log")
}

// shellStatus is how a command ended.
type shellStatus struct {
	exitCode  int
	signal    string // the signal that killed the shell, if one did
	timedOut  bool
	cancelled bool
}

// runShell runs the shell invocation inv in dir, in its own process group
// (a Job Object on Windows), with stdout and stderr merged into out. It
// returns when the shell has exited and its output has been read, or
// bashGrace later if something it left behind keeps the output open. On
// timeout or cancellation it kills the whole group.
func (t *toolbox) runShell(ctx context.Context, inv shellInvocation, dir string, timeout time.Duration, out *outputSink) (shellStatus, error) {
	pr, pw, err := outputPipe()
	if err != nil {
		return shellStatus{}, err
	}
	cmd := &exec.Cmd{
		Path: inv.argv[0],
		Args: inv.argv,
		Dir:  dir,
		// With an explicit environment exec no longer sets PWD; the last
		// entry wins over an inherited one.
		Env: append(append(slices.Clip(t.env), inv.env...), "PWD="+dir),
		// Both are the same *os.File, so the children write to the pipe
		// directly, in order, and exec starts no copying goroutines.
		Stdout: pw,
		Stderr: pw,
	}
	group, err := startGroup(cmd)
	pw.Close() // the children hold their own copies
	if err != nil {
		pr.Close()
		return shellStatus{}, err
	}
	defer group.release()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		out.readFrom(pr)
	}()
	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()

	st, werr := awaitShell(ctx, group, timeout, waitDone)
	drainOutput(pr, readDone, bashGrace)
	pr.Close()
	st.setExit(werr)
	return st, nil
}

// agentEnvPrefix starts the names of the variables that configure the
// agent itself.
const agentEnvPrefix = "FLEET_"

// childEnv returns environ without the agent's own variables, which may
// hold secrets such as a join token (FLEET_JOIN_TOKEN). It never returns nil, so a
// command never falls back to inheriting the agent's environment.
func childEnv(environ []string) []string {
	env := make([]string, 0, len(environ))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, agentEnvPrefix) {
			env = append(env, kv)
		}
	}
	return env
}

// awaitShell waits for the shell to exit, killing its process group on
// timeout or when ctx is done. It returns cmd.Wait's error.
func awaitShell(ctx context.Context, group *procGroup, timeout time.Duration, waitDone <-chan error) (shellStatus, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var st shellStatus
	select {
	case err := <-waitDone:
		// Background processes may keep running: they were asked for.
		return st, err
	case <-timer.C:
		st.timedOut = true
	case <-ctx.Done():
		st.cancelled = true
	}
	group.kill()
	return st, <-waitDone
}

// drainOutput waits until the reader closes done, for at most grace, then
// makes it stop reading. Output still waiting in the pipe at that point
// means the reader is behind (a loaded machine), not that something the
// command left running holds the pipe open: it gets more time, up to
// maxDrain, so that a slow reader never loses what the command printed.
func drainOutput(pr *os.File, done <-chan struct{}, grace time.Duration) {
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for waited := grace; ; waited += grace {
		select {
		case <-done:
			return
		case <-timer.C:
		}
		if waited >= maxDrain || pipeBuffered(pr) <= 0 {
			break
		}
		timer.Reset(grace)
	}
	// Something the command started still holds the pipe open.
	if err := pr.SetReadDeadline(time.Now()); err != nil {
		pr.Close()
	}
	<-done
}

// maxDrain bounds how long drainOutput waits for a reader that is behind.
const maxDrain = 5 * time.Second

// setExit records how the shell ended from cmd.Wait's error.
func (st *shellStatus) setExit(err error) {
	var ee *exec.ExitError
	switch {
	case err == nil:
	case !errors.As(err, &ee):
		st.exitCode = -1
	default:
		if st.signal = exitSignal(ee); st.signal != "" {
			return
		}
		st.exitCode = ee.ExitCode()
	}
}

// bashResult renders the result of a finished command.
func bashResult(tc *toolCall, out *outputSink, st shellStatus, timeout time.Duration) *protocol.Result {
	tr := out.truncation()
	saved, saveErr := out.finish(tr.Truncated)
	text := tr.Content
	if text == "" {
		text = "(no output)"
	}
	if tr.Truncated {
		text = strings.TrimSuffix(text, "\n") + "\n\n" + spillNote(tr, out.lim, out.lastLineLen(), saved, saveErr, out.savedPart())
	}
	if !st.timedOut && !st.cancelled && st.signal == "" && st.exitCode >= 0 {
		code := st.exitCode
		tc.exit = &code
	}
	status := ""
	switch {
	case st.timedOut:
		status = "Command timed out after " + secondsText(timeout)
	case st.cancelled:
		status = "Command cancelled"
	case st.signal != "":
		status = "Command was killed by signal " + st.signal
	case st.exitCode != 0:
		status = fmt.Sprintf("Command exited with code %d", st.exitCode)
	}
	if status != "" {
		// One blank line between the output and the status line, also
		// when the output ends with a newline.
		r := toolText(tc, strings.TrimSuffix(text, "\n")+"\n\n"+status)
		r.IsError = true
		return r
	}
	r := toolText(tc, text)
	r.Structured = out.jsonObject()
	return r
}

// spillNote is the note after truncated output that says what is shown
// and where the rest is.
func spillNote(tr truncation, lim outputLimits, lastLineLen int64, saved string, saveErr error, part string) string {
	where := "Full output: " + saved
	switch {
	case saveErr != nil:
		where = "Full output could not be saved: " + saveErr.Error()
	case part != "":
		where = part + ": " + saved
	}
	switch {
	case tr.LastLinePartial:
		return fmt.Sprintf("[Showing last %s of line %d (line is %s). %s]", sizeLabel(lim.bytes), tr.EndLine, humanSize(lastLineLen), where)
	case tr.By == "lines":
		return fmt.Sprintf("[Showing lines %d-%d of %d. %s]", tr.StartLine, tr.EndLine, tr.TotalLines, where)
	default:
		return fmt.Sprintf("[Showing lines %d-%d of %d (%s limit). %s]", tr.StartLine, tr.EndLine, tr.TotalLines, sizeLabel(lim.bytes), where)
	}
}

// keep is how much of the end of the output the sink keeps once the
// output exceeds the byte limit: enough to tail-truncate it (see cutTail).
func (s *outputSink) keep() int { return s.lim.bytes + 1 }

// outputSink collects a command's output. It streams every chunk to live,
// keeps the output in memory until it exceeds the byte limit and from
// then on only its end, writing all of it to a full-output file instead.
// Its methods are called by one goroutine at a time.
type outputSink struct {
	live      func([]byte)
	spillPath string
	lim       outputLimits // what the result shows
	buf       []byte       // the output, or its last keep()+ bytes
	spill     *os.File     // open while the output is being saved
	spillErr  error        // why the output could not be saved
	spilled   bool         // the full-output file was created
	// maxSpill bounds the full-output file (0: spillMaxBytes); what
	// comes after is not saved. maxAge, maxFiles and maxTotal bound the
	// files kept (0: spillMaxAge, spillMaxFiles, spillMaxTotal).
	maxSpill int64
	maxAge   time.Duration
	maxFiles int
	maxTotal int64
	saved    int64 // bytes written to the full-output file
	cut      bool  // the full-output file reached maxSpill

	total    int64 // bytes of output
	newlines int
	lastByte byte
	curLine  int64 // bytes of the line being written
	prevLine int64 // bytes of the last complete line, without '\n'
}

// newOutputSink returns a sink that streams to live and saves the full
// output, when it must, at spillPath.
func newOutputSink(live func([]byte), spillPath string, lim outputLimits) *outputSink {
	if live == nil {
		live = func([]byte) {}
	}
	return &outputSink{live: live, spillPath: spillPath, lim: lim}
}

// readFrom copies r into the sink until r fails or ends.
func (s *outputSink) readFrom(r io.Reader) {
	buf := make([]byte, bashReadSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			s.write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// write takes one chunk of output.
func (s *outputSink) write(p []byte) {
	if len(p) == 0 {
		return
	}
	s.live(p)
	s.count(p)
	if !s.spilled && s.total > int64(s.lim.bytes) {
		s.startSpill()
	}
	if s.spill != nil {
		s.save(p)
	}
	s.buf = append(s.buf, p...)
	if keep := s.keep(); len(s.buf) > 2*keep {
		n := copy(s.buf, s.buf[len(s.buf)-keep:])
		s.buf = s.buf[:n]
	}
}

// count updates the byte, line and line-length counts for p.
func (s *outputSink) count(p []byte) {
	s.total += int64(len(p))
	s.lastByte = p[len(p)-1]
	i := bytes.LastIndexByte(p, '\n')
	if i < 0 {
		s.curLine += int64(len(p))
		return
	}
	s.newlines += bytes.Count(p, []byte{'\n'})
	if j := bytes.LastIndexByte(p[:i], '\n'); j >= 0 {
		s.prevLine = int64(i - j - 1)
	} else {
		s.prevLine = s.curLine + int64(i)
	}
	s.curLine = int64(len(p) - i - 1)
}

// startSpill creates the full-output file and saves what is buffered, the
// whole output so far.
func (s *outputSink) startSpill() {
	s.spilled = true
	dir := filepath.Dir(s.spillPath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		s.spillErr = err
		return
	}
	f, err := os.OpenFile(s.spillPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		s.spillErr = err
		return
	}
	s.spill = f
	// The others may take what the total leaves once this one has taken
	// all it may.
	others := max(cmp.Or(s.maxTotal, spillMaxTotal)-cmp.Or(s.maxSpill, spillMaxBytes), 0)
	pruneSpillFiles(dir, s.spillPath, time.Now(), cmp.Or(s.maxAge, spillMaxAge), cmp.Or(s.maxFiles, spillMaxFiles), others)
	s.save(s.buf)
}

// save appends p to the full-output file; after an error, or once the
// file holds maxSpill bytes, it stops saving.
func (s *outputSink) save(p []byte) {
	limit := cmp.Or(s.maxSpill, spillMaxBytes)
	if room := limit - s.saved; int64(len(p)) > room {
		p = p[:max(room, 0)]
		s.cut = true
	}
	n, err := s.spill.Write(p)
	s.saved += int64(n)
	if err == nil && !s.cut {
		return
	}
	if err != nil {
		s.spillErr = err
	}
	s.spill.Close()
	s.spill = nil
}

// savedPart describes a full-output file that holds only the start of
// the output; "" when it holds all of it.
func (s *outputSink) savedPart() string {
	if !s.cut {
		return ""
	}
	return fmt.Sprintf("Full output (its first %s of %s; the host saves at most %s per command)", humanSize(s.saved), humanSize(s.total), humanSize(cmp.Or(s.maxSpill, spillMaxBytes)))
}

// whole reports whether the buffer holds all the output.
func (s *outputSink) whole() bool { return int64(len(s.buf)) == s.total }

// lines returns the number of output lines.
func (s *outputSink) lines() int {
	if s.total > 0 && s.lastByte != '\n' {
		return s.newlines + 1
	}
	return s.newlines
}

// lastLineLen returns the length of the last output line, without '\n'.
func (s *outputSink) lastLineLen() int64 {
	if s.lastByte == '\n' {
		return s.prevLine
	}
	return s.curLine
}

// truncation tail-truncates the output to the output limits.
func (s *outputSink) truncation() truncation {
	return cutTail(string(s.buf), s.lines(), s.whole(), s.lim)
}

// finish closes the full-output file, first creating it when the output
// was truncated but small enough to have stayed in memory. It returns the
// file's path, or why there is none.
func (s *outputSink) finish(truncated bool) (string, error) {
	if truncated && !s.spilled {
		s.startSpill()
	}
	if s.spill != nil {
		if err := s.spill.Close(); err != nil && s.spillErr == nil {
			s.spillErr = err
		}
		s.spill = nil
	}
	return s.spillPath, s.spillErr
}

// jsonObject returns the output when all of it, without surrounding white
// space, is one JSON object; otherwise nil.
func (s *outputSink) jsonObject() json.RawMessage {
	if !s.whole() {
		return nil
	}
	b := bytes.TrimSpace(s.buf)
	if len(b) == 0 || b[0] != '{' || !json.Valid(b) {
		return nil
	}
	return json.RawMessage(bytes.Clone(b))
}

// pruneSpillFiles removes full-output files in dir older than maxAge and
// then the oldest ones until, counting keep, at most maxFiles remain and
// the others hold at most maxBytes. It never removes keep. Errors are
// ignored: another call may be pruning too.
func pruneSpillFiles(dir, keep string, now time.Time, maxAge time.Duration, maxFiles int, maxBytes int64) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type spillFile struct {
		path string
		mod  time.Time
		size int64
	}
	var files []spillFile
	var total int64
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".log") || p == keep {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if now.Sub(info.ModTime()) > maxAge {
			os.Remove(p)
			continue
		}
		files = append(files, spillFile{p, info.ModTime(), info.Size()})
		total += info.Size()
	}
	excess := len(files) + 1 - maxFiles
	if excess <= 0 && total <= maxBytes {
		return
	}
	slices.SortFunc(files, func(a, b spillFile) int { return a.mod.Compare(b.mod) })
	for i, f := range files {
		if i >= excess && total <= maxBytes {
			return
		}
		if os.Remove(f.path) == nil {
			total -= f.size
		}
	}
}

// secondsText says d in seconds as a status line does: "1 second",
// "0.3 seconds", "120 seconds".
func secondsText(d time.Duration) string {
	n := strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
	if n == "1" {
		return n + " second"
	}
	return n + " seconds"
}
