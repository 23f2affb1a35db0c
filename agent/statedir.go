package agent

import (
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/agent/statelock"
)

// The agent's hold on its state directory (package statelock): one agent
// process owns a state directory at a time, so that a second agent started
// on the same directory is refused at start rather than listing,
// cancelling and re-attaching the first one's background tasks.
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
	stateLockFile = statelock.FileName
	agentIDFile   = "agent-id"
	// agentIDLen is the length of an AgentID: 16 random bytes in hex.
	agentIDLen = 32
)

// StateDirInUseError reports a state directory another agent process
// holds.
type StateDirInUseError = statelock.InUseError

// stateDir is a state directory this process holds.
type stateDir struct {
	lock    *statelock.Lock
	agentID string
}

// openStateDir locks dir for this process (creating it if need be), or
// takes over held, a lock on dir the caller took already, and reads (or,
// the first time, creates) the installation's identity. On an error the
// lock is released, held included.
func openStateDir(dir string, held *statelock.Lock) (*stateDir, error) {
	lock := held
	if lock == nil {
		var err error
		if lock, err = statelock.Acquire(dir); err != nil {
			return nil, err
		}
	} else if !lock.Holds(dir) {
		lock.Release()
		return nil, fmt.Errorf("state directory %s: the lock given is on %s", dir, lock.Dir())
	}
	id, err := loadAgentID(dir)
	if err != nil {
		lock.Release()
		return nil, err
	}
	return &stateDir{lock: lock, agentID: id}, nil
}

// close releases the state directory; later calls do nothing.
func (s *stateDir) close() { s.lock.Release() }

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
	if err := safefs.WriteStateFile(path, []byte(id+"\n")); err != nil {
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
