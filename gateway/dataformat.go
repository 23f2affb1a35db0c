package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/fleetmcp/fleetmcp/gateway/internal/fsutil"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A gateway's data directory says which layout of its files and buckets
// wrote it, so that a binary older than the data (a package downgrade, a
// restored old binary) refuses to start rather than misread or rewrite
// what a newer one left. An upgrade that changes the layout raises
// dataFormat and migrates before it stamps the directory.

const (
	dataFormatFile = "format"
	// dataFormat is the layout this gateway reads and writes: operator-mode
	// NATS keys, the fleet CA, JetStream buckets fleet_hosts, fleet_agents,
	// fleet_tokens, fleet_nonces, skill rollout.
	dataFormat = 1
)

// DataFormatError reports a data directory written by a newer gateway.
type DataFormatError struct {
	Dir        string
	Found, Max int
}

func (e *DataFormatError) Error() string {
	return fmt.Sprintf("data directory %s has data format %d, written by a newer fleet-gateway; this one reads format %d at most. "+
		"Run the newer fleet-gateway again (a downgrade cannot read its data), or restore a backup of the data directory taken before the upgrade",
		e.Dir, e.Found, e.Max)
}

// checkDataFormat refuses a data directory of a newer format and stamps
// it with this gateway's format. It runs with the directory locked.
func checkDataFormat(dir string) error {
	path := filepath.Join(dir, dataFormatFile)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("data format: %w", err)
	default:
		found, perr := strconv.Atoi(string(bytes.TrimSpace(data)))
		if perr != nil || found < 1 {
			return fmt.Errorf("data format file %s holds %q, not a format number: restore it from a backup, or delete it if this directory was made by this version", path, protocol.Ellipsis(string(data), 40))
		}
		if found > dataFormat {
			return &DataFormatError{Dir: dir, Found: found, Max: dataFormat}
		}
		if found == dataFormat {
			return nil
		}
	}
	if err := fsutil.WriteFileAtomic(path, []byte(strconv.Itoa(dataFormat)+"\n"), 0o600); err != nil {
		return fmt.Errorf("data format: %w", err)
	}
	return nil
}
