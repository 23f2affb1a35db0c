//go:build !linux && !darwin

package agent

import "io/fs"

// sysStamp is empty where the file information has no inode change time
// (Windows): size and modification time identify a file's content between
// two reconciles, whose full hash catches a restored modification time.
type sysStamp struct{}

func sysStampOf(fs.FileInfo) sysStamp { return sysStamp{} }
