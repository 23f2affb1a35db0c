//go:build !unix

package main

import "errors"

// mkfifo makes a named pipe at path; there are none here.
func mkfifo(string) error { return errors.ErrUnsupported }
