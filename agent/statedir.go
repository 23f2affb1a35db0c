package agent

import (
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// The agent's hold on its state directory. One agent process owns a state
// directory at a time: it holds an exclusive lock on StateDir/agent.lock
// for as long as it runs, so that a second agent started on the same
// directory (the same command run twice, or two agents left on the
// default) is refused at start rather than listing, cancelling and
// re-attaching the first one's background tasks. The lock is an flock on
// a descriptor opened close-on-exec: the background tasks the agent
// starts, which outlive it, never hold it, and the kernel releases it when
// the process dies however it dies.
//
// The directory also keeps the installation's identity (StateDir/agent-id,
// generated once): every announce carries it, so that the gateway knows a
// restarted agent from a second machine claiming the same host name.
// Anyone who can read the state directory can copy it, and so can a
// command the agent runs; what a copy buys is no more than the host's NATS
// credential, which such a reader holds already. A copy that runs at the
// same time as the original (a cloned machine) is still a conflict: the
// gateway sees two live processes of one installation.

const (
	stateLockFile = "agent.lock"
	agentIDFile   = "agent-id"
	// agentIDLen is the length of an AgentID: 16 random bytes in hex.
	agentIDLen = 32
)

// StateDirInUseError reports a state directory another agent process
// holds.
type StateDirInUseError struct {
	Dir string
	// PID is the process holding it, when it could be read (0 if not).
	PID int
}

func (e *StateDirInUseError) Error() string {
	holder := "another fleet-agent"
	if e.PID > 0 {
		holder += " (pid " + strconv.Itoa(e.PID) + ")"
	}
	return fmt.Sprintf("state directory %s is in use by %s: one agent runs per state directory; "+
		"stop that one, or give this one its own --state_dir (a second agent on this machine also needs its own --name and credential)",
		e.Dir, holder)
}

// stateDir is a state directory this process holds.
type stateDir struct {
	once    sync.Once
	lock    *os.File
	agentID string
}

// openStateDir creates dir if need be, locks it for this process and
// reads (or, the first time, creates) the installation's identity.
func openStateDir(dir string) (*stateDir, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	f, err := openLockFile(filepath.Join(dir, stateLockFile))
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		pid := holderPID(f)
		f.Close()
		if errors.Is(err, errLocked) {
			return nil, &StateDirInUseError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("lock state directory %s: %w", dir, err)
	}
	// Tell whoever finds the directory locked who holds it.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	id, err := loadAgentID(dir)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &stateDir{lock: f, agentID: id}, nil
}

// close releases the state directory; later calls do nothing.
func (s *stateDir) close() { s.once.Do(func() { s.lock.Close() }) }

// holderPID reads the process ID the lock's holder wrote; 0 if none.
func holderPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// loadAgentID returns the installation's identity kept in dir, creating
// it the first time. The caller holds dir's lock, so no other agent
// creates it at the same time; a crash leaves the file whole or absent.
func loadAgentID(dir string) (string, error) {
	path := filepath.Join(dir, agentIDFile)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(data))
		if !validAgentID(id) {
			return "", fmt.Errorf("%s is damaged (want %d hex digits): it holds this agent's identity in the fleet; "+
				"delete it and the agent makes a new one (the gateway then sees a new agent for this host until the old one's heartbeats expire)",
				path, agentIDLen)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("read agent identity: %w", err)
	}
	b := make([]byte, agentIDLen/2)
	_, _ = crand.Read(b) // never fails: it crashes the program instead
	id := hex.EncodeToString(b)
	if err := writeStateFile(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("create agent identity: %w", err)
	}
	return id, nil
}

func validAgentID(id string) bool {
	if len(id) != agentIDLen {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}
