package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// One gateway process owns a data directory at a time: the embedded NATS
// server's JetStream store is not made to be shared, and two servers on
// one store corrupt it. The gateway holds an exclusive lock on
// DataDir/gateway.lock from before the embedded server starts until it
// has shut down; the kernel releases it when the process dies, however it
// dies.

const dataLockFile = "gateway.lock"

// DataDirInUseError reports a data directory another gateway holds.
type DataDirInUseError struct {
	Dir string
	// PID is the process holding it, when it could be read (0 if not).
	PID int
}

func (e *DataDirInUseError) Error() string {
	holder := "another fleet-gateway"
	if e.PID > 0 {
		holder += " (pid " + strconv.Itoa(e.PID) + ")"
	}
	return fmt.Sprintf("data directory %s is in use by %s: one gateway runs per --data_dir. "+
		"Stop that one, or give this one its own --data_dir (its own fleet), or run several gateways against one external NATS cluster with --nats_url",
		e.Dir, holder)
}

// lockDataDir creates dir if need be and locks it for this process. The
// returned file holds the lock until it is closed.
func lockDataDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	f, err := openLockFile(filepath.Join(dir, dataLockFile))
	if err != nil {
		return nil, fmt.Errorf("data directory lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		pid := holderPID(f)
		f.Close()
		if errors.Is(err, errLocked) {
			return nil, &DataDirInUseError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

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
