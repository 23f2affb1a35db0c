//go:build !unix

package doctor

import "io/fs"

// fileOwner: no uid here; the directory's ACL is the operator's.
func fileOwner(fs.FileInfo) (int, bool) { return 0, false }
